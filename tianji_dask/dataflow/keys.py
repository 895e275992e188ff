"""Every key and name a run gives Dask, made and parsed here and nowhere else: task keys (explore,
evaluation, learner, reducer, pre-flight), data keys (weights), worker plugin names (env pool,
closing guard), the published dataset of a run that outlives its driver, and the names of the
workers and batch jobs a run starts. The chaos harness, the dashboard and the tests read these
strings, so their forms do not change. Imports only the standard library: anything may import it.

A learner's *tag* is what its task and data keys carry: its run id (8 hex digits), with
``-g<group>`` in group mode (``learner_tag``).
"""

from __future__ import annotations

import uuid

#: the start of every explore task key (``explore_key``)
EXPLORE_PREFIX = "tianji-explore-"
#: Dask's task prefix (``key_split``) of every explore key, under which its metrics are kept: the
#: run id (8 hex digits) and the serial are left out of it
EXPLORE_TASK_PREFIX = "tianji-explore"
#: the start of every evaluation task key (``eval_key``)
EVAL_PREFIX = "tianji-eval-"
#: the start of every env pool's worker plugin name (``pool_name``)
POOL_PREFIX = "tianji-envs-"
#: the batch system's job names (dask-jobqueue's ``job_name``) of the run's learner and explorer jobs
LEARNER_JOB_NAME = "tianji-learner"
EXPLORER_JOB_NAME = "tianji-explorer"
JOB_NAMES = (LEARNER_JOB_NAME, EXPLORER_JOB_NAME)


# ---- a learner's tag ----------------------------------------------------------------------------
def learner_tag(run_id: str, group: int | None = None) -> str:
    """``<run_id>``, or ``<run_id>-g<group>`` for a learner of group mode (``group`` given)."""
    return run_id if group is None else f"{run_id}-g{group}"


def tag_group(tag: str) -> tuple[str, int] | None:
    """``(run_id, group)`` of a group-mode tag ``<run_id>-g<group>``; None for a tag without a group."""
    run_id, sep, group = tag.rpartition("-g")
    return (run_id, int(group)) if sep and group.isdigit() else None


# ---- task keys ------------------------------------------------------------------------------------
def explore_key(tag: str) -> str:
    """A new explore task key, ``tianji-explore-<tag>-<12 hex digits>``."""
    return f"{EXPLORE_PREFIX}{tag}-{uuid.uuid4().hex[:12]}"


def is_explore_key(key) -> bool:
    """Is ``key`` an explore task key, ``tianji-explore-...``?"""
    return isinstance(key, str) and key.startswith(EXPLORE_PREFIX)


def explore_tag(key: str) -> str:
    """The learner's tag that explore task key ``tianji-explore-<tag>-<serial>`` carries."""
    return key[len(EXPLORE_PREFIX):].rpartition("-")[0]


def eval_key(tag: str, serial: int) -> str:
    """An evaluation task key, ``tianji-eval-<tag>-<serial>``."""
    return f"{EVAL_PREFIX}{tag}-{serial}"


def run_task_prefixes(run_id: str) -> tuple[str, ...]:
    """The starts of a run's explore and evaluation task keys, ``tianji-explore-<run_id>-`` and ``tianji-eval-<run_id>-``."""
    return tuple(f"{prefix}{run_id}-" for prefix in (EXPLORE_PREFIX, EVAL_PREFIX))


def learner_key(run_id: str, group: int | None = None, attempt: int = 0) -> str:
    """A learner actor's key, ``tianji-learner-<run_id>[-g<group>][-r<attempt>]`` (group: with several groups)."""
    return f"tianji-learner-{run_id}" + (f"-g{group}" if group is not None else "") + (f"-r{attempt}" if attempt else "")


def reducer_key(run_id: str) -> str:
    """The reducer actor's key of a group-mode run, ``tianji-reducer-<run_id>``."""
    return f"tianji-reducer-{run_id}"


def preflight_key(run_id: str) -> str:
    """The env pre-flight task's key on an explorer worker, ``tianji-preflight-<run_id>``."""
    return f"tianji-preflight-{run_id}"


# ---- data keys ------------------------------------------------------------------------------------
def weights_key(tag: str, version: int) -> str:
    """A scattered weights version's key, ``tianji-weights-<tag>-<version>``."""
    return f"tianji-weights-{tag}-{version}"


# ---- worker plugins and published datasets -----------------------------------------------------------
def pool_name(run_id: str) -> str:
    """A run's env pool worker plugin name, ``tianji-envs-<run_id>``."""
    return f"{POOL_PREFIX}{run_id}"


def is_pool_name(name) -> bool:
    """Is ``name`` an env pool's worker plugin name, ``tianji-envs-...``?"""
    return isinstance(name, str) and name.startswith(POOL_PREFIX)


def closing_guard_name(run_id: str) -> str:
    """A run's learner close guard worker plugin name, ``tianji-closing-<run_id>``."""
    return f"tianji-closing-{run_id}"


def run_dataset_name(run_id: str) -> str:
    """The dataset a run that outlives its driver is published under, ``tianji-run-<run_id>``."""
    return f"tianji-run-{run_id}"


# ---- workers and batch jobs ----------------------------------------------------------------------
def learner_worker_name(i: int) -> str:
    """An embedded cluster's ``i``-th LEARNER worker, ``tianji-learner`` (the first) or ``tianji-learner-<i>``."""
    return "tianji-learner" if i == 0 else f"tianji-learner-{i}"


def explorer_worker_name(i: int) -> str:
    """An embedded cluster's ``i``-th EXPLORER worker, ``tianji-explorer-<i>``."""
    return f"tianji-explorer-{i}"


def learner_job_worker_name(i: int) -> str:
    """A batch cluster's ``i``-th learner job's worker, ``tianji-learner-<i>``."""
    return f"tianji-learner-{i}"


def fresh_learner_worker_name(n: int) -> str:
    """The ``n``-th fresh LEARNER worker a run starts for a handoff, ``tianji-learner-n<n>``."""
    return f"tianji-learner-n{n}"
