"""When a learner's worker closes under it: Dask closes a worker the moment its connection to the
scheduler breaks (``Worker.handle_scheduler``), and the worker process ends about 12 s later when
its heartbeat fails. A learner still training then has its state only in that process. This
worker plugin, on every worker of a run, holds the worker's close (its ``teardown``) while the
learner it hosts stops without a word to the scheduler, writes a checkpoint, and writes its final
books (results, episodes, chunks) into the run folder, where the driver reads them back
(``read_final``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
from distributed import WorkerPlugin

from tianji_dask import dask_internals
from tianji_dask.core.exact_replay_log import REPLAY_FIELDS
from tianji_dask.core.metrics import CHUNK_FIELDS, EPISODE_FIELDS, write_results

#: at most this long the worker's close waits for its learner (the process ends ~12 s after the
#: scheduler's loss: a heartbeat fails)
CLOSE_WAIT_S = 9.0
FINAL_DIR = "final"


def guard_name(run_id: str) -> str:
    return f"tianji-closing-{run_id}"


class LearnerCloseGuard(WorkerPlugin):
    """Registered on every worker of a run; only a worker hosting one of its learners waits."""

    def __init__(self, run_id: str):
        self.run_id = run_id

    async def teardown(self, worker) -> None:
        from tianji_dask.dataflow.learner.actor import Learner

        for learner in dask_internals.worker_actors(worker):
            if isinstance(learner, Learner) and learner.spec.run_id == self.run_id:
                ended = learner.worker_closing()
                await asyncio.to_thread(ended.wait, CLOSE_WAIT_S)


def write_final(rows_dir: str | Path, final: dict) -> Path:
    """A learner's final books (``LearnerCore.finish``'s) as files in its rows folder."""
    return write_results(Path(rows_dir) / FINAL_DIR, final["results"], final["episodes"], final["chunks"],
                         replay=final.get("replay"))


def read_final(rows_dir: str | Path) -> dict | None:
    """What ``write_final`` wrote, as ``Learner.final`` gives it; None when nothing is there."""
    d = Path(rows_dir) / FINAL_DIR
    if not (d / "results.json").is_file():
        return None

    def rows(name: str, width: int) -> np.ndarray:
        return np.loadtxt(d / name, delimiter=",", skiprows=1, ndmin=2).reshape(-1, width)

    replay = rows("replay.csv", len(REPLAY_FIELDS)) if (d / "replay.csv").is_file() else None
    return {"results": json.loads((d / "results.json").read_text()), "episodes": rows("episodes.csv", len(EPISODE_FIELDS)),
            "chunks": rows("chunks.csv", len(CHUNK_FIELDS)), "replay": replay}
