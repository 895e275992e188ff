"""A finished run's record: the learners' finals pooled into one set of results (with what the
pipeline was and how the start went), the tracebacks moved to ``error.txt``, and every file
written atomically into the run folder."""

from __future__ import annotations

import shutil
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tianji_dask.config import Pipeline
from tianji_dask.core.metrics import CHUNK_FIELDS, EPISODE_FIELDS, write_results
from tianji_dask.core.stop import StopRules
from tianji_dask.errors import RunFault, SchedulerLost, first_line
from tianji_dask.run.groups import pool_results
from tianji_dask.run.provenance import stream_seeds
from tianji_dask.run.startup import startup_results


@dataclass(frozen=True)
class RunRecord:
    """What a run's results say of it besides its learners' books: its pipeline, id, stop rules and
    folder; ``startup``: when each step of its start was reached (Unix times); ``provenance``:
    what it recorded of its origins as it started (``provenance.at_start``), to which the explorer
    streams' env seeds are added (``env_seed``: the offset a run continued from a checkpoint adds
    to the pipeline's seed); ``earlier``: what it says of the legs before (``legs.history``)."""

    pipeline: Pipeline
    run_id: str
    rules: StopRules
    out: Path
    t_process_start: float
    startup: dict
    provenance: dict | None = None
    env_seed: int = 0
    earlier: dict | None = None


def assemble(finals: list[dict], record: RunRecord, group_stop: str | None, fusion: Callable[[], dict | None]
             ) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray | None]:
    """(results, episodes, chunks, replay log) of the run: one learner's, or every group's pooled
    (``fusion()``: the reducer's rounds, read only then)."""
    p, replay = record.pipeline, None
    if len(finals) > 1:
        results, episodes, chunks = pool_results(finals, record.rules, group_stop, fusion(),
                                                 replicas=p.learner.replicas > 1)
    else:
        final = finals[0]
        results, episodes, chunks = dict(final["results"]), final["episodes"], final["chunks"]
        replay = final.get("replay_log")
    results.update(
        run_id=record.run_id, pipeline=p.name, mode=p.mode, env_id=p.env.id, algo=p.algo.label, seed=p.seed,
        explorers=p.explorers, groups=p.groups, learner_replicas=p.learner.replicas, chunk_steps=p.chunk_steps,
        num_envs=p.env.num_envs,
        pipeline_config=p.model_dump(mode="json"),
    )
    results["simulated"] = p.simulated()
    if p.learner.simulated_step_ms:
        results["simulated_learner"] = {"step_ms": p.learner.simulated_step_ms,
                                        "about": "each gradient step also sleeps this long (learner.simulated_step_ms)"}
    results["startup"] = startup_results(record.startup, record.t_process_start, finals)
    results["provenance"] = {**(record.provenance or {}), "seeds": stream_seeds(p, record.env_seed, finals)}
    return results, episodes, chunks, replay


def move_tracebacks(results: dict, out: Path) -> str | None:
    """Move the learners' tracebacks out of the results into ``error.txt``; its name, or None."""
    per = [results, *(results.get("group_results") or results.get("replica_results") or [])]
    tracebacks = [r.pop("error_traceback", None) for r in per]
    texts = tracebacks[1:] if len(per) > 1 else tracebacks
    found = [(g, text) for g, text in enumerate(texts) if text]
    if not found:
        return None
    word = "replica" if results.get("replica_results") else "group"
    body = "\n".join(text if len(texts) == 1 else f"{word} {g}:\n{text}" for g, text in found)
    try:
        (Path(out) / "error.txt").write_text(f"{results.get('error')}\n\n{body}")
    except OSError:
        return None  # the one line is still in the results
    return "error.txt"


def write(out: Path, results: dict, episodes: np.ndarray, chunks: np.ndarray, replay: np.ndarray | None) -> Path:
    """results.json and the CSVs, each atomically; then the learners' spilled rows go (they are in
    the CSVs now). RunFault, one line, when the folder cannot take them."""
    try:
        path = write_results(out, results, episodes, chunks, replay=replay)
    except OSError as err:
        newest = results.get("checkpoint")
        go_on = f"`tianji-dask resume {out}` continues from it once the disk has room" if newest else "no checkpoint to go on from"
        raise RunFault(f"out: cannot write the results to {str(out)!r} ({err.strerror or err}); "
                       f"the run's newest checkpoint: {newest or 'none'}; {go_on}") from None
    shutil.rmtree(Path(out) / "rows", ignore_errors=True)
    return path


