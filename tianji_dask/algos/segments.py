"""What PPO and IMPALA share: an actor-critic acting on explorers (categorical for Discrete
actions, one per dimension for MultiDiscrete, Bernoulli per bit for MultiBinary, diagonal Gaussian
for Box actions; Dict observations' ``action_mask`` masking the choices), optional running
observation normalization, and the queue of on-policy segments (chunks) that the next update
trains on. Pure torch/numpy, no Dask."""

from __future__ import annotations

from typing import Literal

import gymnasium as gym
import numpy as np
import torch
from pydantic import Field

from tianji_dask.algos.base import AlgoConfig
from tianji_dask.algos.encoders import EncoderSpec, network_input
from tianji_dask.algos.gaussian import (
    GaussianActorCritic,
    check_box_spaces,
    sample_gaussian,
)
from tianji_dask.algos.heads import ActionHeads
from tianji_dask.algos.models import ActorCritic
from tianji_dask.algos.multi_input import MASK
from tianji_dask.algos.optim import Adam
from tianji_dask.algos.weights import seeded_init, snapshot, weights_of
from tianji_dask.algos.normalize import ObsNormalizer, load_policy_weights
from tianji_dask.algos.recurrent import RecurrentActorCritic, frames
from tianji_dask.algos.spaces import check_mask, observation_input, refuse_normalize
from tianji_dask.chunk import extras, map_obs, obs_leaves, observations


