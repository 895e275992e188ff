"""An Optuna study whose trials are runs on one shared cluster, K at a time.

The driver alone speaks to Optuna (ask, report, tell), so the study's storage sees one writer;
each trial is a ``Run`` on its own slot of the cluster, waited for in a thread of its own. A
trial's live status (about twice a second) feeds the pruner: a hopeless trial is stopped and
its slot goes to the next. Storage: SQLite in the sweep's folder, so the same command resumes a
stopped sweep and ``optuna-dashboard sqlite:///DIR/study.db`` opens it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tianji_dask.errors import PipelineError

OBJECTIVES = {"time_to_solve": "minimize", "final_return": "maximize", "eval_return": "maximize"}
STUDY_NAME = "tianji-sweep"
REPORTS = 20  # pruning checkpoints over a trial's budget


def objective_value(objective: str, results: dict, budget: float) -> float | None:
    """A finished trial's value: its time to solve (an unsolved trial counts with its budget, as
    the time-to-solve rule does), its final 100-episode mean return, or its last evaluation's."""
    if objective == "time_to_solve":
        solved = results.get("time_to_solve_s")
        return float(solved) if results.get("solved") and solved is not None else float(budget)
    if objective == "final_return":
        value = results.get("final_mean_return")
    else:
        evals = results.get("eval") or []
        value = evals[-1]["mean_return"] if evals else None
    return None if value is None else float(value)


def live_value(objective: str, status: dict) -> float | None:
    """What the pruner compares while a trial runs, in the study's direction: the running mean
    return (negated for time to solve, which is minimized), or the newest evaluation."""
    if objective == "eval_return":
        return status.get("eval_mean_return")
    ret = status.get("mean_return")
    if ret is None or ret != ret:  # no episode yet (None or NaN)
        return None
    return -ret if objective == "time_to_solve" else ret


@dataclass
class Active:
    trial: object  # optuna.Trial
    slot: object  # slots.Slot
    run: object  # Run
    params: dict
    t_start: float = field(default_factory=time.time)
    status: dict = field(default_factory=dict)
    results: dict | None = None
    error: str | None = None
    pruned: bool = False
    last_step: int = -1
    done: threading.Event = field(default_factory=threading.Event)


def watch(holder, run, name: str) -> None:
    """Wait for the started ``run`` in a thread of its own: ``holder.status`` follows the run's
    live status, then ``holder.results`` (or ``holder.error``) is set and ``holder.done``. Writes
    stop once ``holder.run`` is another run (a PBT member that moved on to its next generation)."""
    done = holder.done

    def ours() -> bool:
        return holder.run is run

    def wait():
        try:
            results = run.wait(on_status=lambda s: setattr(holder, "status", s) if ours() else None)
            if ours():
                holder.results = results
        except Exception as err:  # noqa: BLE001 - the trial fails; the sweep goes on
            if ours():
                holder.error = f"{type(err).__name__}: {err}"
        finally:
            done.set()

    threading.Thread(target=wait, name=name, daemon=True).start()


def stop_quietly(run) -> None:
    """Ask ``run`` to stop (it writes its results); nothing when its learner is gone already."""
    try:
        run.stop()
    except Exception:  # noqa: BLE001
        pass


def make_pruner(name: str, reports: int = REPORTS):
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=reports // 4)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, reports // 8), max_resource=reports)
    if name == "none":
        return optuna.pruners.NopPruner()
    raise PipelineError(f"--pruner: {name!r} is not a pruner; allowed: median, hyperband, none")


def make_sampler(name: str, seed: int | None):
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise PipelineError(f"--sampler: {name!r} is not a sampler; allowed: tpe, random")


def open_study(out: Path, objective: str, sampler, pruner):
    """The study in ``out/study.db``, created or loaded; trials a stopped sweep left running are
    failed and their parameters queued again, so a resumed sweep runs them first."""
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=STUDY_NAME, storage=f"sqlite:///{(out / 'study.db').resolve()}",
                                direction=OBJECTIVES[objective], sampler=sampler, pruner=pruner, load_if_exists=True)
    if study.direction.name.lower() != OBJECTIVES[objective]:
        raise PipelineError(f"--objective: the sweep in {str(out)!r} was started with another objective "
                            f"(it {study.direction.name.lower()}s); allowed: the same objective, or a new --out")
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
        if trial.state == TrialState.RUNNING:
            study.tell(trial.number, state=TrialState.FAIL)
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
    return study


def finished_count(study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
