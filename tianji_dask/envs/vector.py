"""Gymnasium environment helpers: id checks and vector envs (no Dask).

Ids of PettingZoo parallel envs (``mpe2:simple_spread_v3``) resolve to a multi-agent vector env
(see marl_envs); every other id is a gymnasium one.

Third-party envs that register their ids only when a function is called (MinAtar:
``minatar.gym:register_envs``) are named by a pipeline's ``env.register``. The validated
pipeline's ``env.id`` is an ``EnvId`` (``source.py`` resolves it): the id string, carrying that
``module:callable``, the ``EnvSpec`` its envs are made from (a class, a factory or an id registered
only in the driver travels inside it, by value when it lives in ``__main__``) and the wrappers
around each single env, to every process the id travels to (explorer workers get it inside their
env pool); every helper here makes envs from what it carries."""

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
    """An env id (compares, hashes and prints as the plain string, its label) that carries, through
    pickling, what the processes making its envs need: ``register``, the ``module:callable``
    registering it; ``spec``, the ``gymnasium.EnvSpec`` to make it from (None: look the id up in
    gymnasium's registry); ``wrappers``, callables applied in order around each single env;
    ``source``, the class or callable a user gave (None for a string); ``backend``, what makes its
    vector envs: ``gymnasium``, or ``envpool`` (an EnvPool id, no spec: ``envpool_backend.py``)."""

    def __new__(cls, env_id: str, register: str | None = None, spec=None, wrappers=(), source=None,
                backend: str = "gymnasium"):
        self = super().__new__(cls, env_id)
        self.register, self.spec, self.wrappers, self.source = register, spec, tuple(wrappers), source
        self.backend = backend
        return self

    def __reduce__(self):
        return (EnvId, (str(self), self.register, self.spec, self.wrappers, self.source, self.backend))


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
        hint = (" (a third-party env's ids are registered by importing its module, module:Name-v0, or by calling a function: "
                "env.register; an id a notebook or script registered must be registered again in this process)")
    raise ValueError(f"unknown gymnasium id {env_id!r}{hint}")


def registered_id(env_id: str) -> str:
    """``module:Name-v0`` -> ``Name-v0`` after importing ``module`` (which registers it)."""
    if ":" in env_id:
        module, _, env_id = env_id.partition(":")
        importlib.import_module(module)
    return env_id


def env_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The spec an id's envs are made from: the one an ``EnvId`` carries, or the registry's."""
    register(getattr(env_id, "register", None))
    return getattr(env_id, "spec", None) or gym.spec(registered_id(str(env_id)))


def vectorization_mode(spec, wrappers) -> str:
    """The env's own vector entry point when it has one and no wrappers are asked for; else
    gymnasium's SyncVectorEnv over single envs (wrapped, when asked), as for an env that has none."""
    return "vector_entry_point" if spec.vector_entry_point is not None and not wrappers else "sync"


def make_single_env(env_id: str, **env_kwargs) -> gym.Env:
    """One env as a SyncVectorEnv of ``env_id`` holds it: ``gym.make`` of its spec, then its wrappers."""
    env = gym.make(env_spec(env_id), **env_kwargs)
    for wrapper in getattr(env_id, "wrappers", ()):
        env = wrapper(env)
    return env


def make_vec_env(env_id: str, num_envs: int, seed: int | None = None, **env_kwargs) -> gym.vector.VectorEnv:
    """A vector env of ``num_envs`` copies, natively vectorised when the env offers it (and no
    wrappers are asked for: see ``vectorization_mode``).

    All routes use autoreset NEXT_STEP, which the chunk format relies on. An ``EnvId``'s
    ``register`` is called first (once per process); one of ``env.backend: envpool`` is EnvPool's.
    """
    if getattr(env_id, "backend", "gymnasium") == "envpool":
        from tianji_dask.envs import envpool_backend

        return envpool_backend.make_vec(env_id, num_envs, seed, **env_kwargs)
    register(getattr(env_id, "register", None))
    if is_parallel_env_id(env_id):
        env = ParallelVecEnv(env_id, num_envs, **env_kwargs)
        env.reset(seed=seed)
        return env
    spec, wrappers = env_spec(env_id), list(getattr(env_id, "wrappers", ()))
    env = gym.make_vec(spec, num_envs=num_envs, vectorization_mode=vectorization_mode(spec, wrappers),
                       wrappers=wrappers or None, **env_kwargs)
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
