"""Gymnasium environment helpers: id checks and vector envs (no Dask).

Ids of PettingZoo parallel envs (``mpe2:simple_spread_v3``) resolve to a multi-agent vector env
(see marl_envs); every other id is a gymnasium one.

Third-party envs that register their ids only when a function is called (MinAtar:
``minatar.gym:register_envs``) are named by a pipeline's ``env.register``. The validated
pipeline's ``env.id`` is then an ``EnvId``: the id string, carrying that ``module:callable`` to
every process the id travels to (explorer workers get it inside their env pool), and every
helper here calls it, once per process, before it checks or makes the env."""

from __future__ import annotations

import difflib
import importlib
import threading

import gymnasium as gym

from tianji_dask.envs.marl import (
    ParallelVecEnv,
    check_parallel_env_id,
    is_parallel_env_id,
)
from tianji_dask.importing import load_object

REGISTER_ALLOWED = ("'module:callable', a function of an importable module that registers gymnasium ids, "
                    "called with no arguments (e.g. minatar.gym:register_envs)")

_registered: set[str] = set()
_register_lock = threading.Lock()


class EnvId(str):
    """An env id (compares, hashes and prints as the plain string) that carries ``register``, the
    ``module:callable`` registering it, through pickling to the processes that make its envs."""

    def __new__(cls, env_id: str, register: str | None = None):
        self = super().__new__(cls, env_id)
        self.register = register
        return self

    def __reduce__(self):
        return (EnvId, (str(self), self.register))


def with_register(env_id: str, spec: str | None) -> str:
    """``env_id`` carrying ``spec`` (an ``EnvId``), or the plain id when there is none."""
    return EnvId(env_id, spec) if spec else str(env_id)


def resolve_register(spec: str):
    """The callable a ``module:callable`` spec names; ValueError (one line) when it is malformed,
    its module cannot be imported or has no such callable."""
    fn = load_object(spec, REGISTER_ALLOWED)
    if not callable(fn):
        raise ValueError(f"{spec!r} is not callable; allowed: {REGISTER_ALLOWED}")
    return fn


def register(spec: str | None) -> None:
    """Call the ``module:callable`` of ``spec`` (a pipeline's env.register), once per process:
    later calls with the same spec do nothing (its ids stay registered). ``None`` does nothing.
    ValueError (one line) when the callable cannot be found or fails."""
    if not spec or spec in _registered:
        return
    with _register_lock:  # explorer threads may make their first envs at once
        if spec in _registered:
            return
        fn = resolve_register(spec)
        try:
            fn()
        except Exception as err:
            raise ValueError(f"{spec}() failed ({type(err).__name__}: {err}); allowed: {REGISTER_ALLOWED}") from None
        _registered.add(spec)


def check_env_id(env_id: str, register_spec: str | None = None) -> None:
    """Raise ValueError with close matches when ``env_id`` is not a registered gymnasium id.

    ``module:Name-v0`` imports ``module`` first (it registers its own envs), as gymnasium does;
    ``register_spec`` (or the one an ``EnvId`` carries) is called first (see ``register``).
    PettingZoo ids must be among the supported ones (marl_envs.PARALLEL_ENVS)."""
    register(register_spec or getattr(env_id, "register", None))
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
    if not close and "/" in env_id and not getattr(env_id, "register", None):
        hint = " (a third-party env's ids are registered by importing its module, module:Name-v0, or by calling a function: env.register)"
    raise ValueError(f"unknown gymnasium id {env_id!r}{hint}")


def registered_id(env_id: str) -> str:
    """``module:Name-v0`` -> ``Name-v0`` after importing ``module`` (which registers it)."""
    if ":" in env_id:
        module, _, env_id = env_id.partition(":")
        importlib.import_module(module)
    return env_id


def make_vec_env(env_id: str, num_envs: int, seed: int | None = None, **env_kwargs) -> gym.vector.VectorEnv:
    """A vector env of ``num_envs`` copies, natively vectorised when the env offers it.

    All routes use autoreset NEXT_STEP, which the chunk format relies on. An ``EnvId``'s
    ``register`` is called first (once per process).
    """
    register(getattr(env_id, "register", None))
    if is_parallel_env_id(env_id):
        env = ParallelVecEnv(env_id, num_envs, **env_kwargs)
        env.reset(seed=seed)
        return env
    env_id = registered_id(str(env_id))
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
