"""A package's names loaded on first use, so that importing the package stays cheap."""

from __future__ import annotations

import importlib


def lazy_attributes(namespace: dict, where: dict[str, str]):
    """The module ``__getattr__`` that imports each name of ``where`` (name -> module) on first
    use and keeps it in ``namespace`` (the package's ``globals()``)."""

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = namespace[name] = getattr(importlib.import_module(where[name]), name)
        return value

    return __getattr__
