"""Pydantic's validation errors as the one line a user sees: the field's dotted name, what was
wrong, what is allowed (an unknown key lists the keys its section takes), what was given."""

from __future__ import annotations

import typing

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


def one_line(err: ValidationError, prefix: str = "", model: type[BaseModel] | None = None,
              overrides: dict | None = None) -> str:
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
        if typed is not None:
            return f"{typed}: unknown key {loc!r}{allowed}"
        msg = "unknown key" + allowed
    elif first["type"] == "missing":
        msg = "required"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    shown = first.get("input")
    tail = "" if first["type"] in ("missing", "extra_forbidden") or isinstance(shown, dict) else f" (got {shown!r})"
    return f"{loc or 'pipeline'}: {msg}{tail}"
