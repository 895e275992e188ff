"""Clusters beyond the embedded one: a real Slurm through dask-jobqueue, an external scheduler
with workers started by hand, and TLS."""

import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from tianji_dask.run import Run

HAVE_SLURM = shutil.which("sbatch") is not None and subprocess.run(
    ["sinfo", "-h"], capture_output=True).returncode == 0 if shutil.which("sinfo") else False


def _need_slurm():
    if not HAVE_SLURM:
        if os.environ.get("TIANJI_REQUIRE_SLURM"):
            pytest.fail("a running Slurm is required here (TIANJI_REQUIRE_SLURM) but sinfo does not answer")
        pytest.skip("needs a running Slurm (.ci/slurm-up starts a one-node one)")


@pytest.mark.slurm
@pytest.mark.slow  # a real Slurm: the full suite (CI) runs it
def test_slurm_jobs_run_the_learner_and_the_explorers(tmp_path):
    _need_slurm()
    seen: set[str] = set()

    def watch(status):
        out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True).stdout
        seen.update(line.split()[1] for line in out.splitlines() if "RUNNING" in line)

    run = Run("cartpole_ppo", out=tmp_path / "slurm", overrides={
        "cluster.kind": "slurm", "cluster.dashboard_address": None,
        "cluster.jobqueue": {"minimum_jobs": 2, "maximum_jobs": 2, "memory": "2GiB", "walltime": "00:20:00",
                             "learner": {"memory": "2GiB"}, "start_timeout": 180},
        "stop.max_seconds": 60,
    })
    run.start()
    workers = run.client.scheduler_info(n_workers=-1)["workers"].values()
    roles = sorted(next(iter(w["resources"])) for w in workers)
    assert "LEARNER" in roles and "EXPLORER" in roles
    results = run.wait(on_status=watch)
    assert {"tianji-learner", "tianji-explorer"} <= seen, seen  # both roles ran as Slurm jobs
    assert results["error"] is None and results["updates"] > 0 and results["episodes"] > 0
    assert (run.out / "results.json").exists()
    _wait_for_no_jobs()
    left = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True).stdout
    assert "tianji-" not in left  # the run's jobs are gone with it