def unheard_final(status: dict, rules: StopRules, *, t_run_start: float, t_process_start: float,
                  checkpoint: str | None) -> dict:
    """A learner killed with its worker wrote no final books: a final of what its driver last
    heard of it (its figures; no episodes or chunks), every results field present."""
    from tianji_dask.core import summary
    from tianji_dask.core.ledger import Ledger

    ledger = Ledger(rules, t_run_start=t_run_start, t_process_start=t_process_start)
    ledger.t_end = t_run_start + float(status.get("elapsed_s") or 0.0)
    results = summary.results(ledger, int(status.get("version") or 0))
    results.update(env_steps=int(status.get("env_steps") or 0), updates=int(status.get("updates") or 0),
                   final_mean_return=status.get("mean_return"), checkpoint=checkpoint, learner_chunks=None,
                   heard_only=True)
    return {"results": results, "episodes": np.zeros((0, len(EPISODE_FIELDS))), "chunks": np.zeros((0, len(CHUNK_FIELDS)))}


def learner_chunk_accounting(finals: list[dict]) -> dict:
    """The chunk accounting from the learners' own books, when the controller's went with its
    scheduler: every task a learner submitted was consumed or lost."""
    books = [f["results"].get("learner_chunks") for f in finals]
    source = "the learners' own books (the controller's went with the scheduler)"
    if any(b is None for b in books):
        return {"balanced": None, "source": source, "why": "a learner wrote no books: its worker was killed with it"}
    submitted, consumed, lost, out = (sum(b.get(k, 0) for b in books) for k in ("submitted", "consumed", "lost", "in_flight"))
    return {"granted": submitted, "consumed": consumed, "returned": {"lost": lost}, "in_flight": out,
            "balanced": all(b["balanced"] for b in books), "source": source}


def after_cluster_lost(lost, found: list[dict | None], record: RunRecord, last_status: dict | None, t_run_start: float):
    """(results, episodes, chunks, replay log) of a run its cluster can no longer run (``lost``,
    a ``ClusterLost``: its scheduler lost, or no learner worker left): from each group's ``found``
    final books (what its learner wrote as its worker closed; None: none, then what the driver
    last heard), with one line saying what happened and how to go on."""
    p, out = record.pipeline, record.out
    heard = (last_status.get("groups") or last_status.get("replicas") or [last_status]) if last_status else []
    finals = [final if final is not None else unheard_final(
        heard[g] if g < len(heard) else {}, record.rules, t_run_start=t_run_start, t_process_start=record.t_process_start,
        checkpoint=None) for g, final in enumerate(found)]
    stop = "scheduler_lost" if isinstance(lost, SchedulerLost) else "learner_lost"
    results, episodes, chunks, replay = assemble(finals, record, stop, lambda: None)
    # the run lasted until its driver gave up on its cluster, not only while a learner trained
    results["wall_s"] = max(results["wall_s"], time.time() - t_run_start)
    wrote = sum(f is not None for f in found)
    results.update(stop_reason=stop, error_file=None, chunk_accounting=learner_chunk_accounting(finals),
                   error=(f"{lost}; {wrote} of {len(found)} learners wrote a checkpoint and their books as they "
                          f"closed; {resume_hint(out, p)}"))
    return results, episodes, chunks, replay


def driver_fault(err: BaseException) -> dict:
    """What the driver's own supervision raised (a fault of this code, or of the caller's
    ``on_status``; not of the cluster): its one line, and its traceback, taken while it is handled."""
    return {"line": f"driver: {first_line(err)}", "traceback": traceback.format_exc()}


def record_driver_fault(results: dict, fault: dict, out: Path, p: Pipeline) -> None:
    """The driver's fault in the results (``stop_reason: driver_error``): the line names it, says
    the driver stopped the run, and how to go on; its traceback goes to ``error.txt``, before any
    learner's."""
    after = results.get("error") or resume_hint(out, p)
    results.update(stop_reason="driver_error", error=f"{fault['line']}; the driver stopped the run; {after}")
    path = Path(out) / "error.txt"
    try:
        earlier = path.read_text() if results.get("error_file") else ""
        path.write_text(f"{results['error']}\n\n{fault['traceback']}" + (f"\n{earlier}" if earlier else ""))
    except OSError:
        return  # the one line is still in the results
    results["error_file"] = "error.txt"


def resume_hint(out: Path, p: Pipeline) -> str:
    """How to go on with a run its cluster lost: resume from the newest checkpoint that loads (on a
    scheduler, for a run that had one), or start again when none was written."""
    from tianji_dask.core import checkpoint
    from tianji_dask.run.specs import checkpoint_dirs

    try:
        for directory in checkpoint_dirs(out, p.groups):
            checkpoint.newest_loadable(directory)
    except checkpoint.CheckpointError:
        return "no checkpoint was written: `tianji-dask train` starts it again"
    on = " --scheduler ADDRESS" if p.cluster.kind == "address" else ""
    return f"`tianji-dask resume {out}{on}` continues from its newest checkpoint"
