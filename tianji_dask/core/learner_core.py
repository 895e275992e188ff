"""The learner core: the algorithm, its version, the books, checkpoints, the numeric guard and the
stop rules. No Dask: the single-process mode and the learner actor run the same core, so an
update, a checkpoint, a resume or a stop means the same in both."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from tianji_dask.algos import optim
from tianji_dask.core import checkpoint, summary
from tianji_dask.core.compile import BackgroundCompile, resolve
from tianji_dask.core.consumption import Consumption
from tianji_dask.core.env_errors import EnvErrors
from tianji_dask.core.guard import NumericFault, check_metrics, check_weights
from tianji_dask.core.ledger import Ledger
from tianji_dask.core.exact_replay_log import ExactReplayLog, weights_digest
from tianji_dask.core.replicas import ReplicaError, Replicas
from tianji_dask.core.spec import CoreSpec
from tianji_dask.core.torch_setup import learner_device, prepare_torch
from tianji_dask.errors import raised_in


@dataclass
class Final:
    """A finished learner: its results, and the episode and chunk tables behind them."""

    results: dict
    episodes: np.ndarray
    chunks: np.ndarray
    replay_log: np.ndarray | None = None  # the exact-replay log's rows (exact_replay_log.REPLAY_FIELDS)

    def as_dict(self) -> dict:
        return {"results": self.results, "episodes": self.episodes, "chunks": self.chunks, "replay_log": self.replay_log}


class LearnerCore:
    def __init__(self, spec: CoreSpec):
        prepare_torch(spec.threads)
        self.spec = spec
        self.algo = spec.make_algo()
        self.algo.to_device(learner_device(spec.device))
        mode, self.compile_why = resolve(spec.compile, self.algo, self.algo.device, spec.stop.max_seconds)
        self.compiler = None if mode is None else BackgroundCompile(self.algo, mode)
        self.version = 0
        self.ledger = Ledger(spec.stop, t_run_start=time.time(), t_process_start=spec.t_process_start,
                             explorer_workers=spec.explorer_workers, rows_dir=spec.rows_dir)
        self.checkpointer = checkpoint.Checkpointer(spec.checkpoint)
        #: what a checkpoint holds besides the core's own state (the actor adds the controller's)
        self.checkpoint_extra: Callable[[], dict] = dict
        self.restored: dict = {}  # the checkpoint's whole state when resumed
        if spec.resume_from:  # continue the learning curve, the books and the clock
            # a replica starting from another's checkpoint (a run started from a checkpoint) takes its
            # policy and clock, not its books: their episodes and chunks would count once per replica
            own = spec.checkpoint is not None and Path(spec.resume_from).parent == Path(spec.checkpoint.dir)
            ledger = self.ledger if spec.replica is None or spec.replica.rank == 0 or own else Ledger(
                spec.stop, t_run_start=0.0, t_process_start=spec.t_process_start)
            self.restored = checkpoint.restore(spec.resume_from, self.algo, ledger, spec.keep_t_run_start)
            self.ledger.t_run_start = ledger.t_run_start
            self.version = self.checkpointer.last_version = int(self.restored["version"])
        elif spec.keep_t_run_start is not None:  # rebuilt from the start: the time lost still counts
            self.ledger.t_run_start = spec.keep_t_run_start
        #: the replicas this learner trains one policy with (None: it trains alone); joined here, so
        #: every replica starts from rank 0's networks
        self.replicas = None if spec.replica is None else Replicas(spec.replica, self.algo.device)
        self._checkpoint_agreed = False  # the replicas' last agreement: a checkpoint after the update
        if self.replicas is not None:
            self.replicas.attach(self.algo)
        self.replay_log = None
        if spec.replay_log:
            self.replay_log = ExactReplayLog(self.algo.exploration(0, 0), spec.rows_dir)
            if spec.resume_from or spec.keep_t_run_start is not None:
                self.replay_log.not_replayable("the learner continued from a checkpoint (resumed or rebuilt)")
            if spec.device != "cpu":
                self.replay_log.not_replayable(f"the learner trained on {spec.device}, which is not bit-for-bit repeatable")
        self.env_errors = EnvErrors(spec.env_max_errors)
        self.error: str | None = None
        self.error_detail: str | None = None  # the traceback behind error, when there is one
        self._tensorboard = None if spec.scalar_log is None else spec.scalar_log()
        self.callbacks = None  # a CallbackRunner when the run has callbacks
        if spec.callbacks is not None:
            from tianji_dask.callbacks.runner import CallbackRunner

            self.callbacks = CallbackRunner(spec.callbacks)
            self.callbacks.emit("on_start", {**spec.callbacks.info, "version": self.version, "resumed": bool(spec.resume_from)})

    @property
    def t_run_start(self) -> float:
        return self.ledger.t_run_start

    # ---- what the dataflow asks of the algorithm and the books (through here, not their parts) --
    @property
    def on_policy(self) -> bool:
        return self.algo.on_policy

    def timed(self, part: str):
        """A block whose wall time counts toward ``part`` of the learner's time (``Ledger.timed``)."""
        return self.ledger.time.timed(part)

    def exploration(self) -> dict:
        """What explorers act with now, given the learner's progress (``Algorithm.exploration``)."""
        return self.algo.exploration(self.ledger.env_steps, self.version)

    def replay_progress(self) -> dict | None:
        return self.algo.replay_progress()

    def set_replay_ratio_max(self, rho_max: float | None) -> None:
        self.algo.set_replay_ratio_max(rho_max)

    def takes_more(self) -> bool:
        """Would the next update train on one more chunk?"""
        return self.algo.takes_more()

    @property
    def policy(self):
        """The algorithm as explorers act with it: single mode's explorers act with the learner's own."""
        return self.algo

    def model_state(self) -> dict:
        """What group mode averages across learners (``Algorithm.model_state``)."""
        return self.algo.model_state()

    def load_model_state(self, state: dict) -> None:
        self.algo.load_model_state(state)

    @property
    def checkpoints(self) -> bool:
        """This learner writes checkpoints."""
        return self.checkpointer.settings is not None

    @property
    def last_checkpoint(self):
        """The path of the newest checkpoint this learner wrote (None: none yet)."""
        return self.checkpointer.last_path

    @property
    def chunks_lost(self) -> int:
        return len(self.ledger.lost)

    @property
    def chunks_consumed(self) -> int:
        """Chunks on the books (``consume``), a resumed learner's earlier ones included."""
        return len(self.ledger.chunk_rows)

    def recent_episodes(self) -> list[list[float]]:
        """The last ``stop.mean_episodes`` training episodes, as [end time, return] (group mode
        pools them)."""
        return self.ledger.episodes.tail(self.spec.stop.mean_episodes)[:, :2].tolist()

    def learner_figures(self, now: float) -> dict:
        """Small and flat: what the dashboard and the Prometheus collector show of the learner."""
        ledger, progress = self.ledger, self.algo.replay_progress()
        return {
            "version": self.version, "updates": ledger.updates, "env_steps": ledger.env_steps,
            "samples_trained": ledger.samples_trained, "learn_s": ledger.learn_s, "episodes": len(ledger.episodes),
            "mean_return": ledger.mean_return(), "eval_mean_return": ledger.eval_mean(),
            "elapsed_s": now - ledger.t_run_start,
            "solved_s": None if ledger.solved_online_at is None else ledger.solved_online_at - ledger.t_run_start,
            "replay_ratio": self.replay_ratio(),
            # what the controller holds a replay_staleness_target by, and how full the buffer is
            "replay_staleness_recent_mean": ledger.replay_staleness_recent(),
            "replay_fill": (progress or {}).get("fill"),
        }

    # ---- consuming ------------------------------------------------------------------------
    def staleness(self, chunk: dict) -> int:
        return self.version - chunk["policy_version"]

    def filter_reason(self, chunk: dict, *, max_staleness: int | None = None, superseded: bool = False) -> str | None:
        """Why the dataflow's filters drop ``chunk`` now (None: they keep it): staler than
        ``max_staleness``, or made by a version ``superseded`` before it was sent (TianJi's drop
        on refresh)."""
        if max_staleness is not None and self.staleness(chunk) > max_staleness:
            return "max_staleness"
        return "refresh" if superseded else None

    def waits(self, chunk: dict) -> bool:
        """Would the algorithm still train on ``chunk`` (on-policy data waits for the update
        that takes it), rather than drop it at once?"""
        return self.algo.accepts(self.staleness(chunk))

    def consume(self, chunk: dict, *, key: str = "", dropped: str | None = None, submit_version: int | None = None,
                explore: dict | None = None) -> Consumption:
        """Put a chunk on the books; unless ``dropped`` names why not (``filter_reason``), the
        algorithm ingests it (it may still refuse it: "algorithm", e.g. on-policy data past its
        lag limit). A dropped chunk's episodes count all the same: they ran."""
        staleness, kept = self.staleness(chunk), 0
        if self.replay_log is not None:
            self.replay_log.record(chunk, self.ledger.updates, dropped is not None, explore)
        if dropped is None:
            with self.ledger.time.timed("ingest"):
                kept = self.algo.ingest(chunk, staleness)
            if kept == 0:
                dropped = "algorithm"
        if dropped is not None:
            self.ledger.record_dropped(dropped)
        age_s = self.ledger.consume(chunk, self.version, staleness, kept, submit_version=submit_version)
        if self.callbacks is not None and len(chunk["episodes"]) and self.callbacks.wants("on_episodes"):
            self.callbacks.emit("on_episodes", self._episode_rows(chunk))
        return Consumption(key, int(chunk["explorer_id"]), int(chunk["env_steps"]), int(chunk["nbytes"]), staleness,
                           age_s, dropped, kept)

    def _episode_rows(self, chunk: dict) -> list[dict]:
        """The chunk's episodes as callbacks get them, in the order the books keep them."""
        eps = chunk["episodes"]
        eps = eps[np.argsort(eps[:, 0])]
        t0, steps = self.ledger.t_run_start, self.ledger.env_steps
        return [{"t": float(t) - t0, "return": float(ret), "length": int(length), "explorer_id": int(chunk["explorer_id"]),
                 "policy_version": int(chunk["policy_version"]), "version": self.version, "env_steps": steps}
                for t, ret, length in eps[:, :3]]

    def record_lost(self, key: str, explorer_id: int, why: str) -> None:
        self.ledger.record_lost(key, explorer_id, why)

    def record_env_error(self, explorer_id: int, line: str, detail: str | None) -> None:
        """An env raised (its chunk is lost, recorded apart): counted, and the run stopped when
        ``env.max_errors`` is exceeded (env_errors.py)."""
        stop = self.env_errors.record(explorer_id, line, detail)
        if stop is not None and self.error is None:
            self.fail(stop, "env_errors", detail=detail)

    def record_eval(self, t: float, version: int, returns: list[float]) -> dict:
        """An evaluation of policy ``version`` ended at ``t`` (see ``Ledger.record_eval``)."""
        row = self.ledger.record_eval(t, version, returns)
        if self.callbacks is not None:
            self.callbacks.emit("on_evaluation", {**row, "t": row["t"] - self.ledger.t_run_start})
        return row

    # ---- training -------------------------------------------------------------------------
    def ready(self) -> bool:
        return self.algo.ready()

    def agree(self, ready: bool, stop: bool) -> bool:
        """With replicas: may every replica update now? One agreement over each one's ``ready``
        and ``stop`` (and whether a checkpoint falls due with the update, so that all write it or
        none does); a stop on any ends them all (``replicas.ended``). Alone: ``ready``."""
        if self.replicas is None:
            return ready
        ready, _, self._checkpoint_agreed = self.replicas.agree(ready, stop, self.checkpointer.due(self.version + 1))
        return ready

    def learn_once(self) -> None:
        """One update: a new version, on the books, checkpointed when one is due."""
        t0 = time.perf_counter()
        if self.compiler is not None:
            self.compiler.before_update()
        steps0 = optim.steps_taken()
        metrics = self.algo.learn()
        if self.spec.simulated_step_s:  # the compute a bigger learner host would spend on these steps
            time.sleep(self.spec.simulated_step_s * (optim.steps_taken() - steps0))
        if self.compiler is not None and self.compiler.after_update(self.version + 1) and self.replay_log is not None:
            self.replay_log.not_replayable("the learner's losses were compiled (learner.compile)")
        check_metrics(metrics, self.version)
        self.ledger.record_update(metrics, time.perf_counter() - t0, self.version)  # replay staleness at this version
        self.version += 1
        if self.replicas is not None:
            self.replicas.updated(self.algo, self.version)
        if self.callbacks is not None:
            self.callbacks.emit("on_update", self.version, dict(metrics))
        # replicas write one at the same version, or none does: as they agreed before this update
        due = self._checkpoint_agreed if self.replicas is not None else self.checkpointer.due(self.version)
        if due:
            with self.ledger.time.timed("checkpoint"):
                self.write_checkpoint()

    def new_version(self) -> None:
        """The model changed other than by an update (a fused model installed)."""
        self.version += 1
        if self.replay_log is not None:
            self.replay_log.not_replayable("a fused model was installed (group mode)")

    def weights(self) -> dict:
        """The policy weights to publish; NumericFault if any is non-finite."""
        return check_weights(self.algo.get_weights(), self.version, published=True)

    def write_checkpoint(self) -> None:
        check_weights(self.algo.get_weights(), self.version)
        path = self.checkpointer.write(self.algo, self.version, self.ledger, self.checkpoint_extra())
        if path is not None and self.callbacks is not None:
            self.callbacks.emit("on_checkpoint", str(path), self.version)

    # ---- stopping -------------------------------------------------------------------------
    def stop_reason(self) -> str | None:
        """Why the run stops (the stop rules on the books, or a stop requested), None to go on."""
        return self.ledger.check_stop()

    def request_stop(self, reason: str) -> None:
        self.ledger.request_stop(reason)

    def run(self, loop: Callable[[], None]) -> None:
        """Run ``loop`` until it returns, then write the last checkpoint. A numeric fault or any
        error stops the run and is kept for its results; nothing escapes."""
        try:
            loop()
            self.write_checkpoint()
        except NumericFault as fault:
            self.error = str(fault)
            self.request_stop("numeric_fault")
        except checkpoint.CheckpointWriteError as err:
            self.error = str(err)
            self.request_stop("disk")
        except ReplicaError as err:
            self.error = str(err)
            self.request_stop("replicas")
        except BaseException as err:  # noqa: BLE001 - reported in the results, never swallowed
            self.fail(f"learner: {raised_in(err, type(self.algo))}", "error", detail=traceback.format_exc())

    def fail(self, error: str, reason: str, detail: str | None = None) -> None:
        """Stop the run for ``reason`` and report ``error`` (one line) with its results, and
        ``detail`` (a traceback), which the run writes to its error.txt."""
        self.error, self.error_detail = error, detail
        self.request_stop(reason)

    # ---- reading ----------------------------------------------------------------------------
    def status(self, now: float | None = None) -> dict:
        compiling = "off" if self.compiler is None else self.compiler.state
        return {**self.ledger.status(self.version, now), "learner_compile": compiling}

    def compile_summary(self) -> dict:
        """``learner.compile``: off (and why), or how the background compilation went."""
        if self.compiler is None:
            return {"state": "off", "reason": self.compile_why}
        return self.compiler.summary()

    def log_status(self, status: dict, force: bool = False) -> None:
        """TensorBoard scalars, when the run asked for them (at most once a second)."""
        if self._tensorboard is not None:
            self._tensorboard.write(status, force=force)

    def replay_ratio(self) -> float | None:
        """Samples trained per env step past the warm-up (replaying algorithms only)."""
        progress = self.algo.replay_progress()
        return progress["samples_trained"] / progress["env_steps"] if progress and progress["env_steps"] else None

    def finish(self, extra: dict | None = None, final_status: Callable[[dict], dict] = lambda s: s) -> Final:
        """End the books: the results with ``extra`` added, the last status logged."""
        ledger = self.ledger
        ledger.request_stop("stopped")
        ledger.t_end = time.time()
        episodes, chunks = ledger.arrays()
        results = summary.results(ledger, self.version, arrays=(episodes, chunks), extra={
            "error": self.error, "error_traceback": self.error_detail, "algo_counters": self.algo.counters(),
            "replay_progress": self.algo.replay_progress(),
            "checkpoint": None if self.checkpointer.last_path is None else str(self.checkpointer.last_path),
            "learner_time": ledger.time.breakdown(ledger.t_end - ledger.t_run_start, ledger.learn_s),
            "final_weights_sha256": weights_digest(self.algo.get_weights()),
            "replay": None if self.replay_log is None else self.replay_log.meta(),
            "learner_compile": self.compile_summary(), "env_errors": self.env_errors.summary(),
            "replica": None if self.replicas is None else self.replicas.figures(ledger.updates), **(extra or {}),
        })
        if self.replicas is not None:
            self.replicas.close()
        ledger.discard_spill()  # the rows go out with the results (read for their summaries first)
        if self.callbacks is not None:  # what is queued is delivered, then on_end: bounded in time
            results["callbacks"] = self.callbacks.end(dict(results))
        if self._tensorboard is not None:
            self._tensorboard.write(final_status(self.status(ledger.t_end)), force=True)
            self._tensorboard.close()
            self._tensorboard = None
        return Final(results, episodes, chunks, None if self.replay_log is None else self.replay_log.take())
