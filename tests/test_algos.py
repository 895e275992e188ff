"""Unit tests of DQN, PPO and IMPALA without Dask: losses, targets and returns against direct
computations on small hand-made batches."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch

from tianji_dask.algos import make_algorithm
from tianji_dask.algos.dqn import DQN, DQNConfig
from tianji_dask.algos.impala import IMPALA, IMPALAConfig, vtrace
from tianji_dask.algos.models import ActorCritic, QNetwork
from tianji_dask.algos.optim import Adam, clip_grad_norm
from tianji_dask.algos.ppo import PPO, PPOConfig, gae
from tianji_dask.algos.replay_buffer import ReplayBuffer, nstep_transitions
from tianji_dask.chunk import make_chunk
from tianji_dask.envs.rollout import Rollout
from tianji_dask.envs.vector import env_spaces
from helpers import acted_chunk, hand_chunk, set_linear

OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)


pytestmark = pytest.mark.usefixtures("one_torch_thread")



ACT = gym.spaces.Discrete(2)


# ---- replay and n-step returns ---------------------------------------------------------------
def test_replay_ring_buffer_wraps_around_keeping_the_newest():
    buf = ReplayBuffer(capacity=5)
    assert buf.storage is None  # nothing allocated until data arrives

    def batch(lo, hi):
        x = np.arange(lo, hi, dtype=np.float32)
        return {"obs": x[:, None], "actions": np.arange(lo, hi), "rewards": x, "next_obs": x[:, None] + 1,
                "discounts": np.ones(hi - lo, np.float32)}

    buf.add(batch(0, 3))
    assert (len(buf), buf.pos) == (3, 3)
    buf.add(batch(3, 7))  # 3, 4 fill the end; 5, 6 overwrite slots 0, 1
    assert (len(buf), buf.pos) == (5, 2)
    np.testing.assert_array_equal(buf.storage["rewards"], [5, 6, 2, 3, 4])
    np.testing.assert_array_equal(buf.storage["next_obs"][:, 0], [6, 7, 3, 4, 5])
    buf.add(batch(7, 20))  # more than the capacity: only the newest 5
    assert (len(buf), buf.pos) == (5, 2)
    assert sorted(buf.storage["actions"].tolist()) == [15, 16, 17, 18, 19]
    sample = buf.sample(100)
    assert set(sample["actions"].tolist()) <= {15, 16, 17, 18, 19}
    np.testing.assert_array_equal(sample["obs"][:, 0], sample["actions"])


def nstep_by_loop(chunk, gamma, n):
    """Direct per-transition computation of the n-step windows."""
    T, N = chunk["rewards"].shape
    out = []
    for t in range(T):
        for i in range(N):
            if not chunk["valid"][t, i]:
                continue
            g = 0.0
            for j in range(t, min(t + n, T)):
                g += gamma ** (j - t) * chunk["rewards"][j, i]
                if chunk["terminated"][j, i]:
                    disc = 0.0
                    break
                disc = gamma ** (j - t + 1)
                if chunk["truncated"][j, i]:
                    break
            out.append((t, i, g, j + 1, disc))
    return out


@pytest.mark.parametrize("n", [1, 3, 5])
def test_nstep_transitions_match_a_direct_loop(n):
    gamma = 0.9
    chunk = hand_chunk(T=12, N=4, seed=n, done_p=0.3)
    assert chunk["terminated"].any() and chunk["truncated"].any() and not chunk["valid"].all()
    got = nstep_transitions(chunk, gamma, n)
    expected = nstep_by_loop(chunk, gamma, n)
    assert len(got["rewards"]) == len(expected) == chunk["env_steps"]
    for k, (t, i, g, nxt, disc) in enumerate(expected):
        np.testing.assert_allclose(got["rewards"][k], g, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["discounts"][k], disc, rtol=1e-6)
        np.testing.assert_array_equal(got["obs"][k], chunk["obs"][t, i])
        np.testing.assert_array_equal(got["next_obs"][k], chunk["obs"][nxt, i])
        assert got["actions"][k] == chunk["actions"][t, i]


def test_nstep_hand_values_with_a_terminal_mid_window():
    # one env: steps 0,1 normal, 2 terminated, 3 invalid (reset), 4 normal
    T = 5
    chunk = make_chunk(
        obs=np.arange(T + 1, dtype=np.float32).reshape(T + 1, 1, 1), actions=np.zeros((T, 1), np.int64),
        rewards=np.array([[1.0], [2.0], [4.0], [0.0], [8.0]], np.float32),
        terminated=np.array([[0], [0], [1], [0], [0]], bool), truncated=np.zeros((T, 1), bool),
        valid=np.array([[1], [1], [1], [0], [1]], bool), extras={}, explorer_id=0, policy_version=0,
        t_start=0.0, t_end=0.0, episodes=[])
    got = nstep_transitions(chunk, gamma=0.5, n=3)
    np.testing.assert_allclose(got["rewards"], [1 + 0.5 * 2 + 0.25 * 4, 2 + 0.5 * 4, 4, 8])
    np.testing.assert_allclose(got["discounts"], [0, 0, 0, 0.5])  # last: chunk end, 1 step
    np.testing.assert_array_equal(got["next_obs"][:, 0], [3, 3, 3, 5])
    np.testing.assert_array_equal(got["obs"][:, 0], [0, 1, 2, 4])


# ---- DQN -------------------------------------------------------------------------------------
def linear_dqn(**cfg) -> DQN:
    """DQN whose Q is linear in the observation (no hidden layers), with known weights."""
    algo = DQN(OBS, ACT, DQNConfig(hidden=(), **cfg), seed=0)
    set_linear(algo.q.head, [[1.0, 0.0, -1.0], [0.5, 2.0, 0.0]], [0.1, -0.2])
    set_linear(algo.target.head, [[0.0, 1.0, 1.0], [1.0, -1.0, 0.5]], [0.0, 0.3])
    return algo


def dqn_batch():
    return {
        "obs": torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 2.0], [3.0, -1.0, 1.0]]),
        "actions": torch.tensor([0, 1, 1]),
        "rewards": torch.tensor([1.0, 0.5, -2.0]),
        "next_obs": torch.tensor([[0.0, 2.0, 1.0], [1.0, 1.0, 1.0], [4.0, 0.0, -1.0]]),
        "discounts": torch.tensor([0.9, 0.0, 0.81]),
    }


def np_q(w, b, x):
    return x @ np.asarray(w).T + np.asarray(b)


@pytest.mark.parametrize("double_q", [True, False])
def test_dqn_td_targets_double_q(double_q):
    algo = linear_dqn(double_q=double_q)
    batch = dqn_batch()
    nxt = batch["next_obs"].numpy()
    q_online = np_q([[1.0, 0.0, -1.0], [0.5, 2.0, 0.0]], [0.1, -0.2], nxt)
    q_target = np_q([[0.0, 1.0, 1.0], [1.0, -1.0, 0.5]], [0.0, 0.3], nxt)
    if double_q:  # online net picks, target net evaluates
        q_next = q_target[np.arange(3), q_online.argmax(1)]
    else:
        q_next = q_target.max(1)
    expected = batch["rewards"].numpy() + batch["discounts"].numpy() * q_next
    got = algo.td_targets(batch["rewards"], batch["next_obs"], batch["discounts"]).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # the two rules really differ on this batch (row 0: online argmax 1, target argmax 0)
    assert q_online[0].argmax() != q_target[0].argmax()


@pytest.mark.parametrize("loss", ["huber", "mse"])
def test_dqn_loss_against_direct_computation(loss):
    algo = linear_dqn(loss=loss)
    batch = dqn_batch()
    x, nxt = batch["obs"].numpy(), batch["next_obs"].numpy()
    q_online_next = np_q([[1.0, 0.0, -1.0], [0.5, 2.0, 0.0]], [0.1, -0.2], nxt)
    q_target_next = np_q([[0.0, 1.0, 1.0], [1.0, -1.0, 0.5]], [0.0, 0.3], nxt)
    y = batch["rewards"].numpy() + batch["discounts"].numpy() * q_target_next[np.arange(3), q_online_next.argmax(1)]
    q = np_q([[1.0, 0.0, -1.0], [0.5, 2.0, 0.0]], [0.1, -0.2], x)[np.arange(3), batch["actions"].numpy()]
    d = q - y
    if loss == "huber":
        expected = np.mean(np.where(np.abs(d) < 1, 0.5 * d**2, np.abs(d) - 0.5))
    else:
        expected = np.mean(d**2)
    got, got_q, got_target = algo.loss(batch)
    np.testing.assert_allclose(got_target.numpy(), y, rtol=1e-6)
    np.testing.assert_allclose(got_q.detach().numpy(), q, rtol=1e-6)
    np.testing.assert_allclose(got.item(), expected, rtol=1e-5)


def test_dqn_dueling_head_combines_value_and_centred_advantage():
    net = QNetwork(3, 2, hidden=(), dueling=True)
    set_linear(net.value, [[1.0, 1.0, 1.0]], [0.5])
    set_linear(net.advantage, [[1.0, 0.0, 0.0], [0.0, 0.0, 3.0]], [0.0, 1.0])
    x = np.array([[1.0, 2.0, 3.0]], np.float32)
    v, adv = 6.5, np.array([1.0, 10.0])
    expected = v + adv - adv.mean()
    np.testing.assert_allclose(net(torch.from_numpy(x)).detach().numpy()[0], expected, rtol=1e-6)
    np.testing.assert_allclose(net.numpy_forward(x)[0], expected, rtol=1e-6)


def filled_dqn(**cfg) -> DQN:
    algo = DQN(OBS, ACT, DQNConfig(**{"learning_starts": 10, "batch_size": 8, **cfg}), seed=0)
    algo.ingest(hand_chunk(T=20, N=2, seed=1, done_p=0.2), staleness=0)
    return algo


def test_dqn_hard_target_update_every_interval():
    algo = filled_dqn(target_update_interval=3, updates_per_env_step=1.0)
    before = [p.clone() for p in algo.target.parameters()]

    def same(a, b):
        return all(torch.equal(x, y) for x, y in zip(a, b))

    for _ in range(2):
        algo.learn()
    assert same(algo.target.parameters(), before)  # not yet
    assert not same(algo.q.parameters(), before)  # while the online net moved
    algo.learn()
    assert same(algo.target.parameters(), algo.q.parameters())


def test_dqn_polyak_target_update():
    algo = filled_dqn(target_update_interval=1, tau=0.25)
    old_target = [p.clone() for p in algo.target.parameters()]
    algo.learn()
    for t, old, q in zip(algo.target.parameters(), old_target, algo.q.parameters()):
        torch.testing.assert_close(t, 0.75 * old + 0.25 * q)


def test_dqn_epsilon_schedule_is_linear_then_flat():
    algo = DQN(OBS, ACT, DQNConfig(eps_start=1.0, eps_final=0.1, eps_decay_steps=1000), seed=0)
    assert algo.exploration(0, 0) == {"epsilon": 1.0}
    assert algo.exploration(500, 7)["epsilon"] == pytest.approx(0.55)
    assert algo.exploration(1000, 0)["epsilon"] == pytest.approx(0.1)
    assert algo.exploration(10**6, 0)["epsilon"] == pytest.approx(0.1)


def test_dqn_act_epsilon_greedy():
    algo = DQN(OBS, ACT, DQNConfig(hidden=()), seed=0)
    set_linear(algo.q.head, [[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]], [0.0, 0.0])
    obs = np.array([[1.0, 0, 0], [-1.0, 0, 0]] * 500, np.float32)
    greedy = np.array([0, 1] * 500)
    actions, extras = algo.act(obs, {"epsilon": 0.0})
    np.testing.assert_array_equal(actions, greedy)
    assert extras == {}
    actions, _ = algo.act(obs, {"epsilon": 0.5})
    # random actions half the time, of which half happen to be greedy: ~25% differ
    assert 0.18 < np.mean(actions != greedy) < 0.32


def test_dqn_replay_ratio_in_ready():
    algo = DQN(OBS, ACT, DQNConfig(learning_starts=40, updates_per_env_step=0.25, batch_size=4), seed=0)
    algo.ingest(hand_chunk(T=15, N=2, seed=0), staleness=0)  # 30 steps < warm-up
    assert not algo.ready()
    algo.ingest(hand_chunk(T=15, N=2, seed=1), staleness=3)  # 60 steps: 21 past the warm-up
    n = 0
    while algo.ready():
        algo.learn()
        n += 1
    assert n == 5  # floor(21 * 0.25)
    assert algo.chunks_per_update() == 1  # any chunk feeds the replay: the base's default


def test_dqn_learn_reduces_td_loss_on_a_fixed_batch():
    algo = filled_dqn(lr=1e-2, target_update_interval=10**6)
    batch = {k: torch.from_numpy(v) for k, v in algo.replay.gather(np.arange(len(algo.replay))).items()}
    first = algo.loss(batch)[0].item()
    for _ in range(200):
        metrics = algo.learn()
    assert algo.loss(batch)[0].item() < 0.5 * first
    assert metrics["samples"] == 8.0 and set(metrics) >= {"loss", "q_mean"}


# ---- PPO -------------------------------------------------------------------------------------
def gae_by_loop(rewards, values, terminated, truncated, valid, gamma, lam):
    """Per env, per step, backwards, with the episode-boundary rules spelled out."""
    T, N = rewards.shape
    adv = np.zeros((T, N))
    for i in range(N):
        running = 0.0
        for t in reversed(range(T)):
            if not valid[t, i]:
                running = 0.0
                continue
            if terminated[t, i]:
                running = rewards[t, i] - values[t, i]
            elif truncated[t, i]:
                running = rewards[t, i] + gamma * values[t + 1, i] - values[t, i]
            else:
                later = running if t + 1 < T else 0.0
                running = rewards[t, i] + gamma * values[t + 1, i] - values[t, i] + gamma * lam * later
            adv[t, i] = running
    return adv


def test_gae_matches_a_direct_loop_with_terminated_truncated_and_reset_steps():
    chunk = hand_chunk(T=16, N=5, seed=3, done_p=0.3)
    assert chunk["terminated"].any() and chunk["truncated"].any() and not chunk["valid"].all()
    values = np.random.default_rng(0).normal(size=(17, 5)).astype(np.float32)
    args = (chunk["rewards"], values, chunk["terminated"], chunk["truncated"], chunk["valid"])
    adv, ret = gae(*args, gamma=0.97, lam=0.9)
    expected = gae_by_loop(*args, gamma=0.97, lam=0.9)
    np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret[chunk["valid"]], (expected + values[:16])[chunk["valid"]], rtol=1e-5, atol=1e-5)
    assert np.all(adv[~chunk["valid"]] == 0)


def test_gae_hand_values():
    # one env, gamma=0.5, lam=0.5: step 0 normal, step 1 truncated (bootstraps from V(obs[2]))
    r = np.array([[1.0], [1.0]], np.float32)
    v = np.array([[2.0], [4.0], [8.0]], np.float32)
    f = np.zeros((2, 1), bool)
    adv, _ = gae(r, v, f, np.array([[False], [True]]), ~f, 0.5, 0.5)
    d1 = 1 + 0.5 * 8 - 4
    d0 = 1 + 0.5 * 4 - 2
    np.testing.assert_allclose(adv[:, 0], [d0 + 0.25 * d1, d1])
    adv, _ = gae(r, v, f, f, ~f, 0.5, 0.5)  # not truncated: still bootstraps from the last frame
    np.testing.assert_allclose(adv[:, 0], [d0 + 0.25 * d1, d1])
    adv, _ = gae(r, v, np.array([[False], [True]]), f, ~f, 0.5, 0.5)  # terminated: no bootstrap
    np.testing.assert_allclose(adv[:, 0], [d0 + 0.25 * (1 - 4), 1 - 4])


def linear_ppo(**cfg) -> PPO:
    algo = PPO(OBS, ACT, PPOConfig(hidden=(), **cfg), seed=0)
    set_linear(algo.net.actor_head, [[0.5, -1.0, 0.0], [0.0, 1.0, 0.5]], [0.1, 0.0])
    set_linear(algo.net.critic_head, [[1.0, 0.5, -0.5]], [0.2])
    return algo


@pytest.mark.parametrize("clip_vloss", [True, False])
def test_ppo_loss_against_direct_computation(clip_vloss):
    c = dict(clip_coef=0.2, ent_coef=0.01, vf_coef=0.5, clip_vloss=clip_vloss)
    algo = linear_ppo(**c)
    rng = np.random.default_rng(0)
    B = 6
    x = rng.normal(size=(B, 3)).astype(np.float32)
    actions = np.array([0, 1, 1, 0, 1, 0])
    logits = x @ np.array([[0.5, -1.0, 0.0], [0.0, 1.0, 0.5]]).T + [0.1, 0.0]
    logp_all = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    newlogp = logp_all[np.arange(B), actions]
    # behaviour log-probs chosen so that some ratios fall outside [0.8, 1.2]
    oldlogp = newlogp + np.array([0.5, -0.5, 0.05, -0.05, 0.3, 0.0])
    adv = np.array([1.0, -2.0, 0.5, 3.0, -1.0, 0.2])
    newv = x @ np.array([1.0, 0.5, -0.5]) + 0.2
    oldv = newv + np.array([0.5, -0.1, 0.0, 0.3, -0.4, 0.05])
    returns = rng.normal(size=B)
    mb = {k: torch.tensor(v, dtype=torch.float32) for k, v in dict(
        obs=x, logprobs=oldlogp, advantages=adv, returns=returns, values=oldv).items()}
    mb["actions"] = torch.tensor(actions)
    loss, stats = algo.loss(mb)

    ratio = np.exp(newlogp - oldlogp)
    assert np.any(ratio > 1.2) and np.any(ratio < 0.8)
    a = (adv - adv.mean()) / (adv.std(ddof=1) + 1e-8)
    pg = np.mean(np.maximum(-a * ratio, -a * np.clip(ratio, 0.8, 1.2)))
    if clip_vloss:
        vclip = oldv + np.clip(newv - oldv, -0.2, 0.2)
        vl = 0.5 * np.mean(np.maximum((newv - returns) ** 2, (vclip - returns) ** 2))
    else:
        vl = 0.5 * np.mean((newv - returns) ** 2)
    ent = np.mean(-(np.exp(logp_all) * logp_all).sum(1))
    np.testing.assert_allclose(stats["pg_loss"].item(), pg, rtol=1e-5)
    np.testing.assert_allclose(stats["v_loss"].item(), vl, rtol=1e-5)
    np.testing.assert_allclose(stats["entropy"].item(), ent, rtol=1e-5)
    np.testing.assert_allclose(loss.item(), pg - 0.01 * ent + 0.5 * vl, rtol=1e-5)
    np.testing.assert_allclose(stats["clipfrac"].item(), np.mean(np.abs(ratio - 1) > 0.2))


def test_ppo_act_logprob_matches_policy():
    algo = linear_ppo()
    x = np.random.default_rng(1).normal(size=(4000, 3)).astype(np.float32)
    actions, extras = algo.act(x, {})
    logp_all = torch.log_softmax(algo.net.logits(torch.from_numpy(x)), 1).detach().numpy()
    np.testing.assert_allclose(extras["logprob"], logp_all[np.arange(len(x)), actions], rtol=1e-4, atol=1e-5)
    assert extras["logprob"].dtype == np.float32
    # sampled actions follow the policy: mean probability of action 1 ~ frequency of action 1
    assert abs(np.mean(actions == 1) - np.exp(logp_all[:, 1]).mean()) < 0.03
    greedy, _ = algo.act(x, {"greedy": True})
    np.testing.assert_array_equal(greedy, logp_all.argmax(1))


def test_ppo_drops_and_counts_stale_segments():
    algo = PPO(OBS, ACT, PPOConfig(segments_per_batch=2, max_policy_lag=1), seed=0)
    assert algo.ingest(acted_chunk(algo, 0), staleness=2) == 0
    assert algo.dropped_segments == 1 and not algo.ready()
    c1 = acted_chunk(algo, 1)
    assert algo.ingest(c1, staleness=1) == c1["env_steps"] > 0
    assert not algo.ready()
    algo.ingest(acted_chunk(algo, 2), staleness=0)
    algo.ingest(acted_chunk(algo, 3), staleness=1)  # surplus: waits for the next batch
    assert algo.ready() and algo.chunks_per_update() == 2
    metrics = algo.learn()
    # the batch was exactly the first two segments ...
    assert metrics["batch_env_steps"] == c1["env_steps"] + acted_chunk(algo, 2)["env_steps"]
    assert metrics["samples"] == metrics["batch_env_steps"] * algo.config.update_epochs
    # ... and the surplus, now two versions old, was dropped
    assert algo.segments == [] and algo.dropped_segments == 2 and algo.updates == 1


@pytest.mark.parametrize("cls,cfg", [(PPO, PPOConfig), (IMPALA, IMPALAConfig)])
def test_a_checkpoint_keeps_every_counter_of_ppo_and_impala(cls, cfg):
    # PPO's checkpoints once lost late_segments_used; both now save what counters() reports
    algo = cls(OBS, ACT, cfg(segments_per_batch=2, max_policy_lag=1), seed=0)
    algo.ingest(acted_chunk(algo, 0), staleness=2)  # dropped: past the lag limit
    algo.ingest(acted_chunk(algo, 1), staleness=1)  # trained on, one version late
    algo.ingest(acted_chunk(algo, 2), staleness=0)
    algo.learn()
    assert algo.counters()["late_segments_used"] == 1 and algo.counters()["dropped_segments"] == 1
    again = cls(OBS, ACT, cfg(segments_per_batch=2, max_policy_lag=1), seed=1)
    again.load_state_dict(algo.state_dict())
    assert again.counters() == algo.counters() and again.updates == algo.updates == 1


def test_ppo_learn_on_real_rollouts_improves_the_surrogate():
    algo = make_algorithm("ppo", *env_spaces("CartPole-v1"), {"segments_per_batch": 1}, seed=0)
    rollout = Rollout("CartPole-v1", 4, seed=0)
    chunk = rollout.run(algo, 64, {}, policy_version=0, explorer_id=0)
    algo.ingest(chunk, staleness=0)
    batch = algo.build_batch([chunk])  # the advantages the update is made from
    with torch.no_grad():
        before = algo.loss(batch)[1]["pg_loss"].item()
    metrics = algo.learn()
    with torch.no_grad():
        after = algo.loss(batch)[1]["pg_loss"].item()
    # the clipped surrogate objective (minus pg_loss) on the batch trained on went up
    assert after < before - 1e-3, (before, after)
    assert metrics["batch_env_steps"] == chunk["env_steps"]
    assert metrics["approx_kl"] > 0 and 0 <= metrics["clipfrac"] <= 1
    assert not algo.ready() and algo.segments == []


# ---- IMPALA (V-trace) ---------------------------------------------------------------------------
def vtrace_by_definition(blogp, tlogp, rewards, values, terminated, truncated, valid, gamma, rho_clip, c_clip, lam):
    """Espeholt et al. (2018), eq. (1) as a sum, per env and step:
    v_s = V(x_s) + sum_{t=s}^{e} gamma^(t-s) (prod_{i=s}^{t-1} c_i) rho_t (r_t + gamma V(x_{t+1}) - V(x_t)),
    where e is the episode's last step in the segment (terminated: V(x_{t+1}) = 0; truncated or
    the segment's end: V of the next frame). Advantage: rho_s (r_s + gamma v_{s+1} - V(x_s)), with
    V(x_{s+1}) in place of v_{s+1} at e."""
    T, N = rewards.shape
    ratio = np.exp(tlogp.astype(np.float64) - blogp)
    rho, c = np.minimum(rho_clip, ratio), lam * np.minimum(c_clip, ratio)

    def next_value(t, i):
        return 0.0 if terminated[t, i] else values[t + 1, i]

    def end(s, i):
        e = s
        while e < T - 1 and not (terminated[e, i] or truncated[e, i]):
            e += 1
        return e

    def v(s, i):
        total = values[s, i]
        for t in range(s, end(s, i) + 1):
            total += gamma ** (t - s) * np.prod(c[s:t, i]) * rho[t, i] * (
                rewards[t, i] + gamma * next_value(t, i) - values[t, i])
        return total

    vs = np.array(values[:T], dtype=np.float64)
    adv = np.zeros((T, N))
    for i in range(N):
        for s in range(T):
            if not valid[s, i]:
                continue
            vs[s, i] = v(s, i)
            after = v(s + 1, i) if s < end(s, i) else next_value(s, i)
            adv[s, i] = rho[s, i] * (rewards[s, i] + gamma * (0.0 if terminated[s, i] else after) - values[s, i])
    return vs, adv


def vtrace_case():
    """Two envs, seven steps. Env 0: normal, normal, terminated, reset (invalid), normal,
    truncated, reset. Env 1: reset (the segment starts after an episode's end), normal x2,
    truncated, reset, normal x2 (the last bootstraps from frame 7)."""
    valid = np.array([[1, 0], [1, 1], [1, 1], [0, 1], [1, 0], [1, 1], [0, 1]], bool)
    terminated = np.zeros((7, 2), bool)
    terminated[2, 0] = True
    truncated = np.zeros((7, 2), bool)
    truncated[5, 0] = truncated[3, 1] = True
    rewards = np.array([[1, 0], [2, 1], [3, -1], [0, 2], [1, 0], [-2, 1], [0, 3]], np.float32)
    values = np.array([[0.5, 9], [1, 2], [-1, 0.5], [7, 1.5], [2, -3], [0, 1], [4, 2], [9, 0.25]], np.float32)
    target = np.log(np.array([[0.6, 0.5], [0.7, 0.2], [0.5, 0.9], [0.5, 0.5], [0.3, 0.5], [0.8, 0.4], [0.5, 0.6]]))
    behaviour = np.log(np.array([[0.3, 0.5], [0.8, 0.5], [0.25, 0.6], [0.5, 0.5], [0.6, 0.5], [0.4, 0.8], [0.5, 0.5]]))
    return (behaviour.astype(np.float32), target.astype(np.float32), rewards, values, terminated, truncated, valid)


@pytest.mark.parametrize("rho_clip,c_clip,lam", [(1.0, 1.0, 1.0), (1.0, 0.9, 0.8), (1.5, 1.2, 1.0)])
def test_vtrace_matches_the_papers_definition(rho_clip, c_clip, lam):
    case = vtrace_case()
    blogp, tlogp, rewards, values, terminated, truncated, valid = case
    ratio = np.exp(tlogp - blogp)[valid]
    assert np.sum(ratio > max(rho_clip, c_clip)) >= 3 and np.sum(ratio < 1) >= 3  # both clips bite
    vs, adv = vtrace(*case, gamma=0.9, rho_clip=rho_clip, c_clip=c_clip, lam=lam)
    expected_vs, expected_adv = vtrace_by_definition(*case, 0.9, rho_clip, c_clip, lam)
    np.testing.assert_allclose(vs[valid], expected_vs[valid], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(adv, expected_adv, rtol=1e-5, atol=1e-5)
    assert np.all(adv[~valid] == 0)
    # by hand, env 0 (rho_bar 1, c_bar 1, lam 1): step 2 terminated, step 5 truncated (V of frame 6)
    if (rho_clip, c_clip, lam) == (1.0, 1.0, 1.0):
        np.testing.assert_allclose(vs[5, 0], 0 + 1.0 * (-2 + 0.9 * 4 - 0), rtol=1e-6)  # rho 2, clipped to 1
        np.testing.assert_allclose(vs[2, 0], -1 + 1.0 * (3 - (-1)), rtol=1e-6)
        # step 1: rho = c = 0.7/0.8; the trace carries step 2's correction back
        r1 = 0.7 / 0.8
        np.testing.assert_allclose(vs[1, 0], 1 + r1 * (2 + 0.9 * -1 - 1) + 0.9 * r1 * (vs[2, 0] - -1), rtol=1e-5)


def test_vtrace_on_policy_is_the_n_step_return():
    chunk = hand_chunk(T=16, N=5, seed=4, done_p=0.3)
    assert chunk["terminated"].any() and chunk["truncated"].any() and not chunk["valid"].all()
    T, N = chunk["rewards"].shape
    values = np.random.default_rng(1).normal(size=(T + 1, N)).astype(np.float32)
    logp = np.log(np.random.default_rng(2).uniform(0.1, 1, size=(T, N))).astype(np.float32)
    rewards, terminated, truncated, valid = chunk["rewards"], chunk["terminated"], chunk["truncated"], chunk["valid"]
    vs, adv = vtrace(logp, logp, rewards, values, terminated, truncated, valid, gamma=0.95)
    for i in range(N):
        for s in range(T):
            if not valid[s, i]:
                continue
            ret, t = 0.0, s
            while True:  # rewards up to the episode's or the segment's end, then its bootstrap
                ret += 0.95 ** (t - s) * rewards[t, i]
                if terminated[t, i] or truncated[t, i] or t == T - 1:
                    break
                t += 1
            if not terminated[t, i]:
                ret += 0.95 ** (t - s + 1) * values[t + 1, i]
            np.testing.assert_allclose(vs[s, i], ret, rtol=1e-5, atol=1e-5)
            # on-policy, the advantage is the same return's error: r_s + gamma v_{s+1} - V(x_s)
            np.testing.assert_allclose(adv[s, i], ret - values[s, i], rtol=1e-5, atol=1e-5)


def test_impala_trains_on_stale_segments_and_drops_only_beyond_max_policy_lag():
    algo = IMPALA(OBS, ACT, IMPALAConfig(segments_per_batch=2), seed=0)
    old = acted_chunk(algo, 0)
    assert algo.accepts(10**6)
    assert algo.ingest(old, staleness=500) == old["env_steps"] > 0
    assert not algo.ready()
    algo.ingest(acted_chunk(algo, 1), staleness=0)
    assert algo.ready() and algo.chunks_per_update() == 2
    metrics = algo.learn()
    assert metrics["segments"] == 2 and metrics["policy_lag_mean"] == 250
    assert algo.counters() == {"dropped_segments": 0, "late_segments_used": 1, "max_lag_used": 500}
    bounded = IMPALA(OBS, ACT, IMPALAConfig(max_policy_lag=3), seed=0)
    assert not bounded.accepts(4) and bounded.ingest(acted_chunk(bounded, 2), staleness=4) == 0
    assert bounded.ingest(acted_chunk(bounded, 3), staleness=3) > 0
    assert bounded.counters()["dropped_segments"] == 1


def test_impala_loss_uses_vtrace_targets_and_advantages():
    algo = IMPALA(OBS, ACT, IMPALAConfig(hidden=(), norm_adv=False, ent_coef=0.01, vf_coef=0.5), seed=0)
    set_linear(algo.net.actor_head, [[0.5, -1.0, 0.0], [0.0, 1.0, 0.5]], [0.1, 0.0])
    set_linear(algo.net.critic_head, [[1.0, 0.5, -0.5]], [0.2])
    chunk = acted_chunk(IMPALA(OBS, ACT, IMPALAConfig(), seed=5), 1, T=10, N=4)
    loss, stats = algo.loss([chunk])
    T, N = chunk["rewards"].shape
    x = chunk["obs"].astype(np.float64)
    logits = x @ np.array([[0.5, -1.0, 0.0], [0.0, 1.0, 0.5]]).T + [0.1, 0.0]
    logp_all = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    values = x @ np.array([1.0, 0.5, -0.5]) + 0.2
    tlogp = np.take_along_axis(logp_all[:T], chunk["actions"][..., None], -1)[..., 0]
    valid = chunk["valid"]
    vs, adv = vtrace_by_definition(chunk["extra_logprob"], tlogp, chunk["rewards"], values, chunk["terminated"],
                                   chunk["truncated"], valid, 0.99, 1.0, 1.0, 1.0)
    pg = -np.mean((adv * tlogp)[valid])
    vl = 0.5 * np.mean(((values[:T] - vs) ** 2)[valid])
    ent = np.mean(-(np.exp(logp_all[:T]) * logp_all[:T]).sum(-1)[valid])
    np.testing.assert_allclose(stats["pg_loss"].item(), pg, rtol=1e-4)
    np.testing.assert_allclose(stats["v_loss"].item(), vl, rtol=1e-4)
    np.testing.assert_allclose(stats["entropy"].item(), ent, rtol=1e-5)
    np.testing.assert_allclose(loss.item(), pg - 0.01 * ent + 0.5 * vl, rtol=1e-4)


def test_impala_step_minibatches_match_the_segment_loss_and_train():
    # minibatch_size: V-trace once per pass, then minibatches of single steps re-evaluated under
    # the current network; one minibatch holding every step is the segment's loss, gradients too
    def chunk():
        return acted_chunk(IMPALA(OBS, ACT, IMPALAConfig(), seed=5), 1, T=10, N=4)

    steps = int(chunk()["valid"].sum())
    # one gradient step each: a on the whole segment, b on one minibatch of every one of its steps
    a = IMPALA(OBS, ACT, IMPALAConfig(clip_coef=0.2, update_epochs=1), seed=0)
    b = IMPALA(OBS, ACT, IMPALAConfig(clip_coef=0.2, update_epochs=1, minibatch_size=steps), seed=0)
    with torch.no_grad():
        _, segment = a.loss([chunk()])  # the segment's loss under the network both start from
    for algo in (a, b):
        algo.ingest(chunk(), staleness=0)
    stats_a, stats_b = a.learn(), b.learn()  # the statistics of the step each took
    for k in ("pg_loss", "v_loss", "entropy"):
        np.testing.assert_allclose(stats_b[k], segment[k].item(), rtol=1e-5, atol=1e-7)  # summed in another order
        np.testing.assert_allclose(stats_a[k], segment[k].item(), rtol=1e-5, atol=1e-7)
    for p, q in zip(a.net.parameters(), b.net.parameters()):  # the gradients of that step, and the step
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(q.detach(), p.detach(), rtol=1e-4, atol=1e-6)
    # minibatches of 8 single steps train too
    c = IMPALA(OBS, ACT, IMPALAConfig(clip_coef=0.2, minibatch_size=8), seed=0)
    before = [p.detach().clone() for p in c.net.parameters()]
    c.ingest(chunk(), staleness=0)
    metrics = c.learn()
    assert c.updates == 1 and metrics["batch_env_steps"] == chunk()["env_steps"]
    assert any(not torch.equal(p, q) for p, q in zip(before, c.net.parameters()))


def test_impala_state_dict_round_trip_resumes_identically():
    a = IMPALA(OBS, ACT, IMPALAConfig(), seed=0)
    a.ingest(acted_chunk(a, 0), staleness=3)
    a.learn()
    state = pickle.loads(pickle.dumps(a.state_dict()))
    b = IMPALA(OBS, ACT, IMPALAConfig(), seed=7)
    b.load_state_dict(state)
    assert b.updates == 1 and b.counters() == a.counters() == {"dropped_segments": 0, "late_segments_used": 1, "max_lag_used": 3}
    chunk = acted_chunk(IMPALA(OBS, ACT, IMPALAConfig(), seed=3), 1)
    a.ingest(chunk, staleness=0)
    b.ingest(chunk, staleness=0)
    assert a.learn() == b.learn()  # same optimiser state and RNG (minibatch shuffles): same step
    for p, q in zip(a.net.parameters(), b.net.parameters()):
        assert torch.equal(p, q)
    assert a.act(chunk["obs"][0], {})[0].tolist() == b.act(chunk["obs"][0], {})[0].tolist()


# ---- weights, checkpoints, pickling ------------------------------------------------------------
@pytest.mark.parametrize("name", ["dqn", "ppo", "impala"])
def test_get_set_weights_round_trip(name):
    a = make_algorithm(name, OBS, ACT, {}, seed=0)
    b = make_algorithm(name, OBS, ACT, {}, seed=1)
    x = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    explore = {"epsilon": 0.0} if name == "dqn" else {"greedy": True}
    w = a.get_weights()
    assert all(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in w.values())
    if name in ("ppo", "impala"):
        assert not any(k.startswith("critic") for k in w)  # explorers don't need the critic
    assert not np.array_equal(a.act(x, explore)[0], b.act(x, explore)[0])
    b.set_weights(w)
    np.testing.assert_array_equal(a.act(x, explore)[0], b.act(x, explore)[0])
    for k, v in b.get_weights().items():
        np.testing.assert_array_equal(v, w[k])
    w[next(iter(w))][...] = 123.0  # a copy, not a view of a's parameters
    assert not np.any(a.get_weights()[next(iter(w))] == 123.0)
    with pytest.raises(ValueError):
        b.set_weights({k: v for k, v in list(w.items())[1:]})


@pytest.mark.parametrize("name", ["dqn", "ppo", "impala"])
def test_pickled_algorithm_acts_with_weights_set_after_unpickling(name):
    a = make_algorithm(name, OBS, ACT, {}, seed=0)
    x = np.random.default_rng(0).normal(size=(32, 3)).astype(np.float32)
    explore = {"epsilon": 0.0} if name == "dqn" else {"greedy": True}
    a.act(x, explore)  # builds the numpy views
    b = pickle.loads(pickle.dumps(make_algorithm(name, OBS, ACT, {}, seed=5)))
    b.act(x, explore)
    b.set_weights(a.get_weights())
    np.testing.assert_array_equal(a.act(x, explore)[0], b.act(x, explore)[0])


def test_numpy_forward_matches_torch():
    x = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    for net in (QNetwork(3, 4, (8, 8)), QNetwork(3, 4, (8,), "tanh", dueling=True)):
        np.testing.assert_allclose(net.numpy_forward(x), net(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
    ac = ActorCritic(3, 4, (8, 8), shared=True)
    np.testing.assert_allclose(ac.numpy_logits(x), ac.logits(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
    # the views follow in-place parameter updates
    with torch.no_grad():
        ac.actor_head.bias.add_(1.0)
    np.testing.assert_allclose(ac.numpy_logits(x), ac.logits(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_dqn_state_dict_round_trip_resumes_identically():
    a = filled_dqn(checkpoint_replay=True, updates_per_env_step=1.0)
    for _ in range(3):
        a.learn()
    state = pickle.loads(pickle.dumps(a.state_dict()))
    b = DQN(OBS, ACT, a.config, seed=99)
    b.load_state_dict(state)
    assert (b.updates, b.env_steps, len(b.replay)) == (a.updates, a.env_steps, len(a.replay))
    ma, mb = a.learn(), b.learn()  # same RNG, same replay, same optimiser state: same step
    assert ma == mb
    for p, q in zip(a.q.parameters(), b.q.parameters()):
        assert torch.equal(p, q)
    for p, q in zip(a.target.parameters(), b.target.parameters()):
        assert torch.equal(p, q)
    # without replay contents the buffer refills the warm-up before updating again
    a.config = a.config.model_copy(update={"checkpoint_replay": False})
    c = DQN(OBS, ACT, a.config, seed=0)
    c.load_state_dict(a.state_dict())
    assert len(c.replay) == 0 and not c.ready() and c.updates == a.updates


def test_ppo_state_dict_round_trip_resumes_identically():
    a = PPO(OBS, ACT, PPOConfig(), seed=0)
    a.ingest(acted_chunk(a, 0), staleness=0)
    a.learn()
    state = pickle.loads(pickle.dumps(a.state_dict()))
    b = PPO(OBS, ACT, PPOConfig(), seed=7)
    b.load_state_dict(state)
    assert b.updates == 1
    chunk = acted_chunk(PPO(OBS, ACT, PPOConfig(), seed=3), 1)
    a.ingest(chunk, staleness=0)
    b.ingest(chunk, staleness=0)
    assert a.learn() == b.learn()
    for p, q in zip(a.net.parameters(), b.net.parameters()):
        assert torch.equal(p, q)
    assert a.act(chunk["obs"][0], {})[0].tolist() == b.act(chunk["obs"][0], {})[0].tolist()


# ---- misc --------------------------------------------------------------------------------------
def test_clip_grad_norm_matches_torch():
    a, b = torch.nn.Linear(3, 4), torch.nn.Linear(3, 4)
    b.load_state_dict(a.state_dict())
    x = torch.randn(5, 3)
    (a(x) ** 2).sum().backward()
    (b(x) ** 2).sum().backward()
    n1 = clip_grad_norm(list(a.parameters()), 0.1)
    n2 = torch.nn.utils.clip_grad_norm_(b.parameters(), 0.1)
    torch.testing.assert_close(n1, n2)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


@pytest.mark.parametrize("fused", [True, False], ids=["fused kernel", "multi-tensor ops"])
def test_adam_matches_the_textbook_update(fused):
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(4, 3))
    p = torch.nn.Parameter(torch.tensor(w0, dtype=torch.float64))
    opt = Adam([p], lr=0.1, betas=(0.8, 0.9), eps=1e-3, fused=fused)
    w, m, v = w0.copy(), np.zeros_like(w0), np.zeros_like(w0)
    for t in range(1, 6):
        g = rng.normal(size=w0.shape)
        opt.zero_grad()
        p.grad = torch.tensor(g)
        opt.step()
        m = 0.8 * m + 0.2 * g
        v = 0.9 * v + 0.1 * g * g
        w = w - 0.1 * (m / (1 - 0.8**t)) / (np.sqrt(v / (1 - 0.9**t)) + 1e-3)
        np.testing.assert_allclose(p.detach().numpy(), w, rtol=1e-10)
    assert opt.fused == fused  # the path asked for is the one taken
    q = torch.nn.Parameter(torch.tensor(w0))
    opt2 = Adam([q], lr=0.5)
    opt2.load_state_dict(opt.state_dict())
    # the moments and the step count come from the state; the settings stay as opt2 was made
    assert (opt2.steps, opt2.lr, tuple(opt2.betas), opt2.eps) == (5, 0.5, (0.9, 0.999), 1e-8)
    np.testing.assert_allclose(opt2.exp_avg[0].numpy(), m, rtol=1e-12)


@pytest.mark.parametrize("name", ["dqn", "ppo", "impala"])
def test_unsupported_spaces_raise(name):
    with pytest.raises(ValueError, match="Discrete"):  # PPO and IMPALA take MultiBinary (tests/test_spaces.py)
        make_algorithm(name, OBS, gym.spaces.Tuple((gym.spaces.Discrete(2),) * 2), {})
    with pytest.raises(ValueError, match="Box"):
        make_algorithm(name, gym.spaces.Discrete(3), ACT, {})
    with pytest.raises(ValueError):  # unknown hyperparameters are errors
        make_algorithm(name, OBS, ACT, {"no_such_key": 1})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the learner.device: cuda path)")
@pytest.mark.parametrize("name", ["dqn", "ppo"])
def test_learner_on_cuda_trains_and_publishes_cpu_weights(name):
    from tianji_dask.envs.rollout import Rollout

    obs_space, act_space = env_spaces("CartPole-v1")
    config = {"learning_starts": 64} if name == "dqn" else {}
    learner = make_algorithm(name, obs_space, act_space, config)
    learner.to_device("cuda")
    actor = make_algorithm(name, obs_space, act_space, config)
    rollout = Rollout("CartPole-v1", 4, seed=0)
    while not learner.ready():
        actor.set_weights(learner.get_weights())
        learner.ingest(rollout.run(actor, 32, {"epsilon": 1.0} if name == "dqn" else {}, policy_version=0, explorer_id=0), 0)
    before = {k: v.copy() for k, v in learner.get_weights().items()}
    metrics = learner.learn()
    weights = learner.get_weights()
    assert all(isinstance(v, np.ndarray) for v in weights.values())
    assert any(not np.array_equal(before[k], weights[k]) for k in weights)
    assert np.isfinite(metrics["samples"])
    net = learner.q if name == "dqn" else learner.net
    assert next(net.parameters()).device.type == "cuda"


@pytest.mark.parametrize("name", ["dqn", "ppo"])
def test_image_observations_get_the_convolutional_encoder_and_act_through_torch(name):
    obs_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    algo = make_algorithm(name, obs_space, gym.spaces.Discrete(6), {"hidden": []})
    net = algo.q if name == "dqn" else algo.net
    assert any(isinstance(m, torch.nn.Conv2d) for m in net.modules())
    obs = np.random.default_rng(0).integers(0, 256, (3, 4, 84, 84), dtype=np.uint8)
    actions, _ = algo.act(obs, {"epsilon": 0.0} if name == "dqn" else {"greedy": True})
    with torch.no_grad():
        x = torch.from_numpy(obs)
        expected = (net(x) if name == "dqn" else net.logits(x)).argmax(1).numpy()
    np.testing.assert_array_equal(actions, expected)
    # pixels are scaled to [0, 1] inside the network: all-255 frames do not blow activations up
    with torch.no_grad():
        out = net(torch.full((1, 4, 84, 84), 255, dtype=torch.uint8))
    out = out if name == "dqn" else out[0]
    assert torch.isfinite(out).all() and out.abs().max() < 10


@pytest.mark.parametrize("name", ["ppo", "impala"])
def test_a_busy_learner_takes_up_to_max_segments_into_one_update(name):
    algo = make_algorithm(name, OBS, ACT, {"segments_per_batch": 2, "max_segments_per_batch": 4}, seed=0)
    chunks = [acted_chunk(algo, seed) for seed in range(6)]
    assert algo.takes_more() and not algo.ready()
    for chunk in chunks[:2]:
        algo.ingest(chunk, staleness=0)
    assert algo.ready() and algo.takes_more()  # enough to train; room for two more
    for chunk in chunks[2:5]:
        algo.ingest(chunk, staleness=0)
    assert not algo.takes_more()
    metrics = algo.learn()
    assert metrics["segments"] == 4.0
    assert len(algo.segments) == 1 and not algo.ready()  # the fifth waits for the next update
    plain = make_algorithm(name, OBS, ACT, {"segments_per_batch": 2}, seed=0)
    for chunk in chunks[:3]:
        plain.ingest(chunk, staleness=0)
    assert not plain.takes_more()  # without a maximum: exactly segments_per_batch


def test_a_checkpoint_loaded_with_a_new_learning_rate_trains_with_the_new_one():
    """Adam's moments and step count are state; its learning rate is a setting (a resumed run
    given --set algo.config.lr, or a PBT member that took another's checkpoint)."""
    a = filled_dqn(lr=1e-3, updates_per_env_step=1.0)
    for _ in range(3):
        a.learn()
    b = DQN(OBS, ACT, DQNConfig(**{**a.config.model_dump(), "lr": 5e-5}), seed=1)
    b.load_state_dict(pickle.loads(pickle.dumps(a.state_dict())))
    assert b.optimizer.lr == 5e-5 and b.optimizer.steps == a.optimizer.steps == 3
    for x, y in zip(b.optimizer.exp_avg, a.optimizer.exp_avg):
        assert torch.equal(x, y)


@pytest.mark.parametrize("cls,cfg", [(PPO, PPOConfig), (IMPALA, IMPALAConfig)])
def test_an_annealed_learning_rate_falls_with_the_steps_trained_and_a_checkpoint_carries_it_on(cls, cfg):
    """CleanRL's --anneal-lr: each update uses lr x (1 - steps trained before it / anneal_lr_steps),
    never below 0; a resumed learner goes on from the steps its checkpoint trained."""
    config = cfg(lr=1e-3, segments_per_batch=1, anneal_lr_steps=50)
    algo = cls(OBS, ACT, config, seed=0)
    used, steps = [], []

    def update(learner, i):
        chunk = acted_chunk(learner, i)
        steps.append(int(chunk["valid"].sum()))
        learner.ingest(chunk, staleness=0)
        used.append(learner.learn()["lr"])

    for i in range(2):
        update(algo, i)
    resumed = cls(OBS, ACT, config, seed=1)
    resumed.load_state_dict(pickle.loads(pickle.dumps(algo.state_dict())))
    for i in range(2, 4):
        update(resumed, i)
    before = np.cumsum([0, *steps[:-1]])
    assert resumed.trained_env_steps == sum(steps) and before[-1] > 50  # the last update is past the horizon
    np.testing.assert_allclose(used, 1e-3 * np.clip(1 - before / 50, 0, None), rtol=1e-6, atol=1e-12)
    assert used[0] == 1e-3 and used[-1] == 0.0 and used[1] < 1e-3
    constant = cls(OBS, ACT, cfg(lr=1e-3, segments_per_batch=1), seed=0)
    constant.ingest(acted_chunk(constant, 0), staleness=0)
    assert "lr" not in constant.learn() and constant.optimizer.lr == 1e-3
