"""Discrete observations as one-hot vectors, for networks that take flat Box observations.

``OneHot-v0`` wraps any env whose observation space is Discrete or MultiDiscrete (POPGym's card
games, for one: ``env.kwargs: {base: "popgym:popgym-RepeatPreviousEasy-v0"}``, ``module:Id``
importing the module that registers the id, as gymnasium does) in gymnasium's
``FlattenObservation``: one float32 one-hot block per discrete entry. Importing this module
registers it, so a pipeline names it ``tianji_dask.envs.onehot:OneHot-v0``."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


def one_hot(base: str, **kwargs) -> gym.Env:
    """``gym.make(base, **kwargs)`` with one-hot float32 observations."""
    env = gym.make(base, **kwargs)
    if not isinstance(env.observation_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        raise ValueError(f"{base}: OneHot-v0 is for Discrete or MultiDiscrete observations, got {env.observation_space}")
    env = gym.wrappers.FlattenObservation(env)
    space = env.observation_space
    return gym.wrappers.TransformObservation(env, lambda obs: obs.astype(np.float32),
                                             gym.spaces.Box(0.0, 1.0, space.shape, np.float32))


if "OneHot-v0" not in gym.registry:
    gym.register("OneHot-v0", entry_point=one_hot)
