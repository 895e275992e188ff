"""``algo.config.encoder``: a network of the user's (``custom_nets.py``) in place of the built-in
MLP input or convolutional encoder of every network of DQN, PPO, IMPALA and SAC, on flat and image
observations: it is used, trained, published, pickled, seeded and checkpointed with the rest; a
bad spec is one line."""

from __future__ import annotations

import functools
import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch
from custom_nets import Features
from helpers import hand_chunk

from tianji_dask.algos import make_algorithm
from tianji_dask.chunk import validate_chunk
from tianji_dask.config import PipelineError, parse_pipeline

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FLAT = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
IMAGE = gym.spaces.Box(0, 255, (3, 12, 12), np.uint8)  # (C, H, W) pixels
DISCRETE = gym.spaces.Discrete(2)
BOX = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
BREAKOUT, REGISTER = "MinAtar/Breakout-v1", "minatar.gym:register_envs"
#: each algorithm's networks that take observations, and their encoders' attribute names
ENCODERS = {
    "dqn": {"q": ["encoder"], "target": ["encoder"]},
    "ppo": {"net": ["actor_encoder", "critic_encoder"]},
    "impala": {"net": ["actor_encoder", "critic_encoder"]},
    "sac": {"actor": ["encoder"], "q": ["encoders.0", "encoders.1"], "q_target": ["encoders.0", "encoders.1"]},
}
SMALL = {"dqn": {"learning_starts": 16, "batch_size": 8, "buffer_size": 256},
         "sac": {"learning_starts": 16, "batch_size": 8, "buffer_size": 256, "hidden": (16,)},
         "ppo": {"num_minibatches": 2}, "impala": {}}
GREEDY = {"epsilon": 0.0, "greedy": True}


def breakout_spaces():
    pytest.importorskip("minatar", reason="MinAtar needs minatar (pip install 'tianji-dask[minatar]')")
    from tianji_dask.envs.vector import EnvId, env_spaces

    return env_spaces(EnvId(BREAKOUT, REGISTER))


CASES = [  # (algorithm, observation space, action space, factory, extra config)
    ("dqn", FLAT, DISCRETE, "mlp", {}),
    ("ppo", FLAT, DISCRETE, "mlp", {}),
    ("ppo", FLAT, BOX, "mlp", {}),
    ("impala", FLAT, DISCRETE, "mlp", {}),
    ("sac", FLAT, BOX, "mlp", {}),
    ("dqn", "breakout", None, "conv", {"hidden": ()}),
    ("ppo", "breakout", None, "conv", {"hidden": ()}),
    ("impala", "breakout", None, "conv", {"shared_trunk": True}),
    ("ppo", IMAGE, BOX, "conv", {}),
    ("sac", IMAGE, BOX, "conv", {}),
]


def case_id(case):
    name, obs, act, _, extra = case
    kind = "breakout" if obs == "breakout" else "image" if obs is IMAGE else "flat"
    return f"{name}-{kind}-{'box' if act is BOX else 'discrete'}" + ("-shared" if extra.get("shared_trunk") else "")


def build(case, seed=0):
    name, obs_space, act_space, factory, extra = case
    if obs_space == "breakout":
        obs_space, act_space = breakout_spaces()
    config = {**SMALL[name], **extra, "encoder": f"custom_nets:{factory}"}
    return make_algorithm(name, obs_space, act_space, config, seed=seed)


def observations(algo, n=6, seed=0) -> np.ndarray:
    """A batch as the env gives it (bool grids, uint8 pixels or floats)."""
    space = algo.obs_space
    rng = np.random.default_rng(seed)
    if space.dtype == np.bool_:
        return rng.random((n, *space.shape)) < 0.3
    if space.dtype == np.uint8:
        return rng.integers(0, 256, (n, *space.shape), dtype=np.uint8)
    return rng.uniform(-1, 1, (n, *space.shape)).astype(np.float32)


def policy_output(algo, obs: np.ndarray) -> np.ndarray:
    """What the greedy action is the argmax (Discrete) or the tanh (SAC) of: Q values, logits, means."""
    if hasattr(algo, "actor"):
        return algo.actor.numpy_forward(obs)[0]
    if hasattr(algo, "q"):
        return algo.q.numpy_forward(obs)
    return algo.net.numpy_mean(obs)[0] if algo.continuous else algo.net.numpy_logits(obs)


