"""A recurrent policy wherever a trained policy acts: ``play_episodes`` (evaluations, ``tianji-dask
eval``, videos) carries the state and starts each episode afresh; ``load_policy`` acts as the
algorithm's ``act_recurrent`` with exploration off; TorchScript and ONNX exports take and give the
state and act as ``load_policy`` does, step by step; ``check_algorithm`` checks ``act_recurrent``
and the policy module. On CartPoleNoVel, which needs memory; no Dask."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

import tianji_dask.envs.masked  # noqa: F401 - registers CartPoleNoVel-v1
from tianji_dask.algos import make_algorithm
from tianji_dask.algos.ppo import PPO, PPOConfig
from tianji_dask.config import load_pipeline, pipeline_yaml
from tianji_dask.core import checkpoint
from tianji_dask.envs.play import DETERMINISTIC, play_episodes
from tianji_dask.envs.rollout import Rollout
from tianji_dask.envs.vector import make_vec_env
from tianji_dask.export import Policy, export_policy, load_policy
from tianji_dask.testing import AlgorithmCheckError, check_algorithm
from tianji_dask.acting import Acting

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ENV = "tianji_dask.envs.masked:CartPoleNoVel-v1"
RECURRENT = {"kind": "lstm", "hidden": 16}


def _algo(kind: str = "lstm", **config) -> PPO:
    env = make_vec_env(ENV, 1)
    try:
        return PPO(env.single_observation_space, env.single_action_space,
                   PPOConfig(recurrent={"kind": kind, "hidden": 16}, hidden=(32,), **config))
    finally:
        env.close()


def _trained(algo: PPO) -> PPO:
    """``algo`` after one update on a chunk of its own (weights and statistics not as initialised),
    its policy head then drawn at random, N(0, 1): one update leaves one action winning the argmax
    everywhere, a random head makes the greedy action follow the observation and the state."""
    rollout = Rollout(ENV, 4, 0)
    try:
        algo.ingest(rollout.run(algo, 32, {}, policy_version=0, explorer_id=0), 0)
    finally:
        rollout.close()
    algo.learn()
    with torch.no_grad():
        head = algo.net.actor_head.weight
        head.copy_(torch.randn(head.shape, generator=torch.Generator().manual_seed(3)))
    return algo


class Recorded(Acting):
    """A policy that records each ``act_recurrent`` call's state in and state out."""

    def __init__(self, algo):
        self.algo, self.calls = algo, []

    def initial_state(self, num_envs):
        return self.algo.initial_state(num_envs)

    def act_recurrent(self, obs, state, explore):
        actions, extra, new_state = self.algo.act_recurrent(obs, state, explore)
        self.calls.append((state.copy(), new_state.copy()))
        return actions, extra, new_state

    def act(self, obs, explore):
        raise AssertionError("a recurrent policy acts through act_recurrent")

    def env_action(self, actions):
        return actions


def _hand_played(algo, episodes: int, seed: int) -> tuple[list, list]:
    """What play_episodes must do with a recurrent policy, written out: each episode from zeros."""
    env = make_vec_env(ENV, 1)
    returns, lengths = [], []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            state, total, steps, done = np.zeros((1, algo.net.state_size), np.float32), 0.0, 0, False
            while not done:
                actions, _, state = algo.act_recurrent(obs, state, DETERMINISTIC)
                obs, reward, terminated, truncated, _ = env.step(actions)
                total, steps, done = total + float(reward.sum()), steps + 1, bool(terminated.any() or truncated.any())
            returns.append(total)
            lengths.append(steps)
    finally:
        env.close()
    return returns, lengths


