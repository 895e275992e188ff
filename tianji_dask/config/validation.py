"""Pydantic's validation errors as the one line a user sees: the field's dotted name, what was
wrong, what is allowed (an unknown key lists the keys its section takes, and where it may belong:
another section's field, a close spelling, or this project's name for a Stable-Baselines3 / RL
Zoo hyperparameter), what was given; and "did you mean" for a name among a few."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterator, Sequence

from pydantic import BaseModel, ValidationError

from tianji_dask.config.renamed import old_names
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


def did_you_mean_name(typed: str, names: Sequence[str], *, n: int = 2, cutoff: float = 0.6) -> str:
    """"; did you mean a or b?": the names among ``names`` closest to ``typed`` (a pipeline's, an
    algorithm's name); empty when none is near."""
    close = difflib.get_close_matches(typed, list(names), n=n, cutoff=cutoff)
    return f"; did you mean {' or '.join(close)}?" if close else ""


#: Stable-Baselines3 / RL Zoo hyperparameter names and this project's fields for them: the first
#: choice whose fields the pipeline has (``algo.config.*`` only the named algorithm's), and a note
#: where the meaning differs. Names that are ours too (gamma, tau, batch_size, ...) in the wrong
#: section are found as any other field is.
SB3_NAMES: dict[str, tuple[tuple[tuple[str, ...], str], ...]] = {
    "learning_rate": ((("algo.config.lr",), ""), (("algo.config.actor_lr", "algo.config.critic_lr"), "")),
    "n_steps": ((("algo.config.n_step",), "n-step returns"), (("chunk_steps",), "vector steps per chunk")),
    "batch_size": ((("algo.config.batch_size",), ""), (("algo.config.minibatch_size",), ""),
                   (("algo.config.num_minibatches",), "a count: n_steps x n_envs / batch_size")),
    "n_epochs": ((("algo.config.update_epochs",), ""),),
    "gae_lambda": ((("algo.config.gae_lambda",), ""), (("algo.config.lam",), "")),
    "ent_coef": ((("algo.config.ent_coef",), ""), (("algo.config.alpha",), "'auto': algo.config.autotune")),
    "vf_coef": ((("algo.config.vf_coef",), ""),),
    "clip_range": ((("algo.config.clip_coef",), ""),),
    "max_grad_norm": ((("algo.config.max_grad_norm",), ""),),
    "buffer_size": ((("algo.config.buffer_size",), ""),),
    "learning_starts": ((("algo.config.learning_starts",), ""),),
    "tau": ((("algo.config.tau",), ""),),
    "gamma": ((("algo.config.gamma",), ""),),
    "train_freq": ((("algo.config.updates_per_env_step",), "gradient_steps / train_freq"),),
    "gradient_steps": ((("algo.config.updates_per_env_step",), "gradient_steps / train_freq"),),
    "target_update_interval": ((("algo.config.target_update_interval",), "counted in updates, not env steps"),),
    "exploration_fraction": ((("algo.config.eps_decay_steps",), "env steps: exploration_fraction x total timesteps"),),
    "exploration_initial_eps": ((("algo.config.eps_start",), ""),),
    "exploration_final_eps": ((("algo.config.eps_final",), ""),),
    "normalize_advantage": ((("algo.config.norm_adv",), ""),),
    "normalize": ((("algo.config.normalize_obs", "algo.config.normalize_reward"), ""), (("algo.config.normalize_obs",), "")),
    "policy_delay": ((("algo.config.policy_frequency",), ""),),
    "policy_kwargs": ((("algo.config.hidden", "algo.config.activation"), "net_arch, activation_fn"),
                      (("algo.config.hidden",), "net_arch")),
    "net_arch": ((("algo.config.hidden",), ""),),
    "activation_fn": ((("algo.config.activation",), ""),),
    "n_envs": ((("env.num_envs",), "per explorer stream"),),
    "n_timesteps": ((("stop.max_env_steps",), ""),),
    "total_timesteps": ((("stop.max_env_steps",), ""),),
}


def _sb3_name(key: str, paths: set[str]) -> str:
    """"; did you mean algo.config.lr?" for a Stable-Baselines3 name ``key`` (its last part) whose
    equivalent the pipeline has; empty otherwise."""
    leaf = key.rpartition(".")[2]
    for fields, note in SB3_NAMES.get(leaf, ()):
        if key not in fields and all(field in paths for field in fields):
            return f"; did you mean {' and '.join(fields)}?{f' ({note})' if note else ''}"
    return ""


def did_you_mean(key: str, models: Sequence[tuple[str, type[BaseModel]]]) -> str:
    """"; did you mean a.b?": where ``key``, an unknown key, may belong among the fields of
    ``models`` (each under its dotted prefix): this project's field for a Stable-Baselines3 name
    (``learning_rate``: ``algo.config.lr``), a field of the same name in another section (``lr``
    for ``algo.config.lr``), else the closest spellings, those beside ``key`` first; empty when
    none is near. A renamed field's old name counts as a spelling of it: ``stop.windw`` is near
    ``stop.window``, whose name is now ``stop.mean_episodes``, the name said."""
    paths = [path for prefix, model in models for path in _paths(model, prefix)]
    sb3 = _sb3_name(key, set(paths))
    if sb3:
        return sb3
    now = old_names(paths)  # an old name: what it is called now
    paths += list(now)
    parent, _, leaf = key.rpartition(".")
    near = [path for path in paths if path.rpartition(".")[2] == leaf and path != key]
    if not near:
        close = set(difflib.get_close_matches(leaf, {path.rpartition(".")[2] for path in paths}, n=3, cutoff=0.75))
        near = [path for path in paths if path.rpartition(".")[2] in close]
        near = [path for path in near if path.rpartition(".")[0] == parent] or near
    near = list(dict.fromkeys(now.get(path, path) for path in near))
    near = [path for path in near if path != key]
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