def a_chunk(algo, T=8, N=3, seed=0) -> dict:
    """A chunk of ``algo``'s own actions: real Breakout steps, else the test_algos helper's
    episode structure with observations of the algorithm's space."""
    if algo.obs_space.shape == (10, 10, 4):
        from tianji_dask.envs.rollout import Rollout
        from tianji_dask.envs.vector import EnvId

        return Rollout(EnvId(BREAKOUT, REGISTER), N, seed=seed).run(algo, T, {"epsilon": 0.5}, policy_version=0, explorer_id=0)
    chunk = hand_chunk(T=T, N=N, seed=seed, done_p=0.2)
    chunk["obs"] = observations(algo, (T + 1) * N, seed).reshape(T + 1, N, *algo.obs_space.shape)
    actions, extras = algo.act(chunk["obs"][:T].reshape(T * N, *algo.obs_space.shape), {})
    chunk["actions"] = actions.reshape(T, N, *actions.shape[1:])
    for k, v in extras.items():
        chunk[f"extra_{k}"] = v.reshape(T, N)
    validate_chunk(chunk)
    return chunk


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_every_network_gets_its_own_instance_of_the_factorys_module_and_publishes_it(case):
    algo = build(case)
    instances = []
    for net_name, attrs in ENCODERS[case[0]].items():
        net = getattr(algo, net_name)
        for attr in attrs:
            enc = functools.reduce(getattr, attr.split("."), net)
            if attr == "critic_encoder" and case[4].get("shared_trunk"):
                assert enc is None  # the critic reads the actor's features
                continue
            assert isinstance(enc.module, Features)
            instances.append(enc.module)
        # the built-in encoders are gone
        assert not any(type(m).__name__ in ("MinAtarCNN", "NatureCNN") for m in net.modules())
    assert len({id(m) for m in instances}) == len(instances)
    assert len({id(p) for m in instances for p in m.parameters()}) == sum(len(list(m.parameters())) for m in instances)
    weights = algo.get_weights()
    actor_encoder = next(k for k in ("encoder", "actor_encoder") if any(k2.startswith(k + ".") for k2 in weights))
    own = {f"{actor_encoder}.module.{k}": v for k, v in instances[0].state_dict().items()}
    assert own and all(np.array_equal(weights[k], v.numpy()) for k, v in own.items())
    assert not any(k.startswith("critic") for k in weights)  # explorers act without the critic
    # model_state (group mode's average) covers every instance, targets and critics included
    state = algo.model_state()
    for net_name, attrs in ENCODERS[case[0]].items():
        for attr in attrs:
            if functools.reduce(getattr, attr.split("."), getattr(algo, net_name)) is not None:
                assert any(k.startswith(f"{net_name}.{attr}.module.") for k in state)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_acts_ingests_learns_pickles_and_loads_weights_with_the_factorys_module(case):
    rng_before = torch.random.get_rng_state()
    algo = build(case, seed=0)
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # made under its own seed
    again = build(case, seed=0)
    for k, v in algo.get_weights().items():
        np.testing.assert_array_equal(v, again.get_weights()[k])  # seeded: the same weights
    obs = observations(algo)
    actions, _ = algo.act(obs, GREEDY)
    assert len(actions) == len(obs)
    out = policy_output(algo, obs)
    # acting goes through torch and the factory's module, whatever dtype the env gives
    np.testing.assert_allclose(policy_output(algo, obs.astype(np.float32)), out, rtol=1e-6)

    encoder_params = {k: v.copy() for k, v in algo.get_weights().items() if "encoder.module." in k}
    while not algo.ready():
        assert algo.ingest(a_chunk(algo, seed=algo.updates + 1), staleness=0) > 0
    metrics = algo.learn()
    assert metrics and all(np.isfinite(v) for v in metrics.values()), metrics
    after = algo.get_weights()
    assert any(not np.array_equal(after[k], v) for k, v in encoder_params.items())  # it trained the module

    clone = pickle.loads(pickle.dumps(algo))
    np.testing.assert_array_equal(clone.act(obs, GREEDY)[0], algo.act(obs, GREEDY)[0])
    np.testing.assert_array_equal(policy_output(clone, obs), policy_output(algo, obs))

    fresh = build(case, seed=7)
    assert not np.allclose(policy_output(fresh, obs), policy_output(algo, obs))
    fresh.set_weights(algo.get_weights())
    np.testing.assert_array_equal(fresh.act(obs, GREEDY)[0], algo.act(obs, GREEDY)[0])
    np.testing.assert_array_equal(policy_output(fresh, obs), policy_output(algo, obs))

    resumed = build(case, seed=3)
    resumed.load_state_dict(pickle.loads(pickle.dumps(algo.state_dict())))
    for k, v in algo.model_state().items():
        np.testing.assert_array_equal(resumed.model_state()[k], v)
    averaged = build(case, seed=4)
    averaged.load_model_state(algo.model_state())
    np.testing.assert_array_equal(policy_output(averaged, obs), policy_output(algo, obs))


@pytest.mark.parametrize("name", ["sac", "ppo"])
def test_image_observations_with_continuous_actions_need_an_own_encoder(name):
    with pytest.raises(ValueError, match="algo.config.encoder") as err:
        make_algorithm(name, IMAGE, BOX, {})
    assert "\n" not in str(err.value)
    assert make_algorithm(name, IMAGE, BOX, {"encoder": "custom_nets:conv"}).act(
        np.zeros((2, *IMAGE.shape), np.uint8), GREEDY)[0].shape == (2, 2)


