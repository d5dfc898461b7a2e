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
    assert tr.requests[0].input_tokens.dtype == np.int64
    path.write_bytes(b"garbage")
    assert load_packed(path) is None
    assert load_packed(tmp_path / "absent.npz") is None


def test_cache_root_and_key(monkeypatch, tmp_path):
    monkeypatch.setenv("MARCONI_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path / "traces"
    assert cache_root(str(tmp_path / "own")) == tmp_path / "own"
    assert cache_key({"a": 1, "b": 2}) == cache_key({"b": 2, "a": 1}) != cache_key({"a": 1, "b": 3})
