"""SAC's twin Q networks as one stacked module (``algos/twin.py``) compute what the two separate
networks computed: the same initial weights, losses and gradients of every parameter on a batch,
the same ``learn()`` steps and metrics, and a checkpoint written in the two-network layout loads
and trains on as it would have. The reference is the two-network critic as it was, kept here
(``PairSAC``)."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_continuous import BOX, OBS, box_chunk

from tianji_dask.algos.encoders import network_input
from tianji_dask.algos.gaussian import SoftQNetwork, SquashedGaussianActor
from tianji_dask.algos.models import Adam, seeded_init
from tianji_dask.algos.sac import SAC, SACConfig, frozen, host_floats

pytestmark = pytest.mark.usefixtures("one_torch_thread")

IMAGE = gym.spaces.Box(0, 255, (3, 12, 12), np.uint8)
CASES = {  # name: (observation space, config)
    "64-64": (OBS, {"hidden": (64, 64), "batch_size": 256}),
    "256-256": (OBS, {"hidden": (256, 256), "batch_size": 256}),
    "encoder": (IMAGE, {"hidden": (16,), "batch_size": 32, "encoder": "custom_nets:conv"}),
}
#: float32 sums taken in another order: relative differences of a few ulp, absolute ones near zero
TOL = {"rtol": 1e-6, "atol": 1e-7}
TOL_STEPS = {"rtol": 1e-5, "atol": 1e-6}  # after Adam steps, which divide by the gradients' running scale


class PairSAC(SAC):
    """SAC with its critic as it was: two ``SoftQNetwork``s (``qf1``, ``qf2``) and their targets, made
    as then, with the losses, target update, optimizer, metrics and checkpoint layout of then."""

    NETWORKS = ("actor", "qf1", "qf2", "qf1_target", "qf2_target", "temperature")

    def __init__(self, obs_space, action_space, config: SACConfig, seed: int = 0):
        super().__init__(obs_space, action_space, config, seed)
        c = config
        obs_dim = network_input(c.encoder, obs_space, int(np.prod(obs_space.shape)))

        def build():
            actor = SquashedGaussianActor(obs_dim, self.action_dim, c.hidden)
            qs = [SoftQNetwork(obs_dim, self.action_dim, c.hidden) for _ in range(2)]
            targets = [SoftQNetwork(obs_dim, self.action_dim, c.hidden) for _ in range(2)]
            for q, target in zip(qs, targets):
                target.load_state_dict(q.state_dict())
            return actor, *qs, *targets

        self.twin = self.critic  # kept for its key mapping (pair_state) only
        del self.critic, self.critic_target
        self.actor, self.qf1, self.qf2, self.qf1_target, self.qf2_target = seeded_init(seed, build)
        self.qf1_target.requires_grad_(False)
        self.qf2_target.requires_grad_(False)

    def critic_loss(self, b, next_noise):
        with torch.no_grad():
            next_actions, next_log_pi = self.actor.sample(b["next_obs"], next_noise)
            min_q_next = torch.min(self.qf1_target(b["next_obs"], next_actions), self.qf2_target(b["next_obs"], next_actions))
            target = b["rewards"] + b["discounts"] * (min_q_next - self.alpha() * next_log_pi)
        q1, q2 = self.qf1(b["obs"], b["actions"]), self.qf2(b["obs"], b["actions"])
        return F.mse_loss(q1, target) + F.mse_loss(q2, target), q1.detach(), target

    def actor_loss(self, obs, noise):
        actions, log_pi = self.actor.sample(obs, noise)
        with frozen(self.qf1, self.qf2):
            min_q = torch.min(self.qf1(obs, actions), self.qf2(obs, actions))
        return (self.alpha() * log_pi - min_q).mean(), log_pi

    def update_targets(self):
        with torch.no_grad():
            for q, target in ((self.qf1, self.qf1_target), (self.qf2, self.qf2_target)):
                torch._foreach_lerp_(list(target.parameters()), list(q.parameters()), self.config.tau)

    def _make_optimizers(self):
        c = self.config
        self.actor_optimizer = Adam(self.actor.parameters(), c.actor_lr)
        self.q_optimizer = Adam([*self.qf1.parameters(), *self.qf2.parameters()], c.critic_lr)
        self.alpha_optimizer = Adam(self.temperature.parameters(), c.critic_lr)

    def learn(self):
        c = self.config
        if self.q_optimizer is None:
            self._make_optimizers()
        sample = self.replay.sample(c.batch_size)
        sample["obs"], sample["next_obs"] = self._obs(sample["obs"]), self._obs(sample["next_obs"])
        b = {k: torch.from_numpy(v).to(self.device) for k, v in sample.items()}
        b["obs"], b["next_obs"] = b["obs"].flatten(1).float(), b["next_obs"].flatten(1).float()
        critic_loss, q1, target = self.critic_loss(b, self._noise(c.batch_size))
        self._step(self.q_optimizer, critic_loss)
        if self.updates % c.policy_frequency == 0:
            for _ in range(c.policy_frequency):
                actor_loss, log_pi = self.actor_loss(b["obs"], self._noise(c.batch_size))
                self._step(self.actor_optimizer, actor_loss)
                self.actor_stats = {"actor_loss": actor_loss.item(), "entropy": -log_pi.detach().mean().item()}
                if c.autotune:
                    with torch.no_grad():
                        _, log_pi = self.actor.sample(b["obs"], self._noise(c.batch_size))
                    alpha_loss = self.alpha_loss(log_pi)
                    self._step(self.alpha_optimizer, alpha_loss)
                    self.actor_stats["alpha_loss"] = alpha_loss.item()
        self.update_targets()
        self.updates += 1
        self.update_credit -= 1.0
        if self.obs_norm is not None:
            self.obs_norm.fold()
        return {"critic_loss": critic_loss.item(), "q_mean": q1.mean().item(), "target_mean": target.mean().item(),
                "alpha": float(self.alpha()), **self.actor_stats, "samples": float(c.batch_size)}

    def load_state_dict(self, state):
        raise NotImplementedError("a reference: it writes checkpoints of the old layout, it reads none")


def build(case: str, cls=SAC, seed: int = 0, **extra) -> SAC:
    obs_space, config = CASES[case]
    algo = cls(obs_space, BOX, SACConfig(**{**config, "learning_starts": 512, **extra}), seed=seed)
    chunk = box_chunk(T=64, N=8, seed=1)  # 512 transitions
    if obs_space is IMAGE:
        chunk["obs"] = np.random.default_rng(1).integers(0, 256, (65, 8, *IMAGE.shape), dtype=np.uint8)
    algo.ingest(chunk, staleness=0)
    return algo


def batch_of(algo: SAC) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """A replay batch as ``learn()`` makes it, and two standard normal noise draws for it."""
    b = {k: torch.from_numpy(v) for k, v in algo.replay.sample(algo.config.batch_size).items()}
    b["obs"], b["next_obs"] = b["obs"].flatten(1).float(), b["next_obs"].flatten(1).float()
    g = torch.Generator().manual_seed(0)
    return b, torch.randn(len(b["obs"]), 2, generator=g), torch.randn(len(b["obs"]), 2, generator=g)


def stacked(algo: SAC, of=lambda p: p) -> dict[str, torch.Tensor]:
    """``of`` each Q network parameter (online ``critic.``, target ``critic_target.``) and buffer,
    where not None, in the stacked layout, for either kind of SAC."""
    if isinstance(algo, PairSAC):
        pairs = {"critic": (algo.qf1, algo.qf2), "critic_target": (algo.qf1_target, algo.qf2_target)}
        states = {name: algo.twin.pair_state(*(_tensors(q, of) for q in pair)) for name, pair in pairs.items()}
    else:
        states = {name: _tensors(getattr(algo, name), of) for name in ("critic", "critic_target")}
    return {f"{name}.{k}": v for name, state in states.items() for k, v in state.items()}


def _tensors(module: torch.nn.Module, of) -> dict[str, torch.Tensor]:
    out = {k: of(v) for k, v in [*module.named_parameters(), *module.named_buffers()]}
    return {k: v for k, v in out.items() if v is not None}


def q_params(algo: SAC) -> list[torch.Tensor]:
    """The online Q networks' parameters."""
    return [*algo.qf1.parameters(), *algo.qf2.parameters()] if isinstance(algo, PairSAC) else list(algo.critic.parameters())


