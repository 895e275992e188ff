"""The burn-in history a Rollout keeps for a recurrent policy with ``burn_in`` K (no Dask, no torch):
the last K steps of each env across chunks, shipped with the next chunk so that the learner can
recompute the chunk's ``state0`` with its current weights.

Per chunk: ``burn_obs`` (K, N, *obs_shape), the observations those K steps acted on;
``burn_valid`` (K, N), their validity (the state after an invalid step is reset to the initial
one, as the explorer resets it); ``burn_state`` (N, S), the state the first of them acted from.
Before the first chunk there is no history: padding steps, invalid, from the initial state, so
that the state entering the first real step is the initial one, exactly as the explorer's."""

from __future__ import annotations

import numpy as np


def _shift(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """The last ``len(old)`` rows of ``old`` followed by ``new``, a new array."""
    k, t = len(old), len(new)
    return new[t - k:].copy() if t >= k else np.concatenate([old[t:], new])


class BurnInHistory:
    """The last ``k`` steps of ``n`` envs: what they acted on, whether they were valid, and the
    state each acted from."""

    def __init__(self, k: int, obs: np.ndarray, initial: np.ndarray):
        """``obs``: an (N, *obs_shape) array of the chunk's observation dtype; ``initial``: the
        policy's initial state (N, S)."""
        self.k = k
        self.obs = np.zeros((k, *obs.shape), dtype=obs.dtype)
        self.valid = np.zeros((k, len(obs)), dtype=bool)
        self.states = np.repeat(initial[None], k, axis=0)

    def fields(self) -> dict[str, np.ndarray]:
        """The chunk fields of the history as it stands (arrays no later ``advance`` changes)."""
        return {"burn_obs": self.obs, "burn_valid": self.valid, "burn_state": self.states[0].copy()}

    def tail_steps(self, n_steps: int) -> int:
        """The first step of a chunk of ``n_steps`` whose state ``advance`` needs."""
        return max(0, n_steps - self.k)

    def advance(self, obs: np.ndarray, valid: np.ndarray, tail_states: np.ndarray) -> None:
        """Append a chunk's steps: ``obs`` (T, N, ...) and ``valid`` (T, N) of all of them, the
        states (T - tail_steps(T), N, S) its last steps acted from."""
        self.obs = _shift(self.obs, obs)
        self.valid = _shift(self.valid, valid)
        self.states = _shift(self.states, tail_states)
