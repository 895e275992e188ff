"""A learner's finals (its results, episodes, chunks and exact-replay log) as files in its rows
folder: written by a learner whose worker closes under it (``closing.py``), read back by the
driver, which cannot reach that learner any more."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tianji_dask.core.exact_replay_log import REPLAY_FIELDS
from tianji_dask.core.metrics import CHUNK_FIELDS, EPISODE_FIELDS, write_results

FINAL_DIR = "final"


def write_final(rows_dir: str | Path, final: dict) -> Path:
    """A learner's finals (``LearnerCore.finish``'s) as files in its rows folder."""
    return write_results(Path(rows_dir) / FINAL_DIR, final["results"], final["episodes"], final["chunks"],
                         replay=final.get("replay_log"))


def read_final(rows_dir: str | Path) -> dict | None:
    """What ``write_final`` wrote, as ``Learner.final`` gives it; None when nothing is there."""
    d = Path(rows_dir) / FINAL_DIR
    if not (d / "results.json").is_file():
        return None

    def rows(name: str, width: int) -> np.ndarray:
        return np.loadtxt(d / name, delimiter=",", skiprows=1, ndmin=2).reshape(-1, width)

    replay = rows("replay.csv", len(REPLAY_FIELDS)) if (d / "replay.csv").is_file() else None
    return {"results": json.loads((d / "results.json").read_text()), "episodes": rows("episodes.csv", len(EPISODE_FIELDS)),
            "chunks": rows("chunks.csv", len(CHUNK_FIELDS)), "replay_log": replay}
