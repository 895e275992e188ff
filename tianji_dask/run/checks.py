"""What a run checks before any cluster starts: every error a user can cause surfaces here, as one
``PipelineError`` line, and nothing has been started or written yet."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

from tianji_dask.algos import algorithm_registry, make_algorithm
from tianji_dask.config import Pipeline, PipelineError, load_pipeline, parse_pipeline
from tianji_dask.dataflow.controller.settings import window_floor
from tianji_dask.envs.vector import env_spaces
from tianji_dask.run.preflight import check_driver

PipelineLike = Pipeline | dict | str | os.PathLike


def as_pipeline(pipeline: PipelineLike, overrides: dict | None) -> Pipeline:
    """The pipeline a run is given (a Pipeline, a dict, a YAML path or a bundled name), validated
    with ``overrides`` applied."""
    if overrides is not None and not isinstance(overrides, dict):
        raise PipelineError(f"overrides: must be a mapping of dotted fields to values, got {type(overrides).__name__}")
    if not isinstance(pipeline, (Pipeline, dict, str, os.PathLike)):
        raise PipelineError(f"pipeline: must be a Pipeline, a dict, a YAML path or a bundled name, got {type(pipeline).__name__}")
    if isinstance(pipeline, Pipeline):
        return parse_pipeline(pipeline.model_dump(), overrides=overrides) if overrides else pipeline
    if isinstance(pipeline, dict):
        return parse_pipeline(pipeline, overrides=overrides)
    return load_pipeline(pipeline, overrides=overrides)


@dataclass(frozen=True)
class Prepared:
    """What the checks learnt, which the run builds its learners from. ``make_algo``: the
    picklable factory every role builds the algorithm with. ``chunks_per_update``: the fewest
    chunks one update needs (the window's floor). ``own_replay_ratio``: the algorithm's own
    samples trained per env step (None: it does not replay), which an ``auto`` replay band is
    resolved around (``LawSettings.resolve``). ``reduce_every`` and ``reduce_barrier``: group
    mode's fusion settings. ``env_spaces``, ``env_warnings``: the env's spaces and its checker's
    warnings in the driver's pre-flight (``preflight.py``), which an explorer worker's must match."""

    make_algo: Callable
    chunks_per_update: int
    on_policy: bool
    own_replay_ratio: float | None
    reduce_every: int
    reduce_barrier: bool
    env_spaces: tuple = ()
    env_warnings: tuple = ()


def check_pipeline(p: Pipeline, *, has_client: bool) -> Prepared:
    """Build the env and the algorithm once, here: a pipeline they refuse fails before a cluster
    starts. ``has_client``: the run joins a cluster given to it (so the learner may not run on
    this machine)."""
    (obs_space, act_space), env_warnings = _spaces(p)
    make_algo = functools.partial(make_algorithm, p.algo.name, obs_space, act_space, p.algo_config.model_dump(), p.seed)
    algo = _build(p, make_algo)
    # on-policy chunks hold their credit until trained on: a window below one update's chunks deadlocks
    chunks_per_update = algo.chunks_per_update()
    c = p.controller
    if p.mode == "relaxed":
        try:
            window_floor(c.model_dump(), chunks_per_update, p.algo.label)
        except ValueError as err:
            raise PipelineError(f"controller.{err}") from None
    if p.logging.tensorboard:
        from tianji_dask.observe import tensorboard

        if not tensorboard.available():
            raise PipelineError("logging.tensorboard: needs the tensorboard package (pip install tensorboard); "
                                "tianji_dask does not install it")
    _check_device(p, algo, has_client)
    missing = [n for n in algo.compilable if not callable(getattr(algo, n, None))]
    if missing:
        raise PipelineError(f"algo.name: {p.algo.label}.compilable names {', '.join(map(repr, missing))}, "
                            "which the class does not define as methods (learner.compile compiles methods)")
    if p.learner.compile == "on" and not algo.compilable:
        raise PipelineError(f"learner.compile: on, but {p.algo.label} declares no losses to compile "
                            "(Algorithm.compilable; the bundled sac and dqn do); use auto or off")
    _check_handoff(p, has_client)
    progress = algo.replay_progress()
    if isinstance(c.replay_ratio, tuple) and progress is None:
        raise PipelineError(f"controller.replay_ratio: {p.algo.label} does not replay; remove replay_ratio")
    if c.replay_staleness_target is not None and progress is None:
        raise PipelineError(f"controller.replay_staleness_target: {p.algo.label} does not replay; "
                            "remove replay_staleness_target (staleness_target holds its chunks' staleness)")
    return Prepared(
        make_algo=make_algo, chunks_per_update=chunks_per_update, on_policy=algo.on_policy,
        own_replay_ratio=None if progress is None else progress["ratio"],
        reduce_every=p.reduce.every or (1 if algo.on_policy else 16),
        reduce_barrier=algo.on_policy if p.reduce.barrier is None else p.reduce.barrier,
        env_spaces=(obs_space, act_space), env_warnings=tuple(env_warnings),
    )


def _build(p: Pipeline, make_algo):
    """The algorithm, built once here; what its constructor refuses is one line. A class of the
    user's must also pickle (cloudpickle, as Dask sends it) to reach the workers."""
    try:
        algo = make_algo()
    except ValueError as err:  # a refused config's own network names its field: "encoder: ..."
        line = f"algo.config.{err}" if str(err).startswith("encoder: ") else f"algo.name: {err}"
        raise PipelineError(f"{line} ({p.env.id})") from None
    except Exception as err:  # noqa: BLE001 - a user's constructor may raise anything
        raise PipelineError(f"algo.name: {p.algo.label}({p.env.id} spaces) raised {type(err).__name__}: {err}") from None
    if p.mode != "single" and p.algo.label not in algorithm_registry():
        import cloudpickle

        try:
            cloudpickle.dumps(make_algo)
        except Exception as err:  # noqa: BLE001
            raise PipelineError(f"algo.name: {p.algo.label} cannot be pickled to reach the workers "
                                f"({type(err).__name__}: {err})") from None
    return algo


def _spaces(p: Pipeline):
    """The env's spaces, from its pre-flight here (made, reset, stepped, checked), and the
    checker's warnings; every explorer's env must have the same spaces."""
    spaces, warnings = check_driver(p)
    for eid in p.env.explorer_kwargs:
        kwargs = p.env_kwargs_for(eid)
        try:
            theirs = env_spaces(p.env.id, **kwargs)
        except Exception as err:  # noqa: BLE001
            raise PipelineError(f"env.explorer_kwargs: cannot create {p.env.id} for explorer {eid} with kwargs {kwargs}: {err}") from None
        if theirs != spaces:
            raise PipelineError(f"env.explorer_kwargs: explorer {eid}'s env has other spaces than the rest ({theirs})")
    return spaces, warnings


def _check_handoff(p: Pipeline, has_client: bool) -> None:
    """A learner lifetime needs a cluster the run starts (it adds the fresh learner worker) and
    checkpoints (the fresh learner goes on from one)."""
    if p.cluster.learner_lifetime is None:
        return
    why = None
    if p.mode == "single":
        why = "single mode has no learner worker to replace"
    elif has_client:
        why = "a handoff needs a fresh learner worker, which only a cluster the run starts gives (no client)"
    elif p.groups > 1:
        why = "not with groups > 1 yet (the reducer lives on the first learner's worker)"
    elif not p.checkpoint.enabled:
        why = "the fresh learner goes on from a checkpoint; set checkpoint.enabled: true"
    if why is not None:
        raise PipelineError(f"cluster.learner_lifetime: {why}")


def _check_device(p: Pipeline, algo, has_client: bool) -> None:
    if p.learner.device.partition(":")[0] not in algo.device_types:
        raise PipelineError(f"learner.device: {p.algo.label} trains on {' or '.join(algo.device_types)} only (got {p.learner.device})")
    if p.learner.device != "cpu" and (p.mode == "single" or (not has_client and p.cluster.kind == "local")):
        from tianji_dask.core.torch_setup import learner_device

        try:  # the learner will run on this machine: say now if it has no such device
            learner_device(p.learner.device)
        except RuntimeError as err:
            raise PipelineError(str(err)) from None
