"""Faster updates compute what the plain ones did: each shortcut, switched off, gives the same
networks after several updates from the same data (benchmarks/learner_roofline.py measures the gain)."""

import contextlib

import numpy as np
import pytest

from tianji_dask.algos import make_algorithm, sac
from tianji_dask.envs.rollout import Rollout
from tianji_dask.envs.vector import env_spaces


def _trained(config: dict, updates: int = 6) -> dict:
    spaces = env_spaces("Pendulum-v1")
    algo = make_algorithm("sac", *spaces, {"hidden": [32, 32], "batch_size": 64, "learning_starts": 64, **config}, seed=0)
    rollout = Rollout("Pendulum-v1", 4, seed=0)
    while not algo.ready():
        algo.ingest(rollout.run(algo, 16, algo.exploration(0, 0), policy_version=0, explorer_id=0), 0)
    for _ in range(updates):
        algo.learn()
    return algo.model_state()


@pytest.mark.parametrize("config", [{}, {"policy_frequency": 2, "autotune": False}])
def test_sac_without_the_critics_weight_gradients_in_the_actor_step_trains_the_same(monkeypatch, config):
    fast = _trained(config)
    monkeypatch.setattr(sac, "frozen", lambda *modules: contextlib.nullcontext())
    plain = _trained(config)
    untrained = _trained(config, updates=0)
    assert fast.keys() == plain.keys() and any(not np.array_equal(fast[k], untrained[k]) for k in fast if k.startswith("actor"))
    for key in fast:
        np.testing.assert_array_equal(fast[key], plain[key], err_msg=key)
