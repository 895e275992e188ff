"""Population-based training (Jaderberg et al. 2017) on one cluster: a population of runs, each
on its own slot; every ``interval_s`` seconds the members in the bottom quantile by live score
stop, and each starts again from the newest checkpoint of a member in the top quantile with that
member's parameters perturbed (numbers ×0.8 or ×1.2 within their range, choices redrawn now and
then). Every exploit step is recorded (the lineage); a member's clock goes on from the
checkpoint it took, so each member trains for the budget along its own line."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tianji_dask.errors import PipelineError
from tianji_dask.sweeps import report
from tianji_dask.sweeps.driver import POLL_S, prepare
from tianji_dask.sweeps.study import stop_quietly, watch

OBJECTIVES = ("final_return", "eval_return")


@dataclass
class Member:
    index: int
    slot: object
    params: dict
    generation: int = 0
    run: object = None
    status: dict = field(default_factory=dict)
    results: dict | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)
    history: list = field(default_factory=list)  # one row per generation: run_dir, params, how it ended

    def score(self, objective: str) -> float:
        key = "eval_mean_return" if objective == "eval_return" else "mean_return"
        value = self.status.get(key)
        return float("-inf") if value is None or value != value else float(value)


def pbt(pipeline, params, *, population: int = 4, objective: str = "final_return", max_seconds: float | None = None,
        interval_s: float | None = None, quantile: float = 0.25, out: str | Path = "sweeps/pbt",
        overrides: dict | None = None, seed: int = 0, on_event=None) -> dict:
    """Train a population of ``population`` runs for ``max_seconds`` each, exploiting and exploring
    every ``interval_s`` seconds (default: a fifth of the budget). Writes ``sweep.json`` (every
    member's generations and the lineage), ``best.yaml`` and the table's data; returns it."""
    from tianji_dask.sweeps.slots import SweepCluster

    if objective not in OBJECTIVES:
        raise PipelineError(f"--objective: population-based training ranks members by their live return; "
                            f"allowed: {', '.join(OBJECTIVES)} (got {objective})")
    if population < 2:
        raise PipelineError(f"--concurrent: a population needs at least 2 members (got {population})")
    if not 0 < quantile <= 0.5:
        raise PipelineError(f"quantile: must be in (0, 0.5] (got {quantile})")
    user, base, params, budget = prepare(pipeline, params, trials=population, concurrent=population, objective=objective,
                                         max_seconds=max_seconds, overrides=overrides)
    if budget is None:
        raise PipelineError("--max-seconds: population-based training needs each member's time budget")
    interval = float(interval_s or budget / 5)
    if interval >= budget:
        raise PipelineError(f"--pbt-interval: must be shorter than the budget ({budget:g} s; got {interval:g})")
    from tianji_dask.run.handle import as_pipeline

    # checkpoints often enough that a member copied from is at most half an interval behind
    base = as_pipeline(base, {"checkpoint.enabled": True, "checkpoint.every_seconds": interval / 2})
    out = Path(out)
    if (out / "members").exists():
        raise PipelineError(f"--out: {str(out)!r} already holds a population; allowed: a new folder "
                            "(population-based training does not resume)")
    cluster = SweepCluster(base, population)  # refused (too small) before anything is written
    try:
        report.make_out(out)
    except PipelineError:
        cluster.close()
        raise
    emit = on_event or (lambda kind, info: None)
    rng = random.Random(seed)
    emit("cluster", {"slots": len(cluster.slots), "dashboard": cluster.dashboard_link})
    members = [Member(i, slot, {p.key: p.sample(rng) for p in params}) for i, slot in enumerate(cluster.slots)]
    lineage: list[dict] = []
    t0 = time.time()
    try:
        for m in members:
            _launch(m, base, cluster.client, out, emit)
        next_step = t0 + interval
        while not all(m.done.is_set() for m in members):
            time.sleep(POLL_S)
            if time.time() >= next_step:
                next_step += interval
                _exploit(members, params, objective, quantile, rng, base, cluster.client, out, lineage, t0, emit)
    except BaseException:
        for m in members:
            stop_quietly(m.run)
        raise
    finally:
        cluster.close()
    return report.write(out, _summary(members, params, objective, budget, lineage), user)


def _launch(m: Member, base, client, out: Path, emit, checkpoint_path: str | None = None) -> None:
    from tianji_dask.run.handle import Run

    run_dir = out / "members" / f"m{m.index}-g{m.generation}"
    placement = {"learner_worker": m.slot.learner, "explorer_workers": m.slot.explorers, "progress": False}
    if checkpoint_path is None:
        m.run = Run(base, client, out=run_dir, overrides=m.params, **placement)
    else:
        m.run = Run.from_checkpoint(base, checkpoint_path, client, out=run_dir, overrides=m.params, **placement)
    m.status, m.results, m.error, m.done = {}, None, None, threading.Event()
    m.history.append({"generation": m.generation, "run_dir": str(run_dir), "params": dict(m.params),
                      "from_checkpoint": checkpoint_path})
    m.run.start()
    watch(m, m.run, name=f"tianji-pbt-{m.index}")
    emit("start", {"number": m.index, "params": m.params, "slot": m.slot.index, "run_dir": str(run_dir)})


def _exploit(members, params, objective, quantile, rng, base, client, out, lineage, t0, emit) -> None:
    """The bottom quantile of the members still training takes a top member's checkpoint."""
    from tianji_dask.core import checkpoint

    running = sorted((m for m in members if not m.done.is_set() and m.status), key=lambda m: m.score(objective))
    n = max(1, int(len(running) * quantile))
    if len(running) < 2 * n:
        return
    bottom, top = running[:n], running[-n:]
    for m in bottom:
        src = rng.choice(top)
        if m.score(objective) >= src.score(objective):
            continue  # tied with the top (a solved task's ceiling): nothing better to copy
        try:
            path = str(checkpoint.latest(src.run.out / "checkpoints"))
        except checkpoint.CheckpointError:
            continue  # no checkpoint yet: it keeps training as it is
        before, score = dict(m.params), m.score(objective)
        stop_quietly(m.run)
        m.done.wait(60)
        m.history[-1].update(ended="exploited", score=score, results=_brief(m.results))
        m.generation += 1
        m.params = {p.key: p.perturb(src.params[p.key], rng) for p in params}
        row = {"t": time.time() - t0, "member": m.index, "generation": m.generation, "score": score,
               "from_member": src.index, "from_score": src.score(objective), "checkpoint": path,
               "params_before": before, "params_after": dict(m.params)}
        lineage.append(row)
        emit("exploit", {"member": m.index, "from_member": src.index, "params": m.params})
        _launch(m, base, client, out, emit, checkpoint_path=path)


def _brief(results: dict | None) -> dict | None:
    if results is None:
        return None
    return {k: results.get(k) for k in ("stop_reason", "final_mean_return", "time_to_solve_s", "env_steps", "final_version")}


def _summary(members, params, objective, budget, lineage) -> dict:
    """sweep.json for a population: a row per member generation (the last one's value is the
    member's), the lineage, and the best member's final parameters as best.yaml."""
    from tianji_dask.sweeps.study import objective_value

    rows, number = [], 0
    for m in members:
        for i, gen in enumerate(m.history):
            last = i == len(m.history) - 1
            value = objective_value(objective, m.results or {}, budget) if last else None
            if last:
                gen.update(ended=(m.results or {}).get("stop_reason") or "failed", results=_brief(m.results))
            rows.append({"number": number, "member": m.index, "generation": gen["generation"],
                         "state": ("COMPLETE" if value is not None else "FAIL") if last else "EXPLOITED",
                         "value": value, "params": gen["params"], "run_dir": gen["run_dir"],
                         "from_checkpoint": gen["from_checkpoint"], "error": m.error if last else None})
            number += 1
    complete = [r for r in rows if r["state"] == "COMPLETE"]
    best = max(complete, key=lambda r: r["value"]) if complete else None
    return {"mode": "pbt", "objective": objective, "direction": "maximize", "budget_s": budget,
            "space": {p.key: p.spec for p in params}, "trials": rows, "lineage": lineage,
            "best": None if best is None else {"number": best["number"], "member": best["member"],
                                               "value": best["value"], "params": best["params"]}}
