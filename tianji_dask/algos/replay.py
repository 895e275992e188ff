"""Uniform replay: n-step transitions cut from a chunk, stored in a preallocated ring buffer.

A stored transition is (obs, action, reward, next_obs, discount) where ``reward`` is the n-step
discounted return and ``discount`` is gamma**k for a k-step window that bootstraps from
``next_obs``, or 0 when the window ends on a terminated step. The TD target is therefore
``reward + discount * max_a Q(next_obs, a)`` whatever n, termination or truncation was.
"""

from __future__ import annotations

import numpy as np


def nstep_transitions(chunk: dict, gamma: float, n: int) -> dict[str, np.ndarray]:
    """All transitions of one chunk as n-step windows, flattened over (time, env).

    Each valid step t starts a window that runs until n steps are summed, the episode ends
    (terminated: no bootstrap; truncated: bootstrap from the true final observation obs[t+k+1]),
    or the chunk ends (bootstrap from obs[T]: chunks are self-contained, so windows never cross
    them and are shorter there). Invalid (autoreset) steps start no window. Rewards may carry
    trailing dimensions, (T, N, n_agents) for per-agent rewards; each is summed alike.
    """
    obs, actions, rewards = chunk["obs"], chunk["actions"], chunk["rewards"]
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
    return {
        "obs": obs[t_idx, env_idx],
        "actions": actions[t_idx, env_idx],
        "rewards": ret[t_idx, env_idx].astype(np.float32),
        "next_obs": obs[end[t_idx, env_idx], env_idx],
        "discounts": discount[t_idx, env_idx],
    }


class ReplayBuffer:
    """Fixed-capacity ring buffer of transitions in preallocated numpy arrays.

    Arrays are allocated on the first ``add`` (shapes and dtypes come from the data), so an
    instance that never receives data costs nothing.
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

    def _allocate(self, batch: dict[str, np.ndarray]) -> None:
        self.storage = {
            k: np.empty((self.capacity, *batch[k].shape[1:]), dtype=batch[k].dtype) for k in self.FIELDS
        }

    def add(self, batch: dict[str, np.ndarray]) -> int:
        """Append a batch of transitions (arrays with the same leading length); oldest are
        overwritten once full. Returns how many were added."""
        n = len(batch["rewards"])
        if n == 0:
            return 0
        if self.storage is None:
            self._allocate(batch)
        if n > self.capacity:  # only the newest fit
            batch = {k: batch[k][n - self.capacity:] for k in self.FIELDS}
            n = self.capacity
        first = min(n, self.capacity - self.pos)
        for k in self.FIELDS:
            self.storage[k][self.pos:self.pos + first] = batch[k][:first]
            if first < n:
                self.storage[k][: n - first] = batch[k][first:]
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        return n

    def sample_indices(self, batch_size: int) -> np.ndarray:
        return self.rng.integers(0, self.size, size=batch_size)

    def gather(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        return {k: self.storage[k][idx] for k in self.FIELDS}

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        """A uniform minibatch (with replacement)."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        return self.gather(self.sample_indices(batch_size))

    def state_dict(self, include_data: bool = True) -> dict:
        state = {"capacity": self.capacity, "rng": self.rng.bit_generator.state}
        if include_data and self.storage is not None:
            state.update(pos=self.pos, size=self.size,
                         storage={k: v[: self.size].copy() for k, v in self.storage.items()})
        return state

    def load_state_dict(self, state: dict) -> None:
        if state["capacity"] != self.capacity:
            raise ValueError(f"replay capacity {state['capacity']} != {self.capacity}")
        self.rng.bit_generator.state = state["rng"]
        if "storage" in state:
            self._allocate(state["storage"])
            size = state["size"]
            for k, v in state["storage"].items():
                self.storage[k][:size] = v
            self.pos, self.size = state["pos"], size
