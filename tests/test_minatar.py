"""MinAtar: a third-party env registered by ``env.register``, its 10x10xC bool grids through the
MinAtar paper's small network, in single mode and on a real cluster's explorer processes.

Learning Breakout takes millions of env steps and is not for the test suite; these check the
registration everywhere envs are made, the network choice and a few seconds of training."""

import pickle

import pytest

pytest.importorskip("minatar", reason="MinAtar needs minatar (pip install 'tianji-dask[minatar]')")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402

from tianji_dask import Run  # noqa: E402
from tianji_dask.algos import make_algorithm  # noqa: E402
from tianji_dask.algos.encoders import MinAtarCNN, NatureCNN  # noqa: E402
from tianji_dask.config import PipelineError, parse_pipeline, pipeline_yaml  # noqa: E402
from tianji_dask.envs.vector import EnvId, env_spaces, register  # noqa: E402

BREAKOUT = "MinAtar/Breakout-v1"
REGISTER = "minatar.gym:register_envs"
PIPELINE = {"name": "t", "env": {"id": BREAKOUT, "register": REGISTER, "num_envs": 4},
            "algo": {"name": "dqn"}, "stop": {"max_seconds": 3}}


@pytest.mark.parametrize("spec,says", [
    ("minatar.gym", "must be 'module:callable'"),
    ("no_such_module_xyz:register_envs", "cannot import module 'no_such_module_xyz'"),
    ("minatar.gym:no_such_function", "module 'minatar.gym' has no attribute 'no_such_function'"),
    ("json:dumps", "json:dumps() failed (TypeError"),
])
def test_a_bad_register_is_one_line_naming_env_register(spec, says):
    with pytest.raises(PipelineError) as err:
        parse_pipeline({**PIPELINE, "env": {**PIPELINE["env"], "register": spec}})
    line = str(err.value)
    assert line.startswith("env.register: ") and says in line and "\n" not in line
    assert "allowed: 'module:callable'" in line or "must be 'module:callable'" in line


def test_register_is_called_and_the_id_carries_it_to_other_processes():
    p = parse_pipeline(PIPELINE)
    assert BREAKOUT in gym.registry  # called while the pipeline was validated, here
    assert p.env.id == BREAKOUT and str(p.env.id) == BREAKOUT and p.env.register == REGISTER
    # what an explorer worker receives: the id, pickled, still carrying its registration
    carried = pickle.loads(pickle.dumps(p.env.id))
    assert isinstance(carried, EnvId) and carried.register == REGISTER and carried == BREAKOUT
    register(REGISTER)  # idempotent: once per process
    # the resolved pipeline a run writes (and resume reads) keeps it
    again = parse_pipeline(yaml.safe_load(pipeline_yaml(p)))
    assert again.env.register == REGISTER and again.env.id.register == REGISTER
    without = parse_pipeline({**PIPELINE, "env": {"id": "CartPole-v1"}})
    assert without.env.id == "CartPole-v1" and without.env.id.register is None and without.env.register is None


def test_bool_grids_get_the_minatar_network_for_dqn_and_ppo():
    obs_space, act_space = env_spaces(EnvId(BREAKOUT, REGISTER))
    assert obs_space.shape == (10, 10, 4) and obs_space.dtype == np.bool_ and act_space.n == 3
    obs = np.random.default_rng(0).random((5, 10, 10, 4)) < 0.3
    for name in ("dqn", "ppo"):
        algo = make_algorithm(name, obs_space, act_space, {"hidden": []})
        net = algo.q if name == "dqn" else algo.net
        encoders = [m for m in net.modules() if isinstance(m, (MinAtarCNN, NatureCNN))]
        assert encoders and all(isinstance(m, MinAtarCNN) for m in encoders)
        conv = encoders[0].conv
        assert (conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride) == (4, 16, (3, 3), (1, 1))
        assert encoders[0].fc.out_features == 128
        actions, _ = algo.act(obs, {"epsilon": 0.0} if name == "dqn" else {"greedy": True})
        assert actions.shape == (5,) and ((0 <= actions) & (actions < 3)).all()
        # the grid is read channels-last: the same grid as float32 (as chunks carry it) acts the same
        again, _ = algo.act(obs.astype(np.float32), {"epsilon": 0.0} if name == "dqn" else {"greedy": True})
        np.testing.assert_array_equal(actions, again)
    # Atari's 4x84x84 uint8 frames keep the Nature CNN
    atari = make_algorithm("dqn", gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), act_space, {"hidden": []})
    assert any(isinstance(m, NatureCNN) for m in atari.q.modules())


@pytest.mark.slow  # the fast tier checks the network choice and registration; CI trains
@pytest.mark.parametrize("pipeline,overrides", [
    ("minatar_breakout_dqn", {"algo.config.learning_starts": 256}),
    ("minatar_breakout_ppo", {"chunk_steps": 32, "algo.config.update_epochs": 1}),
    ("minatar_space_invaders_dqn", {"algo.config.learning_starts": 256}),
])
def test_breakout_trains_for_a_few_seconds_in_single_mode(tmp_path, pipeline, overrides):
    run = Run(pipeline, out=tmp_path / "r", overrides={
        "mode": "single", "env.num_envs": 4, "stop.max_seconds": 3, "stop.target_return": None, **overrides})
    results = run.start().wait()
    assert results["error"] is None
    assert results["env_steps"] > 0 and results["updates"] >= 1
    net = run.backend.core.algo.q if pipeline.endswith("dqn") else run.backend.core.algo.net
    assert any(isinstance(m, MinAtarCNN) for m in net.modules())


def _explorers(client) -> list[str]:
    workers = client.scheduler_info(n_workers=-1)["workers"]
    return [a for a, w in workers.items() if "EXPLORER" in w["resources"]]


def _has_breakout() -> bool:
    import gymnasium

    return BREAKOUT in gymnasium.registry


def test_explorer_processes_register_and_make_minatar_envs(tianji_client, tmp_path):
    before = tianji_client.run(_has_breakout, workers=_explorers(tianji_client))  # False on a fresh cluster
    run = Run("minatar_breakout_ppo", tianji_client, out=tmp_path / "r", overrides={
        "env.num_envs": 4, "chunk_steps": 16, "algo.config.update_epochs": 1,
        "stop.max_env_steps": 640, "stop.max_seconds": 60, "stop.target_return": None})
    results = run.start().wait()
    assert results["error"] is None
    assert results["chunks"] >= 5 and results["updates"] >= 1 and results["env_steps"] >= 640
    # the explorer processes registered MinAtar's ids themselves (nothing but the id told them how)
    after = tianji_client.run(_has_breakout, workers=_explorers(tianji_client))
    assert all(after.values()), f"explorers with MinAtar's ids before the run: {before}, after: {after}"
