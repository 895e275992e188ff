"""How a run ends: ``wait`` polls the learners until they are done, the cluster can no longer run
them, or the driver's own supervision raises; then the results are written from what the learners
wrote. ``RunEnding`` is that part of ``handle.Run``, whose state it reads."""

from __future__ import annotations

import time
from collections.abc import Callable

from tianji_dask.errors import ClusterLost, RunFault, SchedulerLost
from tianji_dask.run import provenance, quiet, results_writer
from tianji_dask.run.backend import Backend
from tianji_dask.run.groups import groups_stop_reason
from tianji_dask.run.progress import Progress

#: a learner whose worker closes with a lost scheduler has written its books by then (closing.CLOSE_WAIT_S)
FINALS_WAIT_S = 65.0
#: with its scheduler alive, a learner's worker leaves it only once its plugins' teardown, which
#: writes the books, is done: books not there by then never come (its worker was killed outright)
FINALS_LEFT_WAIT_S = 5.0
#: a learner asked to stop ends within a pass of its loop and a checkpoint (as closing.CLOSE_WAIT_S)
STOP_WAIT_S = 60.0


class RunEnding:
    """Waiting for the run's end and writing its results (mixed into ``handle.Run``)."""

    def wait(self, timeout: float | None = None, poll_s: float = 0.25, on_status: Callable[[dict], None] | None = None) -> dict:
        """Block until the run ends (or ``timeout`` s, then stop it); write and return results.
        ``on_status(status)`` is called with each status; should it raise (or the driver's own
        supervision), the run is stopped and its results written, ``stop_reason: driver_error``."""
        if self.results is not None:
            return self.results
        backend = self._started()
        fault = None
        with quiet.kept_quiet(self.verbose), Progress(self.pipeline.mode, self.progress) as progress:
            try:
                lost = self._wait(backend, timeout, poll_s, on_status, progress)
            except Exception as err:  # noqa: BLE001 - the driver's own fault (or on_status's): the run keeps what it trained
                fault = results_writer.driver_fault(err)
                lost = self._stop_after_fault(backend, poll_s)
        return self._write(fault) if lost is None else self._write_after(lost, fault)

    def _stop_after_fault(self, backend: Backend, poll_s: float) -> ClusterLost | None:
        """The driver's supervision raised while the learners train on: stop them and fetch their
        books (None), or the error that says the cluster can no longer give them."""
        try:
            backend.stop()
        except Exception:  # noqa: BLE001 - a learner that cannot be asked has its books read as its worker closed
            pass
        deadline = time.time() + STOP_WAIT_S
        try:
            while None in (finals := backend.finals()):  # each learner's, once it has stopped
                if time.time() >= deadline:
                    return ClusterLost(f"learner: not stopped {STOP_WAIT_S:.0f} s after the driver asked")
                time.sleep(poll_s)
        except ClusterLost as lost:
            return lost
        self._finals = finals
        return None

    def _wait(self, backend: Backend, timeout: float | None, poll_s: float, on_status, progress: Progress
              ) -> ClusterLost | None:
        """Poll the learners until they are done (None) or the cluster can no longer run them (that error)."""
        deadline = None if timeout is None else time.time() + timeout
        stopped = False
        while True:
            # waits up to poll_s in the learners, which answer at once when they finish
            try:
                reports = backend.reports(poll_s)
            except ClusterLost as lost:
                return lost
            if reports is None:
                continue  # a learner was rebuilt: ask again
            status = self._last_status = self._pooled(reports)
            progress(status)
            if on_status is not None:
                on_status(status)
            if status.get("done"):
                try:
                    self._finals = backend.finals()
                except ClusterLost as lost:
                    return lost
                return None
            if not stopped and self.pipeline.groups > 1:
                self._group_stop = self._group_stop or groups_stop_reason(status, [r.status for r in reports], self._rules)
                if self._group_stop:
                    self.stop()
                    stopped = True
            if deadline is not None and time.time() > deadline and not stopped:
                self.stop()
                stopped = True

    def _record(self) -> dict:
        """What the results record of the run's origins (read as it started; an attached run's now)."""
        return {"provenance": self._provenance or provenance.at_start(self.pipeline, self.source), "env_seed": self._env_seed}

    def _write(self, fault: dict | None = None) -> dict:
        backend = self._backend
        results, episodes, chunks, replay = results_writer.assemble(
            self._finals, self.pipeline, run_id=self.run_id, rules=self._rules, group_stop=self._group_stop,
            fusion=backend.fusion, startup={**self._startup, **backend.startup}, t_process_start=self.t_process_start,
            **self._record())
        results["error_file"] = results_writer.move_tracebacks(results, self.out)
        if fault is not None:
            results_writer.record_driver_fault(results, fault, self.out, self.pipeline)
        results.update(backend.figures(results))
        try:
            self.results_path = results_writer.write(self.out, results, episodes, chunks, replay)
        except RunFault:
            self.results = results  # still the caller's, in memory
            self.close()
            raise
        self.results = results
        t_written = time.time()
        self.close()
        t_stop = results["t_run_start"] + results["wall_s"]
        self.shutdown = {"results_written_s": t_written - t_stop, "closed_s": time.time() - t_stop}
        return results

    def _write_after(self, lost: ClusterLost, fault: dict | None = None) -> dict:
        """The cluster can no longer run the learners (its scheduler lost, its workers with it; or
        no learner worker left): the results from what each learner wrote as its worker closed
        (or what this driver last heard), and the line that says so and how to go on (after the
        driver's own ``fault``'s, when that came first)."""
        backend = self._backend
        wait_s = FINALS_WAIT_S if isinstance(lost, SchedulerLost) else FINALS_LEFT_WAIT_S
        results, episodes, chunks, replay = results_writer.after_cluster_lost(
            lost, backend.finals_left(wait_s), self.pipeline, run_id=self.run_id, rules=self._rules,
            out=self.out, last_status=self._last_status, t_run_start=backend.learners.t_run_start or time.time(),
            startup={**self._startup, **backend.startup}, t_process_start=self.t_process_start, **self._record())
        results["learner_restarts"] = backend.learners.restarts
        if not isinstance(lost, SchedulerLost):  # the controller's books are still on its scheduler
            results.update(backend.controller_figures(results) or {})
        if fault is not None:
            results_writer.record_driver_fault(results, fault, self.out, self.pipeline)
        backend.abandon()
        self.results = results
        self.results_path = results_writer.write(self.out, results, episodes, chunks, replay)
        self.close()
        return results
