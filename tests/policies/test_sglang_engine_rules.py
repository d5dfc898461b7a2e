"""Rules of the ``sglang`` preset found by the differential run against SGLang's own cache code
(``benchmarks/differential_sglang.py``, SGLang 0.5.23: ``UnifiedRadixCache`` with its mamba
component), each worked by hand on a tiny trace in sequential mode (request i at t = i).
"""

from __future__ import annotations

from engine_cases import cat, one_per_session, run, state_depths, toks


def test_decode_tracks_land_on_the_chunk_grid_too():
    """sgl-project/sglang 0.5.23 ``python/sglang/srt/runtime_context.py`` L1974-L1979
    (``mamba_track_grid`` = lcm(mamba_checkpoint_grid(page), --mamba-track-interval)), read by
    ``ScheduleBatch.prepare_for_decode`` (``managers/schedule_batch.py`` L3803-L3816: track when
    ``seq_lens % grid == 0``). With ``--mamba-track-interval 32`` and page 1 the grid is
    lcm(64, 32) = 64, not 32. r0: 70 prompt tokens, 30 output tokens, 99 stored; the prefill track
    is 64 and no multiple of 64 lies in (70, 99], so r1 (the 99 tokens and more) reuses 64, not 96."""
    trace = one_per_session(
        (toks(0, 70), toks(1000, 30)), (cat(toks(0, 70), toks(1000, 29), toks(5000, 10)), toks(9000, 3))
    )
    got, sim = run(trace, "sglang", mamba_track_interval=32)
    assert got == [0, 64]
    assert state_depths(sim.tree)[0] == 64
    # an interval on the chunk grid is unchanged: 128 tracks 128 in a 300 + 100 request
    trace = one_per_session(
        (toks(0, 100), toks(1000, 100)), (cat(toks(0, 100), toks(1000, 99), toks(5000, 5)), toks(9000, 3))
    )
    assert run(trace, "sglang", mamba_track_interval=128)[0] == [0, 128]
