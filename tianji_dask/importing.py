"""What a pipeline names as ``"module:attribute"`` (an algorithm, a network factory, a callback,
an env registration), imported in whichever process needs it."""

from __future__ import annotations

import importlib


def load_object(spec: str, allowed: str):
    """The object ``module:attr`` names (``attr`` may be dotted: ``module:Outer.Inner``).
    ValueError, one line ending with ``allowed``, when the spec is malformed, its module cannot be
    imported or has no such attribute."""
    module, sep, name = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if not sep or not module or not name or ":" in name:
        raise ValueError(f"must be {allowed} (got {spec!r})")
    try:
        obj = importlib.import_module(module)
    except Exception as err:  # ImportError, or whatever the module's own import raises
        raise ValueError(f"cannot import module {module!r} ({type(err).__name__}: {err}); allowed: {allowed}") from None
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ValueError(f"module {module!r} has no attribute {name!r}; allowed: {allowed}")
    return obj


def spec_of(obj) -> str:
    """The ``module:qualname`` that names ``obj`` (a class or function), as a pipeline writes it."""
    return f"{obj.__module__}:{obj.__qualname__}"
