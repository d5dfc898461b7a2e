"""The replay checkpoint store: one slot per live checkpoint id of the simulator's event stream,
and a paged KV store for the attention layers.

A slot holds the fp32 recurrent state and the conv window of every replayed gated-delta layer,
the position and a hash of the token prefix it summarises. Slots live on the GPU (default) or in
pinned host memory (``where="host"``, as engines offload); freed slots are reused, so the pool
grows to the peak number of live checkpoints, which is what ``peak_bytes`` reports.

KV pages: a checkpoint at position p also needs the keys and values of tokens [0, p) of every
attention layer (a hybrid hit restores both). They live in pages of ``page_tokens`` tokens keyed
by a chained digest of the prefix up to the page's end (``tokens.page_keys``), shared between
checkpoints with a common prefix (reference counted, as a radix tree shares its edges), so the
store holds the KV of exactly the union of the live checkpoints' prefixes. A checkpoint's page
list is its block table; ``restore`` gathers it. Needs torch (imported lazily by the CLI).

Integrity (``digests=True``, replay's ``--validate exact|shadow``): every layer's state and conv
window and every KV page is digested (``checks.digest``) from the tensor the kernels produced,
before the store copies it; ``verify`` digests what a restore returned and lists every layer, head
and page whose bits differ, and every layer never written. Invariants: a slot is restorable only
when every layer was written (``filled``); a page's bits never change while it is referenced.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np
import torch

from kernels._common import upload
from sim.replay.checks import digest
from sim.replay.model import ReplayShape, StackState

PAGE_TOKENS = 64
#: the KV page pool grows by chunks, never by copying what it holds: each new chunk as many pages
#: as the pool has (16 at first), up to this many bytes (a grown copy of a 30 GB pool would need
#: 90 GB for a moment)
POOL_CHUNK_BYTES = 1 << 30


class StoreError(RuntimeError):
    """A store operation the event stream should never ask for (double admit, unknown id)."""


@dataclass
class SlotInfo:
    slot: int
    position: int
    prefix_hash: bytes
    request: int
    layers_written: set = field(default_factory=set)
    pages: list = field(default_factory=list)  # KV block table: [(key, page slot)]
    kv_written: bool = False
    rec_digest: dict = field(default_factory=dict)  # layer -> int64 [Hv] (digests=True)
    conv_digest: dict = field(default_factory=dict)  # layer -> int64 scalar

    @property
    def filled(self) -> bool:
        return len(self.layers_written) == self._layers and (self.kv_written or not self._kv)

    _layers: int = 0
    _kv: bool = False


def pool_growth(pages: int, page_bytes: int) -> int:
    """The pages a KV page pool of ``pages`` grows by when it is full: as many as it has, at
    least 16, at most ``POOL_CHUNK_BYTES`` of them."""
    return max(16, min(pages, POOL_CHUNK_BYTES // max(1, page_bytes)))


def pool_pages_for(pages: int, page_bytes: int) -> int:
    """The pages a pool holds once ``pages`` of them have been live at once (``pool_growth``)."""
    n = 0
    while n < pages:
        n += pool_growth(n, page_bytes)
    return n


class CheckpointStore:
    def __init__(
        self,
        shape: ReplayShape,
        act_dtype: torch.dtype,
        *,
        where: str = "gpu",
        device="cpu",
        page_tokens: int = PAGE_TOKENS,
        digests: bool = False,
    ) -> None:
        if where not in ("gpu", "host"):
            raise ValueError(f"store must be gpu or host, not {where!r}")
        self.shape = shape
        self.act_dtype = act_dtype
        self.where = where
        self.compute_device = torch.device(device)
        # a "gpu" store on a CPU-only run is plain memory on the compute device
        self.device = self.compute_device if where == "gpu" else torch.device("cpu")
        self._pin = where == "host" and self.compute_device.type == "cuda"
        self._rec: list[torch.Tensor] = []
        self._conv: list[torch.Tensor] = []
        self._free: list[int] = []
        self._info: dict[int, SlotInfo] = {}
        self.slot_bytes = shape.state_bytes(act_dtype)
        self.peak_slots = 0
        # KV pages: pool chunks [pages, A, 2, page_tokens, KVH, hd] (page slot s is row s -
        # base of the chunk holding it), key -> [slot, refs, tokens, digest]
        self.page_tokens = int(page_tokens)
        self.has_kv = shape.attn_layers > 0
        self._chunks: list[torch.Tensor] = []
        self._chunk_base: list[int] = []
        self.pool_pages = 0  # pages allocated
        self._pages: dict[bytes, list] = {}
        self._free_pages: list[int] = []
        self.kv_tokens = 0
        self.peak_pages = 0
        self.page_bytes = shape.kv_bytes_per_token(act_dtype) * self.page_tokens
        self.digests = bool(digests)

    # ---- bookkeeping -------------------------------------------------------------------------
    def __contains__(self, cp: int) -> bool:
        return cp in self._info

    def __len__(self) -> int:
        return len(self._info)

    def ids(self) -> set[int]:
        return set(self._info)

    def info(self, cp: int) -> SlotInfo:
        try:
            return self._info[cp]
        except KeyError:
            raise StoreError(f"checkpoint {cp} is not in the store") from None

    @property
    def live_bytes(self) -> int:
        return len(self._info) * self.slot_bytes

    @property
    def device_bytes(self) -> int:
        """Bytes the store has allocated on the compute device (its slots and pages: the pools
        never shrink); 0 for a host store of a GPU run."""
        if self.device != self.compute_device:
            return 0
        return len(self._rec) * self.slot_bytes + self.pool_pages * self.page_bytes

    @property
    def peak_bytes(self) -> int:
        return self.peak_slots * self.slot_bytes + self.peak_pages * self.page_bytes

    @property
    def live_pages(self) -> int:
        return len(self._pages)

    # ---- slots -------------------------------------------------------------------------------
    def _new_slot(self) -> int:
        s = self.shape
        rec = torch.empty(
            s.layers,
            s.v_heads,
            s.head_k_dim,
            s.head_v_dim,
            dtype=torch.float32,
            device=self.device,
            pin_memory=self._pin,
        )
        conv = torch.empty(
            s.layers, s.conv_dim, s.conv_width - 1, dtype=self.act_dtype, device=self.device, pin_memory=self._pin
        )
        self._rec.append(rec)
        self._conv.append(conv)
        return len(self._rec) - 1

    def reserve(self, cp: int, position: int, prefix_hash: bytes, request: int = -1) -> SlotInfo:
        """Give checkpoint ``cp`` a slot (filled later, layer by layer, by ``write``)."""
        if cp in self._info:
            raise StoreError(f"checkpoint {cp} admitted twice")
        slot = self._free.pop() if self._free else self._new_slot()
        info = SlotInfo(slot, int(position), prefix_hash, request)
        info._layers = self.shape.layers
        info._kv = self.has_kv
        self._info[cp] = info
        self.peak_slots = max(self.peak_slots, len(self._info))
        return info

    def write(self, cp: int, layer: int, rec: torch.Tensor, conv: torch.Tensor) -> None:
        info = self.info(cp)
        nb = self._pin
        if self.digests:  # of the produced tensors, before the copy (a lossy copy shows)
            info.rec_digest[layer] = digest(rec, 1)
            info.conv_digest[layer] = digest(conv, 0)
        self._rec[info.slot][layer].copy_(rec, non_blocking=nb)
        self._conv[info.slot][layer].copy_(conv, non_blocking=nb)
        info.layers_written.add(layer)

    def put(self, cp: int, state: StackState) -> None:
        """Fill every gated-delta layer of ``cp`` from a whole stack state."""
        info = self.info(cp)
        if self.digests:
            rd, cd = digest(state.rec, 2), digest(state.conv, 1)
            for layer in range(self.shape.layers):
                info.rec_digest[layer] = rd[layer]
                info.conv_digest[layer] = cd[layer]
        self._rec[info.slot].copy_(state.rec, non_blocking=self._pin)
        self._conv[info.slot].copy_(state.conv, non_blocking=self._pin)
        info.layers_written.update(range(self.shape.layers))

    def unwritten(self, cp: int) -> list[int]:
        """The gated-delta layers of ``cp`` never written (a slot is restorable without any)."""
        info = self.info(cp)
        return [layer for layer in range(self.shape.layers) if layer not in info.layers_written]

    def verify(self, cp: int, state: StackState) -> list[str]:
        """Every difference between the bits ``restore(cp)`` returned (``state``) and the bits the
        kernels produced for ``cp``: ``"layer L head H"``, ``"layer L conv"``, ``"KV page I"``,
        ``"layer L never written"``; empty when they are the same (``digests=True`` only)."""
        if not self.digests:
            raise StoreError("verify needs a store with digests=True")
        info = self.info(cp)
        out = [f"layer {layer} never written" for layer in self.unwritten(cp)]
        L = self.shape.layers
        if L and not out:
            got_r, got_c = digest(state.rec, 2), digest(state.conv, 1)
            want_r = torch.stack([info.rec_digest[i] for i in range(L)]).to(got_r.device)
            want_c = torch.stack([info.conv_digest[i] for i in range(L)]).to(got_c.device)
            bad = (got_r != want_r).nonzero().tolist()
            out += [f"layer {layer} head {h}" for layer, h in bad]
            out += [f"layer {layer} conv" for layer in (got_c != want_c).nonzero().flatten().tolist()]
        if self.has_kv and state.kv is not None:
            P = self.page_tokens
            got, want, where = [], [], []
            for i, (key, _) in enumerate(info.pages):
                page = self._pages.get(key)
                if page is None or page[3] is None:
                    out.append(f"KV page {i} not held")
                    continue
                s, e = i * P, min(info.position, (i + 1) * P)
                got.append(digest(state.kv[:, :, s:e].transpose(0, 2), 0))
                want.append(page[3])
                where.append(i)
            if got:  # one comparison, one device-to-host sync
                bad = (torch.stack(got) != torch.stack(want).to(got[0].device)).nonzero().flatten().tolist()
                out += [f"KV page {where[j]}" for j in bad]
            if not info.kv_written:
                out.append("KV never written")
        return out

    def free(self, cp: int) -> None:
        info = self._info.pop(cp, None)
        if info is None:
            raise StoreError(f"evict of checkpoint {cp}, which is not in the store")
        self._free.append(info.slot)
        for key, _ in info.pages:
            self._unref(key)
        info.pages = []

    # ---- KV pages ----------------------------------------------------------------------------
    def _page_slot(self) -> int:
        if self._free_pages:
            return self._free_pages.pop()
        s = self.shape
        n = self.pool_pages
        grow = pool_growth(n, self.page_bytes)
        chunk = torch.empty(
            grow,
            s.attn_layers,
            2,
            self.page_tokens,
            s.attn_kv_heads,
            s.attn_head_dim,
            dtype=self.act_dtype,
            device=self.device,
            pin_memory=self._pin,
        )
        self._chunks.append(chunk)
        self._chunk_base.append(n)
        self.pool_pages = n + grow
        self._free_pages.extend(range(n + grow - 1, n, -1))
        return n

    def _page(self, slot: int) -> torch.Tensor:
        """Page slot ``slot`` of the pool itself ``[A, 2, page_tokens, KVH, hd]``."""
        c = bisect_right(self._chunk_base, slot) - 1
        return self._chunks[c][slot - self._chunk_base[c]]

    @property
    def pool_bytes(self) -> int:
        """Bytes the KV page pool has allocated (live pages and free ones)."""
        return self.pool_pages * self.page_bytes

    def _unref(self, key: bytes) -> None:
        page = self._pages[key]
        page[1] -= 1
        if page[1] == 0:
            del self._pages[key]
            self._free_pages.append(page[0])
            self.kv_tokens -= page[2]

    def put_kv(self, cp: int, keys: list, kv: torch.Tensor) -> None:
        """Give ``cp`` the KV pages of its prefix: ``keys`` from ``tokens.page_keys``, ``kv``
        ``[A, 2, >= position, KVH, hd]`` (pages already held are shared, not copied)."""
        info = self.info(cp)
        if not self.has_kv:
            return
        if info.pages:
            raise StoreError(f"KV of checkpoint {cp} written twice")
        P = self.page_tokens
        for i, key in enumerate(keys):
            page = self._pages.get(key)
            if page is None:
                s, e = i * P, min(info.position, (i + 1) * P)
                slot = self._page_slot()
                # digest of the tokens' KV as produced, token-major ([tokens, A, 2, KVH, hd])
                d = digest(kv[:, :, s:e].transpose(0, 2), 0) if self.digests else None
                self._page(slot)[:, :, : e - s].copy_(kv[:, :, s:e], non_blocking=self._pin)
                page = self._pages[key] = [slot, 0, e - s, d]
                self.kv_tokens += e - s
            page[1] += 1
            info.pages.append((key, page[0]))
        self.peak_pages = max(self.peak_pages, len(self._pages))
        info.kv_written = True

    def page_keys_of(self, cp: int) -> list:
        return [k for k, _ in self.info(cp).pages]

    def restore_kv(self, cp: int) -> torch.Tensor | None:
        """The KV of ``cp``'s prefix ``[A, 2, position, KVH, hd]``, gathered from its pages."""
        info = self.info(cp)
        if not self.has_kv:
            return None
        s = self.shape
        if not info.pages:
            return torch.empty(
                s.attn_layers, 2, 0, s.attn_kv_heads, s.attn_head_dim, dtype=self.act_dtype, device=self.compute_device
            )
        slots = [slot for _, slot in info.pages]
        page_shape = tuple(self._chunks[0].shape[1:])
        if self._pin:
            # page by page onto the device, queued behind the copies that wrote them (a gather on
            # the host would read pinned pages before their device-to-host copies land)
            g = torch.empty((len(slots),) + page_shape, dtype=self.act_dtype, device=self.compute_device)
            for j, slot in enumerate(slots):
                g[j].copy_(self._page(slot), non_blocking=True)
        else:
            # one gather per pool chunk the pages lie in  -> [n, A, 2, P, KVH, hd]
            at = np.asarray(slots, dtype=np.int64)
            chunk = np.searchsorted(np.asarray(self._chunk_base), at, side="right") - 1
            if (chunk == chunk[0]).all():
                c = int(chunk[0])
                g = self._chunks[c].index_select(0, upload(at - self._chunk_base[c], self.device))
            else:
                g = torch.empty((len(slots),) + page_shape, dtype=self.act_dtype, device=self.device)
                for c in np.unique(chunk).tolist():
                    rows = np.nonzero(chunk == c)[0]
                    g[upload(rows, self.device)] = self._chunks[c].index_select(
                        0, upload(at[rows] - self._chunk_base[c], self.device)
                    )
        g = g.permute(1, 2, 0, 3, 4, 5).reshape(s.attn_layers, 2, -1, s.attn_kv_heads, s.attn_head_dim)
        return g[:, :, : info.position]  # a fresh gather on the compute device: never the pool itself

    def page(self, cp: int, i: int) -> torch.Tensor:
        """Page ``i`` of ``cp``'s block table itself (tests plant faults here)."""
        return self._page(self.info(cp).pages[i][1])

    def restore(self, cp: int) -> StackState:
        """A copy of ``cp``'s state on the compute device (the stored slot stays untouched)."""
        info = self.info(cp)
        if not info.filled:
            raise StoreError(f"checkpoint {cp} was restored before its state was produced")
        rec = self._rec[info.slot].to(self.compute_device, copy=True, non_blocking=self._pin)
        conv = self._conv[info.slot].to(self.compute_device, copy=True, non_blocking=self._pin)
        return StackState(info.position, rec, conv, self.restore_kv(cp))

    def tensors(self, cp: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored ``(recurrent, conv)`` tensors of ``cp`` themselves (tests plant faults here)."""
        info = self.info(cp)
        return self._rec[info.slot], self._conv[info.slot]
