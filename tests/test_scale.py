"""Simulated scale: a simulator's cost without its CPU, and many explorer streams on few processes."""

from __future__ import annotations

import numpy as np
import pytest

from tianji_dask import Run
from tianji_dask.acting import Acting
from tianji_dask.config import PipelineError, load_pipeline
from tianji_dask.core.metrics import CHUNK_FIELDS
from tianji_dask.envs.rollout import Rollout
from tianji_dask.envs.simulate import StepCost, StepCostClock

COL = {name: i for i, name in enumerate(CHUNK_FIELDS)}


def test_jitter_is_a_mean_one_lognormal_drawn_per_chunk_from_the_seed_and_stream():
    cost = StepCost(ms=2.0, jitter=1.0)
    draws = [StepCostClock(cost, 4, seed=0, stream=3).chunk() for _ in range(3)]
    assert draws[0] == draws[1] == draws[2]  # the same seed and stream: the same sequence
    clock = StepCostClock(cost, 4, seed=0, stream=3)
    many = np.array([clock.chunk() for _ in range(20_000)]) / (2e-3 * 4)  # multipliers of N x step_cost_ms
    assert abs(many.mean() - 1.0) < 0.05 and many.std() > 0.5
    other = StepCostClock(cost, 4, seed=0, stream=4).chunk()
    assert other != draws[0]
    assert StepCostClock(StepCost(2.0, 0.0), 4, 0, 0).chunk() == pytest.approx(8e-3)  # no jitter: N x ms


def test_a_rollout_draws_a_cost_per_chunk_and_the_env_stays_real():
    class Clock(StepCostClock):
        def __init__(self):
            super().__init__(StepCost(0.01, 0.5), 2, 0, 0)
            self.chunks, self.steps = 0, 0

        def chunk(self):
            self.chunks += 1
            return super().chunk()

        def step(self):
            self.steps += 1

    clock = Clock()
    rollout = Rollout("CartPole-v1", 2, seed=0, step_cost=clock)
    policy = type("P", (Acting,), {"act": lambda self, obs, explore: (np.zeros(len(obs), int), {})})()
    for _ in range(2):
        chunk = rollout.run(policy, 10, {}, policy_version=0, explorer_id=0)
    assert (clock.chunks, clock.steps) == (2, 20) and chunk["env_steps"] > 0
    rollout.close()


def test_explorer_kwargs_set_a_streams_cost_and_never_reach_gymnasium():
    p = load_pipeline("cartpole_ppo", overrides={"env.step_cost_ms": 1.0, "env.explorer_kwargs": {1: {"step_cost_ms": 5}}})
    assert "step_cost_ms" not in p.env_kwargs_for(1) and p.step_cost_for(1) == StepCost(5.0, 0.0)
    assert p.step_cost_for(0) == StepCost(1.0, 0.0)
    simulated = p.simulated()
    assert simulated["step_cost_ms"] == 1.0 and simulated["per_stream"] == {1: {"step_cost_ms": 5.0, "step_cost_jitter": 0.0}}
    assert load_pipeline("cartpole_ppo").simulated() is None
    with pytest.raises(PipelineError, match=r"^env.explorer_kwargs.0.step_cost_ms: must be a number >= 0 \(got -1\)"):
        load_pipeline("cartpole_ppo", overrides={"env.explorer_kwargs": {0: {"step_cost_ms": -1}}})
    with pytest.raises(PipelineError, match="^env.step_cost_jitter: Input should be greater than or equal to 0"):
        load_pipeline("cartpole_ppo", overrides={"env.step_cost_jitter": -0.5})


def test_sixteen_streams_run_at_once_on_two_worker_processes(tmp_path):
    # 1,000 env steps: every stream's first chunk at once, then about one more each
    run = Run("cartpole_impala", out=tmp_path / "sixteen", overrides={
        "explorers": 16, "env.num_envs": 2, "chunk_steps": 16, "env.step_cost_ms": 10, "stop.target_return": None,
        "stop.max_env_steps": 1_000, "cluster.explorer_workers": 2, "cluster.dashboard_address": None})
    results = run.start().wait()
    assert results["error"] is None and results["simulated"]["step_cost_ms"] == 10 and results["controller"]["simulated"]
    assert len(results["controller"]["per_explorer_env_steps"]) == 16
    chunks = np.loadtxt(run.out / "chunks.csv", delimiter=",", skiprows=1, ndmin=2)
    starts, ends = chunks[:, COL["t_start"]], chunks[:, COL["t_end"]]
    # how many chunks were being stepped at the same moment: every stream had a thread of its own
    overlap = max(int(((starts <= t) & (ends > t)).sum()) for t in starts)
    assert overlap >= 8, overlap
    memory = results["explorer_memory"]
    assert memory["streams"] == 16 and memory["workers"] == 2 and memory["bytes_per_stream"] > 0
