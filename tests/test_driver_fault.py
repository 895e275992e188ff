"""A fault of the driver's own supervision (a bug in it, or a caller's ``on_status`` that raises;
not a fault of the cluster) stops the run and keeps what it trained: results.json from the
learners' books, a checkpoint that loads, the traceback in error.txt, one line saying how to go on."""

import json

from tianji_dask.cli import main
from tianji_dask.core import checkpoint
from tianji_dask.run import Run
from tianji_dask.run.ending import Ending


def _version_of(path) -> int:
    return int(checkpoint.NAME.match(path.name).group(1))


def test_an_on_status_that_raises_stops_the_run_and_its_results_and_checkpoint_are_written(tianji_client, tmp_path):
    out = tmp_path / "run"
    run = Run("cartpole_ppo", tianji_client, out=out, overrides={
        "stop.target_return": None, "stop.max_seconds": 300, "checkpoint.every_versions": 5})

    def boom(status):
        if status.get("version", 0) >= 10:
            raise ValueError("boom: the caller's own bug\nsecond line")

    results = run.start().wait(on_status=boom)
    assert results["stop_reason"] == "driver_error"
    assert results["error"].startswith("driver: ValueError: boom: the caller's own bug; the driver stopped the run; ")
    assert f"`tianji-dask resume {out}` continues from its newest checkpoint" in results["error"]
    assert json.loads((out / "results.json").read_text())["stop_reason"] == "driver_error"
    text = (out / results["error_file"]).read_text()
    assert text.startswith(results["error"]) and "Traceback" in text and "in boom" in text
    # what the learner trained up to the stop is in its newest checkpoint, and every chunk is accounted for
    newest = checkpoint.newest_loadable(out / "checkpoints")[0]
    assert _version_of(newest) == results["final_version"] >= 10
    ctrl = results["controller"]
    assert ctrl["chunks_in_flight"] == 0
    assert ctrl["credits_granted"] == sum(ctrl["credits_returned"].values()), ctrl["credits_returned"]
    # and resume goes on from it
    second = Run.resume(out, tianji_client, overrides={"stop.max_updates": results["updates"] + 5}).start().wait()
    assert second["error"] is None and second["final_version"] > results["final_version"]


def test_the_cli_says_a_driver_fault_in_one_line_and_writes_the_results(tmp_path, capsys, monkeypatch):
    pooled = Ending.pooled

    def failing(self, reports):  # a bug in the driver's supervision, once the learner has trained a little
        status = pooled(self, reports)
        if status.get("version", 0) >= 6:
            raise KeyError("workers")
        return status

    monkeypatch.setattr(Ending, "pooled", failing)
    out = tmp_path / "cli"
    code = main(["train", "cartpole_ppo", "--mode", "single", "--out", str(out), "--quiet",
                 "--set", "stop.target_return=null", "--set", "stop.max_updates=1000", "--set", "checkpoint.every_versions=2"])
    captured = capsys.readouterr()
    assert code == 1
    assert "Traceback" not in captured.err + captured.out
    lines = [line for line in captured.err.splitlines() if line.startswith("tianji-dask: the run failed")]
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("tianji-dask: the run failed: driver: KeyError: 'workers'; the driver stopped the run; ")
    assert f"`tianji-dask resume {out}` continues" in lines[0] and f"(traceback: {out / 'error.txt'})" in lines[0]
    results = json.loads((out / "results.json").read_text())
    assert results["stop_reason"] == "driver_error" and results["final_version"] >= 6
    assert "finished (no target): stopped by an error in the driver after " in captured.out and f"tianji-dask: results {out / 'results.json'}" in captured.out
