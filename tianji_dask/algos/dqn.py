"""DQN with a target network, double-Q, optional dueling head, n-step returns and uniform or
prioritized replay.

One ``learn()`` is one gradient step on one minibatch. The replay ratio is controlled by
``ready()``: once the replay holds ``learning_starts`` transitions, every env step ingested allows
``updates_per_env_step`` more updates. A resumed run without replay contents refills the warm-up
before it updates again, without a burst of catch-up updates.

Dict and Tuple observations go through the multi-input encoder (``multi_input.py``) and are
replayed leaf by leaf. Their ``action_mask`` leaf masks the Q-values: the greedy action, epsilon's
random one and the TD target's max are over the valid actions alone. Actions are Discrete.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from tianji_dask.algos.base import AlgoConfig, Algorithm
from tianji_dask.algos.encoders import EncoderSpec, network_input
from tianji_dask.algos.heads import ActionHeads, random_valid
from tianji_dask.algos.models import QNetwork
from tianji_dask.algos.multi_input import MASK
from tianji_dask.algos.optim import Adam
from tianji_dask.algos.weights import load_weights, seeded_init, snapshot, weights_of
from tianji_dask.algos.replay_buffer import (
    PrioritizedReplayBuffer,
    ReplayBuffer,
    ReplayPacing,
    nstep_transitions,
)
from tianji_dask.algos.spaces import check_spaces
from tianji_dask.chunk import map_obs, obs_leaves, observations


class DQNConfig(AlgoConfig):
    """Defaults are tuned for wall-clock time to solve CartPole-v1 on a small CPU: few, large
    minibatch updates (one per 8 env steps), a high learning rate kept stable by 3-step returns,
    double-Q and frequent hard target updates, and a short epsilon decay."""

    hidden: tuple[int, ...] = (64, 64)
    activation: Literal["relu", "tanh"] = "relu"
    dueling: bool = False
    double_q: bool = True
    gamma: float = Field(0.99, ge=0.0, le=1.0)
    n_step: int = Field(3, ge=1)
    lr: float = Field(2.3e-3, gt=0.0)
    adam_eps: float = Field(1e-8, gt=0.0)
    batch_size: int = Field(128, ge=1)
    buffer_size: int = Field(100_000, ge=1)
    #: replay size (transitions) before the first update
    learning_starts: int = Field(1_000, ge=1)
    #: gradient steps per env step ingested, past the warm-up (0.125 = one update per 8 env steps)
    updates_per_env_step: float = Field(0.125, gt=0.0)
    #: the target network moves every this many updates ...
    target_update_interval: int = Field(100, ge=1)
    #: ... by this fraction of the way to the online network (1.0 = hard copy)
    tau: float = Field(1.0, gt=0.0, le=1.0)
    loss: Literal["huber", "mse"] = "huber"
    max_grad_norm: float | None = Field(10.0, gt=0.0)
    eps_start: float = Field(1.0, ge=0.0, le=1.0)
    eps_final: float = Field(0.04, ge=0.0, le=1.0)
    #: env steps (or updates, see eps_decay_on) over which epsilon decays linearly to eps_final
    eps_decay_steps: int = Field(5_000, ge=1)
    #: what epsilon's decay follows: env steps collected, or the learner's updates (TianJi ties it
    #: to learner progress, so adding explorers does not shorten exploration in updates)
    eps_decay_on: Literal["env_steps", "updates"] = "env_steps"
    #: proportional prioritized replay (Schaul et al. 2016) instead of uniform
    prioritized: bool = False
    #: priority exponent: 0 = uniform, 1 = fully proportional to |TD error|
    per_alpha: float = Field(0.6, ge=0.0)
    #: importance-sampling exponent at the first update, annealed linearly to 1 ...
    per_beta_start: float = Field(0.4, ge=0.0, le=1.0)
    #: ... over this many updates
    per_beta_steps: int = Field(10_000, ge=1)
    #: added to |TD error| so that no transition's priority is zero
    per_eps: float = Field(1e-6, gt=0.0)
    #: include the replay contents in state_dict() (large; off: a resumed run refills it)
    checkpoint_replay: bool = False
    #: your own observation encoder, 'module:factory': ``factory(obs_space)`` returns (torch.nn.Module,
    #: width), the module mapping float32 observations (B, *obs_space.shape), unscaled (a Dict's: a dict of
    #: its leaves, less an action_mask), to (B, width)
    #: features. It replaces the built-in MLP input or convolutional encoder of the Q network and its
    #: target (each an instance); the trunks (``hidden``), heads and losses stay. Workers must be able
    #: to import the module
    encoder: EncoderSpec = None


class DQN(ReplayPacing, Algorithm):
    Config = DQNConfig
    on_policy = False
    device_types = ("cpu", "cuda")
    compilable = ("loss",)

    def __init__(self, obs_space, action_space, config: DQNConfig, seed: int = 0):
        super().__init__(obs_space, action_space, config, seed)
        c = config
        obs_dim, self.n_actions = check_spaces(obs_space, action_space, "DQN")
        self.masked = getattr(obs_dim, "mask", None) is not None
        self.structured = hasattr(obs_dim, "leaves")  # a Dict or Tuple: observations arrive as leaves
        self.masked_actions_taken = 0  # actions ingested that their step's action_mask forbade (must stay 0)
        obs_dim = network_input(c.encoder, obs_space, obs_dim)

        def build():
            q = QNetwork(obs_dim, self.n_actions, c.hidden, c.activation, c.dueling, self.masked)
            target = QNetwork(obs_dim, self.n_actions, c.hidden, c.activation, c.dueling, self.masked)
            target.load_state_dict(q.state_dict())
            return q, target

        self.q, self.target = seeded_init(seed, build)
        self.target.requires_grad_(False)
        self.optimizer = None  # learner side only: made on first learn()
        if c.prioritized:  # allocates on first ingest
            self.replay = PrioritizedReplayBuffer(c.buffer_size, c.per_alpha, c.per_eps, seed=seed + 1)
        else:
            self.replay = ReplayBuffer(c.buffer_size, seed=seed + 1)
        self.rng = np.random.default_rng(seed)  # exploration on the explorer side
        self._init_pacing()  # env_steps, updates, update_credit: the replay ratio's books

    # ---- explorer side -------------------------------------------------------------------
    def epsilon(self, progress: int) -> float:
        """Epsilon after ``progress`` env steps (or updates, with ``eps_decay_on: updates``)."""
        c = self.config
        frac = min(1.0, progress / c.eps_decay_steps)
        return c.eps_start + frac * (c.eps_final - c.eps_start)

    def exploration(self, env_steps: int, updates: int) -> dict:
        progress = updates if self.config.eps_decay_on == "updates" else env_steps
        return {"epsilon": self.epsilon(progress)}

    def act(self, obs: np.ndarray, explore: dict) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        eps = float(explore.get("epsilon", 0.0))
        if self.structured:
            obs = obs_leaves(obs)
        q = self.q.numpy_forward(obs)
        n = len(q)
        actions = q.argmax(axis=1)
        if eps > 0.0:
            rand = self.rng.random(n) < eps
            if rand.any():
                if self.masked:  # uniform among the valid actions
                    actions[rand] = random_valid(np.asarray(obs[MASK])[rand], self.rng)
                else:
                    actions[rand] = self.rng.integers(0, self.n_actions, size=int(rand.sum()))
        return actions, {}

    def get_weights(self) -> dict[str, np.ndarray]:
        return weights_of(self.q)

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        load_weights(self.q, weights)

    # ---- learner side --------------------------------------------------------------------
    def ingest(self, chunk: dict, staleness: int) -> int:
        c = self.config
        if self.masked:
            T = chunk["valid"].shape[0]
            taken = ActionHeads("discrete", (self.n_actions,)).masked_taken(chunk["actions"], observations(chunk)[MASK][:T])
            self.masked_actions_taken += int((taken & chunk["valid"]).sum())
        batch = nstep_transitions(chunk, c.gamma, c.n_step)
        return self.store(batch)

    def counters(self) -> dict[str, int]:
        return {"masked_actions_taken": self.masked_actions_taken} if self.masked else {}  # earns updates_per_env_step updates per env step past the warm-up

    def _make_optimizer(self) -> None:
        self.optimizer = Adam(self.q.parameters(), self.config.lr, eps=self.config.adam_eps)
        self.params = list(self.q.parameters())

    def td_targets(self, rewards: torch.Tensor, next_obs: torch.Tensor, discounts: torch.Tensor) -> torch.Tensor:
        """r + discount * Q_target(s', a*), a* = argmax_a Q_online(s', a) with double-Q, else
        argmax_a Q_target(s', a)."""
        with torch.no_grad():
            q_next_target = self.target(next_obs)
            if self.config.double_q:
                q_next = q_next_target.gather(1, self.q(next_obs).argmax(dim=1, keepdim=True)).squeeze(1)
            else:
                q_next = q_next_target.max(dim=1).values
            return rewards + discounts * q_next

    def per_beta(self) -> float:
        """Importance-sampling exponent now: per_beta_start, linearly to 1 over per_beta_steps updates."""
        c = self.config
        return c.per_beta_start + min(1.0, self.updates / c.per_beta_steps) * (1.0 - c.per_beta_start)

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(TD loss, Q of the taken actions, TD targets) on a minibatch of tensors; with
        ``batch["weights"]`` (prioritized replay) each transition's loss is scaled by its weight."""
        obs, next_obs = batch["obs"], batch["next_obs"]
        # s' goes through the online network apart, without autograd: one pass over s and s'
        # together would carry s' through the backward too
        q_obs = self.q(obs)
        target = self.td_targets(batch["rewards"], next_obs, batch["discounts"])
        q = q_obs.gather(1, batch["actions"].long().unsqueeze(1)).squeeze(1)
        loss_fn = F.smooth_l1_loss if self.config.loss == "huber" else F.mse_loss
        if "weights" in batch:
            loss = (batch["weights"] * loss_fn(q, target, reduction="none")).mean()
        else:
            loss = loss_fn(q, target)
        return loss, q, target

    def update_target(self) -> None:
        with torch.no_grad():
            if self.config.tau >= 1.0:
                for t, p in zip(self.target.parameters(), self.q.parameters()):
                    t.copy_(p)
            else:
                for t, p in zip(self.target.parameters(), self.q.parameters()):
                    t.lerp_(p, self.config.tau)

    def learn(self) -> dict[str, float]:
        c = self.config
        if self.optimizer is None:
            self._make_optimizer()
        idx = self.replay.sample_indices(c.batch_size)
        sample = self.replay.gather(idx)
        if c.prioritized:
            beta = self.per_beta()
            sample["weights"] = self.replay.importance_weights(idx, beta)
        batch = {k: map_obs(lambda v: torch.from_numpy(v).to(self.device), v) for k, v in sample.items()}
        if not self.structured:  # a Dict's leaves go as they are: the encoder takes each as it needs
            batch["obs"] = batch["obs"].float()
            batch["next_obs"] = batch["next_obs"].float()
        loss, q, target = self.compiled("loss")(batch)
        if c.prioritized:  # priorities from the TD errors before this step, as in Schaul et al.
            self.replay.update_priorities(idx, (q.detach() - target).abs().cpu().numpy())
        self.optimizer.minimize(loss, c.max_grad_norm)
        self.updates += 1
        self.update_credit -= 1.0
        if self.updates % c.target_update_interval == 0:
            self.update_target()
        metrics = {"loss": loss.item(), "q_mean": q.detach().mean().item(), "samples": float(c.batch_size),
                   "batch_policy_version": self.replay.mean_version(idx)}
        if c.prioritized:
            metrics["per_beta"] = beta
        return metrics

    # ---- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        if self.optimizer is None:
            self._make_optimizer()
        return {
            "q": snapshot(self.q),
            "target": snapshot(self.target),
            "optimizer": self.optimizer.state_dict(),
            "env_steps": self.env_steps,
            "updates": self.updates,
            "update_credit": self.update_credit,
            "env_steps_past_warmup": self.env_steps_past_warmup,
            "rng": self.rng.bit_generator.state,
            "counters": self.counters(),
            "replay": self.replay.state_dict(include_data=self.config.checkpoint_replay or self.include_replay),
        }

    def load_state_dict(self, state: dict) -> None:
        self.q.load_state_dict(state["q"])
        self.target.load_state_dict(state["target"])
        self._make_optimizer()
        self.optimizer.load_state_dict(state["optimizer"])
        self.env_steps = int(state["env_steps"])
        self.updates = int(state["updates"])
        self.update_credit = float(state["update_credit"])
        self.env_steps_past_warmup = int(state.get("env_steps_past_warmup", 0))
        self.rng.bit_generator.state = state["rng"]
        self.masked_actions_taken = int(state.get("counters", {}).get("masked_actions_taken", 0))
        # transitions of a checkpoint written before they kept their policy versions: counted as the
        # checkpoint's own policy's (their age is unknown; understated until they are overwritten)
        self.replay.load_state_dict(state["replay"], missing_version=self.updates)

    # ---- export ------------------------------------------------------------------------
    def policy_module(self) -> torch.nn.Module:
        """The greedy action of a copy of the online Q network."""
        from tianji_dask.algos.policy import GreedyQ, frozen

        return frozen(GreedyQ(self.q))
