"""Faster updates compute what the plain ones did: each shortcut, switched off, gives the same
networks after several updates from the same data (benchmarks/learner_roofline.py measures the gain)."""

import contextlib
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tianji_dask.algos import make_algorithm, sac
from tianji_dask.algos.gaussian import SoftQNetwork
from tianji_dask.envs.rollout import Rollout
from tianji_dask.envs.vector import env_spaces


def _trained(config: dict, updates: int = 6, algo: bool = False):
    """A Pendulum SAC after ``updates`` updates from seed 0's data: its model_state, or with ``algo`` the algorithm."""
    spaces = env_spaces("Pendulum-v1")
    trained = make_algorithm("sac", *spaces, {"hidden": [32, 32], "batch_size": 64, "learning_starts": 64, **config}, seed=0)
    rollout = Rollout("Pendulum-v1", 4, seed=0)
    while not trained.ready():
        trained.ingest(rollout.run(trained, 16, trained.exploration(0, 0), policy_version=0, explorer_id=0), 0)
    for _ in range(updates):
        trained.learn()
    return trained if algo else trained.model_state()


@pytest.mark.parametrize("config", [{}, {"policy_frequency": 2, "autotune": False}])
def test_sac_without_the_critics_weight_gradients_in_the_actor_step_trains_the_same(monkeypatch, config):
    fast = _trained(config)
    monkeypatch.setattr(sac, "frozen", lambda *modules: contextlib.nullcontext())
    plain = _trained(config)
    untrained = _trained(config, updates=0)
    assert fast.keys() == plain.keys() and any(not np.array_equal(fast[k], untrained[k]) for k in fast if k.startswith("actor"))
    for key in fast:
        np.testing.assert_array_equal(fast[key], plain[key], err_msg=key)


class SeparateQ(torch.nn.Module):
    """The twin critics as they were before QEnsemble: two SoftQNetworks (the plain losses below
    call each; the optimizer and the Polyak step see their parameters)."""

    def __init__(self, ensemble, obs_dim: int, action_dim: int, hidden):
        super().__init__()
        self.members = torch.nn.ModuleList(SoftQNetwork(obs_dim, action_dim, hidden) for _ in range(ensemble.n))
        for i, m in enumerate(self.members):
            m.load_state_dict(ensemble.member_state_dict(i))
        self.requires_grad_(next(ensemble.parameters()).requires_grad)


def plain_critic_loss(self, b, next_noise):
    """SAC.critic_loss as it was written for two separate Q networks."""
    with torch.no_grad():
        next_actions, next_log_pi = self.actor.sample(b["next_obs"], next_noise)
        q1t, q2t = self.q_target.members
        min_q_next = torch.min(q1t(b["next_obs"], next_actions), q2t(b["next_obs"], next_actions))
        target = b["rewards"] + b["discounts"] * (min_q_next - self.alpha() * next_log_pi)
    qf1, qf2 = self.q.members
    q1, q2 = qf1(b["obs"], b["actions"]), qf2(b["obs"], b["actions"])
    return F.mse_loss(q1, target) + F.mse_loss(q2, target), q1.detach(), target


def plain_actor_loss(self, obs, noise):
    """SAC.actor_loss as it was written for two separate Q networks."""
    actions, log_pi = self.actor.sample(obs, noise)
    qf1, qf2 = self.q.members
    with sac.frozen(qf1, qf2):
        min_q = torch.min(qf1(obs, actions), qf2(obs, actions))
    return (self.alpha() * log_pi - min_q).mean(), log_pi


