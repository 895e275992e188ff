"""Recurrent PPO: the hidden state carried by the Rollout across chunks and reset at episode ends
is the one the learner unrolls from (log-probabilities equal step by step at staleness 0)."""

import pickle

import gymnasium as gym
import numpy as np
import torch

from tianji_dask.algos.ppo import PPO, PPOConfig
from tianji_dask.algos.recurrent import segment_features
from tianji_dask.envs.rollout import Rollout


def _algo(kind="lstm"):
    env = gym.make("CartPole-v1")
    return PPO(env.observation_space, env.action_space, PPOConfig(recurrent={"kind": kind, "hidden": 16}, hidden=(32,)))


def _learner_logprobs(algo, chunk):
    with torch.no_grad():
        feats = segment_features(algo.net, chunk["obs"], chunk, "cpu")
        logp = torch.log_softmax(algo.net.logits(feats[:-1]), -1)
        return logp.gather(-1, torch.as_tensor(chunk["actions"]).long().unsqueeze(-1)).squeeze(-1).numpy()


def test_state_survives_chunks_and_resets_at_episode_ends():
    for kind in ("lstm", "gru"):
        algo = _algo(kind)
        rollout = Rollout("CartPole-v1", 4, 0)
        chunks = [rollout.run(algo, 40, {}, policy_version=0, explorer_id=0) for _ in range(3)]
        assert not chunks[-1]["valid"].all()  # an episode restarted inside the chunk
        assert np.abs(chunks[1]["state0"]).sum() > 0  # carried over, not zeroed
        for chunk in chunks:
            np.testing.assert_allclose(_learner_logprobs(algo, chunk), chunk["extra_logprob"], atol=1e-5)
        zeroed = dict(chunks[1], state0=np.zeros_like(chunks[1]["state0"]))
        assert not np.allclose(_learner_logprobs(algo, zeroed), chunks[1]["extra_logprob"], atol=1e-5)


def test_learns_and_round_trips():
    algo = _algo()
    rollout = Rollout("CartPole-v1", 4, 0)
    algo.ingest(rollout.run(algo, 32, {}, policy_version=0, explorer_id=0), 0)
    metrics = algo.learn()
    assert metrics["batch_env_steps"] > 0 and np.isfinite(metrics["v_loss"])
    twin = _algo()
    twin.set_weights(algo.get_weights())
    copy = pickle.loads(pickle.dumps(algo))
    for other in (twin, copy):
        for a, b in zip(algo.get_weights().values(), other.get_weights().values()):
            np.testing.assert_array_equal(a, b)
    loaded = _algo()
    loaded.load_state_dict(algo.state_dict())
    assert loaded.updates == 1
