"""PettingZoo parallel envs as gymnasium vector envs, so Rollout steps them unchanged (no Dask).

N copies of a parallel env are stepped together. Observations are ``(N, n_agents, obs_dim)``
float32, actions ``(N, n_agents)`` ints, and the reward of an env is its team reward: the sum of
its agents' rewards, which is what MPE papers report. Each agent's own reward is in the step's
info as ``agent_rewards`` ``(N, n_agents)``, which Rollout keeps in the chunk as an extra.

Autoreset is gymnasium's NEXT_STEP: the step after an env's episode ended resets it, returns the
new first observation, reward 0 and no termination, and ignores the actions.
"""

from __future__ import annotations

import importlib

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

#: supported PettingZoo parallel envs: env id -> module whose ``parallel_env(**kwargs)`` makes one
PARALLEL_ENVS = {
    "mpe2:simple_spread_v3": "mpe2.simple_spread_v3",
}
#: modules whose ids name PettingZoo envs (``mpe2:NAME``): an id there that is not above is an error
PARALLEL_ENV_PACKAGES = {"mpe2"}


def is_parallel_env_id(env_id: str) -> bool:
    """True for ids that name a PettingZoo parallel env (supported or not), not a gymnasium one."""
    return env_id in PARALLEL_ENVS or env_id.partition(":")[0] in PARALLEL_ENV_PACKAGES


def check_parallel_env_id(env_id: str) -> None:
    """ValueError naming the supported ids when ``env_id`` is not one, or its package is missing."""
    if env_id not in PARALLEL_ENVS:
        raise ValueError(f"unknown PettingZoo env {env_id!r} (supported: {', '.join(sorted(PARALLEL_ENVS))})")
    module = PARALLEL_ENVS[env_id]
    try:
        importlib.import_module(module)
    except ImportError as err:
        raise ValueError(f"cannot import {module!r} for {env_id!r} (pip install 'tianji-dask[marl]'): {err}") from None


class ParallelVecEnv(gym.vector.VectorEnv):
    """``num_envs`` copies of one PettingZoo parallel env with a fixed set of agents.

    The agents must share one observation shape and one Discrete action space (true of
    simple_spread). An agent that finishes before the others keeps its last observation and
    gets reward 0 until the episode ends; its actions are ignored.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, env_id: str, num_envs: int, **env_kwargs):
        check_parallel_env_id(env_id)
        make = importlib.import_module(PARALLEL_ENVS[env_id]).parallel_env
        self.envs = [make(**env_kwargs) for _ in range(num_envs)]
        first = self.envs[0]
        self.agents = list(first.possible_agents)
        obs_space, act_space = first.observation_space(self.agents[0]), first.action_space(self.agents[0])
        for agent in self.agents[1:]:
            if first.observation_space(agent) != obs_space or first.action_space(agent) != act_space:
                raise ValueError(f"{env_id}: agents must share one observation and one action space; "
                                 f"{agent} has {first.observation_space(agent)}, {first.action_space(agent)}")
        if not isinstance(act_space, gym.spaces.Discrete) or len(obs_space.shape) != 1:
            raise ValueError(f"{env_id}: needs Discrete actions and flat observations, got {act_space}, {obs_space}")
        n_agents = len(self.agents)
        self.num_envs = num_envs
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (n_agents, obs_space.shape[0]), np.float32)
        self.single_action_space = gym.spaces.MultiDiscrete(np.full(n_agents, act_space.n))
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self._obs = np.zeros((num_envs, *self.single_observation_space.shape), np.float32)
        # True where the env's episode ended on the previous step: its next step is a reset
        self._needs_reset = np.zeros(num_envs, dtype=bool)

    def _write_obs(self, i: int, obs_by_agent: dict) -> None:
        for j, agent in enumerate(self.agents):
            if agent in obs_by_agent:
                self._obs[i, j] = obs_by_agent[agent]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        for i, env in enumerate(self.envs):
            obs_by_agent, _ = env.reset(seed=None if seed is None else seed + i, options=options)
            self._write_obs(i, obs_by_agent)
        self._needs_reset[:] = False
        return self._obs.copy(), {}

    def step(self, actions):
        actions = np.asarray(actions)
        n, n_agents = self.num_envs, len(self.agents)
        agent_rewards = np.zeros((n, n_agents), np.float32)
        terminated = np.zeros(n, bool)
        truncated = np.zeros(n, bool)
        for i, env in enumerate(self.envs):
            if self._needs_reset[i]:
                obs_by_agent, _ = env.reset()
                self._write_obs(i, obs_by_agent)
                continue
            live = {a: int(actions[i, j]) for j, a in enumerate(self.agents) if a in env.agents}
            obs_by_agent, rewards, terms, truncs, _ = env.step(live)
            self._write_obs(i, obs_by_agent)
            for j, agent in enumerate(self.agents):
                agent_rewards[i, j] = rewards.get(agent, 0.0)
            if not env.agents:  # every agent is done: the episode ended
                truncated[i] = any(truncs.values())
                terminated[i] = not truncated[i]
        self._needs_reset = terminated | truncated
        return (self._obs.copy(), agent_rewards.sum(axis=1), terminated, truncated,
                {"agent_rewards": agent_rewards})

    def close_extras(self, **kwargs) -> None:
        for env in self.envs:
            env.close()
