"""Test envs: a CartPole that sleeps in every step (a slow explorer) and one that breaks."""

import time

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class SleepyCartPole(CartPoleEnv):
    def __init__(self, sleep_s: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.sleep_s = sleep_s

    def step(self, action):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return super().step(action)


if "SleepyCartPole-v0" not in gym.registry:
    gym.register("SleepyCartPole-v0", entry_point=SleepyCartPole, max_episode_steps=500)


class FailingCartPole(CartPoleEnv):
    """Raises from ``step`` once it has taken ``fail_after`` steps (an env that breaks)."""

    def __init__(self, fail_after: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.fail_after = fail_after
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.fail_after is not None and self.steps > self.fail_after:
            raise RuntimeError(f"FailingCartPole: broke after {self.fail_after} steps")
        return super().step(action)


if "FailingCartPole-v0" not in gym.registry:
    gym.register("FailingCartPole-v0", entry_point=FailingCartPole, max_episode_steps=500)


class UnboundedPendulum(gym.Wrapper):
    """Pendulum whose action space claims no bounds (what SAC cannot squash its actions into)."""

    def __init__(self, **kwargs):
        super().__init__(gym.make("Pendulum-v1", **kwargs))
        self.action_space = gym.spaces.Box(-float("inf"), float("inf"), (1,), "float32")


if "UnboundedPendulum-v0" not in gym.registry:
    gym.register("UnboundedPendulum-v0", entry_point=UnboundedPendulum)
