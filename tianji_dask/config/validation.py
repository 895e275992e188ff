"""Pydantic's validation errors as the one line a user sees: the field's dotted name, what was
wrong, what is allowed (an unknown key lists the keys its section takes), what was given."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterator, Sequence

from pydantic import BaseModel, ValidationError

from tianji_dask.errors import PipelineError


def _model_in(annotation) -> type[BaseModel] | None:
    """The model class in a field's annotation (``X``, ``X | None``, a union with one model)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        model = _model_in(arg)
        if model is not None:
            return model
    return None


def _allowed_keys(model: type[BaseModel] | None, loc: tuple) -> str:
    """"; allowed: a, b, c": the fields of the mapping at ``loc`` (empty when it is not a model)."""
    for part in loc:
        field = model.model_fields.get(str(part)) if model is not None else None
        model = _model_in(field.annotation) if field is not None else None
    return f"; allowed: {', '.join(sorted(model.model_fields))}" if model is not None else ""


def _paths(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every field of ``model`` and of its sections, dotted, after ``prefix``."""
    for name, field in model.model_fields.items():
        yield prefix + name
        section = _model_in(field.annotation)
        if section is not None:
            yield from _paths(section, f"{prefix}{name}.")


def did_you_mean(key: str, models: Sequence[tuple[str, type[BaseModel]]]) -> str:
    """"; did you mean a.b?": where ``key``, an unknown key, may belong among the fields of
    ``models`` (each under its dotted prefix): a field of the same name in another section (``lr``
    for ``algo.config.lr``), else the closest spellings, those beside ``key`` first; empty when
    none is near."""
    paths = [path for prefix, model in models for path in _paths(model, prefix)]
    parent, _, leaf = key.rpartition(".")
    near = [path for path in paths if path.rpartition(".")[2] == leaf and path != key]
    if not near:
        close = set(difflib.get_close_matches(leaf, {path.rpartition(".")[2] for path in paths}, n=3, cutoff=0.75))
        near = [path for path in paths if path.rpartition(".")[2] in close]
        near = [path for path in near if path.rpartition(".")[0] == parent] or near
    return f"; did you mean {' or '.join(near)}?" if 0 < len(near) <= 3 else ""


def one_line(err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None,
              overrides: dict | None = None, elsewhere: Sequence[tuple[str, type[BaseModel]]] = ()) -> str:
    """The first error as one line. ``elsewhere``: other models (each under its dotted prefix,
    e.g. ``("algo.config.", PPOConfig)``) where an unknown key may belong."""
    first = err.errors()[0]
    inner = first.get("ctx", {}).get("error")
    if isinstance(inner, PipelineError):  # raised by a model validator: already one full line
        return str(inner)
    loc = ".".join(str(p) for p in first["loc"])
    loc = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        allowed = _allowed_keys(model, first["loc"][:-1])
        # an override like no.such.key fails at "no": name the key the user typed
        typed = next((k for k in overrides or {} if k.startswith(loc + ".")), None)
        models = [*([(f"{prefix}." if prefix else "", model)] if model is not None else []), *elsewhere]
        if typed is not None:
            return f"{typed}: unknown key {loc!r}{allowed}{did_you_mean(loc, models)}"
        msg = "unknown key" + allowed + did_you_mean(loc, models)
    elif first["type"] == "missing":
        msg = "required"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    shown = first.get("input")
    tail = "" if first["type"] in ("missing", "extra_forbidden") or isinstance(shown, dict) else f" (got {shown!r})"
    return f"{loc or 'pipeline'}: {msg}{tail}"
