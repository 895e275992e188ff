"""Runs longer than a learner's worker: with ``cluster.learner_lifetime`` a learner checkpoints,
hands its chunks' credits back and stops before its worker's end, and the run goes on with a
learner on a fresh worker, built from that checkpoint; the explorers' streams go on."""

from __future__ import annotations

import pytest

from tianji_dask.run import Run


@pytest.mark.parametrize("setting,says", [
    ("cluster.learner_lifetime=soon", "learner_lifetime: not a positive duration ('soon')"),
    ("cluster.learner_lifetime=0s", "learner_lifetime: not a positive duration"),
])
def test_a_bad_learner_lifetime_is_one_line_and_exit_2(capsys, setting, says):
    from tianji_dask.cli import main

    code = main(["train", "cartpole_ppo", "--quiet", "--set", setting])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("tianji-dask: error:")]
    assert len(errors) == 1 and says in errors[0], err


@pytest.mark.parametrize("overrides,says", [
    ({"cluster.kind": "slurm", "cluster.jobqueue.walltime": "00:10:00", "cluster.learner_lifetime": "10m"},
     "must be below jobqueue.walltime"),
    ({"cluster.kind": "address", "cluster.address": "tcp://127.0.0.1:8786", "cluster.learner_lifetime": "55m"},
     "only a cluster the run starts"),
    ({"cluster.learner_lifetime": "55m", "checkpoint.enabled": False}, "set checkpoint.enabled: true"),
    ({"cluster.learner_lifetime": "55m", "groups": 2}, "not with groups > 1"),
    ({"cluster.learner_lifetime": "55m", "mode": "single"}, "single mode"),
])
def test_a_learner_lifetime_the_run_cannot_keep_is_refused_before_anything_starts(tmp_path, overrides, says):
    from tianji_dask.config import PipelineError

    with pytest.raises(PipelineError, match="learner_lifetime") as caught:
        Run("cartpole_ppo", out=tmp_path / "run", overrides=overrides)
    assert says in str(caught.value) and "\n" not in str(caught.value)
    assert not (tmp_path / "run").exists()


def test_a_learner_lifetime_with_a_client_given_is_refused(tianji_client, tmp_path):
    from tianji_dask.config import PipelineError

    with pytest.raises(PipelineError, match="cluster.learner_lifetime: a handoff needs a fresh learner worker"):
        Run("cartpole_ppo", tianji_client, out=tmp_path / "run", overrides={"cluster.learner_lifetime": "55m"})


# a handoff comes every lifetime less the drain (about 10 s of a 15 s lifetime), the first sooner
# in the run's clock the slower the run starts (its learner worker's lifetime runs from the
# cluster's start): 24 s holds two and leaves seconds of training after the second and before a third
RUN_S = 24


@pytest.mark.slow
def test_a_learner_handed_off_twice_trains_to_its_budget_with_every_chunk_accounted_for(tmp_path):
    # a 15 s lifetime on the embedded cluster: each learner worker process is replaced a few
    # seconds before it ends (its successor started a quarter of the lifetime ahead, the drain
    # 5 s ahead), and the run trains to its time budget across the handoffs (a budget of updates
    # was reached before the second handoff on a fast machine)
    run = Run("cartpole_dqn", out=tmp_path / "handoff", overrides={
        "cluster.dashboard_address": None, "cluster.learner_lifetime": "15s", "stop.on_solve": False,
        "stop.target_return": None, "stop.max_env_steps": None, "stop.max_seconds": RUN_S,
        "checkpoint.every_versions": None})
    results = run.start().wait(timeout=300)
    assert results["stop_reason"] == "max_seconds" and results["error"] is None, results["error"]
    handoffs = [r for r in results["learner_restarts"] if r["cause"] == "lifetime"]
    assert len(handoffs) >= 2 and len(handoffs) == len(results["learner_restarts"]), results["learner_restarts"]
    versions = [h["version"] for h in handoffs]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)  # each went on from the last
    assert results["final_version"] > versions[-1], (results["final_version"], versions)
    workers = [h["worker"] for h in handoffs] + [handoffs[-1]["new_worker"]]
    assert len(set(workers)) == len(workers)  # every learner on a fresh worker
    for h in handoffs:
        assert h["checkpoint"].endswith(f"ckpt-{h['version']:09d}.pt")  # the checkpoint written at the handoff
        assert h["next_update_s"] is not None and 0 < h["next_update_s"] < 30, h
    # every chunk is accounted for: consumed once, or lost with a reason; every credit came back
    acc = results["chunk_accounting"]
    assert acc["balanced"], acc
    assert acc["granted"] == results["chunks"] + results["chunks_lost"] and acc["consumed"] == results["chunks"]
    at_handoff = [lost for lost in results["lost"] if lost["reason"].endswith("at handoff")]
    assert len(at_handoff) == sum(h["chunks_lost"] for h in handoffs)
    # the explorers' streams went on: both fed the learner throughout
    assert set(results["controller"]["per_explorer_env_steps"]) == {str(i) for i in range(results["explorers"])}
