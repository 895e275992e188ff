"""TensorBoard scalars of a run (``logging: {tensorboard: true}``), written where the learner runs.

Optional: needs the ``tensorboard`` package, which tianji_dask does not install.
"""

from __future__ import annotations

import time

#: status fields written as ``tianji/<name>`` scalars, when present
SCALARS = ("mean_return", "eval_mean_return", "updates", "version", "env_steps_per_s", "staleness_recent_mean", "chunks_in_flight",
           "window", "replay_ratio", "episodes", "chunks_dropped", "chunks_lost")
EVERY_S = 1.0


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


class ScalarLog:
    """Writes a status dict at most once a second, against env steps."""

    def __init__(self, log_dir: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=log_dir, flush_secs=5)
        self.last = 0.0

    def write(self, status: dict, force: bool = False) -> None:
        now = time.time()
        if not force and now - self.last < EVERY_S:
            return
        self.last = now
        step = int(status.get("env_steps", 0))
        for name in SCALARS:
            value = status.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"tianji/{name}", value, step, walltime=now)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