def grad_of(p: torch.Tensor) -> torch.Tensor | None:
    return None if p.grad is None else p.grad.clone()


def assert_close_all(ours: dict, theirs: dict, **tol) -> None:
    assert ours.keys() == theirs.keys()
    for k in ours:
        if theirs[k] is None:
            assert ours[k] is None, k
        else:
            torch.testing.assert_close(ours[k], theirs[k], **tol, msg=lambda m, k=k: f"{k}: {m}")


def others(algo: SAC) -> dict[str, torch.Tensor]:
    """The actor's and the temperature's parameters."""
    return {**{f"actor.{k}": v for k, v in algo.actor.named_parameters()}, "log_alpha": algo.temperature.log_alpha}


@pytest.mark.parametrize("case", list(CASES))
def test_initial_weights_are_those_the_two_networks_had(case):
    ours, theirs = build(case), build(case, PairSAC)
    assert_close_all(stacked(ours), stacked(theirs), rtol=0, atol=0)
    assert_close_all(others(ours), others(theirs), rtol=0, atol=0)
    assert not any(p.requires_grad for p in ours.critic_target.parameters())


@pytest.mark.parametrize("case", list(CASES))
def test_losses_and_the_gradients_of_every_parameter_are_the_two_networks(case):
    ours, theirs = build(case), build(case, PairSAC)
    b, noise, noise2 = batch_of(ours)
    results = []
    for algo in (ours, theirs):
        critic_loss, q1, target = algo.critic_loss(b, noise)
        critic_loss.backward()
        critic_grads = stacked(algo, grad_of)
        actor_grads_in_critic_step = {k: grad_of(p) for k, p in others(algo).items()}
        for p in [*others(algo).values(), *q_params(algo)]:
            p.grad = None
        actor_loss, log_pi = algo.actor_loss(b["obs"], noise2)
        actor_loss.backward()
        actor_grads = {k: grad_of(p) for k, p in others(algo).items()}
        critic_grads_in_actor_step = stacked(algo, grad_of)
        algo.temperature.log_alpha.grad = None
        alpha_loss = algo.alpha_loss(log_pi)
        alpha_loss.backward()
        results.append({"losses": {"critic": critic_loss.detach(), "q1": q1, "target": target, "actor": actor_loss.detach(),
                                   "log_pi": log_pi.detach(), "alpha": alpha_loss.detach(),
                                   "log_alpha_grad": algo.temperature.log_alpha.grad.clone()},
                        "critic_grads": critic_grads, "actor_grads": actor_grads,
                        "actor_grads_in_critic_step": actor_grads_in_critic_step,
                        "critic_grads_in_actor_step": critic_grads_in_actor_step})
    ours_r, theirs_r = results
    for part in ours_r:
        assert_close_all(ours_r[part], theirs_r[part], **TOL)
    assert len(ours_r["critic_grads"]) == len(q_params(ours))  # the online ones, all; not the targets
    assert ours_r["critic_grads_in_actor_step"] == {}  # frozen, as before
    assert all(g is None for g in ours_r["actor_grads_in_critic_step"].values())
    assert all(g is not None for k, g in ours_r["actor_grads"].items() if k.startswith("actor."))


