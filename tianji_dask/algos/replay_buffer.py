"""Replay: n-step transitions cut from a chunk, stored in a preallocated ring buffer, drawn
uniformly or in proportion to their priorities (a sum tree).

A stored transition is (obs, action, reward, next_obs, discount) where ``reward`` is the n-step
discounted return and ``discount`` is gamma**k for a k-step window that bootstraps from
``next_obs``, or 0 when the window ends on a terminated step. The TD target is therefore
``reward + discount * max_a Q(next_obs, a)`` whatever n, termination or truncation was.
Each also keeps the policy version of the chunk that made it (``VERSION``), not trained on: what
replay staleness is measured by (the versions between a sample's making and its training).
Dict and Tuple observations are kept leaf by leaf: ``obs`` and ``next_obs`` are then dicts
``{path: array}``, stored as columns ``obs.<path>`` and ``next_obs.<path>`` and gathered back as dicts.
"""

from __future__ import annotations

import math

import numpy as np

from tianji_dask.chunk import map_obs, observations

#: each transition's column holding the policy version of the chunk that made it
VERSION = "policy_version"


def nstep_transitions(chunk: dict, gamma: float, n: int) -> dict[str, np.ndarray]:
    """All transitions of one chunk as n-step windows, flattened over (time, env).

    Each valid step t starts a window that runs until n steps are summed, the episode ends
    (terminated: no bootstrap; truncated: bootstrap from the true final observation obs[t+k+1]),
    or the chunk ends (bootstrap from obs[T]: chunks are self-contained, so windows never cross
    them and are shorter there). Invalid (autoreset) steps start no window. Rewards may carry
    trailing dimensions, (T, N, n_agents) for per-agent rewards; each is summed alike. Every
    transition carries the chunk's ``policy_version`` (``VERSION``).
    """
    obs, actions, rewards = observations(chunk), chunk["actions"], chunk["rewards"]
    terminated, truncated, valid = chunk["terminated"], chunk["truncated"], chunk["valid"]
    T, N = valid.shape
    ret = np.zeros(rewards.shape, dtype=np.float64)
    per_step = (1,) * (rewards.ndim - 2)  # broadcasts (T, N) masks over the rewards' trailing dims
    length = np.zeros((T, N), dtype=np.int64)  # steps summed into each window
    ended = np.zeros((T, N), dtype=bool)  # window ends on a terminated step: no bootstrap
    alive = valid.copy()  # window still extending
    for k in range(min(n, T)):
        # the window of step t looks at step t+k, for t in [0, T-k)
        a = alive[: T - k] & valid[k:]
        ret[: T - k] += np.where(a.reshape(*a.shape, *per_step), gamma**k * rewards[k:], 0.0)
        length[: T - k] += a
        ended[: T - k] |= a & terminated[k:]
        alive[: T - k] = a & ~terminated[k:] & ~truncated[k:]
        alive[T - k:] = False
    discount = np.where(ended, 0.0, gamma**length).astype(np.float32)
    end = np.arange(T)[:, None] + length  # obs frame to bootstrap from
    t_idx, env_idx = np.nonzero(valid)
    next_t = end[t_idx, env_idx]
    return {
        "obs": map_obs(lambda o: o[t_idx, env_idx], obs),
        "actions": actions[t_idx, env_idx],
        "rewards": ret[t_idx, env_idx].astype(np.float32),
        "next_obs": map_obs(lambda o: o[next_t, env_idx], obs),
        "discounts": discount[t_idx, env_idx],
        VERSION: np.full(len(t_idx), chunk["policy_version"], dtype=np.int64),
    }