def test_play_episodes_carries_the_state_and_starts_each_episode_from_the_initial_one():
    algo = _trained(_algo(normalize_obs=True))
    policy = Recorded(algo)
    env = make_vec_env(ENV, 1)
    try:
        returns, lengths = play_episodes(policy, env, 3, 5, DETERMINISTIC)
    finally:
        env.close()
    assert (returns, lengths) == _hand_played(algo, 3, 5)
    assert len(policy.calls) == sum(lengths) and min(lengths) > 1
    starts = np.cumsum([0, *lengths[:-1]])
    for i, (state_in, _) in enumerate(policy.calls):
        if i in starts:
            assert not state_in.any()  # an episode's first step: the initial state
        else:
            np.testing.assert_array_equal(state_in, policy.calls[i - 1][1])  # the state the previous step left
            assert state_in.any()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory as a run leaves it: its pipeline (recurrent PPO on CartPoleNoVel, obs
    normalized) and a checkpoint of an algorithm one update in."""
    p = load_pipeline("cartpole_ppo", overrides={"env.id": ENV, "algo.config.recurrent": RECURRENT,
                                                 "algo.config.hidden": [32], "algo.config.normalize_obs": True})
    out = tmp_path_factory.mktemp("recurrent") / "run"
    out.mkdir()
    (out / "pipeline.yaml").write_text(pipeline_yaml(p))
    env = make_vec_env(p.env.id, 1)
    algo = make_algorithm(p.algo.name, env.single_observation_space, env.single_action_space, p.algo_config, p.seed)
    env.close()
    checkpoint.save(out / "checkpoints", {"version": 1, "algo": _trained(algo).state_dict()})
    return out


def _stepped(policy: Policy, steps: int, other=None):
    """Step 4 envs ``steps`` times with ``policy.act`` carrying its state, episode starts marked;
    ``other(obs, start)`` (its own state carried) gives (actions, state) compared at every step.
    Returns the episodes that ended; asserts that the policy took both actions (the comparison means something)."""
    env = make_vec_env(ENV, 4, seed=11)
    obs, _ = env.reset(seed=11)
    state, start, resetting, ended, taken = None, np.ones(4, bool), np.zeros(4, bool), 0, set()
    try:
        for _ in range(steps):
            actions, state = policy.act(obs, state=state, episode_start=start)
            taken.update(actions.tolist())
            if other is not None:
                their_actions, their_state = other(obs, start)
                assert their_actions.dtype == np.int64 and np.array_equal(their_actions, actions)
                np.testing.assert_allclose(their_state, state, rtol=0, atol=1e-5)
            obs, _, terminated, truncated, _ = env.step(actions)
            start, resetting = resetting, terminated | truncated  # the step after a reset step begins an episode
            ended += int(resetting.sum())
    finally:
        env.close()
    assert taken == {0, 1}
    return ended


def test_load_policy_acts_as_act_recurrent_with_exploration_off(run_dir):
    policy = load_policy(run_dir)
    assert policy.recurrent and policy.version == 1 and policy.initial_state().shape == (32,)
    assert policy.initial_state(3).shape == (3, 32) and policy.initial_state(3).dtype == np.float32
    algo = _algo(normalize_obs=True)
    algo.load_state_dict(checkpoint.load(policy.checkpoint)["algo"])
    reference = {"state": algo.initial_state(4)}

    def act_recurrent(obs, start):
        reference["state"][start] = 0.0
        actions, _, reference["state"] = algo.act_recurrent(obs, reference["state"], DETERMINISTIC)
        return actions, reference["state"]

    assert _stepped(policy, 250, act_recurrent) > 4  # episodes restarted along the way

    obs = np.array([[0.01, -0.02], [0.03, 0.04]], np.float32)
    state = np.random.default_rng(0).normal(size=(2, 32)).astype(np.float32)
    actions, new_state = policy.act(obs, state=state)
    one_action, one_state = policy.act(obs[1], state=state[1])  # one observation: as in a batch
    assert one_action == actions[1] and one_state.shape == (32,)
    np.testing.assert_allclose(one_state, new_state[1], rtol=0, atol=1e-6)
    restarted, restarted_state = policy.act(obs, state=state, episode_start=np.array([False, True]))
    fresh, fresh_state = policy.act(obs)  # no state: the initial one
    np.testing.assert_array_equal(restarted_state[0], new_state[0])
    np.testing.assert_array_equal(restarted_state[1], fresh_state[1])
    with pytest.raises(ValueError, match=r"^state: shape \(3, 32\); allowed: \(2, 32\) \(one row per observation\)"):
        policy.act(obs, state=np.zeros((3, 32)))
    with pytest.raises(ValueError, match=r"^state: shape \(2, 32\); allowed: \(32,\) \(the state of one observation\)"):
        policy.act(obs[0], state=state)
    with pytest.raises(ValueError, match=r"^episode_start: shape \(3,\); allowed: \(\) or \(2,\)"):
        policy.act(obs, state=state, episode_start=np.zeros(3, bool))


def test_a_feed_forward_policy_acts_as_before_and_takes_no_state():
    env = make_vec_env("CartPole-v1", 1)
    algo = PPO(env.single_observation_space, env.single_action_space, PPOConfig())
    env.close()
    policy = Policy(algo, algo.obs_space, algo.action_space, 0, "in memory")
    obs = np.zeros((3, 4), np.float32)
    assert not policy.recurrent and policy.initial_state() is None and policy.initial_state(3) is None
    np.testing.assert_array_equal(policy.act(obs), algo.act(obs, DETERMINISTIC)[0])
    with pytest.raises(ValueError, match=r"^state: PPO's policy is feed-forward \(no state\); allowed: state=None"):
        policy.act(obs, state=np.zeros((3, 8), np.float32))


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_exports_take_and_give_the_state_and_act_as_load_policy_does(run_dir, tmp_path, fmt):
    policy = load_policy(run_dir)
    if fmt == "onnx":
        ort = pytest.importorskip("onnxruntime", reason="the ONNX check needs onnxruntime (pip install 'tianji-dask[test]')")
        path = export_policy(run_dir, "onnx", tmp_path / "policy.onnx")
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == ["obs", "state"]
        assert [o.name for o in session.get_outputs()] == ["action", "new_state"]
        meta = json.loads(session.get_modelmeta().custom_metadata_map["tianji.json"])

        def run(obs, state):
            return session.run(None, {"obs": obs.astype(np.float32), "state": state})
    else:
        path = export_policy(run_dir, "torchscript", tmp_path / "policy.pt")
        extra = {"tianji.json": ""}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.load's notice of torch.export
            scripted = torch.jit.load(str(path), _extra_files=extra)
        meta = json.loads(extra["tianji.json"])

        def run(obs, state):
            with torch.no_grad():
                action, new_state = scripted(torch.from_numpy(obs.astype(np.float32)), torch.from_numpy(state))
            return action.numpy(), new_state.numpy()
    assert meta["state_shape"] == [32] and meta["version"] == policy.version
    carried = {"state": np.zeros((4, 32), np.float32)}

    def exported(obs, start):
        carried["state"][start] = 0.0  # the initial state, as the metadata's state_shape of zeros
        actions, carried["state"] = run(obs, carried["state"])
        carried["state"] = np.array(carried["state"])
        return actions, carried["state"]

    assert _stepped(policy, 500, exported) > 10
    actions, _ = run(np.zeros((7, 2), np.float32), np.zeros((7, 32), np.float32))  # the batch dimension is free
    assert actions.shape == (7,)


class FloatState(PPO):
    """A recurrent algorithm whose new state comes back as float64."""

    def act_recurrent(self, obs, state, explore):
        actions, extra, new_state = super().act_recurrent(obs, state, explore)
        return actions, extra, new_state.astype(np.float64)


class _Stateless(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, obs, state):
        return self.module(obs, torch.zeros_like(state))


class ForgetfulModule(PPO):
    """A recurrent algorithm whose exported policy forgets the state it is given."""

    def policy_module(self):
        return _Stateless(super().policy_module())


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_check_algorithm_checks_act_recurrent_and_the_policy_module(kind):
    config = {"recurrent": {"kind": kind, "hidden": 16}, "hidden": [32], "normalize_obs": True}
    assert check_algorithm("ppo", ENV, config=config, chunk_steps=16, updates=1) == []
    cls = FloatState if kind == "lstm" else ForgetfulModule
    with pytest.raises(AlgorithmCheckError) as err:
        check_algorithm(cls, ENV, config=config, chunk_steps=16, updates=1)
    says = ("FloatState.act_recurrent: the new state must be a float32 array shaped as initial_state()'s (4, 32), "
            "got an array of shape (4, 32) of float64") if kind == "lstm" else \
        "ForgetfulModule.policy_module: its new_state differs from act_recurrent's at step 1"
    assert err.value.violations == [says]
