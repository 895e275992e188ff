"""The run folder explains itself: ``learning_curve.png`` drawn at the end of every run (not with
``logging.plot: false``; one line, the run unharmed, without matplotlib), whole numbers as
integers in the CSVs, and the line that says how a run ended in words."""

from __future__ import annotations

import csv
import struct
import sys

import pytest

from tianji_dask.cli import main
from tianji_dask.cli.output import stop_words, unsolved

PNG = b"\x89PNG\r\n\x1a\n"
#: a single-mode run of a few seconds, with no target: it stops on its env-step budget
SHORT = ["train", "cartpole_ppo", "--mode", "single", "--set", "stop.target_return=null", "-n", "2048", "--quiet"]


def _table(path) -> tuple[list[str], list[list[str]]]:
    with path.open(newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


def test_a_run_leaves_its_learning_curve_and_writes_whole_numbers_as_integers(cli_training_run):
    # `train cartpole_ppo ... --set stop.max_env_steps=6144` (conftest): a target it does not reach
    proc, out = cli_training_run.proc, cli_training_run.out
    assert proc.returncode == 0, proc.stdout + proc.stderr
    picture = (out / "learning_curve.png").read_bytes()
    assert picture.startswith(PNG) and picture[12:16] == b"IHDR"
    width, height = struct.unpack(">II", picture[16:24])
    assert width > 300 and height > 200
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # written whole: no temporary file left
    fields, rows = _table(out / "episodes.csv")
    assert fields == ["t_end", "return", "length", "explorer_id"] and rows
    for row in rows:
        assert row[2].isdigit() and row[3].isdigit(), row  # length, explorer_id
        assert float(row[1]) == float(row[2])  # CartPole: a return of 1 a step; written as a float
    assert all("." in row[1] for row in rows)
    fields, rows = _table(out / "chunks.csv")
    for name in ("explorer_id", "submit_version", "policy_version", "consumed_version", "staleness_versions", "env_steps",
                 "nbytes"):
        assert all(row[fields.index(name)].isdigit() for row in rows), name
    assert all("." in row[fields.index("t_consumed")] for row in rows)
    fields, rows = _table(out / "replay.csv")
    assert all(row[fields.index(name)].lstrip("-").isdigit() for row in rows
               for name in ("stream", "stream_serial", "env_seed", "policy_version", "updates_before", "skipped"))
    ended = [line for line in proc.stdout.splitlines() if "env steps, final mean return" in line]
    assert len(ended) == 1 and ended[0].startswith("tianji-dask: not solved: env-step budget reached (stop.max_env_steps) "
                                                   "after "), proc.stdout


def test_a_run_with_no_target_says_finished_and_logging_plot_false_draws_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    code = main([*SHORT, "--set", "logging.plot=false", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    assert (out / "results.json").exists() and not (out / "learning_curve.png").exists()
    assert "tianji-dask: finished (no target): env-step budget reached (stop.max_env_steps) after " in stdout, stdout
    assert "not solved" not in stdout and "learning_curve" not in stdout, stdout


def test_without_matplotlib_a_run_says_so_in_one_line_and_ends_as_it_would(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed: importing it fails
    out = tmp_path / "run"
    code = main([*SHORT, "--out", str(out)])
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code == 0, text
    assert (out / "results.json").exists() and not (out / "learning_curve.png").exists()
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]
    said = [line for line in text.splitlines() if "learning_curve.png" in line]
    assert said == ["tianji-dask: no learning_curve.png: matplotlib is not installed (pip install matplotlib, or reinstall "
                    "tianji-dask, which depends on it); set logging.plot: false to skip it"], text
    assert "Traceback" not in text and "finished (no target): " in captured.out


@pytest.mark.parametrize(("reason", "words"), [
    ("stopped", "stopped by Ctrl-C"),
    ("max_seconds", "time budget reached (stop.max_seconds)"),
    ("max_updates", "update budget reached (stop.max_updates)"),
    ("driver_error", "stopped by an error in the driver"),
    ("numeric_fault", "stopped on non-finite numbers"),
    ("group 1: error", "group 1: stopped by an error"),
    ("something_new", "stopped: something_new"),
])
def test_each_stop_reason_reads_in_words(reason, words):
    assert stop_words(reason) == words


def test_the_end_line_names_what_stopped_the_run_and_whether_it_had_a_target():
    results = {"stop_reason": "stopped", "wall_s": 12.04, "env_steps": 8192, "final_mean_return": 21.25}
    assert unsolved({**results, "target_return": 475.0}) == \
        "not solved: stopped by Ctrl-C after 12.0 s, 8,192 env steps, final mean return 21.2"
    assert unsolved({**results, "target_return": None}, "SIGTERM") == \
        "finished (no target): stopped by SIGTERM after 12.0 s, 8,192 env steps, final mean return 21.2"
    assert unsolved({**results, "target_return": None, "final_mean_return": None}).endswith("final mean return -")


def test_the_learning_curve_reads_the_episodes_of_the_mean_by_either_name():
    # results.json written before stop.window became stop.mean_episodes still draw with their own
    from tianji_dask.observe.plots import _mean_episodes

    assert _mean_episodes({"pipeline_config": {"stop": {"mean_episodes": 9}}}) == 9
    assert _mean_episodes({"pipeline_config": {"stop": {"window": 7}}}) == 7
    assert _mean_episodes({}) == 100