def test_sac_twin_critics_as_one_batched_network_train_as_two_separate_ones():
    config = {"policy_frequency": 2}
    fast = _trained(config, updates=0, algo=True)
    plain = _trained(config, updates=0, algo=True)
    for name in ("q", "q_target"):
        setattr(plain, name, SeparateQ(getattr(plain, name), 3, 1, [32, 32]))
    plain.critic_loss, plain.actor_loss = types.MethodType(plain_critic_loss, plain), types.MethodType(plain_actor_loss, plain)
    for algo in (fast, plain):
        for _ in range(6):
            algo.learn()
    for i in range(2):
        for net in ("q", "q_target"):
            mine, theirs = getattr(fast, net).member_state_dict(i), getattr(plain, net).members[i].state_dict()
            assert mine.keys() == theirs.keys()
            for k in mine:
                torch.testing.assert_close(mine[k], theirs[k], rtol=1e-5, atol=1e-6, msg=f"{net}[{i}].{k}")
    # the losses and their gradients, on one batch (Adam's steps barely see a loss's scale)
    sample = fast.replay.gather(np.arange(64))
    b = {k: torch.from_numpy(v) for k, v in sample.items()}
    noise = torch.randn(64, 1, generator=torch.Generator().manual_seed(0))
    for algo in (fast, plain):
        for p in (*algo.q.parameters(), *algo.actor.parameters()):
            p.grad = None
        algo.critic_loss(b, noise)[0].backward()
        algo.actor_loss(b["obs"], noise)[0].backward()
    torch.testing.assert_close(fast.critic_loss(b, noise)[0], plain.critic_loss(b, noise)[0])
    torch.testing.assert_close(fast.actor_loss(b["obs"], noise)[0], plain.actor_loss(b["obs"], noise)[0])
    for i in range(2):
        layers = fast.q._layer_keys
        for j, key in enumerate(layers):
            theirs = plain.q.members[i].get_submodule(key)
            torch.testing.assert_close(fast.q.weights[j].grad[i].T, theirs.weight.grad, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(fast.q.biases[j].grad[i, 0], theirs.bias.grad, rtol=1e-5, atol=1e-6)
    for p, q in zip(fast.actor.parameters(), plain.actor.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    untrained = _trained(config, updates=0, algo=True)
    for p, q, u in zip(fast.actor.parameters(), plain.actor.parameters(), untrained.actor.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(p, u) for p, u in zip(fast.actor.parameters(), untrained.actor.parameters()))


def test_sac_checkpoints_keep_the_separate_networks_layout():
    algo = _trained({}, updates=3, algo=True)
    state = algo.state_dict()
    template = SoftQNetwork(3, 1, [32, 32])
    for name in ("qf1", "qf2", "qf1_target", "qf2_target"):
        assert {k: v.shape for k, v in state[name].items()} == {k: v.shape for k, v in template.state_dict().items()}
    shapes = [p.shape for p in template.parameters()] * 2
    assert [t.shape for t in state["q_optimizer"]["exp_avg"]] == shapes
    assert [t.shape for t in state["q_optimizer"]["exp_avg_sq"]] == shapes
    kept = {name: {k: v.clone() for k, v in state[name].items()} for name in ("qf1", "qf2", "qf1_target", "qf2_target")}
    again = make_algorithm("sac", *env_spaces("Pendulum-v1"), algo.config.model_dump(), seed=5)
    again.load_state_dict(state)
    for name in ("q", "q_target"):
        for p, q in zip(getattr(algo, name).parameters(), getattr(again, name).parameters(), strict=True):
            assert torch.equal(p, q)
    for x, y in zip(algo.q_optimizer.exp_avg_sq, again.q_optimizer.exp_avg_sq, strict=True):
        assert torch.equal(x, y)
    algo.learn()  # a state dict is a snapshot: later updates leave it as it was
    for name, weights in kept.items():
        for k, v in weights.items():
            assert torch.equal(state[name][k], v), (name, k)


def combined_pass_dqn_loss(self, batch):
    """DQN.loss as it was: one online pass over s and s' together (s' carried through the backward)."""
    obs, next_obs = batch["obs"], batch["next_obs"]
    q_all = self.q(torch.cat([obs, next_obs]))
    q_obs, q_next_online = q_all[: len(obs)], q_all[len(obs):].detach()
    with torch.no_grad():  # double Q's target, a* from that pass
        q_next = self.target(next_obs).gather(1, q_next_online.argmax(dim=1, keepdim=True)).squeeze(1)
        target = batch["rewards"] + batch["discounts"] * q_next
    q = q_obs.gather(1, batch["actions"].long().unsqueeze(1)).squeeze(1)
    return F.smooth_l1_loss(q, target) if self.config.loss == "huber" else F.mse_loss(q, target), q, target


@pytest.mark.parametrize("config", [{}, {"loss": "mse", "dueling": True}])
def test_dqn_with_s_prime_outside_the_backward_trains_the_same(monkeypatch, config):
    def trained(plain: bool):
        spaces = env_spaces("CartPole-v1")
        algo = make_algorithm("dqn", *spaces, {"hidden": [32, 32], "batch_size": 64, "learning_starts": 64,
                                               "target_update_interval": 3, **config}, seed=0)
        if plain:
            algo.loss = types.MethodType(combined_pass_dqn_loss, algo)
        rollout = Rollout("CartPole-v1", 4, seed=0)
        while not algo.ready():
            algo.ingest(rollout.run(algo, 16, {"epsilon": 1.0}, policy_version=0, explorer_id=0), 0)
        losses = [algo.learn()["loss"] for _ in range(8)]
        return losses, algo.model_state()

    (fast_losses, fast), (plain_losses, plain) = trained(False), trained(True)
    np.testing.assert_allclose(fast_losses, plain_losses, rtol=1e-5, atol=1e-7)
    assert len(set(fast_losses)) > 1  # it trained: the loss moved
    for key in fast:
        np.testing.assert_allclose(fast[key], plain[key], rtol=1e-5, atol=1e-6, err_msg=key)
