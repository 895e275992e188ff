"""What PPO and IMPALA share: a categorical actor-critic acting on explorers, and the queue of
on-policy segments (chunks) that the next update trains on. Pure torch/numpy, no Dask."""

from __future__ import annotations

import numpy as np

from tianji_dask.algos.models import ActorCritic, Adam, check_spaces, load_weights, sample_categorical, seeded_init, weights_of
from tianji_dask.chunk import extras


class SegmentActorCritic:
    """Mixin for an ``Algorithm`` whose config has hidden, activation, shared_trunk, lr, adam_eps,
    segments_per_batch and max_policy_lag (None: any lag is corrected, nothing dropped)."""

    def _init_actor_critic(self, obs_space, action_space, seed: int) -> None:
        c = self.config
        obs_dim, self.n_actions = check_spaces(obs_space, action_space, type(self).__name__)
        self.net = seeded_init(seed, lambda: ActorCritic(obs_dim, self.n_actions, c.hidden, c.activation, c.shared_trunk))
        # what explorers need to act: everything but the critic
        self.actor_keys = [k for k in self.net.state_dict() if not k.startswith("critic_")]
        self.optimizer = None  # learner side only: made on first learn()
        self.rng = np.random.default_rng(seed)
        self.segments: list[dict] = []  # collected for the next batch, in arrival order
        self.segment_versions: list[int] = []  # their behaviour versions, in our counting
        self.updates = 0
        self.dropped_segments = 0  # beyond max_policy_lag
        self._steps_per_segment = 0  # largest T x N seen, for samples_per_update()

    # ---- explorer side -------------------------------------------------------------------
    def act(self, obs: np.ndarray, explore: dict) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Sample from the policy (``explore={"greedy": True}``: the most likely action); the
        extra ``logprob`` is the behaviour log-probability the learner's correction needs."""
        actions, logp = sample_categorical(self.net.numpy_logits(obs), self.rng, explore.get("greedy", False))
        return actions, {"logprob": logp}

    def get_weights(self) -> dict[str, np.ndarray]:
        return weights_of(self.net, self.actor_keys)

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        load_weights(self.net, weights, self.actor_keys)

    # ---- learner side --------------------------------------------------------------------
    def accepts(self, staleness: int) -> bool:
        return self.config.max_policy_lag is None or staleness <= self.config.max_policy_lag

    def ingest(self, chunk: dict, staleness: int) -> int:
        if not self.accepts(staleness):
            self.dropped_segments += 1
            return 0
        if "logprob" not in extras(chunk):
            name = type(self).__name__
            raise ValueError(f"{name}: chunk has no extra_logprob (was it collected by {name}.act?)")
        self.segments.append(chunk)
        self.segment_versions.append(self.updates - staleness)
        self._steps_per_segment = max(self._steps_per_segment, chunk["rewards"].size)
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

    def chunks_per_update(self) -> int:
        """Chunks one update needs: segments_per_batch."""
        return self.config.segments_per_batch

    def samples_per_update(self) -> int:
        """Env steps one batch holds at most. The segment size is only known once a chunk has
        arrived; before that this returns segments_per_batch (a count of chunks: prefer
        ``chunks_per_update()``)."""
        return self.config.segments_per_batch * max(1, self._steps_per_segment)

    def _make_optimizer(self) -> None:
        self.optimizer = Adam(self.net.parameters(), self.config.lr, eps=self.config.adam_eps)
        self.params = list(self.net.parameters())
