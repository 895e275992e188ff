"""A pipeline's ``env.wrappers``: gymnasium wrappers applied in order around each single env, in
every process that makes the run's envs (no Dask).

An entry is ``"module:Class"`` (a bare name is one of ``gymnasium.wrappers``: ``TimeLimit``), or
``{name: "module:Class", kwargs: {...}}``; from Python the class or a callable itself. It names a
subclass of ``gymnasium.Wrapper`` or a callable taking the env (and the kwargs) and returning an
env. Vector wrappers are refused: their running statistics (``NormalizeObservation``,
``NormalizeReward``) would be one per explorer stream, and the learner, evaluation and export
would never see them."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import gymnasium as gym

from tianji_dask.importing import load_object, spec_of

ALLOWED = ("'module:Class' (a bare name is one of gymnasium.wrappers) or {name: 'module:Class', kwargs: {...}}, "
           "naming a gymnasium.Wrapper subclass or a callable taking the env and returning an env "
           "(from Python, the class or callable itself)")
VECTOR_WHY = ("single-env wrappers only: a vector wrapper's running statistics would be one per explorer stream, "
              "never seen by the learner, evaluation or export (normalise in the algorithm instead)")


@dataclass(frozen=True)
class Wrapper:
    """One resolved entry: ``fn(env, **kwargs)`` wraps a single env. ``label`` is how a pipeline
    writes it (``module:Class``). Picklable: a class of ``__main__`` travels by value."""

    label: str
    fn: object
    kwargs: dict = field(default_factory=dict)

    def __call__(self, env: gym.Env) -> gym.Env:
        return self.fn(env, **self.kwargs)


def _name_and_kwargs(entry) -> tuple[object, dict]:
    if isinstance(entry, dict):
        unknown = sorted(set(entry) - {"name", "kwargs"})
        if unknown or "name" not in entry:
            raise ValueError(f"a mapping takes name and kwargs (got keys {sorted(entry)}); allowed: {ALLOWED}")
        kwargs = entry.get("kwargs") or {}
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ValueError(f"kwargs must be a mapping of argument names to values (got {kwargs!r})")
        return entry["name"], dict(kwargs)
    return entry, {}


def _load(name) -> tuple[object, str]:
    """(the object, its label) that an entry's name stands for."""
    if isinstance(name, str):
        if ":" not in name:
            found = getattr(gym.wrappers, name, None)
            if found is None or not callable(found):
                raise ValueError(f"gymnasium.wrappers has no {name!r}; allowed: {ALLOWED}")
            return found, name
        return load_object(name, ALLOWED), name
    if callable(name):
        return name, label_of(name)
    raise ValueError(f"must be {ALLOWED} (got {type(name).__name__})")


def label_of(obj) -> str:
    """``module:qualname`` of a class or function; the repr of another callable (a partial)."""
    return spec_of(obj) if hasattr(obj, "__qualname__") and hasattr(obj, "__module__") else repr(obj)


def _check_arguments(fn, label: str, kwargs: dict) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: its call will say
        return
    try:
        signature.bind(None, **kwargs)
    except TypeError as err:
        takes = ", ".join(signature.parameters)
        raise ValueError(f"{label}({', '.join(kwargs)}): {err} (it takes: {takes})") from None


def resolve_one(entry) -> Wrapper:
    """One ``env.wrappers`` entry resolved (imported here); ValueError (one line) when it names
    no usable wrapper, a vector wrapper, or arguments the wrapper does not take."""
    name, kwargs = _name_and_kwargs(entry)
    fn, label = _load(name)
    if isinstance(fn, type):
        if issubclass(fn, gym.vector.VectorEnv):
            raise ValueError(f"{label} wraps a vector env; allowed: {VECTOR_WHY}")
        if not issubclass(fn, gym.Wrapper):
            raise ValueError(f"{label} is not a gymnasium.Wrapper subclass; allowed: {ALLOWED}")
    elif not callable(fn):
        raise ValueError(f"{label} is not callable; allowed: {ALLOWED}")
    _check_arguments(fn, label, kwargs)
    return Wrapper(label, fn, kwargs)


def resolve(entries) -> tuple[Wrapper, ...]:
    """Every entry of ``env.wrappers`` resolved; ValueError ``"env.wrappers[i]: ..."`` on the first bad one."""
    if not isinstance(entries, (list, tuple)):
        raise ValueError(f"env.wrappers: must be a list of wrappers, each {ALLOWED}")
    resolved = []
    for i, entry in enumerate(entries):
        try:
            resolved.append(resolve_one(entry))
        except ValueError as err:
            raise ValueError(f"env.wrappers[{i}]: {err}") from None
    return tuple(resolved)


def as_written(entry):
    """An entry as the resolved pipeline.yaml writes it: a class or callable as its ``module:qualname``."""
    if isinstance(entry, dict):
        return {**entry, "name": as_written(entry.get("name"))}
    return entry if isinstance(entry, str) or not callable(entry) else label_of(entry)


def modules(entries) -> list[str]:
    """The modules ``module:attr`` entries name (what every worker must import)."""
    names = [(e.get("name") if isinstance(e, dict) else e) for e in entries]
    return [n.partition(":")[0] for n in names if isinstance(n, str) and ":" in n]
