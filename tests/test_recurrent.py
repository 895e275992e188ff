"""Recurrent PPO and IMPALA: the hidden state carried by the Rollout across chunks and reset at
episode ends is the one the learner unrolls from (log-probabilities equal step by step at
staleness 0), for Discrete and Box actions, flat and image observations; burn-in recomputes a
chunk's start state from the steps before it (exactly the stored one at staleness 0)."""

import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch

from tianji_dask.algos.impala import IMPALA, IMPALAConfig
from tianji_dask.algos.ppo import PPO, PPOConfig, gae
from tianji_dask.algos.recurrent import with_start_state
from tianji_dask.algos.recurrent_ppo import sequence_batch
from tianji_dask.chunk import validate_chunk
from tianji_dask.dataflow.direct.wire import decode, encode
from tianji_dask.envs.rollout import Rollout

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PIXELS = "PixelCartPole-v0"


class PixelCartPole(gym.ObservationWrapper):
    """CartPole seen as a 1x8x8 uint8 image: each state variable a bar, longer the larger it is."""

    def __init__(self, **kwargs):
        super().__init__(gym.make("CartPole-v1", **kwargs))
        self.observation_space = gym.spaces.Box(0, 255, (1, 8, 8), np.uint8)

    def observation(self, obs):
        bars = np.clip(obs[:, None] * 4 + 4 - np.arange(8), 0, 1) * 255
        return np.concatenate([bars, bars[::-1]])[None].astype(np.uint8)


if PIXELS not in gym.registry:
    gym.register(PIXELS, entry_point=PixelCartPole)

#: (algorithm, env id, env kwargs): Discrete and Box actions, flat and image observations
CASES = {
    "ppo": (PPO, "CartPole-v1", {}),
    "ppo-box": (PPO, "Pendulum-v1", {"max_episode_steps": 30}),
    "ppo-image": (PPO, PIXELS, {}),
    "impala": (IMPALA, "CartPole-v1", {}),
}


def _algo(case="ppo", kind="lstm", burn_in=0, **config):
    cls, env_id, kwargs = CASES[case]
    env = gym.make(env_id, **kwargs)
    cfg = (PPOConfig if cls is PPO else IMPALAConfig)(recurrent={"kind": kind, "hidden": 16, "burn_in": burn_in},
                                                       hidden=(32,), **config)
    return cls(env.observation_space, env.action_space, cfg)


def _rollout(case="ppo", num_envs=4):
    _, env_id, kwargs = CASES[case]
    return Rollout(env_id, num_envs, 0, kwargs)


def _learner_logprobs(algo, chunk):
    """The log-probabilities of a chunk's valid steps as the learner's own update computes them."""
    with torch.no_grad():
        if isinstance(algo, IMPALA):
            return algo._terms([with_start_state(algo, chunk)])["logp"].numpy()
        batch = sequence_batch(algo, [chunk], gae)
        feats = algo.net.unroll(batch["obs"], batch["state0"], batch["keep"])
        return algo.net.evaluate(feats, batch["actions"])[0][batch["valid"]].numpy()


@pytest.mark.parametrize("case,kind", [("ppo", "lstm"), ("ppo", "gru"), ("ppo-box", "lstm"), ("ppo-image", "gru"),
                                       ("impala", "lstm"), ("impala", "gru")])
def test_state_survives_chunks_and_resets_at_episode_ends(case, kind):
    algo = _algo(case, kind)
    rollout = _rollout(case)
    chunks = [rollout.run(algo, 40, {}, policy_version=0, explorer_id=0) for _ in range(3)]
    assert not chunks[-1]["valid"].all()  # an episode restarted inside the chunk
    assert np.abs(chunks[1]["state0"]).sum() > 0  # carried over, not zeroed
    for chunk in chunks:
        validate_chunk(chunk)
        assert "burn_obs" not in chunk
        np.testing.assert_allclose(_learner_logprobs(algo, chunk), chunk["extra_logprob"][chunk["valid"]], atol=1e-5)
    zeroed = dict(chunks[1], state0=np.zeros_like(chunks[1]["state0"]))
    assert not np.allclose(_learner_logprobs(algo, zeroed), chunks[1]["extra_logprob"][chunks[1]["valid"]], atol=1e-5)
    if case == "ppo-box":  # Gaussian samples, clipped only in the env
        actions = chunks[0]["actions"]
        assert actions.dtype == np.float32 and actions.shape == (40, 4, 1) and np.abs(actions).max() > 0
        assert np.abs(algo.env_action(actions * 10)).max() <= 2.0
    if case == "ppo-image":
        assert chunks[0]["obs"].dtype == np.uint8 and algo.net.actor_encoder is not None


