"""What a pipeline's ``env.id`` names, resolved once in the driver into an ``EnvId`` that carries
everything the other processes need to make the same envs (no Dask).

- ``"CartPole-v1"``: a gymnasium id registered here (by gymnasium, an ``env.register`` call, or
  the user's own ``gym.register`` in a notebook or script).
- ``"module:Name"``: ``module`` is imported first; if it (or anything before) registered a
  gymnasium id ``Name``, that id (gymnasium's own ``module:Name-v0`` rule); otherwise the attribute
  ``Name`` of the module (dotted for nested ones): a ``gymnasium.Env`` subclass or a callable
  returning an env, called with ``env.kwargs``.
- from Python, the class or callable itself.

A registered id travels with its ``EnvSpec``, a class or callable inside an ``EnvSpec`` of its own
(``gym.make`` of a spec takes a callable entry point): pickled with the pool the explorers get,
so a class of ``__main__`` (a notebook cell's) travels by value, as Dask sends it, and an id
registered only in the driver needs no registration on the workers. Either way the envs are made
by ``gym.make`` / ``gym.make_vec`` (``vector.py``)."""

from __future__ import annotations

import copy
import importlib
import re

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec

from tianji_dask.envs.marl import check_parallel_env_id, is_parallel_env_id
from tianji_dask.envs.vector import EnvId, check_env_id, register
from tianji_dask.envs.wrappers import label_of
from tianji_dask.importing import load_object

ALLOWED = ("a gymnasium id (CartPole-v1; 'module:Name-v0' imports module first), 'module:Name' naming a "
           "gymnasium.Env subclass or a callable returning an env, or from Python the class or callable itself")
MAIN = "__main__:"


def resolve_env(value, register_spec: str | None = None, wrappers=()) -> EnvId:
    """``value`` (what ``env.id`` holds) as an ``EnvId`` carrying its spec and ``wrappers``;
    ValueError (one line) when it names nothing an env can be made from."""
    register(register_spec)
    if isinstance(value, EnvId):  # a validated pipeline validated again (overrides on a Pipeline)
        value = value.source if value.source is not None else str(value)
    if isinstance(value, str):
        if is_parallel_env_id(value):
            check_parallel_env_id(value)
            return EnvId(value, register_spec, wrappers=wrappers)
        registered = _registered(value)
        if registered is not None:
            return _carrying(value, registered, register_spec, wrappers)
        return _carrying(value, _maker_spec(value, _attribute(value)), register_spec, wrappers)
    if isinstance(value, EnvSpec):
        return _carrying(value.id, _local(value), register_spec, wrappers)
    if callable(value):
        label = label_of(value)
        return _carrying(label, _maker_spec(label, _checked_maker(value, label)), register_spec, wrappers, source=value)
    raise ValueError(f"must be {ALLOWED} (got {type(value).__name__})")


def _registered(value: str) -> EnvSpec | None:
    """The registry's spec of a gymnasium id (``module:Name-v0`` importing ``module`` first), or
    None when ``module:Name`` names no registered id (then it names an attribute)."""
    module, sep, name = value.partition(":")
    if not sep:
        check_env_id(value)  # ValueError with close matches when unknown
        return _local(gym.spec(value))
    if module == "__main__":
        return None
    try:
        importlib.import_module(module)  # it may register its ids
    except Exception as err:  # noqa: BLE001 - ImportError, or whatever the module's own import raises
        raise ValueError(f"cannot import module {module!r} ({type(err).__name__}: {err}); allowed: {ALLOWED}") from None
    return _local(gym.spec(name)) if name in gym.registry else None


def _attribute(value: str):
    """The class or callable ``module:Name`` names (it names no registered id)."""
    module, _, name = value.partition(":")
    if module == "__main__":
        import __main__

        found = _dotted(__main__, name)
        if found is None:
            raise ValueError(f"{value!r} names a class or function of the notebook or script that started the run, which "
                             "this process does not define; give it again from Python (e.g. overrides={'env.id': "
                             f"{name.rpartition('.')[2]}}}) or name an importable 'module:Class'")
        return _checked_maker(found, value)
    try:
        found = load_object(value, ALLOWED)
    except ValueError as err:
        if not str(err).startswith(f"module {module!r} has no attribute"):
            raise
        raise ValueError(f"module {module!r} registers no gymnasium id {name!r} and has no attribute {name!r}; "
                         f"allowed: {ALLOWED}") from None
    return _checked_maker(found, value)


def _dotted(obj, name: str):
    for part in name.split("."):
        obj = getattr(obj, part, None)
    return obj


def _checked_maker(obj, label: str):
    if isinstance(obj, type):
        if issubclass(obj, gym.Wrapper):
            raise ValueError(f"{label} is a gymnasium.Wrapper: name it in env.wrappers, around an env; allowed: {ALLOWED}")
        if not issubclass(obj, gym.Env):
            raise ValueError(f"{label} is a class but not a gymnasium.Env subclass; allowed: {ALLOWED}")
        return obj
    if not callable(obj):
        raise ValueError(f"{label} is neither a gymnasium.Env subclass nor callable; allowed: {ALLOWED}")
    return obj


def _maker_spec(label: str, maker) -> EnvSpec:
    """A spec of its own for a class or factory: ``gym.make`` calls it with the kwargs and adds
    gymnasium's usual wrappers (order enforcing, the passive env checker), no time limit."""
    return EnvSpec(id=re.sub(r"[^\w:.-]", "_", label), entry_point=maker)


def _local(spec: EnvSpec) -> EnvSpec:
    """A registered spec whose ``__main__:`` entry points are resolved here: no other process's
    ``__main__`` has them, so they travel as the objects (by value)."""
    if not any(isinstance(p, str) and p.startswith(MAIN) for p in (spec.entry_point, spec.vector_entry_point)):
        return spec
    spec = copy.copy(spec)
    for attr in ("entry_point", "vector_entry_point"):
        point = getattr(spec, attr)
        if isinstance(point, str) and point.startswith(MAIN):
            setattr(spec, attr, _attribute(point))
    return spec


def _carrying(label: str, spec: EnvSpec, register_spec, wrappers, source=None) -> EnvId:
    return EnvId(label, register_spec, spec, wrappers, source)


def wrappers_refused(env_id: EnvId) -> str | None:
    """Why ``env_id`` cannot take the wrappers it carries, or None."""
    if not env_id.wrappers:
        return None
    if env_id.spec is None:
        return f"{env_id} is a multi-agent env, which takes no wrappers; allowed: no wrappers"
    if env_id.spec.entry_point is None:
        return (f"{env_id} has only a vector entry point, no single env to wrap; allowed: wrappers around an env with an "
                "entry point (gymnasium's SyncVectorEnv then vectorises the wrapped envs)")
    return None
