"""Checkpoints and resume: a resumed run continues its learning curve; damage is one clear line."""

import contextlib
import json
import os
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from tianji_dask.cli import main
from tianji_dask.core import checkpoint, guard
from tianji_dask.run import Run


def test_pack_roundtrip_and_safe_load(tmp_path):
    state = {"version": 7, "a": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.int64(3),
             "rng": np.random.default_rng(1).bit_generator.state, "nested": [{"b": np.ones(2, dtype=bool)}],
             "rng_global": checkpoint.rng_state()}
    path = checkpoint.save(tmp_path, state, keep=2)
    back = checkpoint.load(path)
    assert back["version"] == 7 and back["n"] == 3
    np.testing.assert_array_equal(back["a"], state["a"])
    assert back["a"].dtype == np.float32 and back["nested"][0]["b"].dtype == bool
    assert back["rng"] == state["rng"]
    for v in (8, 9, 10):
        checkpoint.save(tmp_path, {**state, "version": v}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000009.pt", "ckpt-000000010.pt"]
    assert checkpoint.latest(tmp_path).name == "ckpt-000000010.pt"


def test_damaged_or_missing_checkpoints_are_one_line(tmp_path):
    bad = tmp_path / "checkpoints"
    bad.mkdir()
    (bad / "ckpt-000000001.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(checkpoint.CheckpointError, match="is damaged or not a tianji checkpoint"):
        checkpoint.load(bad / "ckpt-000000001.pt")
    with pytest.raises(checkpoint.CheckpointError, match="^run_dir: no checkpoint"):
        checkpoint.latest(tmp_path / "empty")
    # the CLI: one line, exit 2
    (tmp_path / "pipeline.yaml").write_text("name: x\n")
    assert main(["resume", str(tmp_path)]) == 2
    assert main(["resume", str(tmp_path / "nowhere")]) == 2


def test_non_finite_metrics_stop_the_run():
    with pytest.raises(guard.NumericFault, match="numeric: non-finite loss at version 4"):
        guard.check_metrics({"loss": float("nan"), "samples": 32.0}, 4)
    assert not guard.all_finite({"w": np.array([1.0, np.inf])})


# single mode's is the full suite's: the fast tier resumes the dataflow's run (and test_core resumes a learner core)
@pytest.mark.parametrize("mode", [pytest.param("single", marks=pytest.mark.slow), "relaxed"])
def test_resumed_run_continues_where_it_stopped(mode, tianji_client, tmp_path):
    client = None if mode == "single" else tianji_client
    out = tmp_path / mode
    # the first part stops once it has learned (a mean of 150; a random policy scores ~20), however
    # many env steps that takes on this machine's numerics
    first = Run("cartpole_ppo", client, out=out, overrides={
        "mode": mode, "stop.target_return": 150, "stop.max_env_steps": 1_000_000, "checkpoint.every_versions": 5,
    }).start().wait()
    assert first["solved"] and first["checkpoint"] and first["final_version"] > 10, first["stop_reason"]
    learned = first["final_mean_return"]
    episodes_before = first["episodes"]

    budget = first["env_steps"] + 30_000
    run = Run.resume(out, client, overrides={"stop.target_return": None, "stop.max_env_steps": budget})
    second = run.start().wait()
    assert second["error"] is None
    # the books go on: same episodes and version counter, more of both
    assert second["episodes"] > episodes_before and second["final_version"] > first["final_version"]
    rows = np.loadtxt(out / "episodes.csv", delimiter=",", skiprows=1, ndmin=2)
    t_first_part = first["wall_s"]
    new = rows[rows[:, 0] - second["t_run_start"] > t_first_part]
    assert len(new) >= 10
    # the new episodes start from the learned policy, not from scratch (a random policy scores ~20)
    assert new[:10, 1].mean() > 0.5 * learned and new[:10, 1].mean() > 40
    results = json.loads((out / "results.json").read_text())
    assert results["env_steps"] >= budget and results["updates"] == second["updates"]


def _exit_process(dask_worker):
    os._exit(1)  # the worker process dies at once; its nanny starts a new one


def _close_worker(dask_worker):
    # what a nanny's SIGTERM does to its worker, the nanny staying: the worker closes (its learner
    # checkpoints and ends first, closing.py) and its nanny starts a new one
    dask_worker.loop.add_callback(dask_worker.close, nanny=False, reason="test: closed under its learner")


@pytest.mark.slow
@pytest.mark.parametrize("lose", [_exit_process, _close_worker], ids=["killed", "closed"])
def test_lost_learner_is_rebuilt_from_its_checkpoint(own_client, tmp_path, lose):
    tianji_client = own_client
    run = Run("cartpole_dqn", tianji_client, out=tmp_path / "lost", overrides={
        "stop.target_return": None, "stop.max_seconds": 300, "checkpoint.every_versions": 200,
    })
    run.start()
    deadline = time.time() + 60
    while run.status().get("version", 0) < 700 and time.time() < deadline:
        time.sleep(0.2)
    learner = next(a for a, w in tianji_client.scheduler_info(n_workers=-1)["workers"].items()
                   if w["resources"].get("LEARNER"))
    version_at_loss = run.status()["version"]
    with contextlib.suppress(Exception):  # the call itself may die with the worker
        tianji_client.run(lose, workers=[learner])
    rebuilt_seen = False

    def stop_once_the_rebuilt_learner_trains(status):
        # a run stopped on its clock could end before the rebuilt learner's first update on a busy
        # machine: stop it once a status taken after the rebuild shows a version past its checkpoint
        nonlocal rebuilt_seen
        restarts = run.backend.learners.restarts
        if not restarts:
            return
        if rebuilt_seen and status.get("version", 0) > _version_of(restarts[0]["checkpoint"]):
            run.stop()
        rebuilt_seen = True

    results = run.wait(timeout=300, on_status=stop_once_the_rebuilt_learner_trains)
    assert len(results["learner_restarts"]) == 1, results["learner_restarts"]
    v_ckpt = _version_of(results["learner_restarts"][0]["checkpoint"])
    assert version_at_loss - 200 <= v_ckpt  # versions lost <= the checkpoint interval
    assert results["final_version"] > v_ckpt and results["error"] is None
    ctrl = results["controller"]
    assert ctrl["chunks_in_flight"] == 0
    assert ctrl["credits_granted"] == sum(ctrl["credits_returned"].values()), ctrl["credits_returned"]


def _close_worker_for_good(dask_worker):
    # what SIGTERM to a `dask worker` does: the nanny closes its worker and does not start another
    dask_worker.loop.add_callback(dask_worker.close, nanny=True, reason="test: its nanny stopped")


@pytest.mark.slow
def test_a_learner_whose_worker_closes_for_good_ends_the_run_with_its_books(own_client, tmp_path, monkeypatch):
    from tianji_dask.run import supervisor

    monkeypatch.setattr(supervisor, "REBUILD_WAIT_S", 5)  # no LEARNER worker comes back: the wait's length only
    out = tmp_path / "gone"
    run = Run("cartpole_dqn", own_client, out=out, overrides={
        "stop.target_return": None, "stop.max_seconds": 300, "checkpoint.every_versions": 200})
    run.start()
    deadline = time.time() + 60
    while run.status().get("version", 0) < 300 and time.time() < deadline:
        time.sleep(0.2)
    learner = next(a for a, w in own_client.scheduler_info(n_workers=-1)["workers"].items() if w["resources"].get("LEARNER"))
    with contextlib.suppress(Exception):
        own_client.run(_close_worker_for_good, workers=[learner])
    results = run.wait(timeout=300)
    assert results["stop_reason"] == "learner_lost", results["error"]
    assert "1 of 1 learners wrote a checkpoint and their books" in results["error"]
    assert f"tianji-dask resume {out}" in results["error"]
    assert json.loads((out / "results.json").read_text())["stop_reason"] == "learner_lost"
    # the checkpoint written as the worker closed holds every update the learner made
    newest = checkpoint.newest_loadable(out / "checkpoints")[0]
    assert _version_of(str(newest)) == results["final_version"] >= 300
    assert results["chunk_accounting"]["balanced"], results["chunk_accounting"]


def _version_of(checkpoint_path: str | None) -> int:
    """The version a checkpoint's file name carries (``ckpt-000000600.pt``); 0 for none."""
    return 0 if checkpoint_path is None else int(checkpoint.NAME.match(Path(checkpoint_path).name).group(1))


def _explorers(client) -> list[str]:
    return sorted(a for a, w in client.scheduler_info(n_workers=-1)["workers"].items() if w["resources"].get("EXPLORER"))


KILL_AT_VERSIONS = (500, 1500, 2500)


@pytest.mark.slow
def test_killed_explorers_cost_only_their_chunks_in_flight(own_client, tmp_path):
    # the run trains to a fixed number of updates, whether or not it solves on the way, so all
    # three kills happen on every machine and the same learning is asked of every draw
    client = own_client
    full = len(_explorers(client))
    run = Run("cartpole_dqn", client, out=tmp_path / "killed", overrides={
        "stop.on_solve": False, "stop.max_updates": 4000, "stop.max_seconds": 300})
    run.start()
    kills = []
    for version in KILL_AT_VERSIONS:  # each once the learner is there and the last kill's worker is back
        deadline = time.time() + 120
        while run.status().get("version", 0) < version or len(_explorers(client)) < full:
            assert time.time() < deadline and not run.status().get("done"), f"version {version} not reached"
            time.sleep(0.1)
        pid = client.run(os.getpid, workers=[_explorers(client)[len(kills) % full]])
        psutil.Process(next(iter(pid.values()))).kill()  # its nanny starts a new worker process
        kills.append(time.time())
    results = run.wait(timeout=300)
    ctrl = results["controller"]
    assert results["stop_reason"] == "max_updates" and results["error"] is None and results["learner_restarts"] == []
    gone = [lost for lost in results["lost"] if lost["reason"] != "cancelled at stop"]
    assert len(gone) <= len(kills) * (ctrl["window_max"] + 1), gone  # at most what was in flight on them
    # every chunk is accounted for: consumed, or lost with a reason; no credit left over
    assert ctrl["credits_granted"] == results["chunks"] + results["chunks_lost"] and ctrl["chunks_in_flight"] == 0
    # every explorer stream came back after the kills (a paced learner may finish on its replay
    # after the last one), and the learning went on
    chunks = np.loadtxt(run.out / "chunks.csv", delimiter=",", skiprows=1, ndmin=2)
    after = chunks[chunks[:, 0] > kills[0]]
    assert set(after[:, 1].astype(int)) == set(range(run.pipeline.explorers))
    episodes = np.loadtxt(run.out / "episodes.csv", delimiter=",", skiprows=1, ndmin=2)
    assert episodes[-100:, 1].mean() > 2 * episodes[:100, 1].mean()


def test_diverging_learner_stops_with_a_numeric_fault(tmp_path):
    results = Run("cartpole_dqn", out=tmp_path / "nan", overrides={
        "mode": "single", "algo.config.lr": 1e30, "algo.config.learning_starts": 100,
        "algo.config.max_grad_norm": None, "stop.max_seconds": 60, "checkpoint.every_versions": 1,
    }).start().wait()
    assert results["stop_reason"] == "numeric_fault"
    assert results["error"].startswith("numeric: non-finite")
    # the checkpoints kept are all finite
    from tianji_dask.core import checkpoint

    state = checkpoint.load(checkpoint.latest(tmp_path / "nan" / "checkpoints"))
    assert all(torch.isfinite(t).all() for t in state["algo"]["q"].values())


@pytest.mark.parametrize("args,kwargs,message", [
    ((123,), {}, "^pipeline: must be a Pipeline, a dict, a YAML path or a bundled name, got int"),
    (("cartpole_ppo",), {"overrides": 5}, "^overrides: must be a mapping"),
    (("cartpole_ppo",), {"out": __file__}, "^out: .* exists and is not a directory"),
])
def test_run_arguments_are_checked(args, kwargs, message):
    from tianji_dask.config import PipelineError

    with pytest.raises(PipelineError, match=message):
        Run(*args, **kwargs)


def test_zero_dimensional_arrays_keep_their_shape_and_normalizer_statistics_resume(tmp_path):
    # a 0-d count came back as [count], and a run with observation normalization could not resume
    from tianji_dask.algos.normalize import ObsNormalizer

    norm = ObsNormalizer((3,))
    norm.observe(np.arange(12, dtype=np.float32).reshape(4, 3))
    norm.fold()
    path = checkpoint.save(tmp_path, {"version": 1, "scalar": np.array(2.5), "norm": norm.state_dict()})
    state = checkpoint.load(path)
    assert state["scalar"].shape == () and float(state["scalar"]) == 2.5
    back = ObsNormalizer((3,))
    back.load_state_dict(state["norm"])
    assert back.count == norm.count and np.allclose(back.mean, norm.mean)


def test_resume_falls_back_to_the_newest_checkpoint_that_loads(tmp_path, capsys):
    out = tmp_path / "run"
    first = Run("cartpole_ppo", out=out, overrides={
        "mode": "single", "stop.target_return": None, "stop.max_updates": 10, "checkpoint.every_versions": 2,
    }).start().wait()
    kept = sorted((out / "checkpoints").iterdir())
    assert [p.name for p in kept] == ["ckpt-000000006.pt", "ckpt-000000008.pt", "ckpt-000000010.pt"], kept
    kept[-1].write_bytes(kept[-1].read_bytes()[:100])  # the newest, cut short (a node lost mid-write)
    run = Run.resume(out, overrides={"stop.max_updates": 12})
    assert run.resume_from == (str(kept[1].resolve()),)
    assert run.skipped_checkpoints == [f"{str(kept[-1])!r} is damaged or not a tianji checkpoint (RuntimeError)"]
    second = run.start().wait()
    assert second["error"] is None and first["final_version"] == 10 and second["final_version"] >= 12
    assert second["stop_reason"] == "max_updates"
    # the CLI says which it skipped, in one line; when none loads, one line and exit 2
    for path in (out / "checkpoints").iterdir():
        path.write_bytes(b"damaged")
    code = main(["resume", str(out), "--set", "stop.max_updates=20"])  # a budget left, but nothing to go on from
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "none of the 3 checkpoints" in err and "is damaged" in err, err