class ReplayBuffer:
    """Fixed-capacity ring buffer of transitions in preallocated numpy arrays.

    Arrays are allocated on the first ``add`` (shapes and dtypes come from the data), so an
    instance that never receives data costs nothing. Beside the ``FIELDS`` trained on, each
    transition keeps its policy version (``storage[VERSION]``, int64; 0 when a batch has none),
    which ``gather`` leaves out and ``mean_version`` reads.
    """

    FIELDS = ("obs", "actions", "rewards", "next_obs", "discounts")

    def __init__(self, capacity: int, seed: int = 0):
        if capacity <= 0:
            raise ValueError("replay capacity must be positive")
        self.capacity = int(capacity)
        self.rng = np.random.default_rng(seed)
        self.storage: dict[str, np.ndarray] | None = None
        self.pos = 0  # next slot to write
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def _allocate(self, columns: dict[str, np.ndarray]) -> None:
        """Storage for ``columns`` (``_columns``' flat ones, or a state's storage)."""
        self.storage = {
            k: np.empty((self.capacity, *v.shape[1:]), dtype=v.dtype) for k, v in columns.items() if k != VERSION
        }
        self.storage[VERSION] = np.zeros(self.capacity, dtype=np.int64)

    def _columns(self, batch: dict) -> dict[str, np.ndarray]:
        """The ``FIELDS`` of a batch as flat columns: a dict-valued field's leaves as ``field.<path>``."""
        out = {}
        for k in self.FIELDS:
            v = batch[k]
            if isinstance(v, dict):
                out.update({f"{k}.{path}": leaf for path, leaf in v.items()})
            else:
                out[k] = v
        return out

    def add(self, batch: dict[str, np.ndarray]) -> int:
        """Append a batch of transitions (arrays with the same leading length); oldest are
        overwritten once full. Returns how many were added."""
        n = len(batch["rewards"])
        if n == 0:
            return 0
        columns = self._columns(batch)
        if self.storage is None:
            self._allocate(columns)
        columns[VERSION] = batch[VERSION] if VERSION in batch else np.zeros(n, dtype=np.int64)
        if n > self.capacity:  # only the newest fit
            columns = {k: v[n - self.capacity:] for k, v in columns.items()}
            n = self.capacity
        first = min(n, self.capacity - self.pos)
        for k, v in columns.items():
            self.storage[k][self.pos:self.pos + first] = v[:first]
            if first < n:
                self.storage[k][: n - first] = v[first:]
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        return n

    def sample_indices(self, batch_size: int) -> np.ndarray:
        """Uniform draws (with replacement) of stored transitions' indices."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        return self.rng.integers(0, self.size, size=batch_size)

    def gather(self, idx: np.ndarray) -> dict:
        """The transitions at ``idx``: each of ``FIELDS``, a dict of leaves for a Dict observation."""
        out: dict = {}
        for k, v in self.storage.items():
            if k == VERSION:
                continue
            field, _, path = k.partition(".")
            if path:
                out.setdefault(field, {})[path] = v[idx]
            else:
                out[k] = v[idx]
        return out

    def mean_version(self, idx: np.ndarray) -> float:
        """The mean policy version of the transitions at ``idx`` (a numpy mean: no device sync)."""
        return float(self.storage[VERSION][idx].mean())

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        """A uniform minibatch (with replacement)."""
        return self.gather(self.sample_indices(batch_size))

    def state_dict(self, include_data: bool = True) -> dict:
        state = {"capacity": self.capacity, "rng": self.rng.bit_generator.state}
        if include_data and self.storage is not None:
            state.update(pos=self.pos, size=self.size,
                         storage={k: v[: self.size].copy() for k, v in self.storage.items()})
        return state

    def load_state_dict(self, state: dict, missing_version: int = 0) -> None:
        """``missing_version``: the policy version given to every stored transition when the state
        holds none (a checkpoint written before transitions kept theirs)."""
        if state["capacity"] != self.capacity:
            raise ValueError(f"replay capacity {state['capacity']} != {self.capacity}")
        self.rng.bit_generator.state = state["rng"]
        if "storage" in state:
            self._allocate(state["storage"])
            size = state["size"]
            for k, v in state["storage"].items():
                self.storage[k][:size] = v
            if VERSION not in state["storage"]:
                self.storage[VERSION][:size] = missing_version
            self.pos, self.size = state["pos"], size


class SumTree:
    """Sums of leaf values in a flat array: node ``i`` has children ``2i`` and ``2i + 1``, the
    root is node 1 and leaf ``j`` is node ``leaves + j`` (leaves padded to a power of two).

    Updates and prefix-sum searches take whole batches; the only Python loop is over the
    tree's levels (17 for 100k leaves).
    """

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.depth = max(1, math.ceil(math.log2(self.capacity)))
        self.leaves = 1 << self.depth
        # float64: a float32 root over 100k leaves would drift away from the sum of its leaves
        self.nodes = np.zeros(2 * self.leaves, dtype=np.float64)

    def total(self) -> float:
        return float(self.nodes[1])

    def values(self, idx: np.ndarray) -> np.ndarray:
        return self.nodes[self.leaves + np.asarray(idx)]

    def update(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Set leaves ``idx`` to ``values`` (the last one wins for a repeated index)."""
        node = self.leaves + np.asarray(idx, dtype=np.int64)
        self.nodes[node] = values
        for _ in range(self.depth):
            node >>= 1
            child = node << 1
            # recomputed from the children, not incremented: no drift, and repeated parents are harmless
            self.nodes[node] = self.nodes.take(child) + self.nodes.take(child + 1)

    def rebuild(self) -> None:
        """Recompute every inner node from the leaves, one level at a time."""
        lo = self.leaves
        while lo > 1:
            self.nodes[lo // 2:lo] = self.nodes[lo:2 * lo:2] + self.nodes[lo + 1:2 * lo:2]
            lo //= 2

    def find(self, prefix: np.ndarray) -> np.ndarray:
        """For each value u in [0, total), the leaf j whose cumulative sum range holds u."""
        u = np.array(prefix, dtype=np.float64)
        node = np.ones(len(u), dtype=np.int64)
        for _ in range(self.depth):
            node <<= 1
            left = self.nodes.take(node)
            right = u >= left
            u -= left * right
            node += right
        return node - self.leaves


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016): transition i is drawn with
    probability p_i^alpha / sum_j p_j^alpha, where p_i = |TD error| + eps from its last update;
    new transitions get the largest priority seen so far, so each is replayed at least once soon.

    A minibatch is stratified: one draw from each of ``batch_size`` equal segments of the total.
    """

    def __init__(self, capacity: int, alpha: float, eps: float, seed: int = 0):
        super().__init__(capacity, seed)
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.tree: SumTree | None = None  # with the storage: explorers' copies never hold one
        self.max_priority = 1.0  # raw (before alpha): what new transitions get

    def _allocate(self, batch: dict[str, np.ndarray]) -> None:
        super()._allocate(batch)
        self.tree = SumTree(self.capacity)

    def add(self, batch: dict[str, np.ndarray], priorities: np.ndarray | None = None) -> int:
        """As ``ReplayBuffer.add``; ``priorities`` (|TD errors|, one per transition, e.g. computed
        by explorers as in Ape-X; eps is added) replace the default of the largest priority so far."""
        start = self.pos
        n = super().add(batch)
        if n == 0:
            return 0
        idx = (start + np.arange(n)) % self.capacity
        if priorities is None:
            self.tree.update(idx, np.full(n, self.max_priority**self.alpha))
        else:
            self.update_priorities(idx, np.asarray(priorities)[-n:])
        return n

    def sample_indices(self, batch_size: int) -> np.ndarray:
        total = self.tree.total()
        prefix = (np.arange(batch_size) + self.rng.random(batch_size)) * (total / batch_size)
        # rounding can put a draw at the very end, past the last stored leaf: that is the last one
        return np.minimum(self.tree.find(prefix), self.size - 1)

    def probabilities(self, idx: np.ndarray) -> np.ndarray:
        return self.tree.values(idx) / self.tree.total()

    def importance_weights(self, idx: np.ndarray, beta: float) -> np.ndarray:
        """w_i = (N * P(i))^-beta, divided by the minibatch's largest so that weights only scale
        updates down."""
        w = (self.size * self.probabilities(idx)) ** -beta
        return (w / w.max()).astype(np.float32)

    def update_priorities(self, idx: np.ndarray, td_abs: np.ndarray) -> None:
        """New priorities |TD error| + eps for the transitions at ``idx``."""
        priorities = np.asarray(td_abs, dtype=np.float64) + self.eps
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self.tree.update(idx, priorities**self.alpha)

    def state_dict(self, include_data: bool = True) -> dict:
        state = super().state_dict(include_data)
        state["max_priority"] = self.max_priority
        if "storage" in state:
            state["priorities"] = self.tree.values(np.arange(self.size))  # already ^alpha
        return state

    def load_state_dict(self, state: dict, missing_version: int = 0) -> None:
        super().load_state_dict(state, missing_version)
        self.max_priority = float(state["max_priority"])
        if "storage" in state:  # the storage was just allocated, with an empty tree
            self.tree.nodes[self.tree.leaves:self.tree.leaves + self.size] = state["priorities"]
            self.tree.rebuild()


class ReplayPacing:
    """The replay ratio of an algorithm that trains on minibatches drawn from ``self.replay``.

    Once the replay holds ``config.learning_starts`` transitions, every env step stored earns
    ``config.updates_per_env_step`` updates (or a controller's ceiling, ``set_replay_ratio_max``);
    ``ready()`` says whether one is owed. The algorithm keeps ``updates`` and spends
    ``update_credit`` in ``learn()``."""

    def _init_pacing(self) -> None:
        self.env_steps = 0  # env steps ingested
        self.updates = 0
        self.update_credit = 0.0  # updates allowed now by the replay ratio
        self.env_steps_past_warmup = 0
        self._upe_max: float | None = None  # a controller's ceiling, replacing updates_per_env_step

    def store(self, batch: dict) -> int:
        """Add transitions to the replay and earn their updates; returns how many were added."""
        c = self.config
        before = len(self.replay)
        kept = self.replay.add(batch)
        self.env_steps += kept
        after = len(self.replay)
        if after >= c.learning_starts:
            past_warmup = kept if before >= c.learning_starts else after - c.learning_starts + 1
            self.env_steps_past_warmup += past_warmup
            self.update_credit += past_warmup * (self._upe_max if self._upe_max is not None else c.updates_per_env_step)
        return kept

    def replay_progress(self) -> dict:
        return {
            "env_steps": self.env_steps_past_warmup,
            "samples_trained": self.updates * self.config.batch_size,
            "warm": len(self.replay) >= self.config.learning_starts,
            "ratio": self.config.updates_per_env_step * self.config.batch_size,  # configured samples per env step
            "fill": len(self.replay) / self.replay.capacity,  # the replay law steers by a full buffer's staleness
        }

    def set_replay_ratio_max(self, rho_max: float | None) -> None:
        self._upe_max = None if rho_max is None else rho_max / self.config.batch_size

    def ready(self) -> bool:
        return self.update_credit >= 1.0 and len(self.replay) >= self.config.learning_starts
