"""The replay checkpoint store: one slot per live checkpoint id of the simulator's event stream.

A slot holds the fp32 recurrent state and the conv window of every replayed layer, the position
and a hash of the token prefix it summarises. Slots live on the GPU (default) or in pinned host
memory (``where="host"``, as engines offload); freed slots are reused, so the pool grows to the
peak number of live checkpoints, which is what ``peak_bytes`` reports. Needs torch (imported
lazily by the CLI).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sim.replay.model import ReplayShape, StackState


class StoreError(RuntimeError):
    """A store operation the event stream should never ask for (double admit, unknown id)."""


@dataclass
class SlotInfo:
    slot: int
    position: int
    prefix_hash: bytes
    request: int
    layers_written: set = field(default_factory=set)

    @property
    def filled(self) -> bool:
        return bool(self.layers_written) and len(self.layers_written) == self._layers

    _layers: int = 0


class CheckpointStore:
    def __init__(self, shape: ReplayShape, act_dtype: torch.dtype, *, where: str = "gpu",
                 device="cpu") -> None:
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
    def peak_bytes(self) -> int:
        return self.peak_slots * self.slot_bytes

    # ---- slots -------------------------------------------------------------------------------
    def _new_slot(self) -> int:
        s = self.shape
        rec = torch.empty(s.layers, s.v_heads, s.head_k_dim, s.head_v_dim, dtype=torch.float32,
                          device=self.device, pin_memory=self._pin)
        conv = torch.empty(s.layers, s.conv_dim, s.conv_width - 1, dtype=self.act_dtype,
                           device=self.device, pin_memory=self._pin)
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
        self._info[cp] = info
        self.peak_slots = max(self.peak_slots, len(self._info))
        return info

    def write(self, cp: int, layer: int, rec: torch.Tensor, conv: torch.Tensor) -> None:
        info = self.info(cp)
        nb = self._pin
        self._rec[info.slot][layer].copy_(rec, non_blocking=nb)
        self._conv[info.slot][layer].copy_(conv, non_blocking=nb)
        info.layers_written.add(layer)

    def put(self, cp: int, state: StackState) -> None:
        """Fill every layer of ``cp`` from a whole stack state."""
        info = self.info(cp)
        self._rec[info.slot].copy_(state.rec, non_blocking=self._pin)
        self._conv[info.slot].copy_(state.conv, non_blocking=self._pin)
        info.layers_written.update(range(self.shape.layers))

    def free(self, cp: int) -> None:
        info = self._info.pop(cp, None)
        if info is None:
            raise StoreError(f"evict of checkpoint {cp}, which is not in the store")
        self._free.append(info.slot)

    def restore(self, cp: int) -> StackState:
        """A copy of ``cp``'s state on the compute device (the stored slot stays untouched)."""
        info = self.info(cp)
        if not info.filled:
            raise StoreError(f"checkpoint {cp} was restored before its state was produced")
        rec = self._rec[info.slot].to(self.compute_device, copy=True, non_blocking=self._pin)
        conv = self._conv[info.slot].to(self.compute_device, copy=True, non_blocking=self._pin)
        return StackState(info.position, rec, conv)

    def tensors(self, cp: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored ``(recurrent, conv)`` tensors of ``cp`` themselves (tests plant faults here)."""
        info = self.info(cp)
        return self._rec[info.slot], self._conv[info.slot]
