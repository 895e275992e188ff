"""The pipeline reference: every section and field of a pipeline, rendered as markdown from the
pydantic models in ``tianji_dask.config`` and the algorithms' config models.

    python -m tianji_dask.config.doc > docs/configuration.md

Types, defaults and ranges (``ge``/``gt``/``le``/``lt``) come from ``model_fields``; a field's
text is its ``description``, or else the ``#:`` comment above it in the model's source.
"""

from __future__ import annotations

import inspect
import re
import types
import typing

import annotated_types as at
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from tianji_dask.algos import algorithm_registry
from tianji_dask.config import Pipeline
from tianji_dask.config.renamed import RENAMED

REGENERATE = "python -m tianji_dask.config.doc > docs/configuration.md"
_BOUNDS = ((at.Ge, "ge", "≥"), (at.Gt, "gt", ">"), (at.Le, "le", "≤"), (at.Lt, "lt", "<"))


def _anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-")


def _value(v) -> str:
    """A default as it would be written in YAML."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    return str(v)


def _type(a, links: dict) -> str:
    origin, args = typing.get_origin(a), typing.get_args(a)
    if a is type(None):
        return "null"
    if origin is typing.Literal:
        return " or ".join(f"`{_value(v)}`" for v in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(x, links) for x in args)
    if isinstance(a, type) and issubclass(a, BaseModel):
        return f"[{links[a]}](#{_anchor(links[a])})"
    if origin in (list, tuple) and (origin is list or (len(args) == 2 and args[1] is Ellipsis)):
        return f"list of {_type(args[0], links)}"
    if origin is tuple:
        return "[" + ", ".join(_type(x, links) for x in args) + "]"
    if origin is dict:
        return "mapping" if args[1] is typing.Any else f"mapping of {_type(args[0], links)} to {_type(args[1], links)}"
    return {str: "string", int: "int", float: "float", bool: "bool", typing.Any: "any"}.get(a, getattr(a, "__name__", str(a)))


def _comments(cls: type) -> dict[str, str]:
    """``#:`` comment lines right above ``name: type`` lines in the class bodies of ``cls``'s MRO."""
    found: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if issubclass(k, BaseModel) and k is not BaseModel]):
        try:
            source = inspect.getsource(klass)
        except OSError:  # a model made by create_model (the controller's fields) has no source
            continue
        pending: list[str] = []
        for line in source.splitlines():
            text = line.strip()
            field = re.match(r"(\w+)\s*:", text)
            if text.startswith("#:"):
                pending.append(text[2:].strip())
            elif field and pending:
                found[field.group(1)] = " ".join(pending)
                pending = []
            else:
                pending = []
    return found


def _models(model: type[BaseModel], path: str, out: dict) -> dict:
    """``model`` and every model nested in its fields (optional and union members too) -> dotted path."""
    out.setdefault(model, path)
    for name, f in model.model_fields.items():
        stack = [f.annotation]
        while stack:
            a = stack.pop()
            if isinstance(a, type) and issubclass(a, BaseModel):
                _models(a, f"{path}.{name}".lstrip("."), out)
            stack.extend(typing.get_args(a))
    return out


def _table(model: type[BaseModel], links: dict) -> list[str]:
    notes = _comments(model)
    path = links.get(model, "")
    formerly = {new: old for old, new in RENAMED.items()}  # a renamed field's old name, said beside it
    rows = ["| field | type | default | allowed | description |", "|---|---|---|---|---|"]
    for name, f in model.model_fields.items():
        if f.is_required():
            default = "required"
        elif f.default_factory is not None:
            made = f.default_factory()
            default = f"see [{links[type(made)]}](#{_anchor(links[type(made)])})" if isinstance(made, BaseModel) else f"`{_value(made)}`"
        else:
            default = f"`{_value(f.default)}`" if f.default is not PydanticUndefined else ""
        limits = [(sign, getattr(m, attr)) for m in f.metadata for kind, attr, sign in _BOUNDS if isinstance(m, kind)]
        bounds = [f"{sign} {int(v) if float(v).is_integer() else v}" for sign, v in limits]
        text = (f.description or notes.get(name, "")).replace("``", "`").replace("|", "\\|").replace("\n", " ")
        if f"{path}.{name}" in formerly:
            text += f"; formerly `{formerly[f'{path}.{name}'].rpartition('.')[2]}`, which still works and will be removed"
        rows.append(f"| `{name}` | {_type(f.annotation, links)} | {default} | {', '.join(bounds)} | {text} |")
    return rows


def _doc(cls: type) -> list[str]:
    text = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
    return [" ".join(text.split()).replace("``", "`"), ""] if text else []


def render() -> str:
    links = _models(Pipeline, "", {})
    links[Pipeline] = "pipeline"
    registry = algorithm_registry()
    lines = [
        "# Pipeline reference",
        "",
        f"Generated from the models in `tianji_dask/config/` and `tianji_dask/algos/`; regenerate with "
        f"`{REGENERATE}`.",
        "A pipeline is a YAML mapping of the fields below; unknown keys, wrong types and out-of-range values are "
        "errors that name the field. Nested sections are written as nested mappings (`stop: {target_return: 475}`); "
        "in Python `overrides` and on the command line they are dotted (`stop.max_seconds`). "
        "[pipelines.md](pipelines.md) says what the settings do together.",
        "",
    ]
    for model, path in links.items():
        lines += [f"## {path}", "", *_doc(model)]
        if model.__name__ == "AlgoSection":
            names = ", ".join(f"[`{n}`](#{_anchor('algo.config: ' + n)})" for n in sorted(registry))
            lines += [f"`name` is one of {names}, or `'module:Class'` naming your own subclass of `tianji_dask.Algorithm` "
                      "([extending.md](extending.md)); `config` holds that algorithm's fields, each optional.", ""]
        lines += [*_table(model, links), ""]
    # models inside an algorithm's config (e.g. the recurrent core), each a section of its own, whose
    # heading names every algorithm field that takes it (PPO's and IMPALA's recurrent share one)
    nested: dict = {}
    for name, algo_cls in sorted(registry.items()):
        for model, path in _models(algo_cls.Config, f"algo.config: {name}", {}).items():
            if model is not algo_cls.Config and (model in nested or model not in links):
                nested.setdefault(model, []).append(path.removeprefix("algo.config: "))
    for model, paths in nested.items():
        links[model] = "algo.config: " + ", ".join(paths)
    for name, algo_cls in sorted(registry.items()):
        cfg = algo_cls.Config
        lines += [f"## algo.config: {name}", "", *_doc(cfg), *_table(cfg, links), ""]
    for model in nested:
        lines += [f"## {links[model]}", "", *_doc(model), *_table(model, links), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
