"""A replay output folder (``sim.replay.output``): what one ``write`` leaves there is that run's."""

import json

import pandas as pd

from sim.replay import output


def test_a_run_without_steps_removes_an_earlier_runs_steps(tmp_path):
    """`marconi replay --out DIR` with --scheduler continuous, then again with --force and fcfs:
    the second run has no steps, and the first one's steps.parquet, left there, would be read as
    the second's (benchmarks/timing_fit.py fits any steps.parquet of a folder)."""
    reqs = pd.DataFrame({"request": [0, 1]})
    written = output.write(
        tmp_path, {"requests": 2}, {"scheduler": "continuous"}, reqs, steps=pd.DataFrame({"t": [0.0]})
    )
    assert (tmp_path / output.STEPS) in written and (tmp_path / output.STEPS).is_file()
    (tmp_path / "notes.txt").write_text("mine")  # not a replay output: kept
    written = output.write(tmp_path, {"requests": 2}, {"scheduler": "fcfs"}, reqs)
    assert not (tmp_path / output.STEPS).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", output.REQUESTS, output.SUMMARY]
    assert json.loads((tmp_path / output.SUMMARY).read_text())["settings"] == {"scheduler": "fcfs"}
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_replay_folder_given_as_text_names_its_files_in_it(tmp_path):
    """``output.files`` takes the folder as text too (benchmarks pass strings): each file is under
    it, requests first and the summary last (mutation run, session 23: the Path conversion dropped
    survived)."""
    import pandas as pd

    from sim.replay import output

    df = pd.DataFrame({"request": [0]})
    got = output.files(str(tmp_path / "r"), {"hits": 1}, {}, df, steps=df)
    assert [p for p, _ in got] == [tmp_path / "r" / n for n in (output.REQUESTS, output.STEPS, output.SUMMARY)]
    (tmp_path / "r").mkdir()
    for path, write in got:
        write(path)
    assert json.loads((tmp_path / "r" / output.SUMMARY).read_text()) == {"settings": {}, "summary": {"hits": 1}}
    assert pd.read_parquet(tmp_path / "r" / output.STEPS).equals(df)
