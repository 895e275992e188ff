"""Tasks that need memory: an env whose observation keeps only some of its entries.

``CartPoleNoVel-v1`` is CartPole-v1 with its two velocities hidden (the observation is cart
position and pole angle, as in the RL Zoo's CartPoleNoVel): a feed-forward policy cannot tell
which way the pole is moving, a recurrent one can. Importing this module registers it, so a
pipeline names it ``tianji_dask.envs.masked:CartPoleNoVel-v1`` and every process that makes its
envs imports the module first (see vector.check_env_id). ``MaskedObs-v0`` masks any env with flat
Box observations: ``env.kwargs: {base: Pendulum-v1, keep: [0, 2]}``."""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np

CARTPOLE_POSITIONS = (0, 2)  # cart position, pole angle; 1 and 3 are their velocities


def _masked_space(space: gym.Space, keep: Sequence[int], name: str) -> gym.spaces.Box:
    if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
        raise ValueError(f"{name}: keep is for flat Box observations, got {space}")
    keep = list(keep)
    if not keep or any(not isinstance(i, int) or not 0 <= i < space.shape[0] for i in keep) or len(set(keep)) != len(keep):
        raise ValueError(f"{name}: keep {keep!r}; allowed: distinct indices in 0..{space.shape[0] - 1}")
    return gym.spaces.Box(space.low[keep], space.high[keep], dtype=space.dtype)


def masked(base: str, keep: Sequence[int], **kwargs) -> gym.Env:
    """``gym.make(base, **kwargs)`` whose observation is ``obs[keep]``."""
    env = gym.make(base, **kwargs)
    space = _masked_space(env.observation_space, keep, base)
    index = np.asarray(list(keep))
    return gym.wrappers.TransformObservation(env, lambda obs: obs[index], space)


def masked_vector(num_envs: int, base: str, keep: Sequence[int], **kwargs) -> gym.vector.VectorEnv:
    """A vector env of ``base`` (its own vector entry point where it has one) whose observations
    are ``obs[:, keep]``."""
    spec = gym.spec(base)
    mode = "vector_entry_point" if spec.vector_entry_point is not None else "sync"
    env = gym.make_vec(base, num_envs=num_envs, vectorization_mode=mode, **kwargs)
    single = _masked_space(env.single_observation_space, keep, base)
    index = np.asarray(list(keep))
    return gym.wrappers.vector.TransformObservation(
        env, lambda obs: obs[:, index], gym.vector.utils.batch_space(single, num_envs), single)


def cartpole_novel(**kwargs) -> gym.Env:
    return masked("CartPole-v1", CARTPOLE_POSITIONS, **kwargs)


def cartpole_novel_vector(num_envs: int, **kwargs) -> gym.vector.VectorEnv:
    return masked_vector(num_envs, "CartPole-v1", CARTPOLE_POSITIONS, **kwargs)


def _register() -> None:
    if "CartPoleNoVel-v1" not in gym.registry:
        gym.register("CartPoleNoVel-v1", entry_point=cartpole_novel, vector_entry_point=cartpole_novel_vector)
    if "MaskedObs-v0" not in gym.registry:
        gym.register("MaskedObs-v0", entry_point=masked, vector_entry_point=masked_vector)


_register()
