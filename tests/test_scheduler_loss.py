"""The scheduler lost in the middle of a run (SIGKILL of an external scheduler): Dask closes every
worker with it, so nothing can train on; the learner, as its worker closes, writes a checkpoint
and its books; the driver writes results.json from them, says in one line what happened and how
to go on (exit 1, no traceback), and ``tianji-dask resume`` on a new scheduler continues from
that checkpoint with the version carried on."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from helpers import external_cluster, wait_for
from tianji_dask.core import checkpoint


def _train_on(address: str, procs: list, pipeline: str, out, max_env_steps: int, every_versions: int,
              log) -> subprocess.Popen:
    """``tianji-dask train PIPELINE --scheduler ADDRESS`` with no target (ended with the cluster's
    ``procs``), once it has written a checkpoint."""
    driver = subprocess.Popen([sys.executable, "-m", "tianji_dask", "train", pipeline, "--scheduler", address,
                               "--set", "stop.target_return=null", "--set", f"stop.max_env_steps={max_env_steps}",
                               "--set", f"checkpoint.every_versions={every_versions}", "--out", str(out), "--quiet"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs.append(driver)
    wait_for("a checkpoint", lambda: any((out / "checkpoints").glob("ckpt-*.pt")), 240, log)
    return driver


@pytest.mark.slow  # two external clusters, a run on each
def test_a_lost_scheduler_leaves_results_a_checkpoint_and_one_line_and_resume_goes_on(tmp_path):
    out = tmp_path / "run"
    with external_cluster(tmp_path / "first.log") as (address, procs):
        # it has trained (a checkpoint is written) and trains on
        driver = _train_on(address, procs, "cartpole_dqn", out, 10_000_000, 300, tmp_path / "first.log")
        procs[0].send_signal(signal.SIGKILL)  # the scheduler
        stdout, stderr = driver.communicate(timeout=180)
    assert driver.returncode == 1, stdout + stderr
    assert "Traceback" not in stdout + stderr, stderr
    said = [line for line in stderr.splitlines() if line.startswith("tianji-dask:")]
    assert len(said) == 1 and said[0].startswith("tianji-dask: the run failed: scheduler: the scheduler at "), stderr
    assert f"tianji-dask resume {out} --scheduler ADDRESS" in said[0] and "1 of 1 learners wrote" in said[0]
    results = json.loads((out / "results.json").read_text())
    assert results["stop_reason"] == "scheduler_lost" and results["updates"] > 0 and results["episodes"] > 0
    accounting = results["chunk_accounting"]
    assert accounting["balanced"] and accounting["granted"] == results["chunks"] + results["chunks_lost"], accounting
    # the checkpoint the learner wrote as its worker closed: its version is the run's last
    path, state, _ = checkpoint.newest_loadable(out / "checkpoints")
    assert str(path) == results["checkpoint"] and int(state["version"]) == results["final_version"]

    with external_cluster(tmp_path / "second.log") as (address, procs):
        resumed = subprocess.run([sys.executable, "-m", "tianji_dask", "resume", str(out), "--scheduler", address,
                                  "--set", f"stop.max_env_steps={results['env_steps'] + 20_000}", "--quiet"],
                                 capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    again = json.loads((out / "results.json").read_text())
    assert again["error"] is None and again["stop_reason"] == "max_env_steps"
    assert again["final_version"] > results["final_version"] and again["episodes"] > results["episodes"]


@pytest.mark.slow  # the scheduler stopped for longer than the driver's 30 s wait on its learner
def test_a_scheduler_paused_and_resumed_is_waited_for_not_declared_lost(tmp_path):
    # SIGSTOP keeps the scheduler's connections open but answers nothing (a long pause, a swapped
    # machine): the driver's questions time out, and it must wait rather than call the scheduler lost
    out = tmp_path / "run"
    with external_cluster(tmp_path / "cluster.log") as (address, procs):
        # a checkpoint at version 50 (about 100k env steps): the budget leaves a few seconds to train after the pause
        driver = _train_on(address, procs, "cartpole_ppo", out, 400_000, 50, tmp_path / "cluster.log")
        procs[0].send_signal(signal.SIGSTOP)
        time.sleep(45)  # the fault's length, not a budget: past the driver's 30 s wait on its learner
        procs[0].send_signal(signal.SIGCONT)
        stdout, stderr = driver.communicate(timeout=600)
    assert driver.returncode == 0, stdout + stderr
    results = json.loads((out / "results.json").read_text())
    assert results["error"] is None and results["stop_reason"] == "max_env_steps", results["error"]
    assert results["chunk_accounting"]["balanced"], results["chunk_accounting"]
