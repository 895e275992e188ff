"""The callbacks a pipeline names: ``"module:Class"`` or ``{"class": "module:Class", "kwargs": {...}}``,
each a ``Callback`` subclass, built in the learner's process. No Dask."""

from __future__ import annotations

from tianji_dask.callbacks.base import Callback, MissingDependency
from tianji_dask.errors import PipelineError
from tianji_dask.importing import load_object

ALLOWED = "'module:Class' or {class: 'module:Class', kwargs: {...}} naming a subclass of tianji_dask.Callback"


def parse(entry) -> tuple[str, dict]:
    """(spec, kwargs) of one entry; ValueError (one line) when it is neither form."""
    if isinstance(entry, str):
        return entry, {}
    if isinstance(entry, dict):
        extra = sorted(set(entry) - {"class", "kwargs"})
        if extra or "class" not in entry:
            what = f"unknown key {extra[0]!r}" if extra else "no 'class'"
            raise ValueError(f"{what}; allowed: {ALLOWED}")
        kwargs = entry.get("kwargs") or {}
        if not isinstance(entry["class"], str) or not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ValueError(f"class must be a string and kwargs a mapping of names; allowed: {ALLOWED}")
        return entry["class"], dict(kwargs)
    raise ValueError(f"must be {ALLOWED} (got {type(entry).__name__})")


def build(entry) -> Callback:
    """The callback an entry names, built with its kwargs; ValueError (one line) when it cannot
    be imported, is no Callback subclass or refuses its kwargs (MissingDependency: a package it
    needs is not installed)."""
    spec, kwargs = parse(entry)
    cls = load_object(spec, ALLOWED)
    if not (isinstance(cls, type) and issubclass(cls, Callback)):
        raise ValueError(f"{spec} is not a subclass of tianji_dask.Callback; allowed: {ALLOWED}")  # noqa: TRY004
    try:
        return cls(**kwargs)
    except MissingDependency:
        raise
    except Exception as err:  # noqa: BLE001 - a user's constructor may raise anything
        first = str(err).splitlines()[0] if str(err) else ""
        raise ValueError(f"{spec}(**{kwargs!r}) raised {type(err).__name__}: {first}") from None


def check(entries) -> list:
    """The entries as given, each checked by building it once; ValueError ``callbacks[i]: ...``."""
    if not isinstance(entries, list):
        raise ValueError(f"callbacks: must be a list, each {ALLOWED}")  # noqa: TRY004
    for i, entry in enumerate(entries):
        try:
            build(entry)
        except (ValueError, MissingDependency) as err:
            raise ValueError(f"callbacks[{i}]: {err}") from None
    return entries


def check_objects(callbacks, mode: str) -> tuple:
    """``Run(callbacks=...)`` as a tuple; PipelineError (one line) for anything but Callback objects,
    or, off single mode, one that cannot be pickled to reach the learner's process."""
    if callbacks is None:
        return ()
    if not isinstance(callbacks, (list, tuple)):
        raise PipelineError(f"callbacks: must be a list of tianji_dask.Callback objects, got {type(callbacks).__name__}")
    for i, cb in enumerate(callbacks):
        if not isinstance(cb, Callback):
            raise PipelineError(f"callbacks[{i}]: must be a tianji_dask.Callback object, got {type(cb).__name__}")
        if mode != "single":
            import cloudpickle

            try:
                cloudpickle.dumps(cb)
            except Exception as err:  # noqa: BLE001 - whatever the object holds
                raise PipelineError(f"callbacks[{i}]: {type(cb).__name__} cannot be pickled to reach the learner's process "
                                    f"({type(err).__name__}: {err}); allowed: objects that pickle, or mode single") from None
    return tuple(callbacks)