@pytest.mark.parametrize("case,extra", [("64-64", {}), ("256-256", {}), ("encoder", {}),
                                        ("64-64", {"max_grad_norm": 0.5, "autotune": False, "policy_frequency": 1})])
def test_learn_steps_and_their_metrics_are_the_two_networks(case, extra):
    ours, theirs = build(case, **extra), build(case, PairSAC, **extra)
    for _ in range(4):
        m_ours, m_theirs = ours.learn(), theirs.learn()
        assert list(m_ours) == list(m_theirs) and all(type(v) is float for v in m_ours.values())
        np.testing.assert_allclose(list(m_ours.values()), list(m_theirs.values()), **TOL_STEPS)
        assert_close_all(stacked(ours), stacked(theirs), **TOL_STEPS)
        assert_close_all(others(ours), others(theirs), **TOL_STEPS)


@pytest.mark.parametrize("case", ["64-64", "encoder"])
def test_a_checkpoint_of_the_two_network_layout_loads_and_trains_on_as_it_would_have(case):
    theirs = build(case, PairSAC)
    for _ in range(3):
        theirs.learn()
    old = pickle.loads(pickle.dumps(theirs.state_dict()))
    assert {"qf1", "qf2", "qf1_target", "qf2_target"} <= old.keys() and "critic" not in old
    ours = build(case, seed=5)
    ours.load_state_dict(old)
    assert_close_all(stacked(ours), stacked(theirs), rtol=0, atol=0)
    assert_close_all(others(ours), others(theirs), rtol=0, atol=0)
    for moment in ("exp_avg", "exp_avg_sq"):
        names = theirs.twin.member_parameter_names()
        old_moments = getattr(theirs.q_optimizer, moment)
        expected = ours.critic.pair_state(dict(zip(names, old_moments[:len(names)])), dict(zip(names, old_moments[len(names):])))
        assert_close_all(dict(zip((k for k, _ in ours.critic.named_parameters()), getattr(ours.q_optimizer, moment))),
                         expected, rtol=0, atol=0)
    assert ours.q_optimizer.steps == theirs.q_optimizer.steps and ours.updates == theirs.updates == 3
    for _ in range(3):  # (the last actor step's metrics are not in checkpoints, before or now: they come with the next)
        m_ours, m_theirs = ours.learn(), theirs.learn()
        np.testing.assert_allclose([m_ours[k] for k in m_ours], [m_theirs[k] for k in m_ours], **TOL_STEPS)
    assert_close_all(stacked(ours), stacked(theirs), **TOL_STEPS)
    assert_close_all(others(ours), others(theirs), **TOL_STEPS)
    again = build(case, seed=6)  # and what it writes now loads as well
    again.load_state_dict(pickle.loads(pickle.dumps(ours.state_dict())))
    assert_close_all(stacked(again), stacked(ours), rtol=0, atol=0)


def test_a_two_network_checkpoint_of_another_network_is_refused():
    old = build("64-64", PairSAC).state_dict()
    with pytest.raises(KeyError, match="hidden layer"):
        build("64-64", hidden=(64,)).load_state_dict(old)


def test_metrics_are_read_back_as_item_would():
    values = {"a": torch.tensor(0.1), "b": torch.tensor([1 / 3]), "c": 2.5, "d": torch.tensor(7.0) / 3}
    out = host_floats(values)
    assert list(out) == list(values) and all(type(v) is float for v in out.values())
    assert out == {"a": values["a"].item(), "b": values["b"].item(), "c": 2.5, "d": values["d"].item()}
