"""A pipeline made from an env id and an algorithm's defaults (``tianji-dask train --env ID --algo
NAME``), and the target an env's gymnasium spec gives: what a run solves when nobody set
``stop.target_return``, and the line that says so when a pipeline's env was changed without it."""

from __future__ import annotations

import re

from tianji_dask.config.pipeline import apply_overrides
from tianji_dask.errors import PipelineError

BUDGETS = ("max_env_steps", "max_updates", "max_seconds")


def reward_threshold(env_id) -> float | None:
    """The ``reward_threshold`` of the spec an env id's envs are made from (None: it has none, or
    it has no gymnasium spec, e.g. a PettingZoo id)."""
    from tianji_dask.envs.marl import is_parallel_env_id
    from tianji_dask.envs.vector import env_spec

    if is_parallel_env_id(env_id):
        return None
    try:
        threshold = env_spec(env_id).reward_threshold
    except Exception:  # noqa: BLE001 - an unknown id: the pipeline's own check says so
        return None
    return None if threshold is None else float(threshold)


def pipeline_for(env_id: str, algo: str, overrides: dict | None = None) -> dict:
    """The pipeline ``--env ID --algo NAME`` trains: the env with its defaults, the algorithm with
    its default hyperparameters, every other field its default, solved at the env spec's
    ``reward_threshold`` where it has one. PipelineError in one line for an unknown env id or
    algorithm, and when neither a target nor a budget (``overrides``) would stop it."""
    from tianji_dask.algos import resolve_algorithm
    from tianji_dask.envs.source import resolve_env

    try:
        resolved = resolve_env(env_id)
    except ValueError as err:
        raise PipelineError(f"--env: {err}") from None
    try:
        resolve_algorithm(algo)
    except ValueError as err:
        raise PipelineError(f"--algo: {err}") from None
    target = reward_threshold(resolved)
    name = re.sub(r"[^a-z0-9]+", "_", f"{env_id.rpartition(':')[2]}_{algo.rpartition(':')[2]}".lower()).strip("_")
    data = {"name": name, "env": {"id": env_id}, "algo": {"name": algo},
            "stop": {} if target is None else {"target_return": target}}
    stop = apply_overrides(data, overrides or {}).get("stop") or {}
    if stop.get("target_return") is None and not any(stop.get(k) for k in BUDGETS):
        why = "has no reward_threshold in its gymnasium spec" if target is None else "has its target switched off"
        raise PipelineError(f"--env: {env_id} {why}, so the run needs a budget; allowed: -n/--total-timesteps N, "
                            "--max-seconds T, or --set stop.target_return=R")
    return data


def target_note(pipeline, overrides: dict | None) -> str | None:
    """The line to show when ``overrides`` changed the env but not the target: the target the run
    keeps came with the pipeline, not from the new env's spec."""
    overrides = overrides or {}
    env_changed = "env.id" in overrides or isinstance(overrides.get("env"), dict)
    target_set = any(k in ("stop", "stop.target_return") for k in overrides)
    target = pipeline.stop.target_return
    if not env_changed or target_set or target is None:
        return None
    threshold = reward_threshold(pipeline.env.id)
    if threshold == target:
        return None
    theirs = (f"{pipeline.env.id}'s reward_threshold is {threshold:g}" if threshold is not None
              else f"{pipeline.env.id} has no reward_threshold")
    return f"stop.target_return {target:g} comes from {pipeline.name}; {theirs}: set stop.target_return"
