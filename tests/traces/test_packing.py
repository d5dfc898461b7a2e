import numpy as np

from traces.packing import TraceBuilder, cache_key, cache_root, load_packed, save_packed


def test_builder_chains_and_order():
    b = TraceBuilder("x", closed_loop=False)
    b.add_request(0, 0, [1, 2], [3], arrival=0.0)
    b.add_request(1, 0, [9], [8], arrival=1.0)
    b.add_request(0, 1, [1, 2, 3, 4], [5], arrival=2.0)
    b.add_request(0, 2, [1, 7], [6], arrival=3.0)  # does not extend: new chain
    packed = b.build()
    assert len(packed.tokens) == 5 + 2 + 3  # [1,2,3,4,5] + [9,8] + [1,7,6]
    tr = packed.to_trace()
    assert [r.session_id for r in tr.requests] == [0, 1, 0, 0]
    assert [r.input_tokens.tolist() for r in tr.requests] == [[1, 2], [9], [1, 2, 3, 4], [1, 7]]
    assert [r.output_tokens.tolist() for r in tr.requests] == [[3], [8], [5], [6]]
    assert np.shares_memory(tr.requests[0].input_tokens, tr.requests[2].input_tokens)


def test_save_load_roundtrip(tmp_path):
    b = TraceBuilder("y")
    b.add_chain(np.array([5, 6, 7, 8, 9]), 3, [(0, 2, 3, 0.0, None, -1, -1), (1, 4, 5, 1.5, None, -1, -1)])
    b.meta["k"] = [1, 2]
    path = tmp_path / "c.npz"
    save_packed(b.build(), path)
    back = load_packed(path)
    tr = back.to_trace()
    assert back.meta == {"k": [1, 2]}
    assert [r.input_tokens.tolist() for r in tr.requests] == [[5, 6], [5, 6, 7, 8]]
    assert tr.requests[1].think_time == 1.5 and tr.requests[1].arrival is None
    assert tr.requests[0].input_tokens.dtype == np.int32  # token ids fit: half the memory
    path.write_bytes(b"garbage")
    assert load_packed(path) is None
    assert load_packed(tmp_path / "absent.npz") is None


def test_cache_root_and_key(monkeypatch, tmp_path):
    monkeypatch.setenv("MARCONI_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path / "traces"
    assert cache_root(str(tmp_path / "own")) == tmp_path / "own"
    assert cache_key({"a": 1, "b": 2}) == cache_key({"b": 2, "a": 1}) != cache_key({"a": 1, "b": 3})


def test_symbol_dtype_int32_when_all_fit_else_int64(tmp_path):
    """int32 buffers where every symbol fits, int64 otherwise; one dtype per trace, views kept
    (the cache tree compares raw bytes, and a per-request copy would undo the packing)."""
    for hi, dtype in [(2**31 - 1, np.int32), (2**31, np.int64), (-(2**31), np.int32), (-(2**31) - 1, np.int64)]:
        b = TraceBuilder("z")
        b.add_request(0, 0, [1, 2], [3])
        b.add_request(1, 0, [hi], [4])
        b.add_request(0, 1, [1, 2, 3, 5], [6])
        packed = b.build()
        assert packed.tokens.dtype == dtype
        save_packed(packed, tmp_path / "z.npz")
        for p in (packed, load_packed(tmp_path / "z.npz")):
            tr = p.to_trace()
            assert {a.dtype for r in tr.requests for a in (r.input_tokens, r.output_tokens)} == {np.dtype(dtype)}
            assert [r.input_tokens.tolist() for r in tr.requests] == [[1, 2], [hi], [1, 2, 3, 5]]
            assert np.shares_memory(tr.requests[0].input_tokens, tr.requests[2].input_tokens)


def test_trace_with_mixed_dtypes_becomes_int64():
    from traces.base import Request, Trace

    reqs = [
        Request(0, 0, np.array([1, 2], dtype=np.int32), np.array([3], dtype=np.int32)),
        Request(1, 0, np.array([1, 5]), np.array([], dtype=float)),
    ]
    tr = Trace("m", reqs)
    assert {a.dtype for r in tr.requests for a in (r.input_tokens, r.output_tokens)} == {np.dtype(np.int64)}
    assert tr.symbol_dtype == np.int64
