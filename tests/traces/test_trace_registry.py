import pytest

from traces.base import TraceError
from traces.registry import SOURCES, SPECS, TraceOptions, load_trace


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


# The cache key of every cached source, pinned: a change here renames every existing trace-cache
# file (a silent full rebuild); change it only on purpose (and then bump nothing else).
_PINNED_OPTIONS = dict(
    sessions=7,
    min_rounds=3,
    max_tokens=999,
    tokenizer="qwen-legacy",
    skip_bad_rows=True,
    seed=4,
    response_time=2.5,
    max_turns=11,
    keep_observations=2,
    words_per_minute=60.0,
    max_non_ascii=0.25,
)
_PINNED_KEYS = {
    "sharegpt": (
        "/x.json",
        {
            "kind": "sharegpt",
            "source": {"id": "traces.sharegpt", "arg": "/x.json"},
            "sessions": 7,
            "min_rounds": 3,
            "max_tokens": 999,
            "tokenizer": "qwen-legacy",
            "skip_bad_rows": True,
            "wpm": 60.0,
        },
        "e168456d717c9e8d7113",
    ),
    "lmsys": (
        "/y",
        {
            "kind": "lmsys",
            "source": {"id": "traces.lmsys", "arg": "/y"},
            "sessions": 7,
            "min_rounds": 3,
            "max_tokens": 999,
            "tokenizer": "qwen-legacy",
            "skip_bad_rows": True,
            "max_non_ascii": 0.25,
            "wpm": 60.0,
        },
        "144e796454aed039c73a",
    ),
    "swebench": (
        "marconi:/z",
        {
            "kind": "swebench",
            "source": {"id": "traces.swebench", "arg": "marconi:/z"},
            "sessions": 7,
            "max_tokens": 999,
            "max_turns": 11,
            "tokenizer": "qwen-legacy",
            "keep": 2,
            "response_time": 2.5,
            "seed": 4,
            "skip_bad_rows": True,
        },
        "7e3a0162ae3d78aa8dc4",
    ),
}


@pytest.mark.parametrize("kind", sorted(_PINNED_KEYS))
def test_cache_key_pinned(kind, monkeypatch):
    import importlib

    from traces.packing import cache_key

    arg, expected, digest = _PINNED_KEYS[kind]
    module = importlib.import_module(f"traces.{kind}")
    monkeypatch.setattr(module, "source_identity", lambda a: {"id": f"traces.{kind}", "arg": a})
    key = SOURCES[kind].cache_key(arg, TraceOptions(**_PINNED_OPTIONS))
    assert key == expected and list(key) == list(expected)
    assert cache_key(key) == digest


def test_uncached_sources_have_no_cache_key():
    cached = {name for name, src in SOURCES.items() if src.key is not None}
    assert cached == set(_PINNED_KEYS)


def test_specs_come_from_the_sources():
    assert list(SPECS) == [form for src in SOURCES.values() for form, _ in src.specs]
    assert all(form.split(":")[0] == name for name, src in SOURCES.items() for form, _ in src.specs)


def test_tokenizer_checked_before_missing_path():
    with pytest.raises(TraceError, match="unknown tokenizer"):
        load_trace("swebench", TraceOptions(tokenizer="nope"))
    for name, src in SOURCES.items():
        if src.key is None:
            assert src.cache_key("x", TraceOptions()) is None, name
