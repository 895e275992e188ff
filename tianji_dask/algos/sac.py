"""SAC (Haarnoja et al. 2018) for Box actions, following CleanRL's sac_continuous_action.py: twin
Q networks with Polyak-averaged target copies, a tanh-squashed Gaussian actor with a
state-dependent log-std, automatic entropy tuning, and actor updates delayed to every
``policy_frequency`` critic updates.

Actions are stored and learnt on in [-1, 1] (the squashed sample); ``env_action`` rescales them
to the Box's bounds. Replay and pacing are DQN's: n-step transitions in a ``ReplayBuffer``, and
once it holds ``learning_starts`` transitions every env step ingested allows
``updates_per_env_step`` updates (one ``learn()`` each). Before ``learning_starts`` env steps,
explorers act uniformly at random.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from tianji_dask.algos.base import AlgoConfig, Algorithm
from tianji_dask.algos.encoders import EncoderSpec, network_input
from tianji_dask.algos.ensemble import QEnsemble
from tianji_dask.algos.gaussian import (
    SoftQNetwork,
    SquashedGaussianActor,
    check_box_spaces,
)
from tianji_dask.algos.optim import Adam
from tianji_dask.algos.weights import seeded_init, snapshot, weights_of
from tianji_dask.algos.normalize import ObsNormalizer, load_policy_weights
from tianji_dask.algos.replay_buffer import ReplayBuffer, ReplayPacing, nstep_transitions
from tianji_dask.algos.spaces import refuse_normalize
from tianji_dask.chunk import map_obs, obs_leaves


class SACConfig(AlgoConfig):
    """CleanRL's defaults, except the critic's learning rate: 3e-4 like the actor's (CleanRL: 1e-3).
    Small CPUs want smaller networks and batches (e.g. hidden [64, 64], batch_size 128)."""

    #: hidden layer widths of the actor and of each Q network
    hidden: tuple[int, ...] = (256, 256)
    #: learning rate of the actor
    actor_lr: float = Field(3e-4, gt=0.0)
    #: learning rate of the Q networks and of the temperature
    critic_lr: float = Field(3e-4, gt=0.0)
    #: discount factor
    gamma: float = Field(0.99, ge=0.0, le=1.0)
    #: Polyak averaging: the target Q networks move this fraction of the way each update
    tau: float = Field(0.005, gt=0.0, le=1.0)
    #: transitions per minibatch (one per update)
    batch_size: int = Field(256, ge=1)
    #: replay capacity in transitions; the oldest are overwritten
    buffer_size: int = Field(1_000_000, ge=1)
    #: replay size (transitions) before the first update; until then explorers act at random
    learning_starts: int = Field(5_000, ge=1)
    #: the actor (and temperature) takes this many steps every this many critic updates
    policy_frequency: int = Field(2, ge=1)
    #: entropy temperature when autotune is off
    alpha: float = Field(0.2, ge=0.0)
    #: learn the temperature toward a target entropy of -action_dim (it starts at alpha = 1)
    autotune: bool = True
    #: n-step returns in the critic's target (1: plain SAC)
    n_step: int = Field(1, ge=1)
    #: gradient steps per env step ingested, past the warm-up
    updates_per_env_step: float = Field(1.0, gt=0.0)
    #: clip each network's gradient norm to this; null: no clipping (as CleanRL)
    max_grad_norm: float | None = Field(None, gt=0.0)
    #: normalize observations by their running mean and std (CleanRL's NormalizeObservation)
    normalize_obs: bool = False
    #: include the replay contents in state_dict() (large; off: a resumed run refills it)
    checkpoint_replay: bool = False
    #: your own observation encoder, 'module:factory': ``factory(obs_space)`` returns (torch.nn.Module,
    #: width), the module mapping float32 observations (B, *obs_space.shape), unscaled (a Dict's: a dict of
    #: its leaves, less an action_mask), to (B, width)
    #: features. It replaces the built-in MLP input or convolutional encoder of the actor, both Q
    #: networks and their targets (an instance each; the Q networks take (features, action)); image
    #: observations are then accepted; the trunks (``hidden``), heads and losses stay. Workers must be
    #: able to import the module
    encoder: EncoderSpec = None


class Temperature(nn.Module):
    """log(alpha), learnt when autotune is on (CleanRL starts it at 0)."""

    def __init__(self):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.zeros(1))


@contextlib.contextmanager
def frozen(*modules: nn.Module):
    """Within: no gradient for the modules' parameters (still through them, to their inputs).
    What they computed before is unchanged; a backward pass then skips their weight gradients."""
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


class SAC(ReplayPacing, Algorithm):
    Config = SACConfig
    on_policy = False
    device_types = ("cpu", "cuda")
    compilable = ("critic_loss", "actor_loss")

    def __init__(self, obs_space, action_space, config: SACConfig, seed: int = 0):
        super().__init__(obs_space, action_space, config, seed)
        c = config
        obs_dim, self.action_dim = check_box_spaces(obs_space, action_space, "sac", finite=True, images=c.encoder is not None)
        self.structured = hasattr(obs_dim, "leaves")  # a Dict or Tuple: observations arrive as leaves
        if c.normalize_obs:
            refuse_normalize(obs_dim, "sac")
        obs_dim = network_input(c.encoder, obs_space, obs_dim)
        self.action_scale = ((action_space.high - action_space.low) / 2).astype(np.float32)
        self.action_bias = ((action_space.high + action_space.low) / 2).astype(np.float32)
        self.target_entropy = -float(self.action_dim)

        def build():
            actor = SquashedGaussianActor(obs_dim, self.action_dim, c.hidden)
            qs = [SoftQNetwork(obs_dim, self.action_dim, c.hidden) for _ in range(2)]
            targets = [SoftQNetwork(obs_dim, self.action_dim, c.hidden) for _ in range(2)]
            for q, target in zip(qs, targets):
                target.load_state_dict(q.state_dict())
            return actor, *qs, *targets

        self.actor, qf1, qf2, qf1_target, qf2_target = seeded_init(seed, build)
        # the twin Q networks (and their targets) as one batched network each: made from two
        # SoftQNetworks, so they start where separate ones would
        self.q, self.q_target = QEnsemble([qf1, qf2]), QEnsemble([qf1_target, qf2_target])
        self.q_target.requires_grad_(False)
        self.temperature = Temperature()
        self.obs_norm = ObsNormalizer(obs_space.shape) if c.normalize_obs else None
        self.actor_optimizer = self.q_optimizer = self.alpha_optimizer = None  # learner side: made on first learn()
        self.replay = ReplayBuffer(c.buffer_size, seed=seed + 1)  # allocates on first ingest
        self.rng = np.random.default_rng(seed)  # exploration on the explorer side
        self.noise_rng = np.random.default_rng(seed + 2)  # the learner's reparameterization noise
        self._init_pacing()  # env_steps, updates, update_credit: the replay ratio's books
        self.actor_stats: dict[str, float] = {}  # of the last actor step, reported with every update

    # ---- explorer side -------------------------------------------------------------------
    def exploration(self, env_steps: int, updates: int) -> dict:
        return {"random": env_steps < self.config.learning_starts}

    def act(self, obs: np.ndarray, explore: dict) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions in [-1, 1]: uniform with ``explore["random"]``, tanh of the mean with
        ``explore["greedy"]``, else sampled from the squashed Gaussian."""
        obs = self.network_obs(obs)
        if explore.get("random", False):
            n = len(next(iter(obs.values()))) if self.structured else len(obs)
            return self.rng.uniform(-1.0, 1.0, (n, self.action_dim)).astype(np.float32), {}
        mean, log_std = self.actor.numpy_forward(obs)
        if explore.get("greedy", False):
            return np.tanh(mean), {}
        noise = self.rng.standard_normal(mean.shape, dtype=np.float32)
        return np.tanh(mean + np.exp(log_std) * noise).astype(np.float32, copy=False), {}

    def env_action(self, actions: np.ndarray) -> np.ndarray:
        """Actions in [-1, 1] rescaled to the Box's bounds."""
        return actions * self.action_scale + self.action_bias

    def get_weights(self) -> dict[str, np.ndarray]:
        weights = weights_of(self.actor)
        if self.obs_norm is not None:  # the statistics this version trains and acts with
            weights.update(self.obs_norm.weights())
        return weights

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        load_policy_weights(weights, self.actor, self.obs_norm)

    def network_obs(self, obs):
        """Normalized with the statistics in use, if on; a Dict or Tuple observation as its leaves."""
        if self.structured:
            return obs_leaves(obs)
        return obs if self.obs_norm is None else self.obs_norm(obs)

    # ---- learner side --------------------------------------------------------------------
    def ingest(self, chunk: dict, staleness: int) -> int:
        if self.obs_norm is not None:
            self.obs_norm.observe_chunk(chunk)  # folded in after the next update
        return self.store(nstep_transitions(chunk, self.config.gamma, self.config.n_step))

    def alpha(self) -> torch.Tensor | float:
        return self.temperature.log_alpha.detach().exp() if self.config.autotune else self.config.alpha

    def critic_loss(self, b: dict[str, torch.Tensor], next_noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(both Q networks' squared soft TD errors, Q1 of the stored actions, the targets)."""
        with torch.no_grad():
            next_actions, next_log_pi = self.actor.sample(b["next_obs"], next_noise)
            min_q_next = self.q_target(b["next_obs"], next_actions).amin(0)
            # discounts: gamma^k for a k-step window, 0 after a terminated step
            target = b["rewards"] + b["discounts"] * (min_q_next - self.alpha() * next_log_pi)
        q = self.q(b["obs"], b["actions"])  # [2, B]
        # the sum of both networks' mean squared errors
        return F.mse_loss(q, target.expand_as(q)) * len(q), q[0].detach(), target

    def actor_loss(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean of alpha log pi(a|s) - min_i Q_i(s, a) over reparameterized a ~ pi(s), log pi)."""
        actions, log_pi = self.actor.sample(obs, noise)
        with frozen(self.q):  # the gradient reaches the actor through the actions; the Q weights' own is not needed
            min_q = self.q(obs, actions).amin(0)
        return (self.alpha() * log_pi - min_q).mean(), log_pi

    def alpha_loss(self, log_pi: torch.Tensor) -> torch.Tensor:
        """CleanRL's temperature loss: alpha rises while the entropy -log pi is below the target."""
        return (-self.temperature.log_alpha.exp() * (log_pi.detach() + self.target_entropy)).mean()

    def update_targets(self) -> None:
        """Polyak averaging: target <- (1 - tau) target + tau online."""
        with torch.no_grad():
            torch._foreach_lerp_(list(self.q_target.parameters()), list(self.q.parameters()), self.config.tau)

    def _make_optimizers(self) -> None:
        c = self.config
        self.actor_optimizer = Adam(self.actor.parameters(), c.actor_lr)
        self.q_optimizer = Adam(self.q.parameters(), c.critic_lr)
        self.alpha_optimizer = Adam(self.temperature.parameters(), c.critic_lr)

    def _noise(self, n: int) -> torch.Tensor:
        return torch.from_numpy(self.noise_rng.standard_normal((n, self.action_dim), dtype=np.float32)).to(self.device)

    def learn(self) -> dict[str, float]:
        c = self.config
        if self.q_optimizer is None:
            self._make_optimizers()
        idx = self.replay.sample_indices(c.batch_size)
        sample = self.replay.gather(idx)
        sample["obs"], sample["next_obs"] = self.network_obs(sample["obs"]), self.network_obs(sample["next_obs"])
        b = {k: map_obs(lambda v: torch.from_numpy(v).to(self.device), v) for k, v in sample.items()}
        if not self.structured:  # a Dict's leaves go as they are: the encoder takes each as it needs
            b["obs"], b["next_obs"] = b["obs"].flatten(1).float(), b["next_obs"].flatten(1).float()

        critic_loss, q1, target = self.compiled("critic_loss")(b, self._noise(c.batch_size))
        self.q_optimizer.minimize(critic_loss, c.max_grad_norm)

        if self.updates % c.policy_frequency == 0:
            # delayed, but as many actor steps as critic steps (CleanRL, after TD3)
            for _ in range(c.policy_frequency):
                actor_loss, log_pi = self.compiled("actor_loss")(b["obs"], self._noise(c.batch_size))
                self.actor_optimizer.minimize(actor_loss, c.max_grad_norm)
                self.actor_stats = {"actor_loss": actor_loss.item(), "entropy": -log_pi.detach().mean().item()}
                if c.autotune:
                    with torch.no_grad():  # the entropy of the actor just updated
                        _, log_pi = self.actor.sample(b["obs"], self._noise(c.batch_size))
                    alpha_loss = self.alpha_loss(log_pi)
                    self.alpha_optimizer.minimize(alpha_loss, c.max_grad_norm)
                    self.actor_stats["alpha_loss"] = alpha_loss.item()

        self.update_targets()
        self.updates += 1
        self.update_credit -= 1.0
        if self.obs_norm is not None:
            self.obs_norm.fold()  # the next version trains and acts with the observations ingested until now
        return {"critic_loss": critic_loss.item(), "q_mean": q1.mean().item(), "target_mean": target.mean().item(),
                "alpha": float(self.alpha()), **self.actor_stats, "samples": float(c.batch_size),
                "batch_policy_version": self.replay.mean_version(idx)}

    # ---- checkpoints ---------------------------------------------------------------------
    NETWORKS = ("actor", "temperature")
    #: the twin Q networks are saved as two SoftQNetworks each (as before they ran as one): name -> (ensemble, member)
    Q_NETWORKS = {"qf1": ("q", 0), "qf2": ("q", 1), "qf1_target": ("q_target", 0), "qf2_target": ("q_target", 1)}
    OPTIMIZERS = ("actor_optimizer", "alpha_optimizer")

    def state_dict(self) -> dict:
        if self.q_optimizer is None:
            self._make_optimizers()
        q_opt = self.q_optimizer.state_dict()
        q_opt["exp_avg"], q_opt["exp_avg_sq"] = self.q.to_members(q_opt["exp_avg"]), self.q.to_members(q_opt["exp_avg_sq"])
        return {
            **{name: snapshot(getattr(self, name)) for name in self.NETWORKS},
            **{name: getattr(self, net).member_state_dict(i) for name, (net, i) in self.Q_NETWORKS.items()},
            **{name: getattr(self, name).state_dict() for name in self.OPTIMIZERS},
            "q_optimizer": q_opt,
            "env_steps": self.env_steps,
            "updates": self.updates,
            "update_credit": self.update_credit,
            "env_steps_past_warmup": self.env_steps_past_warmup,
            "rng": self.rng.bit_generator.state,
            "noise_rng": self.noise_rng.bit_generator.state,
            "obs_norm": None if self.obs_norm is None else self.obs_norm.state_dict(),
            "replay": self.replay.state_dict(include_data=self.config.checkpoint_replay or self.include_replay),
        }

    def load_state_dict(self, state: dict) -> None:
        for name in self.NETWORKS:
            getattr(self, name).load_state_dict(state[name])
        for name, (net, i) in self.Q_NETWORKS.items():
            getattr(self, net).load_member_state_dict(i, state[name])
        self._make_optimizers()
        for name in self.OPTIMIZERS:
            getattr(self, name).load_state_dict(state[name])
        q_opt = dict(state["q_optimizer"])
        q_opt["exp_avg"], q_opt["exp_avg_sq"] = self.q.from_members(q_opt["exp_avg"]), self.q.from_members(q_opt["exp_avg_sq"])
        self.q_optimizer.load_state_dict(q_opt)
        self.env_steps = int(state["env_steps"])
        self.updates = int(state["updates"])
        self.update_credit = float(state["update_credit"])
        self.env_steps_past_warmup = int(state["env_steps_past_warmup"])
        self.rng.bit_generator.state = state["rng"]
        self.noise_rng.bit_generator.state = state["noise_rng"]
        if self.obs_norm is not None:
            self.obs_norm.load_state_dict(state["obs_norm"])
        self.replay.load_state_dict(state["replay"], missing_version=self.updates)  # as DQN's

    # ---- export ------------------------------------------------------------------------
    def policy_module(self) -> torch.nn.Module:
        """tanh of the mean of a copy of the actor, rescaled to the Box's bounds."""
        from tianji_dask.algos.policy import SquashedMean, frozen

        return frozen(SquashedMean(self.actor, self.action_scale, self.action_bias, self.obs_norm))
