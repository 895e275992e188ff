"""The learner's books: consumed chunks, episodes, updates, lost and dropped chunks, and whether
the stop rules say stop. Where its time goes is ``timing.py``; the results read off the books,
``summary.py``.

Dask-free, so the single-process mode and the learner actor keep exactly the same books.
"""

from __future__ import annotations

import os
import time
from collections import deque
from pathlib import Path

import numpy as np

from tianji_dask.core.metrics import CHUNK_FIELDS
from tianji_dask.core.rows import Rows
from tianji_dask.core.stop import StopRules
from tianji_dask.core.timing import TimeSplit


class Ledger:
    """``rows_dir``: where the chunk log and the episodes spill to disk as the run goes (so the
    learner's memory stays flat); None keeps them all in memory."""

    def __init__(self, rules: StopRules, *, t_run_start: float, t_process_start: float, explorer_workers: int = 1,
                 rows_dir: str | os.PathLike | None = None):
        self.rules = rules
        self.rows_dir = None if rows_dir is None else Path(rows_dir)
        self.t_run_start = t_run_start
        self.t_process_start = t_process_start
        self.t_built = t_run_start  # this learner's own start: a resume moves t_run_start, not this
        self.t_first_chunk: float | None = None
        self.explorer_workers = explorer_workers
        self.episodes = self._rows("episodes", 4)  # (t_end, return, length, explorer_id)
        self.chunk_rows = self._rows("chunks", len(CHUNK_FIELDS))
        # replaying algorithms: each update's replay staleness (version at the update minus the mean
        # policy version of the samples it trained on)
        self.replay_staleness = self._rows("replay_staleness", 1)
        self.lost: list[dict] = []
        self.evals: list[dict] = []  # evaluations: t, version, mean, std, episodes, returns
        self.dropped: dict[str, int] = {}  # chunks consumed but not trained on, by reason
        self.env_steps = 0
        self.env_steps_used = 0
        self.updates = 0
        self.samples_trained = 0
        self.learn_s = 0.0
        self.explore_s = 0.0
        self.bytes = 0
        self.last_metrics: dict[str, float] = {}
        self.time = TimeSplit()  # where the learner's wall time goes besides updates (learn_s)
        self._recent_returns: deque[float] = deque(maxlen=rules.mean_episodes)
        self.solved_online_at: float | None = None
        self.stop_reason: str | None = None
        self.t_end: float | None = None

    def _rows(self, name: str, width: int, rows: np.ndarray | None = None) -> Rows:
        spill = None if self.rows_dir is None else self.rows_dir / f"{name}.f64"
        return Rows(width, rows, spill=spill)

    # ---- recording ----------------------------------------------------------------------
    def consume(self, chunk: dict, version: int, staleness: int, kept_steps: int, *, submit_version: int | None = None,
                t_consumed: float | None = None) -> float:
        """Record one chunk consumed at learner ``version``, ``staleness`` versions after its
        policy's; returns its age (seconds since it was made).

        ``submit_version``: the learner's version when the chunk's task was submitted (the
        chunk's policy is at most ``publish_every - 1`` versions older than that)."""
        t_consumed = time.time() if t_consumed is None else t_consumed
        if self.t_first_chunk is None:
            self.t_first_chunk = t_consumed
        age_s = max(0.0, t_consumed - chunk["t_end"])
        self.chunk_rows.append((
            t_consumed, chunk["explorer_id"], chunk["policy_version"] if submit_version is None else submit_version,
            chunk["policy_version"], version, staleness, age_s,
            chunk["env_steps"], chunk["nbytes"], chunk["t_start"], chunk["t_end"],
        ))
        self.env_steps += chunk["env_steps"]
        self.env_steps_used += kept_steps
        self.bytes += chunk["nbytes"]
        self.explore_s += chunk["t_end"] - chunk["t_start"]
        eps = chunk["episodes"]
        if len(eps):
            eps = eps[np.argsort(eps[:, 0])]
            self.episodes.extend(np.column_stack([eps[:, :3], np.full(len(eps), chunk["explorer_id"])]))
            self._recent_returns.extend(eps[:, 1].tolist())
            # the cheap arrival-order mean gates the exact rule (episodes sorted by end time), so
            # the run stops exactly when the reported time-to-solve exists
            if (self.solved_online_at is None and self.rules.running_mean_solves(self._recent_returns)
                    and self.rules.solved_at(self.episodes.all()) is not None):
                self.solved_online_at = t_consumed
        return age_s

    def record_eval(self, t: float, version: int, returns: list[float]) -> dict:
        """One evaluation's episodes (played apart, never trained on); with ``stop.on: eval`` the
        first whose mean reaches the target solves the run."""
        returns = [float(r) for r in returns]
        row = {"t": t, "version": int(version), "mean": float(np.mean(returns)), "std": float(np.std(returns)),
               "episodes": len(returns), "returns": returns}
        self.evals.append(row)
        if self.solved_online_at is None and self.rules.eval_solves(row["mean"]):
            self.solved_online_at = t
        return row

    def evals_since_start(self) -> list[dict]:
        return [{**row, "t": row["t"] - self.t_run_start} for row in self.evals]

    def eval_mean(self) -> float | None:
        return self.evals[-1]["mean"] if self.evals else None

    def record_dropped(self, reason: str) -> None:
        """A consumed chunk the learner did not train on (its episodes still count: they ran)."""
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def record_lost(self, key: str, explorer_id: int, reason: str) -> None:
        self.lost.append({"key": key, "explorer_id": explorer_id, "reason": reason})

    def record_update(self, metrics: dict, seconds: float, version: int = 0) -> None:
        """One update made at learner ``version`` (before it); a replaying algorithm's metrics
        name the mean policy version of its batch (``batch_policy_version``)."""
        self.updates += 1
        self.learn_s += seconds
        self.samples_trained += int(metrics.get("samples", 0))
        self.last_metrics = metrics
        batch_version = metrics.get("batch_policy_version")
        if batch_version is not None:
            self.replay_staleness.append(version - batch_version)

    # ---- checkpoints --------------------------------------------------------------------
    _CHUNK_TIMES = (CHUNK_FIELDS.index("t_consumed"), CHUNK_FIELDS.index("t_start"), CHUNK_FIELDS.index("t_end"))

    def state_dict(self, now: float | None = None) -> dict:
        """The books, with times relative to run start, so a resumed run continues the same clock
        (the time a run was stopped does not count)."""
        now = time.time() if now is None else now
        episodes, chunks = self.arrays()
        episodes[:, 0] -= self.t_run_start
        for i in self._CHUNK_TIMES:
            chunks[:, i] -= self.t_run_start
        return {
            "elapsed_s": now - self.t_run_start, "episodes": episodes, "chunks": chunks, "lost": list(self.lost),
            "dropped": dict(self.dropped), "env_steps": self.env_steps, "env_steps_used": self.env_steps_used,
            "updates": self.updates, "samples_trained": self.samples_trained, "learn_s": self.learn_s,
            "explore_s": self.explore_s, "bytes": self.bytes, "recent_returns": list(self._recent_returns),
            "solved_s": None if self.solved_online_at is None else self.solved_online_at - self.t_run_start,
            "evals": self.evals_since_start(),
            "replay_staleness": self.replay_staleness.all()[:, 0],
        }

    def load_state_dict(self, state: dict, now: float | None = None) -> None:
        now = time.time() if now is None else now
        self.t_run_start = now - state["elapsed_s"]
        episodes, chunks = np.array(state["episodes"]), np.array(state["chunks"])
        episodes[:, 0] += self.t_run_start
        for i in self._CHUNK_TIMES:
            chunks[:, i] += self.t_run_start
        self.episodes = self._rows("episodes", 4, episodes)
        self.chunk_rows = self._rows("chunks", len(CHUNK_FIELDS), chunks)
        self.lost, self.dropped = list(state["lost"]), dict(state["dropped"])
        for key in ("env_steps", "env_steps_used", "updates", "samples_trained", "learn_s", "explore_s", "bytes"):
            setattr(self, key, state[key])
        self._recent_returns.clear()
        self._recent_returns.extend(state["recent_returns"])
        self.evals = [{**row, "t": row["t"] + self.t_run_start} for row in state.get("evals", [])]
        # solved by this run's rules, which a resume may have changed (a new target, or none: train on)
        self.solved_online_at = self.rules.solved_at(self.episodes.all(), self.evals)
        # a checkpoint from before updates were measured so has none: the run's measure starts here
        self.replay_staleness = self._rows("replay_staleness", 1, state.get("replay_staleness"))

    # ---- stopping -----------------------------------------------------------------------
    def check_stop(self, now: float | None = None) -> str | None:
        """The stop rules on these books; the first reason found stays."""
        if not self.stop_reason:
            now = time.time() if now is None else now
            self.stop_reason = self.rules.reason(solved=self.solved_online_at is not None, env_steps=self.env_steps,
                                                 updates=self.updates, elapsed_s=now - self.t_run_start)
        return self.stop_reason

    def request_stop(self, reason: str = "stopped") -> None:
        self.stop_reason = self.stop_reason or reason

    # ---- reading ------------------------------------------------------------------------
    def mean_return(self) -> float | None:
        return sum(self._recent_returns) / len(self._recent_returns) if self._recent_returns else None

    def replay_staleness_recent(self) -> float | None:
        """Mean replay staleness of the last 50 updates (None: no update replayed yet)."""
        recent = self.replay_staleness.tail(50)
        return float(recent.mean()) if len(recent) else None

    def status(self, version: int, now: float | None = None) -> dict:
        now = time.time() if now is None else now
        wall = max(now - self.t_run_start, 1e-9)
        recent = self.chunk_rows.tail(50)[:, CHUNK_FIELDS.index("staleness_versions")]
        return {
            "version": version,
            "env_steps": self.env_steps,
            "updates": self.updates,
            "episodes": len(self.episodes),
            "mean_return": self.mean_return(),
            "eval_mean_return": self.eval_mean(),
            "elapsed_s": wall,
            "env_steps_per_s": self.env_steps / wall,
            "staleness_recent_mean": float(recent.mean()) if len(recent) else None,
            "replay_staleness_recent_mean": self.replay_staleness_recent(),
            "solved": self.solved_online_at is not None,
            "stop_reason": self.stop_reason,
            "chunks_lost": len(self.lost),
            "chunks_dropped": sum(self.dropped.values()),
        }

    def startup(self) -> dict:
        """Seconds from process start to this learner built and to its first chunk consumed."""
        def since(t):
            return None if t is None else t - self.t_process_start

        return {"learner_built_s": since(self.t_built), "first_chunk_s": since(self.t_first_chunk)}

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of (episodes, chunk log) as float64 arrays."""
        return self.episodes.all(), self.chunk_rows.all()

    def discard_spill(self) -> None:
        """Remove the spill files, once the run's rows are in its final results."""
        self.episodes.discard()
        self.chunk_rows.discard()
        self.replay_staleness.discard()
