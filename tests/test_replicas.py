"""Learner replicas: two processes joined by torch.distributed (gloo on 127.0.0.1), each training
on its own chunks, end every update with the same weights, and those are the weights that
averaging the two replicas' gradients gives (for PPO also: one learner on both batches at once),
for PPO, IMPALA, DQN and SAC. Summed gradients, or one replica's alone, give other weights: the
test says so too. Real torch, real gymnasium; the run-level tests start a real cluster."""

from __future__ import annotations

import json
import multiprocessing
import queue
import socket

import numpy as np
import pytest

import replica_training as rt
from helpers import cli

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _replicas(cases: list[str]) -> list[tuple[dict, int, tuple]]:
    """Each replica's (states by case, gradient all-reduces its training made, the known gradients
    averaged), two processes of a real group."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    init = f"tcp://127.0.0.1:{_free_port()}"
    procs = [ctx.Process(target=rt.in_process_group, args=(rank, 2, init, cases, out)) for rank in range(2)]
    for p in procs:
        p.start()
    got = {}
    try:
        while len(got) < len(procs):
            try:
                rank, *rest = out.get(timeout=1)
                got[rank] = tuple(rest)
            except queue.Empty:  # a replica that died says so by its exit code
                assert not any(p.exitcode for p in procs), [p.exitcode for p in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return [got[0], got[1]]


def _close(a: dict, b: dict, atol=1e-6) -> bool:
    return a.keys() == b.keys() and all(np.allclose(a[k], b[k], atol=atol, rtol=1e-5) for k in a)


def _rows(table: np.ndarray) -> list[tuple]:
    """A table's rows as a sorted list: equal for two tables holding the same rows in any order."""
    return sorted(map(tuple, table.tolist()))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def trained():
    """The four algorithms trained by two replicas (one spawn of two processes for all)."""
    return _replicas(list(rt.CASES))


@pytest.mark.parametrize("case", ["ppo", "impala", "dqn", "sac"])
def test_replicas_end_every_update_identical_and_equal_to_the_averaged_gradients(trained, case):
    (states0, calls0, *_), (states1, calls1, *_) = trained
    assert calls0 == calls1 > 0  # every gradient step went through one all-reduce, on both
    assert _same(states0[case], states1[case])  # the replicas' networks are identical
    averaged = rt.averaged_in_threads(case)
    assert _close(states0[case], averaged[0]) and _close(averaged[0], averaged[1])
    # the test can fail: one replica's own data alone, or summed gradients, train other weights
    alone = rt.train(rt.make(case), case, rt.chunks(case, 0))
    assert not _close(states0[case], alone)


def test_the_replicas_gradients_are_their_mean_not_their_sum_nor_one_replicas(trained):
    """Replica r's gradients are all r + 1: both end with 1.5 (a sum gives 3, one replica's 1 or 2);
    a parameter without a gradient averages as zeros."""
    for _, _, (p, q), _ in trained:
        assert p == [1.5, 1.5, 1.5] and q == [0.0, 0.0]


def test_the_replicas_pool_the_running_statistics_their_policy_carries(trained):
    """Observation normalization and reward scaling are not trained by gradients: each replica's
    collected data are pooled before every fold, so the statistics, and with them the published
    weights, are the same on every replica. Replica 0 saw one 0, replica 1 two 10s: both fold
    mean 20/3 (and the prior's 1e-4 count)."""
    (states0, *_, pooled0), (states1, *_, pooled1) = trained
    assert pooled0 == pooled1
    mean, var, count = pooled0
    assert np.allclose(mean, 20 / 3, rtol=1e-4) and np.allclose(var, 200 / 9, rtol=1e-3) and abs(count - 3) < 1e-3
    assert _same(states0["ppo_normalized"], states1["ppo_normalized"])
    alone = rt.train(rt.make("ppo_normalized"), "ppo_normalized", rt.chunks("ppo_normalized", 0))
    assert not _close(states0["ppo_normalized"], alone)


def test_two_ppo_replicas_train_as_one_learner_on_both_batches(trained):
    """PPO with one minibatch and no per-minibatch statistics: two replicas, each on its own batch,
    end with the weights of one learner updated on the two batches concatenated."""
    case = "ppo_whole_batch"
    k = rt.CASES[case][4]
    one = rt.make(case, segments_per_batch=2 * k)
    own = [rt.chunks(case, rank) for rank in range(2)]
    both = [chunk for u in range(rt.CASES[case][5]) for mine in own for chunk in mine[u * k:(u + 1) * k]]
    assert _close(trained[0][0][case], rt.train(one, case, both, per_update=2 * k), atol=1e-5)


@pytest.mark.parametrize("args, line", [
    (["--mode", "single"], "learner.replicas: 2: single mode runs one learner in one process"),
    (["--groups", "2"], "learner.replicas: 2: not with groups > 1"),
    (["--explorers", "1"], "learner.replicas: 2: each replica needs explorer streams of its own: explorers 1 < replicas 2"),
])
def test_replicas_refused_where_they_cannot_run_in_one_line(capsys, tmp_path, args, line):
    code, out, err = cli(capsys, "train", "cartpole_ppo", "--learner-replicas", "2", *args, "--out", str(tmp_path / "r"))
    assert code == 2 and line in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
