import pytest

from traces.base import TraceError
from traces.registry import SPECS, TraceOptions, load_trace


def test_unknown_spec_lists_valid():
    with pytest.raises(TraceError) as exc:
        load_trace("parquet:/x", TraceOptions())
    for spec in SPECS:
        assert spec in str(exc.value)


@pytest.mark.parametrize("spec", ["mooncake", "bailian", "marconi-jsonl", "swebench"])
def test_path_required(spec):
    with pytest.raises(TraceError, match="needs a path"):
        load_trace(spec, TraceOptions())


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("sessions", -1, "--sessions must be >= 0"),
        ("max_tokens", 0, "--max-tokens must be >= 1"),
        ("response_time", -2.0, "--response-time must be a finite number >= 0"),
        ("time_scale", 0.0, "--time-scale must be a finite number > 0"),
    ],
)
def test_option_validation(field, value, message):
    with pytest.raises(TraceError, match=message):
        load_trace("synthetic:chat", TraceOptions(**{field: value}))


def test_cache_keyed_by_options(tmp_path):
    opts = TraceOptions(sessions=2, cache_dir=str(tmp_path))
    a = load_trace("sharegpt", opts)
    assert a.meta["cache"] == "miss"
    assert load_trace("sharegpt", opts).meta["cache"] == "hit"
    b = load_trace("sharegpt", TraceOptions(sessions=2, cache_dir=str(tmp_path), tokenizer="qwen-legacy"))
    assert b.meta["cache"] == "miss"
    assert b.input_tokens_total() != a.input_tokens_total()
    assert len(list(tmp_path.glob("sharegpt-*.npz"))) == 2
