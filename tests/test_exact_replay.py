"""An asynchronous run re-executed exactly in one process (`tianji-dask replay`)."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from tianji_dask.cli import main
from tianji_dask.core.exact_replay_log import REPLAY_FIELDS, ExactReplayLog, weights_digest
from tianji_dask.run import Run


def test_the_digest_names_every_array_its_dtype_shape_and_bytes():
    w = {"b": np.zeros(3, np.float32), "a": np.ones((2, 2), np.float32)}
    assert weights_digest(w) == weights_digest(dict(reversed(list(w.items()))))
    assert weights_digest(w) != weights_digest({**w, "b": np.zeros((3, 1), np.float32)})
    assert weights_digest(w) != weights_digest({**w, "b": np.zeros(3, np.float64)})
    bumped = {**w, "a": w["a"].copy()}
    bumped["a"][0, 0] = np.nextafter(np.float32(1), np.float32(2))
    assert weights_digest(w) != weights_digest(bumped)


def test_the_log_keeps_one_row_per_consumed_chunk_and_says_why_not():
    log = ExactReplayLog({"epsilon": 0.5})
    log.record({"explorer_id": 1, "stream_serial": 3, "env_seed": 1009, "policy_version": 7}, 9, False, {"epsilon": 0.25})
    # every field: the stream, its serial, env seed, policy version, updates before, not skipped, the
    # one explore value and NaN for the explore key this log does not have (assert_equal: NaN == NaN)
    np.testing.assert_equal(log.rows.all(), np.array([[1, 3, 1009, 7, 9, 0, 0.25, np.nan]]))
    assert log.meta() == {"explore_keys": ["epsilon"], "replayable": True, "why_not": None, "rows": 1}
    log.not_replayable("first reason")
    log.not_replayable("second reason")
    assert log.meta()["why_not"] == "first reason" and len(REPLAY_FIELDS) == log.rows.width


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["cartpole_dqn", "cartpole_ppo"])
def test_a_relaxed_run_with_two_explorers_replays_to_its_recorded_weights(tianji_client, tmp_path, capsys, pipeline):
    out = tmp_path / "run"
    results = Run(pipeline, tianji_client, out=out, overrides={
        "explorers": 2, "stop.on_solve": False, "stop.max_seconds": 4}).start().wait(timeout=120)
    assert results["replay"]["replayable"] and results["replay"]["rows"] == results["chunks"] > 10
    assert main(["replay", str(out)]) == 0
    printed = capsys.readouterr().out
    assert results["final_weights_sha256"] in printed and "the same as the run recorded" in printed
    # a log changed after the run: the re-execution says so in one line, exit 1
    path = out / "replay.csv"
    rows = list(csv.reader(path.open()))
    middle = len(rows) // 2
    rows[middle][REPLAY_FIELDS.index("updates_before")] = str(float(rows[middle][REPLAY_FIELDS.index("updates_before")]) + 1)
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    assert main(["replay", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tianji-dask: replay diverged") and "Traceback" not in err


def test_a_run_without_a_log_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "single"
    Run("cartpole_ppo", out=out, overrides={"mode": "single", "stop.max_env_steps": 2048, "stop.on_solve": False}).start().wait()
    assert main(["replay", str(out)]) == 2
    err = capsys.readouterr().err
    assert "has no replay.csv" in err and "Traceback" not in err
