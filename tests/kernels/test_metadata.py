"""``prepare_chunk_metadata`` (vectorised with numpy) against a per-chunk loop written from its
docstring: the same chunk table, sequence table, boundary slots, offsets and positions for any
lengths, start positions, stride and boundary selection (hypothesis), including empty sequences."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kernels._common import CHUNK, prepare_chunk_metadata  # noqa: E402


def loop_metadata(cu, starts, stride=1, wanted=None):
    """One chunk at a time: chunks aligned to absolute multiples of 64, a ragged first chunk when a
    sequence starts off a multiple, a boundary at a full chunk's end when selected."""
    chunk_info, seq_info, slots, offs, positions = [], [], [], [0], []
    for n in range(len(cu) - 1):
        bos, eos, p = cu[n], cu[n + 1], starts[n]
        r = p % CHUNK
        nc = 0 if eos == bos else (eos - bos + r + CHUNK - 1) // CHUNK
        c0, pos_n = len(chunk_info), []
        for c in range(nc):
            ts = bos + c * CHUNK - r
            chunk_info.append((n, ts, max(ts, bos), min(ts + CHUNK, eos)))
            b_abs = p - r + (c + 1) * CHUNK
            pick = b_abs in wanted[n] if wanted is not None else (b_abs // CHUNK) % stride == 0
            if ts + CHUNK <= eos and pick:
                slots.append(offs[-1] + len(pos_n))
                pos_n.append(b_abs)
            else:
                slots.append(-1)
        seq_info.append((bos, eos, c0, len(chunk_info)))
        offs.append(offs[-1] + len(pos_n))
        positions.append(pos_n)
    return chunk_info, seq_info, slots, offs, positions


seqs = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 400)), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(seqs=seqs, stride=st.integers(1, 3), pick=st.one_of(st.none(), st.integers(0, 2**16)))
def test_matches_per_chunk_loop(seqs, stride, pick):
    lens, starts = [s[0] for s in seqs], [s[1] for s in seqs]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    wanted = None
    if pick is not None:  # a pseudo-random subset of each sequence's 64-multiples
        wanted = [
            [b for b in range(CHUNK * (p // CHUNK + 1), p + n + 1, CHUNK) if (b // CHUNK * 2654435761 + pick) % 3]
            for n, p in zip(lens, starts)
        ]
    meta = prepare_chunk_metadata(cu, starts, boundary_stride=stride, boundary_indices=wanted)
    ci, si, sl, offs, pos = loop_metadata(cu, starts, stride, None if wanted is None else [set(w) for w in wanted])
    assert meta.chunk_info.tolist() == [list(r) for r in ci]
    assert meta.seq_info.tolist() == [list(r) for r in si]
    assert meta.store_slot.tolist() == sl
    assert meta.boundary_offsets == offs
    assert meta.boundary_positions == pos
    assert meta.num_chunks == len(ci) and meta.num_boundaries == offs[-1]
    assert meta.max_chunks == max([r[3] - r[2] for r in si], default=0)
    assert meta.has_empty == (0 in lens)
    assert all(type(p) is int for ps in meta.boundary_positions for p in ps)
