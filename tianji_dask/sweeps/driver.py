"""``tianji_dask.sweep``: search a pipeline's hyperparameters with an Optuna study, K trials at
once on one cluster; writes ``sweep.json``, ``best.yaml`` and ``sweep.png`` to the sweep's folder."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tianji_dask.errors import PipelineError
from tianji_dask.sweeps import report
from tianji_dask.sweeps.space import Param, check_space, parse_param
from tianji_dask.sweeps.study import (
    OBJECTIVES,
    REPORTS,
    Active,
    finished_count,
    live_value,
    make_pruner,
    make_sampler,
    objective_value,
    open_study,
    stop_quietly,
    watch,
)

if TYPE_CHECKING:
    from tianji_dask.config import Pipeline

POLL_S = 0.5


def prepare(pipeline, params, *, trials: int, concurrent: int, objective: str, max_seconds: float | None,
            overrides: dict | None):
    """Everything checked before a trial starts: the parameters against the pipeline, the
    objective against what the pipeline records, the counts. Returns (the pipeline as given,
    the pipeline each trial starts from, params, each trial's time budget)."""
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise PipelineError("sweep: needs Optuna, which is not installed; allowed: pip install 'tianji-dask[sweep]'") from None
    if objective not in OBJECTIVES:
        raise PipelineError(f"--objective: {objective!r}; allowed: {', '.join(OBJECTIVES)}")
    if trials < 1 or concurrent < 1:
        raise PipelineError(f"--trials, --concurrent: must be >= 1 (got {trials}, {concurrent})")
    if isinstance(params, dict):
        params = [f"{k}={v}" for k, v in params.items()]
    params = [p if isinstance(p, Param) else parse_param(p) for p in params]
    from tianji_dask.run.handle import as_pipeline

    user = as_pipeline(pipeline, overrides)  # best.yaml: this, its own stop rules, with the best parameters
    base = check_space(user if max_seconds is None else as_pipeline(user, {"stop.max_seconds": float(max_seconds)}), params)
    budget = base.stop.max_seconds
    if objective == "time_to_solve" and (budget is None or base.stop.target_return is None):
        raise PipelineError("--objective time_to_solve: needs a target return (stop.target_return) and a budget "
                            "(--max-seconds or stop.max_seconds) that unsolved trials count with")
    if budget is None and base.stop.max_env_steps is None:
        raise PipelineError("--max-seconds: each trial needs a budget; give --max-seconds (or stop.max_seconds)")
    if objective == "eval_return" and base.eval is None:
        raise PipelineError("--objective eval_return: the pipeline has no eval: section; allowed: add one "
                            "(e.g. --set eval.every_s=10) or another objective")
    from tianji_dask.sweeps.slots import check_concurrent

    check_concurrent(base, min(concurrent, trials), asked=concurrent)
    return user, base, params, budget


def sweep(pipeline: str | os.PathLike | dict | Pipeline, params: dict[str, str] | list[str], *, trials: int = 8,
          concurrent: int = 2, objective: str = "time_to_solve", max_seconds: float | None = None,
          out: str | os.PathLike = "sweeps/sweep", overrides: dict | None = None, pruner: str = "median",
          sampler: str = "tpe", seed: int | None = 0, on_event: Callable[[str, dict], None] | None = None) -> dict:
    """Run (or resume: the same ``out``) an Optuna study of ``trials`` trials, ``concurrent`` at a
    time on one cluster. ``params``: ``{"algo.config.lr": "loguniform:1e-4:1e-2"}`` or
    ``["algo.config.lr=loguniform:1e-4:1e-2"]``. ``on_event(kind, info)``: called as trials
    start, are pruned, finish or fail. Returns what ``sweep.json`` holds."""
    from tianji_dask.sweeps.slots import SweepCluster

    user, base, params, budget = prepare(pipeline, params, trials=trials, concurrent=concurrent, objective=objective,
                                   max_seconds=max_seconds, overrides=overrides)
    out = Path(out)
    fresh = not out.exists()
    report.make_out(out)
    try:
        study = open_study(out, objective, make_sampler(sampler, seed), make_pruner(pruner))
        todo = max(0, trials - finished_count(study))
        if todo == 0:
            return report.write(out, report.summary(study, params, objective, budget), user)
        cluster = SweepCluster(base, min(concurrent, todo))
    except PipelineError:
        if fresh:  # refused before any trial: a folder holding an empty study is no sweep
            shutil.rmtree(out, ignore_errors=True)
        raise
    emit = on_event or (lambda kind, info: None)
    emit("cluster", {"slots": len(cluster.slots), "dashboard": cluster.dashboard_link})
    free, active = list(cluster.slots), []
    try:
        while todo > 0 or active:
            while free and todo > 0:
                active.append(_start(study, base, params, free.pop(0), cluster.client, out, emit))
                todo -= 1
            time.sleep(POLL_S)
            for a in list(active):
                if a.done.is_set():
                    _finish(study, a, objective, budget, emit)
                    active.remove(a)
                    free.append(a.slot)
                    report.write(out, report.summary(study, params, objective, budget), user)
                elif not a.pruned:
                    _maybe_prune(a, objective, budget, emit)
    except BaseException:
        for a in active:  # a stopped sweep: each running trial stops and writes its results; resumed, it runs again
            stop_quietly(a.run)
        wait_all(active, timeout=60)
        raise
    finally:
        cluster.close()
    return report.write(out, report.summary(study, params, objective, budget), user)


def _start(study, base, params: list[Param], slot, client, out: Path, emit) -> Active:
    from tianji_dask.run.handle import Run

    trial = study.ask()
    values = {p.key: p.suggest(trial) for p in params}
    run_dir = out / "trials" / f"{trial.number:04d}"
    trial.set_user_attr("run_dir", str(run_dir))
    run = Run(base, client, out=run_dir, overrides=values, learner_worker=slot.learner, explorer_workers=slot.explorers,
              progress=False)  # trials run side by side: the sweep says what each does
    a = Active(trial, slot, run, values)
    try:
        run.start()
    except Exception as err:  # noqa: BLE001 - this trial fails; the sweep goes on
        a.error = f"{type(err).__name__}: {err}"
        a.done.set()
        return a

    watch(a, run, name=f"tianji-trial-{trial.number}")
    emit("start", {"number": trial.number, "params": values, "slot": slot.index, "run_dir": str(run_dir)})
    return a


def _maybe_prune(a: Active, objective: str, budget: float | None, emit) -> None:
    elapsed, value = a.status.get("elapsed_s"), live_value(objective, a.status)
    if elapsed is None or value is None or not budget:
        return
    step = int(elapsed / budget * REPORTS)
    if step <= a.last_step:
        return
    a.last_step = step
    a.trial.report(float(value), step)
    if a.trial.should_prune():
        a.pruned = True
        emit("prune", {"number": a.trial.number, "step": step, "elapsed_s": elapsed, "value": value})
        stop_quietly(a.run)


def _finish(study, a: Active, objective: str, budget: float | None, emit) -> None:
    from optuna.trial import TrialState

    r = a.results or {}
    a.trial.set_user_attr("seconds", time.time() - a.t_start)
    a.trial.set_user_attr("stop_reason", r.get("stop_reason"))
    for key in ("time_to_solve_s", "final_mean_return", "env_steps"):
        if r.get(key) is not None:
            a.trial.set_user_attr(key, r[key])
    value = objective_value(objective, r, budget) if a.results is not None else None
    if a.pruned:
        study.tell(a.trial, state=TrialState.PRUNED)  # said when it was pruned ("prune")
    elif a.error is not None or value is None:
        a.trial.set_user_attr("error", a.error or f"the run recorded no {objective}")
        study.tell(a.trial, state=TrialState.FAIL)
        emit("fail", {"number": a.trial.number, "error": a.error or f"no {objective}"})
    else:
        study.tell(a.trial, value)
        emit("done", {"number": a.trial.number, "params": a.params, "value": value})


def wait_all(actives, timeout: float) -> None:
    deadline = time.time() + timeout
    for a in actives:
        a.done.wait(max(0.0, deadline - time.time()))