@pytest.mark.parametrize("how", [["--learner-replicas", "2"], ["--set", "learner.replicas=2"]])
def test_cartpole_ppo_solves_with_two_learner_replicas(capsys, tmp_path, how):
    """The embedded cluster starts two learner workers; the run solves with one policy: one
    version, identical final weights on both replicas, each one's figures in results.json."""
    code, out, err = cli(capsys, "train", "cartpole_ppo", *how, "--out", str(tmp_path / "run"), "--quiet")
    assert code == 0, err
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["solved"] and results["learner_replicas"] == 2 and results["error"] is None
    per = results["replica_results"]
    assert len(per) == 2 and per[0]["final_weights_sha256"] == per[1]["final_weights_sha256"]
    assert results["final_version"] == per[0]["final_version"] == per[1]["final_version"] == results["updates"] > 0
    rows = results["replicas"]["per_replica"]
    assert [r["rank"] for r in rows] == [0, 1]
    assert all(r["allreduce_calls"] > 0 and r["updates"] == results["updates"] for r in rows)
    assert rows[0]["allreduce_calls"] == rows[1]["allreduce_calls"]
    assert sum(r["env_steps"] for r in rows) == results["env_steps"]
    # the first replica's where one learner's would be, the other's beside it, at the same version
    first = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("ckpt-*.pt"))
    assert first and first == sorted(p.name for p in (tmp_path / "run" / "checkpoints" / "replica-1").glob("ckpt-*.pt"))


@pytest.mark.slow
def test_a_replica_whose_worker_dies_is_rebuilt_with_the_others_from_their_checkpoint(tmp_path):
    """A replica's worker killed mid-run: the survivor does not wait for ever in its all-reduce;
    both replicas are built anew (the nanny restarts the worker) from the newest checkpoint both
    hold, meet again, and train one policy to the budget."""
    import contextlib
    import os
    import time

    from distributed import Client

    from tianji_dask.launch.cluster import local_cluster
    from tianji_dask.run import Run

    cluster = local_cluster(explorer_workers=2, dashboard_address=None, learner_workers=2)
    client = Client(cluster)
    with contextlib.closing(cluster), contextlib.closing(client):
        run = Run("cartpole_ppo", client, out=tmp_path / "run", overrides={
            "learner.replicas": 2, "stop.target_return": 10_000, "stop.max_env_steps": 250_000,
            "stop.max_seconds": 300, "checkpoint.every_versions": 2})
        run.start()
        while (run.status().get("version") or 0) < 6:
            time.sleep(0.1)
        victim = run._backend.learners._homes[1]
        with contextlib.suppress(Exception):  # the worker dies under the call
            client.run(os._exit, 1, workers=[victim])
        results = run.wait(timeout=600)
    assert results["error"] is None and results["stop_reason"] == "max_env_steps", results["error"]
    [restart] = results["learner_restarts"]
    assert restart["cause"] == "lost" and restart["group"] == 1 and restart["replicas_rebuilt"] == 2
    assert restart["checkpoint"] is not None  # from a checkpoint both replicas wrote, not from the start
    per = results["replica_results"]
    assert per[0]["final_weights_sha256"] == per[1]["final_weights_sha256"]
    assert per[0]["final_version"] == per[1]["final_version"] == results["final_version"] > 6
    for books in results["controller"]["groups"]:  # every credit each replica's books granted came back
        assert books["chunks_in_flight"] == 0
        assert books["credits_granted"] == sum(books["credits_returned"].values()), books["credits_returned"]


@pytest.mark.slow
def test_a_resumed_replica_run_starts_every_replica_from_the_checkpoint_and_counts_episodes_once(tmp_path):
    """Each replica resumes from its own checkpoint of the same version, with its own books: the
    resumed run's books hold every episode of both legs once."""
    import subprocess
    import sys

    run = tmp_path / "run"
    base = [sys.executable, "-m", "tianji_dask"]
    first = subprocess.run([*base, "train", "cartpole_ppo", "--learner-replicas", "2", "-n", "40000", "--set",
                            "stop.target_return=10000", "--out", str(run), "--quiet"], capture_output=True, text=True,
                           timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    before = json.loads((run / "results.json").read_text())
    again = subprocess.run([*base, "resume", str(run), "-n", "80000", "--quiet"], capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    after = json.loads((run / "results.json").read_text())
    assert after["learner_replicas"] == 2 and after["error"] is None
    assert after["final_version"] > before["final_version"] and after["env_steps"] >= 80_000 > before["env_steps"]
    episodes = np.loadtxt(run / "episodes.csv", delimiter=",", skiprows=1)
    first = np.loadtxt(run / "legs" / "0" / "episodes.csv", delimiter=",", skiprows=1)
    assert len(episodes) == after["episodes"] > len(first) == before["episodes"]
    # the first leg's episodes open the resumed books, each once (their clock moved with the resume):
    # a replica that took another's books would repeat that one's and lose its own
    assert _rows(episodes[:len(first), 1:]) == _rows(first[:, 1:])
    per = after["replica_results"]
    assert per[0]["final_weights_sha256"] == per[1]["final_weights_sha256"]
    assert after["episodes"] > before["episodes"]  # both replicas' earlier episodes are still on the books
    assert [r["episodes"] > b["episodes"] for r, b in zip(per, before["replica_results"])] == [True, True]


def test_each_replicas_books_size_their_window_by_its_own_streams():
    """A replica feeds on its share of the explorers: its window starts at its own stream count,
    as one learner's does at the explorers', not at all of them (which overproduces stale chunks)."""
    from tianji_dask.run import Run

    one = Run("cartpole_dqn", overrides={"explorers": 2}).law()
    replicas = Run("cartpole_dqn", overrides={"explorers": 8, "learner.replicas": 4}).law()
    assert replicas["window"] == one["window"] == 2 and replicas["window_max"] == one["window_max"]
