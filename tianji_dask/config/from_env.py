"""A pipeline made from an env id and an algorithm (``tianji-dask train --env ID --algo NAME``): a
bundled pipeline's settings, RL Zoo's hyperparameters or the algorithm's defaults; and the target
an env's gymnasium spec gives: what a run solves when nobody set ``stop.target_return``, and the
line that says so when a pipeline's env was changed without it."""

from __future__ import annotations

import re

import yaml

from tianji_dask.config.bundled import bundled_pipelines, bundled_pipelines_dir
from tianji_dask.config.pipeline import apply_overrides
from tianji_dask.config.validation import did_you_mean_name
from tianji_dask.config.zoo_hyperparams import SOURCE, translate, zoo_entry
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
    """The pipeline ``--env ID --algo NAME`` trains (``pipeline_source``'s, without its line)."""
    return pipeline_source(env_id, algo, overrides)[0]


def pipeline_source(env_id: str, algo: str, overrides: dict | None = None) -> tuple[dict, str]:
    """(the pipeline ``--env ID --algo NAME`` trains, the line that says where its settings come
    from). The first of: the bundled pipeline of that env and algorithm (its settings, its target);
    RL Zoo's published hyperparameters for them (``zoo_hyperparams``), solved at the env spec's
    ``reward_threshold`` where it has one, within the zoo's ``n_timesteps``; the algorithm's
    defaults, every other field its default, solved at that ``reward_threshold``. A bundled
    algorithm's name in any case (``PPO``). PipelineError in one line for an unknown env id or
    algorithm (with the closest names), and when neither a target nor a budget (``overrides``)
    would stop it."""
    from tianji_dask.algos import resolve_algorithm
    from tianji_dask.envs.source import resolve_env

    algo = algorithm_name(algo)
    said = f"--env {env_id} --algo {algo}"
    bundled = bundled_for(env_id, algo)  # before the id is looked up: ALE/Pong-v5 is pong_dqn's, which registers it
    if bundled is not None:
        data = yaml.safe_load((bundled_pipelines_dir() / f"{bundled}.yaml").read_text())
        return _budgeted(data, env_id, overrides), f"{said}: using the bundled pipeline {bundled}'s settings"
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
    zoo = zoo_entry(env_id, algo)
    if zoo is None:
        line = f"{said}: using {algo}'s defaults (no bundled pipeline or RL Zoo entry for {env_id} with {algo})"
    else:
        zoo_id, entry = zoo
        data = _merged(data, translate(algo, entry))
        line = (f"{said}: using RL Zoo's hyperparameters for {zoo_id} ({SOURCE.format(algo=algo)}), "
                "translated to this project's fields")
    return _budgeted(data, env_id, overrides), line


def _merged(data: dict, more: dict) -> dict:
    """``data`` with the sections of ``more`` merged in, field by field."""
    out = dict(data)
    for key, value in more.items():
        out[key] = _merged(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def _budgeted(data: dict, env_id: str, overrides: dict | None) -> dict:
    """``data``, when a target or a budget stops it once ``overrides`` apply; else PipelineError."""
    stop = apply_overrides(data, overrides or {}).get("stop") or {}
    if stop.get("target_return") is None and not any(stop.get(k) for k in BUDGETS):
        target = (data.get("stop") or {}).get("target_return")
        why = "has no reward_threshold in its gymnasium spec" if target is None else "has its target switched off"
        raise PipelineError(f"--env: {env_id} {why}, so the run needs a budget; allowed: -n/--total-timesteps N, "
                            "--max-seconds T, or --set stop.target_return=R")
    return data


def algorithm_name(algo):
    """``algo`` as the registry names it: a bundled algorithm's name in lower case (``PPO``: ppo);
    ``module:Class`` and classes as they are. PipelineError in one line for a name that is no
    bundled algorithm, echoing it with the closest names."""
    from tianji_dask.algos import algorithm_registry

    if not isinstance(algo, str) or ":" in algo:
        return algo
    names = sorted(algorithm_registry())
    if algo.lower() in names:
        return algo.lower()
    hint = did_you_mean_name(algo.lower(), names)
    raise PipelineError(f"--algo: unknown algorithm {algo!r}{hint} (allowed: {', '.join(names)}, in any case, "
                        "or module:Class naming a subclass of tianji_dask.Algorithm)")


def bundled_for(env_id: str, algo: str) -> str | None:
    """The bundled pipeline that trains ``env_id`` (as its ``env.id``, or that id's name after
    ``module:``) with the bundled algorithm ``algo``: of several, the shortest name
    (``cartpole_dqn`` before ``cartpole_dqn_per``); None when none does."""
    if not isinstance(algo, str) or ":" in algo:
        return None
    names = [row["name"] for row in bundled_pipelines()
             if row["algo"] == algo and isinstance(row["env_id"], str) and env_id in (row["env_id"], row["env_id"].rpartition(":")[2])]
    return min(names, key=lambda name: (len(name), name)) if names else None


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