def minibatch_slices(n: int, parts: int) -> list[slice]:
    """``parts`` contiguous slices covering range(n), sizes differing by at most one."""
    bounds = [n * i // parts for i in range(parts + 1)]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


class SegmentConfig(AlgoConfig):
    """What PPO's and IMPALA's hyperparameters share: the actor-critic, its optimizer, the batch of
    segments, the update's passes and terms, normalization and your own encoder."""

    hidden: tuple[int, ...] = (64, 64)
    #: relu: tanh costs several times as much per element on CPU
    activation: Literal["relu", "tanh"] = "relu"
    #: one trunk for actor and critic (otherwise two, as in CleanRL)
    shared_trunk: bool = False
    gamma: float = Field(0.99, ge=0.0, le=1.0)
    adam_eps: float = Field(1e-5, gt=0.0)
    #: the learning rate falls linearly from ``lr`` towards 0 over this many env steps trained on, each
    #: update using the rate of the steps trained before it, and stays at 0 after (CleanRL's
    #: ``--anneal-lr`` over its total_timesteps, SB3's linear schedule); null: constant
    anneal_lr_steps: int | None = Field(None, ge=1)
    #: chunks (segments) per batch: one learn() trains on at least this many
    segments_per_batch: int = Field(1, ge=1)
    #: when more have arrived, one learn() takes up to this many: a busy learner trains on bigger
    #: batches instead of falling behind its explorers; null: exactly segments_per_batch
    max_segments_per_batch: int | None = Field(None, ge=1)
    #: passes over the batch (IMPALA: each shuffles the envs into ``num_minibatches`` groups and takes
    #: one gradient step per group, with V-trace recomputed under the current policy)
    update_epochs: int = Field(2, ge=1)
    ent_coef: float = Field(0.01, ge=0.0)
    vf_coef: float = Field(0.5, ge=0.0)
    max_grad_norm: float | None = Field(0.5, gt=0.0)
    #: scale advantages to unit variance per minibatch (PPO) or batch (IMPALA; not in its paper: it
    #: makes the step size independent of the reward scale)
    norm_adv: bool = True
    #: normalize observations by their running mean and std (CleanRL's NormalizeObservation; MuJoCo)
    normalize_obs: bool = False
    #: your own observation encoder, 'module:factory': ``factory(obs_space)`` returns (torch.nn.Module,
    #: width), the module mapping float32 observations (B, *obs_space.shape), unscaled (a Dict's: a dict of
    #: its leaves, less an action_mask), to (B, width)
    #: features. It replaces the built-in MLP input or convolutional encoder of the actor and the critic
    #: (an instance each, one with shared_trunk); the trunks (``hidden``), heads and losses stay.
    #: Workers must be able to import the module
    encoder: EncoderSpec = None


class SegmentActorCritic:
    """Mixin for an ``Algorithm`` whose config has hidden, activation, shared_trunk, lr, adam_eps,
    segments_per_batch, max_policy_lag (None: any lag is corrected, nothing dropped),
    normalize_obs and encoder."""

    def _init_actor_critic(self, obs_space, action_space, seed: int) -> None:
        c = self.config
        name = type(self).__name__
        self.recurrent = getattr(c, "recurrent", None) is not None
        self.burn_in = c.recurrent.burn_in if self.recurrent else 0  # what a Rollout ships per chunk for it
        self.continuous = isinstance(action_space, gym.spaces.Box)
        self.heads = None  # the distribution over non-continuous actions (heads.py)
        if self.continuous:
            obs_dim, self.action_dim = check_box_spaces(obs_space, action_space, name, images=c.encoder is not None)
            if c.shared_trunk:
                raise ValueError(f"{name}: shared_trunk is for Discrete actions only (the Gaussian policy has separate trunks)")
            self.action_low = action_space.low.astype(np.float32)
            self.action_high = action_space.high.astype(np.float32)
        else:
            self.heads = ActionHeads.of(action_space, name, allowed=f"{ActionHeads.ALLOWED} or Box")
            obs_dim, self.n_actions = observation_input(obs_space, name), self.heads.width
        self.masked = check_mask(obs_dim, self.heads, name)
        self.structured = not isinstance(obs_space, gym.spaces.Box)  # a Dict or Tuple: observations arrive as leaves
        self.masked_actions_taken = 0  # actions ingested that their step's action_mask forbade (must stay 0)
        net_input = network_input(c.encoder, obs_space, obs_dim)
        if self.recurrent and (self.structured or self.heads is not None and self.heads.kind != "discrete"):
            what = obs_space if self.structured else action_space
            raise ValueError(f"{name}: recurrent with {what} is not supported yet; allowed: Box observations and "
                             "Discrete or Box actions (or recurrent: null)")
        if self.recurrent:
            if c.shared_trunk:
                raise ValueError(f"{name}: recurrent has one trunk and core for both heads already; leave shared_trunk false")
            width = self.action_dim if self.continuous else self.n_actions
            self.net = seeded_init(seed, lambda: RecurrentActorCritic(net_input, width, c.hidden, c.activation, c.recurrent,
                                                                      continuous=self.continuous))
        elif self.continuous:
            self.net = seeded_init(seed, lambda: GaussianActorCritic(net_input, self.action_dim, c.hidden, c.activation))
        else:
            self.net = seeded_init(seed, lambda: ActorCritic(net_input, self.n_actions, c.hidden, c.activation, c.shared_trunk,
                                                             heads=self.heads, masked=self.masked))
        if c.normalize_obs:
            refuse_normalize(obs_dim, name)
        self.obs_norm = ObsNormalizer(obs_space.shape) if c.normalize_obs else None
        self.reward_scale = None  # PPO's RewardScaler, when its config asks for one
        # what explorers need to act: everything but the critic
        self.actor_keys = [k for k in self.net.state_dict() if not k.startswith("critic_")]
        self.optimizer = None  # learner side only: made on first learn()
        self.rng = np.random.default_rng(seed)
        self.segments: list[dict] = []  # collected for the next batch, in arrival order
        self.segment_versions: list[int] = []  # their behaviour versions, in our counting
        self.updates = 0
        self.trained_env_steps = 0  # env steps of every batch taken: the learning rate's schedule
        self.dropped_segments = 0  # beyond max_policy_lag
        self.late_segments_used = 0  # trained on at staleness >= 1 (the clipped objective's or V-trace's correction)

    # ---- explorer side -------------------------------------------------------------------
    def act(self, obs: np.ndarray, explore: dict) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Sample from the policy (``explore={"greedy": True}``: the most likely action); the
        extra ``logprob`` is the behaviour log-probability (log-density for Box actions) the
        learner's correction needs."""
        if self.recurrent:
            raise ValueError(f"{type(self).__name__}: a recurrent policy acts through act_recurrent(obs, state, explore)")
        greedy = explore.get("greedy", False)
        obs = self.network_obs(obs)
        if self.continuous:
            actions, logp = sample_gaussian(*self.net.numpy_mean(obs), self.rng, greedy)
        else:
            actions, logp = self.heads.sample(self.net.numpy_logits(obs), self.rng, greedy, self.masked)
        return actions, {"logprob": logp}

    def initial_state(self, num_envs: int) -> np.ndarray | None:
        """Zeros (num_envs, S) for a recurrent policy; None otherwise."""
        return np.zeros((num_envs, self.net.state_size), dtype=np.float32) if self.recurrent else None

    def act_recurrent(self, obs: np.ndarray, state: np.ndarray, explore: dict) -> tuple[np.ndarray, dict, np.ndarray]:
        """``act`` of a recurrent policy from ``state`` (N, S); also returns the state after. Box
        actions are sampled as ``act`` samples them (the extra ``logprob`` a log-density)."""
        greedy = explore.get("greedy", False)
        device = self.net.actor_head.weight.device
        with torch.no_grad():
            feats, new_state = self.net.step(torch.as_tensor(frames(self.network_obs(obs)[None])[0]).to(device),
                                             torch.as_tensor(state, dtype=torch.float32).to(device))
            if self.continuous:
                mean, logstd = self.net.mean(feats).cpu().numpy(), self.net.actor_logstd.cpu().numpy()
                actions, logp = sample_gaussian(mean, logstd, self.rng, greedy)
            else:
                actions, logp = self.heads.sample(self.net.logits(feats).cpu().numpy(), self.rng, greedy)
        return actions, {"logprob": logp}, new_state.cpu().numpy()

    def env_action(self, actions: np.ndarray) -> np.ndarray:
        """Box actions clipped to the bounds (CleanRL's ClipAction); MultiDiscrete ones shaped as the
        space and offset by its start; Discrete and MultiBinary ones unchanged."""
        if not self.continuous:
            return actions if self.heads.kind != "multi_discrete" else self.heads.env_action(actions)
        return np.clip(actions, self.action_low, self.action_high)

    def get_weights(self) -> dict[str, np.ndarray]:
        weights = weights_of(self.net, self.actor_keys)
        if self.obs_norm is not None:  # the statistics this version trains and acts with
            weights.update(self.obs_norm.weights())
        return weights

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        load_policy_weights(weights, self.net, self.obs_norm, self.actor_keys)

    def network_obs(self, obs):
        """Observations as the networks see them: normalized with the statistics in use, if on; a
        Dict or Tuple observation as its leaves ``{path: array}``."""
        if self.structured:
            return obs_leaves(obs)
        return obs if self.obs_norm is None else self.obs_norm(obs)

    def _segment_obs(self, seg: dict):
        """A segment's observations (T+1, N, ...) as the networks see them (see ``_obs``)."""
        return self.network_obs(observations(seg))

    def _rows(self, obs, rows: int):
        """Observations (an array, or a dict of leaves) as tensors of ``rows`` flat rows, on the device."""
        return map_obs(lambda v: torch.as_tensor(v).to(self.device).reshape(rows, -1), obs)

    def _mask_counters(self) -> dict[str, int]:
        return {"masked_actions_taken": self.masked_actions_taken} if self.masked else {}

    def _count_masked(self, chunk: dict) -> None:
        """Count the chunk's valid steps whose action its step's ``action_mask`` forbade."""
        if self.masked:
            T = chunk["valid"].shape[0]
            taken = self.heads.masked_taken(chunk["actions"], observations(chunk)[MASK][:T])
            self.masked_actions_taken += int((taken & chunk["valid"]).sum())

    # ---- learner side --------------------------------------------------------------------
    def accepts(self, staleness: int) -> bool:
        return self.config.max_policy_lag is None or staleness <= self.config.max_policy_lag

    def ingest(self, chunk: dict, staleness: int) -> int:
        self._observe(chunk)  # the statistics describe the env, whether or not this segment is trained on
        self._count_masked(chunk)
        if not self.accepts(staleness):
            self.dropped_segments += 1
            return 0
        if "logprob" not in extras(chunk):
            name = type(self).__name__
            raise ValueError(f"{name}: chunk has no extra_logprob (was it collected by {name}.act?)")
        self.segments.append(chunk)
        self.segment_versions.append(self.updates - staleness)
        return int(chunk["env_steps"])

    def _drop_stale(self) -> None:
        """Segments left over for the next batch age by one version per update."""
        if self.config.max_policy_lag is None:
            return
        keep = [self.updates - v <= self.config.max_policy_lag for v in self.segment_versions]
        self.dropped_segments += keep.count(False)
        self.segments = [s for s, k in zip(self.segments, keep) if k]
        self.segment_versions = [v for v, k in zip(self.segment_versions, keep) if k]

    def ready(self) -> bool:
        return len(self.segments) >= self.config.segments_per_batch

    def takes_more(self) -> bool:
        return len(self.segments) < self._max_segments()

    def _max_segments(self) -> int:
        return max(self.config.max_segments_per_batch or 0, self.config.segments_per_batch)

    def _take_batch(self) -> tuple[list[dict], list[int]]:
        """The segments of the next update, oldest first, and their policy lags (versions behind
        the learner): at least segments_per_batch, up to max_segments_per_batch of those waiting.
        The optimizer is made here, on the learner's first update."""
        if self.optimizer is None:
            self._make_optimizer()
        n_seg = min(len(self.segments), self._max_segments())
        segments, self.segments = self.segments[:n_seg], self.segments[n_seg:]
        versions, self.segment_versions = self.segment_versions[:n_seg], self.segment_versions[n_seg:]
        lags = [self.updates - v for v in versions]
        self.late_segments_used += sum(1 for lag in lags if lag > 0)
        self._schedule_lr(segments)
        return segments, lags

    def _schedule_lr(self, segments: list[dict]) -> None:
        """The rate of the update about to train on ``segments``: ``lr`` scaled by the fraction of
        ``anneal_lr_steps`` not yet trained on (CleanRL's ``frac = 1 - (iteration - 1) / num_iterations``)."""
        c = self.config
        if c.anneal_lr_steps is not None:
            self.optimizer.lr = c.lr * max(0.0, 1.0 - self.trained_env_steps / c.anneal_lr_steps)
        self.trained_env_steps += sum(int(seg["env_steps"]) for seg in segments)  # the chunk's valid steps

    def _schedule_metrics(self) -> dict[str, float]:
        """The rate the update just made used, when it follows a schedule."""
        return {"lr": float(self.optimizer.lr)} if self.config.anneal_lr_steps is not None else {}

    def chunks_per_update(self) -> int:
        """Chunks one update needs: segments_per_batch."""
        return self.config.segments_per_batch

    def _make_optimizer(self) -> None:
        self.optimizer = Adam(self.net.parameters(), self.config.lr, eps=self.config.adam_eps)
        self.params = list(self.net.parameters())

    # ---- normalization statistics -----------------------------------------------------------
    def _observe(self, chunk: dict) -> None:
        """Collect a chunk's observations (and returns) for the statistics' next fold."""
        if self.obs_norm is not None:
            self.obs_norm.observe_chunk(chunk)
        if self.reward_scale is not None:
            self.reward_scale.observe_chunk(chunk)

    def _fold_statistics(self) -> None:
        """Called at the end of ``learn()``: the next version trains and acts with what was
        collected until now, the update just made used the statistics from before it."""
        for stats in (self.obs_norm, self.reward_scale):
            if stats is not None:
                stats.fold()

    def _statistics_state(self) -> dict:
        return {name: stats.state_dict() for name, stats in (("obs_norm", self.obs_norm), ("reward_scale", self.reward_scale))
                if stats is not None}

    def _load_statistics_state(self, state: dict) -> None:
        for name, stats in (("obs_norm", self.obs_norm), ("reward_scale", self.reward_scale)):
            if stats is not None:
                stats.load_state_dict(state[name])

    # ---- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Network, optimizer, counters, RNG and normalization statistics. Segments collected for
        the next batch are not saved: after a resume they would be stale anyway."""
        if self.optimizer is None:
            self._make_optimizer()
        return {
            "net": snapshot(self.net),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
            "trained_env_steps": self.trained_env_steps,
            "counters": self.counters(),
            "rng": self.rng.bit_generator.state,
            **self._statistics_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.net.load_state_dict(state["net"])
        self._make_optimizer()
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        self.trained_env_steps = int(state.get("trained_env_steps", 0))  # absent from checkpoints before the schedule
        # PPO's checkpoints before its counters were kept together hold dropped_segments alone
        counters = state.get("counters") or {"dropped_segments": state["dropped_segments"]}
        for name in self.counters():
            if name in counters:
                setattr(self, name, int(counters[name]))
        self.rng.bit_generator.state = state["rng"]
        self._load_statistics_state(state)
        self.segments, self.segment_versions = [], []

    # ---- export ------------------------------------------------------------------------
    def policy_module(self) -> torch.nn.Module:
        """The most likely action (Discrete) or the clipped mean (Box) of a copy of the actor; with
        ``recurrent``, ``forward(obs, state) -> (action, new_state)`` (see recurrent_policy.py)."""
        if self.recurrent:
            from tianji_dask.algos.recurrent_policy import recurrent_policy

            return recurrent_policy(self)
        from tianji_dask.algos.policy import actor_critic_policy

        return actor_critic_policy(self)
