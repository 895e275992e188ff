"""A small corridor: walk right to its end. Box observation (the position, one-hot), Discrete
actions (0: left, 1: right); +1 at the end, ``-step_cost`` every other step, truncated after
``max_steps``. Episodes start in cell 0 or 1: the best return is 0.7 or 0.75 (length 8); a random
walk seldom reaches the end in 20 steps (about -0.9)."""

import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, length: int = 8, max_steps: int = 20, step_cost: float = 0.05):
        self.length, self.max_steps, self.step_cost = length, max_steps, step_cost
        self.observation_space = gym.spaces.Box(0.0, 1.0, (length,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.position, self.steps = 0, 0

    def _obs(self):
        obs = np.zeros(self.length, np.float32)
        obs[self.position] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position, self.steps = int(self.np_random.integers(0, 2)), 0
        return self._obs(), {}

    def step(self, action):
        self.position = min(self.length - 1, max(0, self.position + (1 if int(action) == 1 else -1)))
        self.steps += 1
        terminated = self.position == self.length - 1
        reward = 1.0 if terminated else -self.step_cost
        return self._obs(), reward, terminated, self.steps >= self.max_steps, {}
