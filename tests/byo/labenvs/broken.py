"""Envs and a wrapper that break on purpose, one way each."""

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class RaisesInInit(CartPoleEnv):
    """Its constructor fails (a missing asset, a bad argument)."""

    def __init__(self, **kwargs):
        raise FileNotFoundError("corridor.map not found")


class WrongShape(CartPoleEnv):
    """Declares 4 observations, returns 3 from reset."""

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return obs[:3], info


class RaisesOnWorkers(CartPoleEnv):
    """Made in the driver, refused on a Dask worker (a package or file only the driver has)."""

    def __init__(self, **kwargs):
        try:
            from distributed import get_worker

            get_worker()
        except ValueError:  # not on a worker
            super().__init__(**kwargs)
            return
        raise ImportError("libsim.so: cannot open shared object file")


class RaiseSometimes(gym.Wrapper):
    """Raises from ``step`` about once in ``every`` steps (its own generator), never in the first
    ``grace`` steps after it is made (a flaky simulator)."""

    def __init__(self, env, every: int = 2000, grace: int = 100):
        super().__init__(env)
        self.every, self.grace, self.steps = every, grace, 0
        self.rng = np.random.default_rng()

    def step(self, action):
        self.steps += 1
        if self.steps > self.grace and self.rng.random() < 1.0 / self.every:
            raise RuntimeError(f"simulator lost its state after {self.steps} steps")
        return self.env.step(action)


class Unseeded(CartPoleEnv):
    """Its reset ignores the seed it is given (what gymnasium's env checker refuses)."""

    def reset(self, *, seed=None, options=None):
        return super().reset(seed=None, options=options)
