"""Gymnasium environment helpers: id checks and vector envs (no Dask)."""

from __future__ import annotations

import difflib

import gymnasium as gym


def check_env_id(env_id: str) -> None:
    """Raise ValueError with close matches when ``env_id`` is not a registered gymnasium id."""
    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ValueError(f"unknown gymnasium id {env_id!r}{hint}")


def make_vec_env(env_id: str, num_envs: int, seed: int | None = None, **env_kwargs) -> gym.vector.VectorEnv:
    """A vector env of ``num_envs`` copies, natively vectorised when the env offers it.

    Both routes use autoreset NEXT_STEP, which the chunk format relies on.
    """
    spec = gym.spec(env_id)
    mode = "vector_entry_point" if spec.vector_entry_point is not None else "sync"
    env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode, **env_kwargs)
    mode_name = getattr(env.metadata.get("autoreset_mode"), "name", "NEXT_STEP")
    if mode_name != "NEXT_STEP":
        raise RuntimeError(f"{env_id}: vector env autoreset mode {mode_name} is not supported")
    env.reset(seed=seed)
    return env


def env_spaces(env_id: str, **env_kwargs):
    """(single observation space, single action space) of an env id."""
    env = gym.make(env_id, **env_kwargs)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()
