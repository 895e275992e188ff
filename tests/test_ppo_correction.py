"""PPO's ``off_policy: decoupled`` (AReaL's decoupled objective, arXiv:2505.24298): at staleness 0 it
is today's loss and update exactly, feed-forward and recurrent; on a chunk from another policy the
behaviour weight pi_prox/mu changes the loss and is truncated at ``is_cap``. Real torch, no cluster."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pydantic
import pytest
import torch

from tianji_dask.algos.ppo import PPO, PPOConfig, gae
from tianji_dask.algos.recurrent_ppo import sequence_batch, sequence_loss
from tianji_dask.envs.rollout import Rollout
from helpers import set_linear

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: env id, env kwargs: Discrete and Box actions
ENVS = {"discrete": ("CartPole-v1", {}), "box": ("Pendulum-v1", {"max_episode_steps": 30})}


def _spaces(case):
    env_id, kwargs = ENVS[case]
    env = gym.make(env_id, **kwargs)
    return env.observation_space, env.action_space


def _ppo(case="discrete", **config) -> PPO:
    return PPO(*_spaces(case), PPOConfig(**{"hidden": (32, 32), "update_epochs": 2, "num_minibatches": 4, **config}), seed=0)


def _chunk(policy, case="discrete", steps=32, num_envs=4, seed=0) -> dict:
    env_id, kwargs = ENVS[case]
    return Rollout(env_id, num_envs, seed, kwargs).run(policy, steps, {}, policy_version=0, explorer_id=0)


def _with_logprobs(chunk: dict, logprobs: np.ndarray) -> dict:
    """``chunk`` with these behaviour log-probabilities: [T, N], or one per valid step."""
    out = dict(chunk)
    lp = np.array(chunk["extra_logprob"], copy=True)
    if logprobs.shape == lp.shape:
        lp[...] = logprobs
    else:
        lp[chunk["valid"]] = logprobs
    out["extra_logprob"] = lp
    return out


def _learn(algo, chunk) -> dict:
    algo.ingest(chunk, staleness=0)
    return algo.learn()


def _assert_same_weights(a, b) -> None:
    for (name, x), y in zip(a.net.state_dict().items(), b.net.state_dict().values()):
        assert torch.equal(x, y), name


def _assert_weights_differ(a, b) -> None:
    assert any(not torch.equal(x, y) for x, y in zip(a.net.state_dict().values(), b.net.state_dict().values()))


# ---- (a) zero staleness: the decoupled loss is PPO's -------------------------------------------
@pytest.mark.parametrize("case", ["discrete", "box"])
def test_behaviour_equal_to_the_proximal_policy_gives_ppos_loss_and_update_exactly(case):
    none, decoupled = _ppo(case), _ppo(case, off_policy="decoupled")
    chunk = _chunk(_ppo(case), case)  # acted by a twin: the learners' RNGs (minibatch order) stay alike
    # mu := pi_prox as the learner computes it, so w = exp(0) = 1 exactly
    prox = decoupled.build_batch([chunk])["prox_logprobs"].numpy()
    chunk = _with_logprobs(chunk, prox)
    batch_none, batch_dec = none.build_batch([chunk]), decoupled.build_batch([chunk])
    torch.testing.assert_close(batch_dec["prox_logprobs"], batch_dec["logprobs"], rtol=0, atol=0)
    loss_none, stats_none = none.loss(batch_none)
    loss_dec, stats_dec = decoupled.loss(batch_dec)
    assert loss_dec.item() == loss_none.item()
    for k in stats_none:
        assert stats_dec[k].item() == stats_none[k].item(), k
    assert stats_dec["is_weight"].item() == 1.0 and stats_dec["is_truncated"].item() == 0.0
    # one update (all epochs x minibatches) from the same seed: the same weights, bit for bit
    m_none, m_dec = _learn(none, chunk), _learn(decoupled, chunk)
    _assert_same_weights(none, decoupled)
    assert m_dec["pg_loss"] == m_none["pg_loss"] and m_dec["is_weight"] == 1.0


@pytest.mark.parametrize("case", ["discrete", "box"])
def test_a_fresh_chunk_as_acted_matches_ppo_to_float_tolerance(case):
    # the explorer's own log-probabilities (numpy acting) differ from the learner's torch ones
    # only by rounding: w = 1 to float tolerance
    none, decoupled = _ppo(case), _ppo(case, off_policy="decoupled")
    chunk = _chunk(_ppo(case), case)
    loss_none, _ = none.loss(none.build_batch([chunk]))
    loss_dec, stats = decoupled.loss(decoupled.build_batch([chunk]))
    np.testing.assert_allclose(loss_dec.item(), loss_none.item(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats["is_weight"].item(), 1.0, atol=1e-5)
    m_none, m_dec = _learn(none, chunk), _learn(decoupled, chunk)
    for x, y in zip(none.net.parameters(), decoupled.net.parameters()):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(m_dec["pg_loss"], m_none["pg_loss"], rtol=1e-3, atol=1e-5)


# ---- (b) another behaviour policy: the weight, truncated ---------------------------------------
OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACT = gym.spaces.Discrete(2)


def _linear_ppo(**cfg) -> PPO:
    algo = PPO(OBS, ACT, PPOConfig(hidden=(), clip_coef=0.2, ent_coef=0.01, vf_coef=0.5, **cfg), seed=0)
    set_linear(algo.net.actor_head, [[0.5, -1.0, 0.0], [0.0, 1.0, 0.5]], [0.1, 0.0])
    set_linear(algo.net.critic_head, [[1.0, 0.5, -0.5]], [0.2])
    return algo


def test_the_decoupled_loss_by_hand_with_the_weight_truncated_at_the_cap():
    cap = 1.5
    algo = _linear_ppo(off_policy="decoupled", is_cap=cap)
    rng = np.random.default_rng(0)
    B = 8
    x = rng.normal(size=(B, 3)).astype(np.float32)
    actions = np.array([0, 1, 1, 0, 1, 0, 1, 0])
    logits = x @ np.array([[0.5, -1.0, 0.0], [0.0, 1.0, 0.5]]).T + [0.1, 0.0]
    logp_all = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    newlogp = logp_all[np.arange(B), actions]
    # the proximal policy a little behind the current one (ratios on both sides of the clip range) ...
    prox = newlogp + np.array([0.5, -0.5, 0.05, -0.05, 0.3, 0.0, -0.3, 0.1])
    # ... and the behaviour policy further behind: w = pi_prox/mu from 0.5 to 3, three above the cap
    mu = prox - np.log([1.0, 3.0, 0.5, 2.0, 1.2, 1.6, 0.8, 1.0])
    adv = np.array([1.0, -2.0, 0.5, 3.0, -1.0, 0.2, 1.5, -0.7])
    returns = rng.normal(size=B)
    values = x @ np.array([1.0, 0.5, -0.5]) + 0.2
    mb = {k: torch.tensor(v, dtype=torch.float32) for k, v in dict(
        obs=x, logprobs=mu, prox_logprobs=prox, advantages=adv, returns=returns, values=values).items()}
    mb["actions"] = torch.tensor(actions)
    loss, stats = algo.loss(mb)

    ratio = np.exp(newlogp - prox)  # r = pi / pi_prox, clipped around pi_prox
    assert np.any(ratio > 1.2) and np.any(ratio < 0.8)
    a = (adv - adv.mean()) / (adv.std(ddof=1) + 1e-8)
    surrogate = np.maximum(-a * ratio, -a * np.clip(ratio, 0.8, 1.2))
    w = np.exp(prox - mu)
    assert np.sum(w > cap) == 3
    pg = np.mean(np.minimum(w, cap) * surrogate)
    pg_untruncated = np.mean(w * surrogate)
    assert abs(pg - pg_untruncated) > 1e-2  # the check below fails without the truncation
    np.testing.assert_allclose(stats["pg_loss"].item(), pg, rtol=1e-5)
    np.testing.assert_allclose(stats["is_weight"].item(), np.minimum(w, cap).mean(), rtol=1e-5)
    np.testing.assert_allclose(stats["is_truncated"].item(), 3 / 8)
    np.testing.assert_allclose(stats["clipfrac"].item(), np.mean(np.abs(ratio - 1) > 0.2))
    vl = 0.5 * np.mean((values - returns) ** 2)
    ent = np.mean(-(np.exp(logp_all) * logp_all).sum(1))
    np.testing.assert_allclose(loss.item(), pg - 0.01 * ent + 0.5 * vl, rtol=1e-5)
    # the weight is data: the policy gradient flows through r only (the weight has no gradient)
    algo.net.zero_grad()
    loss.backward()
    assert algo.net.actor_head.weight.grad is not None
    # today's loss on the same minibatch (ratio to mu, no weight) is another number
    ppo_loss = _linear_ppo().loss(mb)[1]["pg_loss"].item()
    assert abs(ppo_loss - pg) > 1e-2


def _perturbed(algo: PPO, scale: float, seed: int = 1) -> PPO:
    """A copy of ``algo`` whose actor weights are moved by noise: another behaviour policy."""
    other = copy.deepcopy(algo)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in other.net.named_parameters():
            if not name.startswith("critic_"):
                p.add_(scale * torch.randn(p.shape, generator=gen))  # in place: the acting views see it
    return other


def test_a_chunk_from_a_perturbed_policy_is_reweighted_and_truncated():
    none, decoupled = _ppo(), _ppo(off_policy="decoupled", is_cap=2.0)
    chunk = _chunk(_perturbed(none, 0.5))
    batch = decoupled.build_batch([chunk])
    w = (batch["prox_logprobs"] - batch["logprobs"]).exp()
    assert (w > 2.0).any() and (w < 0.6).any()  # the chunk is far off the learner's policy
    loss_none = none.loss(none.build_batch([chunk]))[0].item()
    loss_dec, stats = decoupled.loss(batch)
    assert abs(loss_dec.item() - loss_none) > 1e-3
    assert stats["is_truncated"].item() == pytest.approx((w > 2.0).float().mean().item())
    # with a cap too high to bite, the loss differs: the truncation is what makes it
    loose = _ppo(off_policy="decoupled", is_cap=1e9).loss(batch)[0].item()
    assert abs(loose - loss_dec.item()) > 1e-4
    m_none, m_dec = _learn(none, chunk), _learn(decoupled, chunk)
    _assert_weights_differ(none, decoupled)
    assert 0.0 < m_dec["is_truncated"] < 1.0 and np.isfinite(list(m_dec.values())).all()
    assert "is_weight" not in m_none


# ---- (c) recurrent PPO shares the option -------------------------------------------------------
def _recurrent(case="discrete", burn_in=0, **config) -> PPO:
    spec = {"kind": "lstm" if case == "discrete" else "gru", "hidden": 16, "burn_in": burn_in}
    return PPO(*_spaces(case), PPOConfig(recurrent=spec, hidden=(32,), num_minibatches=2, **config), seed=0)


@pytest.mark.parametrize("case,burn_in", [("discrete", 0), ("box", 6)])
def test_recurrent_ppo_decoupled_is_ppo_at_zero_staleness(case, burn_in):
    none, decoupled = _recurrent(case, burn_in), _recurrent(case, burn_in, off_policy="decoupled")
    env_id, kwargs = ENVS[case]
    rollout, actor = Rollout(env_id, 4, 0, kwargs), _recurrent(case, burn_in)  # a twin acts: the learners' RNGs stay alike
    rollout.run(actor, 16, {}, policy_version=0, explorer_id=0)  # the next chunk has burn-in steps before it
    chunk = rollout.run(actor, 24, {}, policy_version=0, explorer_id=0)
    prox = sequence_batch(decoupled, [chunk], gae)["prox_logprobs"].numpy()
    valid = chunk["valid"]
    np.testing.assert_allclose(prox[valid], chunk["extra_logprob"][valid], atol=1e-5)  # pi_prox = mu up to rounding
    chunk = _with_logprobs(chunk, prox)
    batch_none, batch_dec = sequence_batch(none, [chunk], gae), sequence_batch(decoupled, [chunk], gae)
    loss_none, stats_none = sequence_loss(none, batch_none, True)
    loss_dec, stats_dec = sequence_loss(decoupled, batch_dec, True)
    assert loss_dec.item() == loss_none.item() and stats_dec["is_weight"].item() == 1.0
    _learn(none, chunk), _learn(decoupled, chunk)
    _assert_same_weights(none, decoupled)


def test_recurrent_ppo_decoupled_reweights_a_perturbed_policys_chunk():
    none, decoupled = _recurrent(), _recurrent(off_policy="decoupled")
    chunk = _chunk(_perturbed(none, 0.5), steps=24)
    batch = sequence_batch(decoupled, [chunk], gae)
    loss_none = sequence_loss(none, sequence_batch(none, [chunk], gae), False)[0].item()
    loss_dec, stats = sequence_loss(decoupled, batch, True)
    assert abs(loss_dec.item() - loss_none) > 1e-4 and stats["is_truncated"].item() > 0
    loose = sequence_loss(_recurrent(off_policy="decoupled", is_cap=1e9), batch, False)[0].item()
    assert abs(loose - loss_dec.item()) > 1e-4  # the truncation bites
    _learn(none, chunk), _learn(decoupled, chunk)
    _assert_weights_differ(none, decoupled)


# ---- the config ---------------------------------------------------------------------------------
def test_the_option_defaults_to_none_and_is_checked():
    assert PPOConfig().off_policy == "none" and PPOConfig().is_cap == 2.0
    with pytest.raises(pydantic.ValidationError, match="off_policy"):
        PPOConfig(off_policy="vtrace")
    with pytest.raises(pydantic.ValidationError, match="is_cap"):
        PPOConfig(is_cap=0.5)
