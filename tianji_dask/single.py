"""The single-process mode: the same rollout, algorithm and ledger, no Dask at all."""

from __future__ import annotations

import threading
import time

from tianji_dask import checkpoint
from tianji_dask.dataflow.ledger import Ledger
from tianji_dask.rollout import Rollout
from tianji_dask.torch_setup import learner_device, prepare_torch


class SingleProcessRun:
    """Explorers take turns stepping their envs with the learner's own (always fresh) policy."""

    def __init__(self, spec: dict, env_id: str, num_envs: int, env_kwargs_for, seed: int):
        """``env_kwargs_for(explorer_id)``: the gymnasium kwargs of that explorer's envs."""
        prepare_torch(spec["threads"])
        self.spec = spec
        self.algo = spec["make_algo"]()
        self.algo.to_device(learner_device(spec.get("device", "cpu")))
        self.rollouts = [
            Rollout(env_id, num_envs, seed * 100_003 + i * 1009, env_kwargs_for(i)) for i in range(spec["explorers"])
        ]
        self.version = 0
        self._stop = threading.Event()
        self.t_run_start = time.time()
        self.ledger = Ledger(spec["stop"], t_run_start=self.t_run_start, t_process_start=spec["t_process_start"],
                             rows_dir=spec.get("rows_dir"))
        self._ckpt = checkpoint.Checkpointer(spec.get("checkpoint"))
        if spec.get("resume_from"):
            state = checkpoint.restore(spec["resume_from"], self.algo, self.ledger)
            self.version = self._ckpt.last_version = int(state["version"])
        self.error: str | None = None
        self._tb = None
        if spec.get("tensorboard_dir"):
            from tianji_dask.observe.tensorboard import ScalarLog

            self._tb = ScalarLog(spec["tensorboard_dir"])

    def run(self) -> dict:
        import traceback

        algo, ledger = self.algo, self.ledger
        try:
            while not self._stop.is_set() and ledger.check_stop() is None:
                for eid, rollout in enumerate(self.rollouts):
                    explore = algo.exploration(ledger.env_steps, self.version)
                    chunk = rollout.run(algo, self.spec["chunk_steps"], explore, policy_version=self.version, explorer_id=eid)
                    kept = algo.ingest(chunk, self.version - chunk["policy_version"])
                    ledger.consume(chunk, self.version, kept)
                    if self._tb is not None:
                        self._tb.write(self.status())
                    while algo.ready():
                        t0 = time.perf_counter()
                        metrics = algo.learn()
                        checkpoint.check_finite(metrics, self.version)
                        ledger.record_update(metrics, time.perf_counter() - t0)
                        self.version += 1
                        if self._ckpt.due(self.version):
                            self._write_checkpoint()
            self._write_checkpoint()
        except checkpoint.NumericFault as fault:
            self.error = str(fault)
            ledger.request_stop("numeric_fault")
        except BaseException:  # noqa: BLE001 - reported in the results
            self.error = traceback.format_exc()
            ledger.request_stop("error")
        finally:
            for rollout in self.rollouts:
                rollout.close()
        ledger.request_stop("stopped")
        ledger.t_end = time.time()
        if self._tb is not None:
            self._tb.write(self.status(), force=True)
            self._tb.close()
        episodes, chunks = ledger.arrays()
        ledger.discard_spill()
        extra = {"error": self.error, "checkpoint": None if self._ckpt.last_path is None else str(self._ckpt.last_path)}
        return {"results": ledger.results(self.version, extra=extra, arrays=(episodes, chunks)),
                "episodes": episodes, "chunks": chunks}

    def _write_checkpoint(self) -> None:
        if not checkpoint.all_finite(self.algo.get_weights()):
            raise checkpoint.NumericFault(f"numeric: non-finite weights at version {self.version}; the run stops, "
                                          f"the last good checkpoint is kept")
        self._ckpt.write(self.algo, self.version, self.ledger)

    def status(self) -> dict:
        return self.ledger.status(self.version)

    def stop(self) -> None:
        self._stop.set()