@pytest.mark.parametrize("case,config", [("ppo", {}), ("ppo-box", {}), ("ppo-image", {}), ("impala", {"num_minibatches": 2})])
def test_learns_and_round_trips(case, config):
    algo = _algo(case, **config)
    rollout = _rollout(case)
    algo.ingest(rollout.run(algo, 32, {}, policy_version=0, explorer_id=0), 0)
    metrics = algo.learn()
    assert metrics["batch_env_steps"] > 0 and all(np.isfinite(v) for v in metrics.values())
    twin = _algo(case, **config)
    twin.set_weights(algo.get_weights())
    copy = pickle.loads(pickle.dumps(algo))
    for other in (twin, copy):
        for a, b in zip(algo.get_weights().values(), other.get_weights().values()):
            np.testing.assert_array_equal(a, b)
    loaded = _algo(case, **config)
    loaded.load_state_dict(algo.state_dict())
    assert loaded.updates == 1
    for a, b in zip(algo.net.state_dict().values(), loaded.net.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_unsupported_combinations_are_one_line():
    with pytest.raises(ValueError, match="minibatch_size .single steps. does not apply"):
        _algo("impala", minibatch_size=16)
    with pytest.raises(ValueError, match="leave shared_trunk false"):
        _algo("ppo", shared_trunk=True)


@pytest.mark.parametrize("case,burn_in,steps", [("ppo", 16, 24), ("ppo", 50, 20), ("impala", 16, 24)])
def test_burn_in_recomputes_the_stored_state_exactly_at_staleness_0(case, burn_in, steps):
    algo = _algo(case, burn_in=burn_in)
    rollout = _rollout(case)
    chunks = [rollout.run(algo, steps, {}, policy_version=0, explorer_id=0) for _ in range(4)]
    first = chunks[0]  # no history: padding steps, invalid, so the state entering step 0 is the initial one
    assert first["burn_obs"].shape == (burn_in, 4, 4) and not first["burn_valid"].any()
    assert not all(c["burn_valid"].all() for c in chunks[1:])  # an episode restarted inside some tail
    for chunk in chunks:
        validate_chunk(chunk)
        assert chunk["nbytes"] == sum(v.nbytes for v in chunk.values() if isinstance(v, np.ndarray))
        np.testing.assert_allclose(with_start_state(algo, chunk)["state0"], chunk["state0"], atol=1e-5)
        description, parts = encode(chunk)  # the direct path's wire format and Dask's pickling carry them
        wired = decode(description, np.frombuffer(b"".join(bytes(p) for p in parts), np.uint8).copy())
        for back in (wired, pickle.loads(pickle.dumps(chunk, protocol=5))):
            for name in ("state0", "burn_obs", "burn_valid", "burn_state"):
                np.testing.assert_array_equal(back[name], chunk[name])
    assert np.abs(chunks[2]["state0"]).sum() > 0
    # the learner's weights move on: the recomputed state is its own, no longer the explorer's
    algo.ingest(chunks[0], 0)
    metrics = algo.learn()  # the first chunk (no history) trains
    assert all(np.isfinite(v) for v in metrics.values())
    assert not np.allclose(with_start_state(algo, chunks[2])["state0"], chunks[2]["state0"], atol=1e-3)
    for chunk in chunks[1:]:
        algo.ingest(chunk, 1)
    assert all(np.isfinite(v) for v in algo.learn().values())


def test_chunks_carry_only_what_their_policy_needs():
    env = gym.make("CartPole-v1")
    feed_forward = PPO(env.observation_space, env.action_space, PPOConfig())
    plain = _rollout().run(feed_forward, 8, {}, policy_version=0, explorer_id=0)
    assert not {"state0", "burn_obs", "burn_valid", "burn_state"} & set(plain)
    stored = _rollout().run(_algo(), 8, {}, policy_version=0, explorer_id=0)
    assert "state0" in stored and "burn_obs" not in stored
    with pytest.raises(ValueError, match="chunk has no burn_obs"):
        with_start_state(_algo(burn_in=4), stored)
    bad = dict(_rollout().run(_algo(burn_in=4), 8, {}, policy_version=0, explorer_id=0))
    bad["burn_valid"] = bad["burn_valid"][:2]
    with pytest.raises(ValueError, match="chunk.burn_valid"):
        validate_chunk(bad)