def _spawn(args, log):
    return subprocess.Popen([sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_external_scheduler_and_hand_started_workers(tmp_path):
    log_path = tmp_path / "cluster.log"
    log = open(log_path, "a")
    procs = [_spawn(["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                     "--preload", "tianji_dask.preload"], log)]
    try:
        deadline = time.time() + 60
        address = None
        while address is None and time.time() < deadline:
            time.sleep(0.2)
            m = re.search(r"Scheduler at:\s+(tcp://\S+)", log_path.read_text())
            address = m.group(1) if m else None
        assert address, log_path.read_text()
        procs.append(_spawn(["distributed.cli.dask_worker", address, "--nthreads", "1", "--no-dashboard",
                             "--resources", "LEARNER=1", "--name", "learner"], log))
        for i in range(2):
            procs.append(_spawn(["distributed.cli.dask_worker", address, "--nthreads", "1", "--no-dashboard",
                                 "--resources", "EXPLORER=1", "--name", f"explorer-{i}"], log))
        from tianji_dask.cli import main

        out = tmp_path / "cli"
        rc = main(["train", "cartpole_ppo", "--scheduler", address, "--max-seconds", "15", "--out", str(out), "--quiet"])
        assert rc == 0
        import json

        results = json.loads((out / "results.json").read_text())
        assert results["error"] is None and results["updates"] > 0 and results["episodes"] > 0
        assert results["pipeline_config"]["cluster"]["address"] == address
        assert set(results["controller"]["per_explorer_env_steps"]) == {"0", "1"}
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


def test_no_learner_worker_is_a_clear_error(tmp_path):
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None, resources={"EXPLORER": 1}) as cluster:
        from distributed import Client

        from tianji_dask.launch.cluster import check_roles

        with Client(cluster) as client, pytest.raises(RuntimeError, match="no worker offers the LEARNER resource"):
            check_roles(client, timeout=1)


@pytest.mark.slow
def test_a_run_over_tls(tmp_path):
    run = Run("cartpole_ppo", out=tmp_path / "tls", overrides={
        "cluster.security": "temporary", "cluster.dashboard_address": None, "stop.max_seconds": 10,
        "stop.target_return": None, "learner.direct_chunks_min_mib": 0})
    run.start()
    assert run.client.scheduler.address.startswith("tls://")
    workers = run.client.scheduler_info(n_workers=-1)["workers"]
    assert workers and all(addr.startswith("tls://") for addr in workers)
    results = run.wait()
    assert results["error"] is None and results["updates"] > 0 and results["chunks"] > 0
    assert results["direct_chunks"] is None, "no chunk may bypass TLS on a plain socket"


def _slurm_jobs(name: str) -> list[str]:
    """The running Slurm jobs called ``name``: their ids."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.split()[1:] == [name, "RUNNING"]]


@pytest.mark.slurm
@pytest.mark.slow  # about a minute on a real Slurm: the full suite (CI) runs it
def test_a_run_outlives_its_learner_jobs(tmp_path):
    # learner jobs live 20 s each: every one hands off (a checkpoint, its chunks' credits back)
    # to a learner in a fresh job, started a quarter of the lifetime ahead; the run trains on
    _need_slurm()
    run = Run("cartpole_dqn", out=tmp_path / "handoffs", overrides={
        "cluster.kind": "slurm", "cluster.dashboard_address": None, "cluster.learner_lifetime": "20s",
        "cluster.jobqueue": {"minimum_jobs": 2, "maximum_jobs": 2, "memory": "2GiB", "walltime": "00:10:00",
                             "learner": {"memory": "2GiB"}, "start_timeout": 180},
        "stop.on_solve": False, "stop.max_env_steps": None, "stop.max_seconds": 65, "checkpoint.every_versions": None,
    })
    results = run.start().wait(timeout=360)
    assert results["error"] is None and results["stop_reason"] == "max_seconds", results["error"]
    handoffs = [r for r in results["learner_restarts"] if r["cause"] == "lifetime"]
    assert [h["version"] for h in handoffs] == sorted(h["version"] for h in handoffs), handoffs
    # a lifetime that expires in the run's last seconds hands off to a successor with no time left
    # to train: judge the handoffs that left it some
    t_end = results["t_run_start"] + results["wall_s"]
    handoffs = [h for h in handoffs if h["t"] < t_end - 10]
    assert len(handoffs) >= 2, results["learner_restarts"]
    versions = [h["version"] for h in handoffs]
    assert versions == sorted(versions) and results["final_version"] > versions[-1]
    assert all(h["next_update_s"] is not None and h["next_update_s"] < 60 for h in handoffs), handoffs
    assert results["chunk_accounting"]["balanced"], results["chunk_accounting"]
    assert results["chunk_accounting"]["granted"] == results["chunks"] + results["chunks_lost"]
    _wait_for_no_jobs()
    left = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True).stdout
    assert "tianji-" not in left  # every learner job, the retired ones too, is gone with the run


def _wait_for_no_jobs(timeout: float = 60) -> None:
    """Until Slurm lists none of the run's jobs (cancelled jobs leave the queue as their steps end)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if "tianji-" not in subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True).stdout:
            return
        time.sleep(0.5)


def _wait_for_version(run, version: int, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while run.status().get("version", 0) < version and time.time() < deadline:
        time.sleep(0.5)


@pytest.mark.slurm
@pytest.mark.slow
def test_preempted_explorer_and_learner_jobs_cost_only_their_chunks_in_flight(tmp_path):
    # the batch system's SIGTERM (a preemption: `scancel --full --signal=TERM` signals every process
    # of the job), first to an explorer job: its worker closes, its chunk in flight is cancelled and
    # its credit comes back, adapt starts a replacement job; then to the learner's job: its worker
    # (launch.preemption) has the learner hand off at once, within the worker's close, and the run
    # goes on from that checkpoint in a fresh learner job. The test polls run.status() through the
    # preemption, as a notebook does: the learner's worker closes before the driver hears of the
    # handoff, which must still count as one (not as a lost learner)
    _need_slurm()
    run = Run("cartpole_dqn", out=tmp_path / "preempted", overrides={
        "cluster.kind": "slurm", "cluster.dashboard_address": None,
        "cluster.jobqueue": {"minimum_jobs": 2, "maximum_jobs": 2, "memory": "2GiB", "walltime": "00:10:00",
                             "learner": {"memory": "2GiB"}, "start_timeout": 180},
        "stop.on_solve": False, "stop.max_env_steps": None, "stop.max_seconds": 120, "checkpoint.every_seconds": 600,
    })
    run.start()
    _wait_for_version(run, 500)
    explorers = _slurm_jobs("tianji-explorer")
    assert explorers, "no explorer job is running"
    subprocess.run(["scancel", "--full", "--signal=TERM", explorers[0]], check=True)
    _wait_for_version(run, run.status()["version"] + 500)  # trains on without that job
    assert explorers[0] not in _slurm_jobs("tianji-explorer")  # the preempted job ended
    learners = _slurm_jobs("tianji-learner")
    assert len(learners) == 1, learners
    version = run.status()["version"]
    subprocess.run(["scancel", "--full", "--signal=TERM", learners[0]], check=True)
    _wait_for_version(run, version + 500)  # the learner in the fresh job trains on
    assert run.status().get("version", 0) >= version + 500, run.status()
    run.stop()
    results = run.wait(timeout=300)
    assert results["error"] is None and results["stop_reason"] == "stopped", results["error"]
    assert [r["cause"] for r in results["learner_restarts"]] == ["preempted"], results["learner_restarts"]
    restart = results["learner_restarts"][0]
    # from the checkpoint written at the SIGTERM, not from the start (none was due in 10 minutes)
    assert restart["checkpoint"] and int(restart["checkpoint"].rsplit("-", 1)[1].split(".")[0]) >= version, restart
    acc = results["chunk_accounting"]
    assert acc["balanced"] and acc["granted"] == results["chunks"] + results["chunks_lost"], acc
    gone = [lost for lost in results["lost"] if not lost["reason"].endswith(("at stop", "at handoff"))]
    assert len(gone) <= results["controller"]["window_max"] + 1, gone  # at most what was out on the explorer job
