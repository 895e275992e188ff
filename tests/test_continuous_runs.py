"""Continuous control through the dataflow: SAC and Gaussian PPO on a real LocalCluster, with Box
actions in the chunks, the normalizer's statistics travelling with the weights, MuJoCo."""

import numpy as np
import pytest

from tianji_dask import Run


def _lost_only_at_stop(results):
    return all("stop" in lost["reason"] for lost in results["lost"])


def test_sac_trains_on_the_cluster_with_box_actions(tianji_client, tmp_path):
    run = Run("pendulum_sac", tianji_client, out=tmp_path / "sac", overrides={
        "stop.target_return": None, "stop.max_env_steps": 1_000, "algo.config.learning_starts": 500})
    results = run.start().wait()
    assert results["error"] is None and results["updates"] > 100
    assert results["env_steps"] >= 1_000 and _lost_only_at_stop(results)
    assert results["replay_progress"]["warm"] and results["controller"]["chunks_in_flight"] == 0


@pytest.mark.slow  # ten updates of ten epochs: the fast tier has test_continuous's statistics-travel-with-the-weights
def test_ppo_with_observation_normalization_trains_on_the_cluster(tianji_client, tmp_path):
    # explorers act with the statistics shipped inside each version's weights: a mismatch
    # would fail their tasks (set_weights refuses weights without them)
    run = Run("pendulum_ppo", tianji_client, out=tmp_path / "ppo", overrides={
        "stop.target_return": None, "stop.max_env_steps": 10_000, "chunk_steps": 64})
    results = run.start().wait()
    assert results["error"] is None and results["updates"] >= 10 and _lost_only_at_stop(results)
    chunks = np.loadtxt(run.out / "chunks.csv", delimiter=",", skiprows=1, ndmin=2)
    assert (chunks[:, 5] <= 1).all()  # consumed at most one version stale (max_policy_lag 1)


def test_mujoco_hopper_runs_on_the_cluster(tianji_client, tmp_path):
    pytest.importorskip("mujoco")
    run = Run("hopper_ppo", tianji_client, out=tmp_path / "hopper", overrides={  # a few gradient steps an update
        "stop.target_return": None, "stop.max_env_steps": 8_192, "algo.config.update_epochs": 1,
        "algo.config.num_minibatches": 4})
    results = run.start().wait()
    assert results["error"] is None and results["updates"] >= 2 and results["episodes"] > 0


@pytest.mark.slow
def test_pendulum_sac_solves_on_the_cluster(tianji_client, tmp_path):
    run = Run("pendulum_sac", tianji_client, out=tmp_path / "solve", overrides={"stop.max_seconds": 400})
    results = run.start().wait()
    assert results["error"] is None
    assert results["solved"], (results["final_mean_return"], results["env_steps"], results["wall_s"])
