"""CartPole-v1 observed as a Dict of two Box keys: what a Dict observation costs the dataflow.

``CartPoleDict-v1`` is CartPole-v1 whose observation is ``{"position": [x, theta], "velocity":
[x_dot, theta_dot]}`` (float32, CartPole's own bounds): the same four numbers, the same bytes, in
two leaves. Its vector envs are CartPole's own vectorised env, whose observations are split into
two strided views (no copy), so a run of ``cartpole_dict_ppo`` beside ``cartpole_ppo`` measures
what the Dict path (two leaves per chunk, the multi-input encoder) costs and nothing else.
Importing this module registers the id (``tianji_dask.envs.dict_cartpole:CartPoleDict-v1``). Only
gymnasium and numpy are imported."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


def _split_space(box: gym.spaces.Box) -> gym.spaces.Dict:
    return gym.spaces.Dict({"position": gym.spaces.Box(box.low[0::2], box.high[0::2], dtype=np.float32),
                            "velocity": gym.spaces.Box(box.low[1::2], box.high[1::2], dtype=np.float32)})


def cartpole_dict(**kwargs) -> gym.Env:
    """``gym.make("CartPole-v1", **kwargs)`` observing ``{"position", "velocity"}``."""
    env = gym.make("CartPole-v1", **kwargs)
    return gym.wrappers.TransformObservation(env, lambda obs: {"position": obs[0::2], "velocity": obs[1::2]},
                                             _split_space(env.observation_space))


def cartpole_dict_vector(num_envs: int, **kwargs) -> gym.vector.VectorEnv:
    """CartPole's own vector env, each batch of observations split into two strided views."""
    env = gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs)
    single = _split_space(env.single_observation_space)
    return gym.wrappers.vector.TransformObservation(
        env, lambda obs: {"position": obs[:, 0::2], "velocity": obs[:, 1::2]},
        gym.vector.utils.batch_space(single, num_envs), single)


if "CartPoleDict-v1" not in gym.registry:
    gym.register("CartPoleDict-v1", entry_point=cartpole_dict, vector_entry_point=cartpole_dict_vector)
