"""Gymnasium environment helpers: id checks and vector envs (no Dask).

Ids of PettingZoo parallel envs (``mpe2:simple_spread_v3``) resolve to a multi-agent vector env
(see marl_envs); every other id is a gymnasium one."""

from __future__ import annotations

import difflib
import importlib

import gymnasium as gym

from tianji_dask.marl_envs import ParallelVecEnv, check_parallel_env_id, is_parallel_env_id


def check_env_id(env_id: str) -> None:
    """Raise ValueError with close matches when ``env_id`` is not a registered gymnasium id.

    ``module:Name-v0`` imports ``module`` first (it registers its own envs), as gymnasium does.
    PettingZoo ids must be among the supported ones (marl_envs.PARALLEL_ENVS)."""
    if is_parallel_env_id(env_id):
        check_parallel_env_id(env_id)
        return
    if ":" in env_id:
        module, _, name = env_id.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ValueError(f"cannot import module {module!r} that should register {name!r}: {err}") from None
        env_id = name
    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ValueError(f"unknown gymnasium id {env_id!r}{hint}")


def registered_id(env_id: str) -> str:
    """``module:Name-v0`` -> ``Name-v0`` after importing ``module`` (which registers it)."""
    if ":" in env_id:
        module, _, env_id = env_id.partition(":")
        importlib.import_module(module)
    return env_id


def make_vec_env(env_id: str, num_envs: int, seed: int | None = None, **env_kwargs) -> gym.vector.VectorEnv:
    """A vector env of ``num_envs`` copies, natively vectorised when the env offers it.

    All routes use autoreset NEXT_STEP, which the chunk format relies on.
    """
    if is_parallel_env_id(env_id):
        env = ParallelVecEnv(env_id, num_envs, **env_kwargs)
        env.reset(seed=seed)
        return env
    env_id = registered_id(env_id)
    spec = gym.spec(env_id)
    mode = "vector_entry_point" if spec.vector_entry_point is not None else "sync"
    env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode, **env_kwargs)
    mode_name = getattr(env.metadata.get("autoreset_mode"), "name", "NEXT_STEP")
    if mode_name != "NEXT_STEP":
        raise RuntimeError(f"{env_id}: vector env autoreset mode {mode_name} is not supported")
    env.reset(seed=seed)
    return env


def env_spaces(env_id: str, **env_kwargs):
    """(single observation space, single action space) of an env id, as explorers will see them:
    read off a one-env vector env made the same way (an env's own vector entry point may
    preprocess, e.g. Atari's stacked 84x84 grey frames)."""
    env = make_vec_env(env_id, 1, **env_kwargs)
    try:
        return env.single_observation_space, env.single_action_space
    finally:
        env.close()