def test_without_an_encoder_the_networks_are_as_before():
    for name, act in (("dqn", DISCRETE), ("ppo", DISCRETE), ("ppo", BOX), ("sac", BOX)):
        algo = make_algorithm(name, FLAT, act, {})
        assert not any(isinstance(m, Features) for v in vars(algo).values() if isinstance(v, torch.nn.Module)
                       for m in v.modules())
        assert not any("encoder" in k for k in algo.get_weights())


PIPELINE = {"name": "t", "env": {"id": "CartPole-v1"}, "stop": {"max_seconds": 1}}


@pytest.mark.parametrize("name", ["dqn", "ppo", "impala", "sac"])
@pytest.mark.parametrize("spec,says", [
    ("no_such_module_xyz:net", "cannot import module 'no_such_module_xyz' (ModuleNotFoundError"),
    ("custom_nets:no_such_factory", "module 'custom_nets' has no attribute 'no_such_factory'"),
    ("custom_nets:NOT_CALLABLE", "custom_nets:NOT_CALLABLE is 42, not callable"),
    ("custom_nets", "must be 'module:factory'"),
])
def test_a_spec_that_does_not_import_or_call_is_one_line_when_the_pipeline_is_read(name, spec, says):
    with pytest.raises(PipelineError) as err:
        parse_pipeline({**PIPELINE, "algo": {"name": name, "config": {"encoder": spec}}})
    line = str(err.value)
    assert line.startswith("algo.config.encoder: ") and says in line and "\n" not in line, line
    assert "'module:factory', a function of an importable module" in line


@pytest.mark.parametrize("factory,says", [
    ("no_tuple", "returned Linear(in_features=3, out_features=8, bias=True); allowed: 'module:factory'"),
    ("not_a_module", "returned ('net', 8): the first must be a torch.nn.Module"),
    ("zero_width", "returned (module, 0): the output width must be an int > 0"),
    ("wrong_width", "its module maps float32 observations (2, 3) to (2, 32), not (2, 16)"),
    ("fails", "raised RuntimeError: no network for you"),
])
def test_a_factory_that_breaks_the_contract_is_one_line_when_the_algorithm_is_made(factory, says):
    for name, act in (("dqn", DISCRETE), ("sac", BOX)):
        with pytest.raises(ValueError) as err:
            make_algorithm(name, FLAT, act, {"encoder": f"custom_nets:{factory}"})
        line = str(err.value)
        assert line.startswith(f"encoder: custom_nets:{factory}(obs_space)") and says in line and "\n" not in line, line


def test_a_factory_that_breaks_the_contract_stops_the_run_before_it_starts_naming_the_field():
    from tianji_dask.run.checks import check_pipeline

    p = parse_pipeline({**PIPELINE, "mode": "single", "algo": {"name": "ppo", "config": {"encoder": "custom_nets:wrong_width"}}})
    with pytest.raises(PipelineError) as err:
        check_pipeline(p, has_client=False)
    assert str(err.value) == ("algo.config.encoder: custom_nets:wrong_width(obs_space): its module maps float32 observations "
                              "(2, 4) to (2, 32), not (2, 16) (the output width it returned) (CartPole-v1)")


def test_ppo_initialises_the_built_in_image_encoders_orthogonally_and_dqn_keeps_torchs_defaults():
    """CleanRL's and SB3's PPO give their convolutions and the linear layer after them orthogonal
    weights of gain sqrt(2); the DQN papers' networks keep torch's defaults."""
    from tianji_dask.algos.encoders import MinAtarCNN, NatureCNN, encoder

    for shape in [(4, 10, 10), (4, 84, 84)]:
        enc, _ = encoder(shape, ortho=True)
        layers = [m for m in enc.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
        assert len(layers) == (2 if isinstance(enc, MinAtarCNN) else 4)
        for layer in layers:
            w = layer.weight.detach().flatten(1)
            gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
            assert torch.allclose(gram, 2.0 * torch.eye(gram.shape[0]), atol=1e-4)
            assert torch.count_nonzero(layer.bias) == 0
        plain, _ = encoder(shape)
        assert isinstance(plain, (MinAtarCNN, NatureCNN)) and torch.count_nonzero(plain.fc.bias) > 0
    ppo = make_algorithm("ppo", gym.spaces.Box(0, 1, (10, 10, 4), bool), gym.spaces.Discrete(3), {}, seed=0)
    w = ppo.net.critic_encoder.conv.weight.detach().flatten(1)
    assert torch.allclose(w @ w.T, 2.0 * torch.eye(16), atol=1e-4)
