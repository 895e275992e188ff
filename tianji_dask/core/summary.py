"""A learner's results, read off its books: time-to-solve by TianJi's rule, rates, staleness and
what was lost or dropped (no Dask)."""

from __future__ import annotations

import time

import numpy as np

from tianji_dask.core.ledger import Ledger
from tianji_dask.core.metrics import CHUNK_FIELDS, age_summary, replay_staleness_summary, staleness_summary


def results(ledger: Ledger, version: int, extra: dict | None = None, arrays: tuple | None = None) -> dict:
    """``arrays``: what ``arrays()`` returned, if the caller has it (it reads the spill files)."""
    t_end = ledger.t_end or time.time()
    wall = max(t_end - ledger.t_run_start, 1e-9)
    episodes, chunks = ledger.arrays() if arrays is None else arrays
    target = ledger.rules.target_return
    solved_at = ledger.rules.solved_at(episodes, ledger.evals)
    staleness = chunks[:, CHUNK_FIELDS.index("staleness_versions")] if len(chunks) else np.zeros(0)
    ages = chunks[:, CHUNK_FIELDS.index("age_s")] if len(chunks) else np.zeros(0)
    res = {
        "solved": solved_at is not None,
        "target_return": target,
        "time_to_solve_s": None if solved_at is None else solved_at - ledger.t_run_start,
        "time_to_solve_from_process_start_s": None if solved_at is None else solved_at - ledger.t_process_start,
        "stop_reason": ledger.stop_reason,
        "t_run_start": ledger.t_run_start,
        "t_process_start": ledger.t_process_start,
        "wall_s": wall,
        "env_steps": ledger.env_steps,
        "env_steps_trained": ledger.env_steps_used,
        "updates": ledger.updates,
        "final_version": version,
        "episodes": len(episodes),
        "final_mean_return": ledger.mean_return(),
        "env_steps_per_s": ledger.env_steps / wall,
        "samples_per_s_consumed": ledger.samples_trained / wall,
        "chunks": len(chunks),
        "chunks_per_s": len(chunks) / wall,
        "bytes_per_s": ledger.bytes / wall,
        "chunks_lost": len(ledger.lost),
        "lost": ledger.lost[:100],
        "chunks_dropped": dict(ledger.dropped),
        "learner_busy_fraction": ledger.learn_s / wall,
        "explorer_busy_fraction": ledger.explore_s / (wall * max(ledger.explorer_workers, 1)),
        "staleness_versions": staleness_summary(staleness),
        "replay_staleness_versions": replay_staleness_summary(ledger.replay_staleness.all()[:, 0]),
        "age_s": age_summary(ages),
        "last_update_metrics": ledger.last_metrics,
        "startup": ledger.startup(),
        "eval": ledger.evals_since_start(),
    }
    res.update(extra or {})
    return res
