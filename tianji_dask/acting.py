"""What acts in an env: the interface a rollout, an evaluation and a loaded policy call, with the
defaults a feed-forward policy that acts in the env's own terms needs. ``Algorithm`` is one; a
stand-in for one (a random policy in a test) subclasses ``Acting`` and writes ``act``. No torch,
no Dask."""

from __future__ import annotations

import numpy as np


class Acting:
    #: a recurrent policy's burn-in: the steps before a chunk's first that its chunks carry, from
    #: which the learner recomputes the chunk's start state (0: none; envs/burn_in.py)
    burn_in: int = 0

    def act(self, obs: np.ndarray, explore: dict) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions for a batch of observations, and per-step extras for the learner."""
        raise NotImplementedError

    def initial_state(self, num_envs: int) -> np.ndarray | None:
        """The recurrent state (num_envs, S) each episode starts from; None for a feed-forward
        policy, which acts through ``act`` alone."""
        return None

    def act_recurrent(self, obs: np.ndarray, state: np.ndarray, explore: dict) -> tuple[np.ndarray, dict, np.ndarray]:
        """``act`` from ``state`` (N, S); also returns the state after the step."""
        raise NotImplementedError(f"{type(self).__name__} is feed-forward: it acts through act()")

    def env_action(self, actions: np.ndarray) -> np.ndarray:
        """What ``env.step`` receives for the ``actions`` that ``act`` returned; chunks keep ``actions``."""
        return actions

    def seed_acting(self, seed) -> None:
        """Seed the action sampling (``seed``: anything ``numpy.random.default_rng`` takes), so that
        a chunk's actions depend on its seed and weights alone; a policy that samples nothing
        ignores it."""
