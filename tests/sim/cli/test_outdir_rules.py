"""Output paths and sweep resume (sim/cli/outdir.py, sim/experiments/store.py) at their edges
(issue 44): every output rule with relative and absolute spellings (and ``..``, a symlink) of the
same file, and the resume check of every kind of file a results folder holds (row, per-request and
occupancy files), each truncated, emptied, foreign, short, missing or replaced by a folder."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from sim.cli.outdir import atomic_write, check_output_files, check_output_folder, input_paths, output_folder
from sim.errors import UsageError
from sim.experiments import store
from sim.experiments.grid import make_task


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def spellings(cwd: Path, rel: str) -> list[str]:
    """The same file as a relative path, an absolute one, one through ``..`` and one with ``./``."""
    sub = cwd / "sub"
    sub.mkdir(exist_ok=True)
    return [rel, str(cwd / rel), f"sub/../{rel}", f"./{rel}", str(sub / ".." / rel)]


# ------------------------------------------------------------------------------ output files


def test_an_input_is_refused_as_an_output_in_every_spelling_even_with_force(cwd):
    (cwd / "trace.jsonl").write_text("{}\n")
    for spelled_in in spellings(cwd, "trace.jsonl"):
        inputs = input_paths(f"mooncake:{spelled_in}")
        assert inputs == [(cwd / "trace.jsonl").resolve()]
        for spelled_out in spellings(cwd, "trace.jsonl"):
            for force in (False, True):
                with pytest.raises(UsageError, match=r"--events .*is an input of this command"):
                    check_output_files({Path(spelled_out): "--events"}, force=force, inputs=inputs)


def test_a_symlink_to_an_input_is_the_input(cwd):
    (cwd / "timing.json").write_text("{}")
    os.symlink(cwd / "timing.json", cwd / "link.json")
    inputs = input_paths(None, "link.json")
    assert inputs == [(cwd / "timing.json").resolve()]
    with pytest.raises(UsageError, match="is an input"):
        check_output_files({Path("timing.json"): "--calibrate"}, force=True, inputs=inputs)
    inputs = input_paths(None, str(cwd / "timing.json"))
    with pytest.raises(UsageError, match="is an input"):
        check_output_files({Path("link.json"): "--calibrate"}, force=True, inputs=inputs)


def test_a_file_inside_an_input_folder_is_refused_in_every_spelling(cwd):
    (cwd / "traces").mkdir()
    (cwd / "traces" / "a.jsonl").write_text("{}\n")
    inputs = input_paths(None, "traces")
    for spelled in ("traces/new.parquet", str(cwd / "traces" / "new.parquet"), "sub/../traces/new.parquet"):
        (cwd / "sub").mkdir(exist_ok=True)
        with pytest.raises(UsageError, match=r"is inside .*traces, which is an input"):
            check_output_files({Path(spelled): "--events"}, force=True, inputs=inputs)
    # a sibling whose name only starts like the folder's is not inside it
    check_output_files({Path("traces-out.parquet"): "--events"}, force=False, inputs=inputs)


def test_an_existing_output_needs_force_in_every_spelling(cwd):
    (cwd / "old.parquet").write_text("x")
    for spelled in spellings(cwd, "old.parquet"):
        with pytest.raises(UsageError, match=r"--events: .*old.parquet already exists; pass --force"):
            check_output_files({Path(spelled): "--events"}, force=False, inputs=[])
        check_output_files({Path(spelled): "--events"}, force=True, inputs=[])
    # two existing files: one line naming both, plural
    (cwd / "b.json").write_text("x")
    with pytest.raises(UsageError, match=r"--calibrate and --events: .* already exist;"):
        check_output_files({Path("old.parquet"): "--events", Path("b.json"): "--calibrate"}, force=False, inputs=[])
    # a new file needs nothing
    check_output_files({Path("new.parquet"): "--events"}, force=False, inputs=[])


def test_an_output_that_is_a_folder_or_lies_under_a_file_is_refused_even_with_force(cwd):
    (cwd / "d").mkdir()
    (cwd / "f").write_text("x")
    for spelled in ("d", str(cwd / "d"), "sub/../d"):
        (cwd / "sub").mkdir(exist_ok=True)
        with pytest.raises(UsageError, match="is a folder, not a file"):
            check_output_files({Path(spelled): "--events"}, force=True, inputs=[])
    for spelled in ("f/x.parquet", str(cwd / "f" / "deeper" / "x.parquet")):
        with pytest.raises(UsageError, match=r"is inside .*f, which is a file, not a folder"):
            check_output_files({Path(spelled): "--events"}, force=True, inputs=[])


def test_an_output_folder_that_is_or_lies_in_an_input_is_refused(cwd):
    (cwd / "traces").mkdir()
    inputs = input_paths(None, "traces")
    for spelled in ("traces", str(cwd / "traces"), "./traces/"):
        with pytest.raises(UsageError, match=r"--out .*: is an input of this command"):
            check_output_folder(Path(spelled), "--out", inputs)
    with pytest.raises(UsageError, match=r"--out .*: is inside .*traces, which is an input"):
        check_output_folder(Path("traces/results"), "--out", inputs)
    check_output_folder(Path("results"), "--out", inputs)
    check_output_folder(None, "--out", inputs)


def test_a_trace_spec_without_a_path_has_no_input(cwd):
    assert input_paths("synthetic:chat") == []
    assert input_paths(None) == []


# ------------------------------------------------------------------------------ output folders


def test_output_folder_creates_parents_and_removes_them_when_the_command_fails(cwd):
    with pytest.raises(RuntimeError):
        with output_folder(Path("a/b/c")) as p:
            assert p.is_dir()
            raise RuntimeError("boom")
    assert not (cwd / "a").exists()  # every folder it made, removed again (they are empty)
    with output_folder(Path(str(cwd / "a" / "b"))) as p:
        (p / "row.parquet").write_text("x")
    with pytest.raises(RuntimeError):
        with output_folder(Path("a/b/more")):
            raise RuntimeError("boom")
    assert (cwd / "a" / "b" / "row.parquet").is_file() and not (cwd / "a" / "b" / "more").exists()


def test_output_folder_dry_run_leaves_nothing_and_a_file_is_refused(cwd):
    with output_folder(Path("dry/run"), keep=False) as p:
        assert p.is_dir()
    assert not (cwd / "dry").exists()
    (cwd / "file").write_text("x")
    with pytest.raises(UsageError, match=r"--out file: is a file, not a folder"):
        with output_folder(Path("file")):
            pass
    with pytest.raises(UsageError, match=r"--sweep-out file/sub: is inside (.*/)?file, which is a file"):
        with output_folder(Path("file/sub"), flag="--sweep-out"):
            pass
    with output_folder(None) as p:
        assert p is None


def test_atomic_write_replaces_whole_or_not_at_all(cwd):
    target = cwd / "out.json"
    target.write_text("old")

    def fail(tmp):
        tmp.write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, fail)
    assert target.read_text() == "old" and [p.name for p in cwd.iterdir()] == ["out.json"]
    atomic_write(Path("out.json"), lambda tmp: tmp.write_text("new"))
    assert target.read_text() == "new" and [p.name for p in cwd.iterdir()] == ["out.json"]


# ------------------------------------------------------------------------------ resume, per file kind


TASK = make_task({"trace": "synthetic:chat", "sessions": 2}, policy="sglang+", capacity_bytes=10**9)
OTHER = make_task({"trace": "synthetic:chat", "sessions": 2}, policy="marconi", capacity_bytes=10**9, alpha=1.0)


def result(task, n_requests=3):
    row = {
        "config_id": task.config_id,
        "policy": "p",
        "alpha_mode": "none",
        "capacity_bytes": 1,
        "requests": n_requests,
    }
    req = pd.DataFrame({"request_id": range(n_requests), "hit_tokens": [0] * n_requests})
    occ = pd.DataFrame({"t": [0.0, 1.0], "kv_bytes": [0, 5]})
    return {"row": row, "requests": req, "occupancy": occ}


def paths(out, task):
    return {
        "row": store.row_path(out, task.config_id),
        "requests": out / store.REQUESTS_DIR / f"{task.config_id}.parquet",
        "occupancy": out / store.OCCUPANCY_DIR / f"{task.config_id}.parquet",
    }


def written(tmp_path, task=TASK):
    out = tmp_path / "out"
    store.write_result(out, task, result(task))
    assert store.stored_status(out, task, True) == store.DONE
    return out


def test_a_complete_result_is_done_and_a_missing_row_is_missing(tmp_path):
    out = written(tmp_path)
    assert store.is_done(out, TASK, True) and store.is_done(out, TASK, False)
    assert store.stored_status(out, OTHER, False) == store.MISSING
    paths(out, TASK)["row"].unlink()
    assert store.stored_status(out, TASK, True) == store.MISSING


@pytest.mark.parametrize("kind", ["row", "requests", "occupancy"])
@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage"])
def test_a_damaged_file_of_any_kind_is_recomputed(tmp_path, kind, damage):
    out = written(tmp_path)
    p = paths(out, TASK)[kind]
    data = p.read_bytes()
    p.write_bytes({"truncated": data[: len(data) // 2], "empty": b"", "garbage": b"PAR1 not parquet"}[damage])
    want = store.BAD
    assert store.stored_status(out, TASK, True) == want
    if kind != "row":  # without --save-requests the detail files are not looked at
        assert store.stored_status(out, TASK, False) == store.DONE
    # the rerun's write replaces the damaged file and the result is done again
    store.write_result(out, TASK, result(TASK))
    assert store.stored_status(out, TASK, True) == store.DONE


@pytest.mark.parametrize("kind", ["requests", "occupancy"])
def test_a_missing_detail_file_is_missing_only_with_save_requests(tmp_path, kind):
    out = written(tmp_path)
    paths(out, TASK)[kind].unlink()
    assert store.stored_status(out, TASK, True) == store.MISSING
    assert store.stored_status(out, TASK, False) == store.DONE


@pytest.mark.parametrize("kind", ["row", "requests", "occupancy"])
def test_a_file_of_another_configuration_under_this_name_is_bad(tmp_path, kind):
    out = written(tmp_path)
    other = tmp_path / "other"
    store.write_result(other, OTHER, result(OTHER))
    paths(out, TASK)[kind].write_bytes(paths(other, OTHER)[kind].read_bytes())
    assert store.stored_status(out, TASK, True) == store.BAD


def test_a_row_file_with_two_rows_is_bad(tmp_path):
    out = written(tmp_path)
    row = result(TASK)["row"]
    pd.DataFrame([row, row]).to_parquet(paths(out, TASK)["row"], index=False)
    assert store.stored_status(out, TASK, False) == store.BAD


@pytest.mark.parametrize("n", [2, 4])
def test_a_requests_file_short_or_long_of_the_rows_count_is_bad(tmp_path, n):
    out = written(tmp_path)
    req = result(TASK, n)["requests"]
    req.insert(0, "config_id", TASK.config_id)
    req.to_parquet(paths(out, TASK)["requests"], index=False)
    assert store.stored_status(out, TASK, True) == store.BAD
    # the occupancy file has no count to check: any length of this configuration is sound
    occ = pd.DataFrame({"config_id": [TASK.config_id] * 7, "t": range(7)})
    store.write_result(out, TASK, result(TASK))
    occ.to_parquet(paths(out, TASK)["occupancy"], index=False)
    assert store.stored_status(out, TASK, True) == store.DONE


def test_a_row_without_the_request_count_trusts_the_ids(tmp_path):
    out = written(tmp_path)
    row = {k: v for k, v in result(TASK)["row"].items() if k != "requests"}
    pd.DataFrame([row]).to_parquet(paths(out, TASK)["row"], index=False)
    assert store.stored_status(out, TASK, True) == store.DONE


def test_a_folder_where_a_row_goes_is_bad(tmp_path):
    out = written(tmp_path)
    rp = paths(out, TASK)["row"]
    rp.unlink()
    rp.mkdir()
    assert store.stored_status(out, TASK, False) == store.BAD


def test_a_sound_file_of_an_earlier_attempt_is_written_once(tmp_path):
    out = written(tmp_path)
    before = {k: p.stat().st_mtime_ns for k, p in paths(out, TASK).items()}
    ino = {k: p.stat().st_ino for k, p in paths(out, TASK).items()}
    store.write_result(out, TASK, result(TASK))
    assert {k: p.stat().st_ino for k, p in paths(out, TASK).items()} == ino
    assert {k: p.stat().st_mtime_ns for k, p in paths(out, TASK).items()} == before


def test_readers_skip_temp_files_and_refuse_unreadable_rows(tmp_path):
    out = written(tmp_path)
    (out / ".tmp-x-1-2.parquet").write_bytes(b"partial")
    assert store.row_files(out) == [paths(out, TASK)["row"]]
    assert list(store.load_results(out)["config_id"]) == [TASK.config_id]
    assert len(store.load_details(out, "requests")) == 3
    assert len(store.load_details(out, "occupancy", [TASK.config_id])) == 2
    # some of the asked configurations without records: said, not drawn without them (6893fe4)
    with pytest.raises(UsageError, match="1 of 2 configurations have no occupancy records"):
        store.load_details(out, "occupancy", [TASK.config_id, "absent"])
    (out / "foreign.parquet").write_bytes(b"garbage")
    with pytest.raises(UsageError, match="cannot read results file .*foreign.parquet"):
        store.load_results(out)
    with pytest.raises(UsageError, match="no results in"):
        store.load_results(tmp_path / "empty")
    with pytest.raises(UsageError, match="no requests records"):
        store.load_details(out, "requests", ["absent"])


def test_details_of_several_configurations_are_one_table_with_a_fresh_index(tmp_path):
    out = tmp_path / "out"
    store.write_result(out, TASK, result(TASK))
    store.write_result(out, OTHER, result(OTHER, 2))
    req = store.load_details(out, "requests")
    assert len(req) == 5 and list(req.index) == list(range(5))
    rows = store.load_results(out)
    assert list(rows.index) == [0, 1] and set(rows["config_id"]) == {TASK.config_id, OTHER.config_id}
    assert sorted(set(req["config_id"])) == sorted({TASK.config_id, OTHER.config_id})
    assert store.is_nan(float("nan")) and not store.is_nan(1.0) and not store.is_nan("nan") and not store.is_nan(None)
