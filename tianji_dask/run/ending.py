"""How a run ends. ``Ending.wait`` polls a started run's learners until they are done, the cluster
can no longer run them, or the driver's own supervision raises (``Ended`` says which);
``Ending.results`` then assembles the run's results from what the learners wrote and what the run
records of itself (``results_writer.RunRecord``). ``handle.Run`` holds one per start and hands it
the backend, the stop rules and its ``stop``: nothing here reads the run's own state."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tianji_dask.core.stop import StopRules
from tianji_dask.errors import ClusterLost, LearnerWorkersGone, SchedulerLost
from tianji_dask.run import legs, results_writer
from tianji_dask.run.backend import Backend, Gone
from tianji_dask.run.groups import groups_stop_reason, pool_status
from tianji_dask.run.progress import Progress

#: a learner whose worker closes with a lost scheduler has written its books by then (closing.CLOSE_WAIT_S)
FINALS_WAIT_S = 65.0
#: with its scheduler alive, a learner's worker leaves it only once its plugins' teardown, which
#: writes the books, is done: books not there by then never come (its worker was killed outright)
FINALS_LEFT_WAIT_S = 5.0
#: a learner asked to stop ends within a pass of its loop and a checkpoint (as closing.CLOSE_WAIT_S)
STOP_WAIT_S = 60.0


@dataclass
class Ended:
    """How the waiting ended: each learner's ``finals`` (None when ``lost``, the ``ClusterLost``
    that says the cluster can no longer give them), and the driver's own ``fault`` when that came
    first (``results_writer.driver_fault``)."""

    finals: list[dict] | None = None
    lost: ClusterLost | None = None
    fault: dict | None = None


class Ending:
    """Waiting for one started run's end, and its results. ``stop``: the run's, which stops every
    learner (on the deadline, or when group mode's rules stop the groups)."""

    def __init__(self, backend: Backend, rules: StopRules, groups: int, stop: Callable[[], None], replicas: bool = False):
        """``groups``: the learners (groups, or replicas with ``replicas``)."""
        self.backend, self.rules, self.groups, self._stop, self.replicas = backend, rules, groups, stop, replicas
        self.group_stop: str | None = None  # why the run stopped its groups (group mode)
        self.last_status: dict | None = None  # the last status a poll brought

    def pooled(self, reports) -> dict:
        """One status over the learners' reports (group mode pools them), with whether all are done."""
        status = pool_status([r.status for r in reports], self.rules, self.group_stop, replicas=self.replicas)
        return {**status, "done": all(r.done for r in reports)}

    def wait(self, timeout: float | None, poll_s: float, on_status: Callable[[dict], None] | None,
             progress: Progress) -> Ended:
        """Poll until the learners are done, the cluster is lost, or this supervision (or
        ``on_status``) raises: then the learners are stopped and their books fetched."""
        try:
            return self._poll(timeout, poll_s, on_status, progress)
        except Exception as err:  # noqa: BLE001 - the driver's own fault (or on_status's): the run keeps what it trained
            fault = results_writer.driver_fault(err)
            ended = self._stop_after_fault(poll_s)
            ended.fault = fault
            return ended

    def _stop_after_fault(self, poll_s: float) -> Ended:
        """The driver's supervision raised while the learners train on: stop them and fetch their
        books, or the error that says the cluster can no longer give them."""
        try:
            self.backend.stop()
        except Exception:  # noqa: BLE001 - a learner that cannot be asked has its books read as its worker closed
            pass
        deadline = time.time() + STOP_WAIT_S
        try:
            # each learner's, once it has stopped; one whose worker went (a lost replica) is told
            # by what the driver last heard of it, the others' books fetched
            while None in (finals := self.backend.finals(keep_going=True)):
                if time.time() >= deadline:
                    return Ended(lost=ClusterLost(f"learner: not stopped {STOP_WAIT_S:.0f} s after the driver asked"))
                time.sleep(poll_s)
        except ClusterLost as lost:
            return Ended(lost=lost)
        gone = [f for f in finals if isinstance(f, Gone)]
        if len(gone) == len(finals):
            return Ended(lost=LearnerWorkersGone(f"learner: {gone[0].why}"))
        return Ended(finals=finals)

    def _poll(self, timeout: float | None, poll_s: float, on_status, progress: Progress) -> Ended:
        deadline = None if timeout is None else time.time() + timeout
        stopped = False
        while True:
            # waits up to poll_s in the learners, which answer at once when they finish
            try:
                reports = self.backend.reports(poll_s)
            except ClusterLost as lost:
                return Ended(lost=lost)
            if reports is None:
                continue  # a learner was rebuilt: ask again
            status = self.last_status = self.pooled(reports)
            progress(status)
            if on_status is not None:
                on_status(status)
            if status.get("done"):
                try:
                    return Ended(finals=self.backend.finals())
                except ClusterLost as lost:
                    return Ended(lost=lost)
            if not stopped and self.groups > 1:
                self.group_stop = self.group_stop or groups_stop_reason(status, [r.status for r in reports], self.rules,
                                                                        "replica" if self.replicas else "group")
                if self.group_stop:
                    self._stop()
                    stopped = True
            if deadline is not None and time.time() > deadline and not stopped:
                self._stop()
                stopped = True

    def _heard_for_gone(self, finals: list, record: results_writer.RunRecord) -> list[dict]:
        """``finals`` with each ``Gone`` learner's replaced by what this driver last heard of it."""
        if not any(isinstance(f, Gone) for f in finals):
            return finals
        last = self.last_status or {}
        heard = last.get("groups") or last.get("replicas") or [last]
        t_run_start = self.backend.learners.t_run_start or time.time()
        return [results_writer.unheard_final(heard[g] if g < len(heard) else {}, record.rules, t_run_start=t_run_start,
                                             t_process_start=record.t_process_start, checkpoint=None)
                if isinstance(f, Gone) else f for g, f in enumerate(finals)]

    def results(self, record: results_writer.RunRecord, ended: Ended
                ) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray | None]:
        """(results, episodes, chunks, replay log) of the ended run, not yet written: from the
        learners' finals; or, the cluster lost, from what each learner wrote as its worker closed
        (or what this driver last heard), with the line that says so and how to go on (after the
        driver's own fault's, when that came first)."""
        backend = self.backend
        if ended.lost is None:
            finals = self._heard_for_gone(ended.finals, record)
            results, episodes, chunks, replay = results_writer.assemble(finals, record, self.group_stop,
                                                                        backend.fusion)
            results["error_file"] = results_writer.move_tracebacks(results, record.out)
        else:
            wait_s = FINALS_WAIT_S if isinstance(ended.lost, SchedulerLost) else FINALS_LEFT_WAIT_S
            results, episodes, chunks, replay = results_writer.after_cluster_lost(
                ended.lost, backend.finals_left(wait_s), record, self.last_status,
                t_run_start=backend.learners.t_run_start or time.time())
            results["learner_restarts"] = backend.learners.restarts
            if not isinstance(ended.lost, SchedulerLost):  # the controller's books are still on its scheduler
                results.update(backend.controller_figures(results) or {})
        if ended.fault is not None:
            results_writer.record_driver_fault(results, ended.fault, record.out, record.pipeline)
        if ended.lost is None:
            results.update(backend.figures(results))
        legs.stamp(results, record.earlier)
        return results, episodes, chunks, replay
