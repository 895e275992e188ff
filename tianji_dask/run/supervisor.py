"""The learners of a run on a Dask cluster, kept alive: one actor per group, submitted to a
LEARNER worker; a learner whose worker was lost is rebuilt from its newest checkpoint, and one
whose worker reaches its lifetime (or is preempted) hands off to a learner on a fresh worker.
The Dask backend (``dask_backend.py``) owns the cluster; this owns the learners on it."""

from __future__ import annotations

import time
from collections.abc import Callable

from tianji_dask import dask_internals
from tianji_dask.core.replicas import ReplicaSpec
from tianji_dask.dataflow import keys
from tianji_dask.dataflow.learner.report import LearnerReport
from tianji_dask.errors import LearnerWorkersGone, RunFault, SchedulerLost
from tianji_dask.launch.cluster import learner_workers
from tianji_dask.run import specs

REBUILD_ATTEMPTS = 3
REBUILD_WAIT_S = 120
#: a learner that does not answer this long while its worker is still there stops the run
STALL_LIMIT_S = 600
HANDOFF_LEAD_S = 30.0  # a fresh learner worker is started this long before a learner's handoff


class LearnerSupervisor:
    """``make_spec(group, rebuilt=..., **core_changes)``: a learner's spec; ``published()``:
    called whenever the learners change (a run that outlives its driver publishes them);
    ``opened``: the cluster the run started for itself (None on one given to it)."""

    def __init__(self, client, plan, opened, make_spec: Callable, published: Callable[[], None]):
        self.client, self.plan, self.opened = client, plan, opened
        self._make_spec, self._published = make_spec, published
        self.futures: list = []  # the learner actors' futures, one per group
        self.learners: list = []  # their handles (None: lost while no driver watched)
        self.names: list = []  # each group's learner worker, by name
        #: learners rebuilt: after their worker was lost (cause "lost": when, which group, why, from
        #: which checkpoint), or handed off (cause "lifetime" or "preempted": also when the old one
        #: stopped, the chunks lost with it, and the seconds to the new one's first update)
        self.restarts: list[dict] = []
        self._successors: dict[int, str] = {}  # group -> the fresh learner worker started for its handoff
        self._fresh = 0  # fresh learner workers started
        #: when the run started on the learners' clock (a rebuilt learner keeps it)
        self.t_run_start: float | None = None
        self._stall_since: float | None = None  # since when a learner whose worker is there has not answered
        self._homes: list[str] = []  # the replicas' LEARNER workers, by rank

    # ---- building ---------------------------------------------------------------------------
    def build(self, groups: int) -> None:
        """One learner per group (or replica), each built before this returns. Replicas go one to a
        LEARNER worker, and meet at a free port on the first one's machine."""
        if self.plan.pipeline.learner.replicas > 1:
            self._start_replicas()
        else:
            self._start([self._make_spec(group) for group in range(groups)])

    def _start(self, made: list, attempt: int = 0) -> None:
        """The learner actors of these specs (one per group or replica, in order): all submitted
        before any is waited for, as replicas meet each other while they are built."""
        self.futures = [self._submit(spec, group, attempt=attempt) for group, spec in enumerate(made)]
        self.learners = [future.result() for future in self.futures]
        self.names = [self._worker_name(dask_internals.actor_address(learner)) for learner in self.learners]

    def _start_replicas(self, attempt: int = 0, resume_from: list[str | None] | None = None, **changes) -> None:
        """Every replica, one to each of the first N LEARNER workers, meeting at a port free now on
        the first one's machine (``resume_from``: each one's checkpoint; None: the run's own)."""
        from distributed.comm import get_address_host

        p = self.plan.pipeline
        n = p.learner.replicas
        self._homes = learner_workers(self.client)[:n]
        rendezvous = replica_rendezvous(self.client, self._homes[0])
        resume = [{} if resume_from is None or resume_from[r] is None else {"resume_from": resume_from[r]} for r in range(n)]
        self._start([self._make_spec(r, **changes, **resume[r], replica=ReplicaSpec(
            r, n, rendezvous, p.learner.replica_timeout_s, tuple(self._homes), host=get_address_host(self._homes[r])))
            for r in range(n)], attempt)

    def take_over(self, state: dict) -> None:
        """A driver attaching to a run: the learners the last driver published, each waited for;
        those lost while no driver watched are rebuilt."""
        self.futures, self.names, self.restarts = list(state["learners"]), list(state["learner_names"]), list(state["restarts"])
        lost = []
        for group, future in enumerate(self.futures):
            try:
                self.learners.append(future.result(timeout=60))
            except Exception as err:  # noqa: BLE001 - its worker was lost while no driver watched
                self.learners.append(None)
                lost.append((group, err))
        for group, err in lost:
            self.rebuild(err, group)

    def _submit(self, spec, group: int, attempt: int = 0, workers: list[str] | None = None):
        """The learner actor of ``group`` (on ``workers`` when given); with several groups each on
        its own LEARNER worker while there are enough of them (an actor does not hold its worker's
        resource)."""
        from tianji_dask.dataflow.learner.actor import Learner

        groups, run_id = self.plan.pipeline.learner_actors, self.plan.run_id
        key = keys.learner_key(run_id, group if groups > 1 else None, attempt)
        if workers is None and self._homes:
            workers = [self._homes[group]]
        elif workers is None and self.plan.learner_worker is not None:
            workers = [self.plan.learner_worker]
        elif workers is None and groups > 1:
            homes = learner_workers(self.client)
            workers = [homes[group % len(homes)]] if homes else None
        return self.client.submit(Learner, spec, actor=True, resources={"LEARNER": 1}, workers=workers, key=key)

    def _stalled(self, group: int) -> bool:
        """A learner that did not answer while its worker is still on the cluster has stalled (its
        process stopped, a long pause): True, up to STALL_LIMIT_S in a row; then RunFault. So is a
        scheduler whose connection is open but which does not answer: the run waits for it."""
        state = dask_internals.scheduler_state(self.client)
        if state == "gone":
            raise SchedulerLost(dask_internals.scheduler_address(self.client))
        if state == "silent":
            what = f"the scheduler at {dask_internals.scheduler_address(self.client)}, whose connection is still open"
        else:
            address = dask_internals.actor_address(self.learners[group])
            if address is None or address not in self.client.scheduler_info(n_workers=-1).get("workers", {}):
                return False
            what = f"the learner's worker {address}, which is still on the cluster"
        now = time.time()
        self._stall_since = self._stall_since or now
        if now - self._stall_since > STALL_LIMIT_S:
            raise RunFault(f"no answer for {now - self._stall_since:.0f} s from {what}; "
                           f"`tianji-dask resume {self.plan.out}` continues from the newest checkpoint")
        return True

    def _replace(self, group: int, spec, workers: list[str] | None) -> None:
        """Group ``group``'s learner, built anew from ``spec`` (on ``workers`` when given)."""
        self.futures[group] = self._submit(spec, group, attempt=len(self.restarts), workers=workers)
        self.learners[group] = self.futures[group].result()

    # ---- while it trains ----------------------------------------------------------------------
    def reports(self, wait_s: float) -> list[LearnerReport] | None:
        """Every learner's report, once every learner has finished or after ``wait_s`` seconds;
        None when one was lost, or handed off, and has just been rebuilt."""
        group, calls, reports = 0, [], []
        try:
            for group, learner in enumerate(self.learners):  # all asked first: they wait side by side
                calls.append(learner.status(wait_s))
            for group, call in enumerate(calls):
                reports.append(call.result(timeout=30 + wait_s))
        except Exception as err:  # noqa: BLE001 - the learner's worker is gone, or the whole cluster with its scheduler
            if self._stalled(group):
                return None  # its worker is there, stopped or busy: ask again, never a second learner beside it
            self.rebuild(err, group)
            return None
        self._stall_since = None
        for group, report in enumerate(reports):
            if report.done and report.worker_closed:  # ended as its worker closed under it: lost, not finished
                self.rebuild(RuntimeError("its worker closed under it"), group)
                return None
        now = time.time()
        for group, report in enumerate(reports):
            self._note_first_update(group, report)
            if report.handoff:
                self._hand_off(group, report.handoff)
                return None
            at = report.handoff_at
            if at is not None and group not in self._successors and not report.done and now >= at - self._lead_s():
                self._successors[group] = self._start_fresh_learner()  # ready when the handoff comes
        return reports

    # ---- handoffs -----------------------------------------------------------------------------
    def _hand_off(self, group: int, handoff: dict) -> None:
        """A learner stopped for a handoff (its worker's lifetime, or a preemption) and wrote a
        checkpoint: build its successor from it on a fresh learner worker, then end the old one."""
        name = self._successors.pop(group, None) or self._start_fresh_learner()
        address = self._worker_named(name)
        # the run's clock goes on as the old learner kept it, the handoff's gap counted
        spec = self._make_spec(group, rebuilt=True, keep_t_run_start=handoff["t_run_start"],
                               resume_from=handoff["checkpoint"])
        entry = {"t": time.time(), "group": group, "cause": handoff["cause"], "checkpoint": handoff["checkpoint"],
                 "version": handoff["version"], "t_expiry": handoff["t_expiry"], "chunks_lost": handoff["chunks_lost"],
                 "worker": handoff["worker"], "new_worker": address, "next_update_s": None}
        self.restarts.append(entry)
        self._replace(group, spec, [address])
        old, self.names[group] = self.names[group], name
        self.opened.retire_learner(old)
        self._published()

    def _note_first_update(self, group: int, report: LearnerReport) -> None:
        """Seconds from a handoff's expiry to the successor's first update, once it has made one."""
        if report.first_update_t is None:
            return
        for entry in reversed(self.restarts):
            if entry["group"] == group:
                if entry.get("next_update_s", 0) is None:
                    entry["next_update_s"] = report.first_update_t - entry["t_expiry"]
                return

    def _lead_s(self) -> float:
        """How long before a handoff its fresh worker starts: a batch job's walltime runs from its
        start, so a quarter of the lifetime at most (the successor's own lifetime stays long). With
        no lifetime a handoff is due only because the worker is being preempted, and it is due now."""
        from tianji_dask.config.sections import duration_s

        lifetime = self.plan.pipeline.cluster.learner_lifetime
        if lifetime is None:
            return 0.0
        return min(HANDOFF_LEAD_S, duration_s(lifetime, "learner_lifetime") / 4)

    def _start_fresh_learner(self) -> str:
        """Start a fresh LEARNER worker (a batch job, or an embedded worker process); its name."""
        self._fresh += 1
        name = keys.fresh_learner_worker_name(self._fresh)
        self.opened.start_learner(name)
        return name

    def _worker_named(self, name: str) -> str:
        timeout = max(REBUILD_WAIT_S, self.opened.start_timeout)
        deadline = time.time() + timeout
        while True:
            for address, w in self.client.scheduler_info(n_workers=-1)["workers"].items():
                if str(w.get("name")) == name:
                    return address
            if time.time() > deadline:
                raise RunFault(f"learner: the fresh learner worker {name} did not start within {timeout:.0f}s; "
                               f"`tianji-dask resume {self.plan.out}` continues from the newest checkpoint")
            time.sleep(0.2)

    def _wait_left(self, address: str | None) -> None:
        """Wait (up to ``REBUILD_WAIT_S``) until the lost learner's worker has left the scheduler: a
        worker closing under its learner still offers the LEARNER resource until it is gone."""
        deadline = time.time() + REBUILD_WAIT_S
        while address in self.client.scheduler_info(n_workers=-1)["workers"] and time.time() < deadline:
            time.sleep(0.2)

    def _rebuild_replicas(self, err: Exception, lost_rank: int) -> None:
        """A replica's worker was lost: the others cannot go on without it (their next collective
        fails), so all are stopped and every replica is built anew, on the LEARNER workers there
        are then, from the newest checkpoint version all replicas hold (none yet: from the start),
        meeting at a fresh rendezvous. What the replicas consumed since that checkpoint is lost
        with them, as with one learner rebuilt; at most ``REBUILD_ATTEMPTS`` times per run."""
        from tianji_dask.core import checkpoint
        from tianji_dask.launch.cluster import check_roles

        out, p = self.plan.out, self.plan.pipeline
        n = p.learner.replicas
        lost = sum(entry["cause"] == "lost" for entry in self.restarts)
        if lost >= REBUILD_ATTEMPTS:
            raise RunFault(f"learner replica {lost_rank}: replicas lost {lost + 1} times, giving up (last: {err}); "
                           f"`tianji-dask resume {out}` continues from the newest checkpoint") from None
        for rank, learner in enumerate(self.learners):  # the survivors: stopped, and waited for
            if rank != lost_rank:
                self._stop_and_wait(learner, p.learner.replica_timeout_s + 60)
        try:
            paths = [str(path.resolve()) for path, _, _ in specs.newest_checkpoints(out, p)]
        except checkpoint.CheckpointError:
            paths = [None] * n  # lost before the first checkpoint: they start over (from the one this run resumed, if any)
        if self.opened is not None and self.opened.learner_job is not None:
            # a batch job that ended does not come back: a fresh one in its place
            name = self._start_fresh_learner()
            self._worker_named(name)
            old, self.names[lost_rank] = self.names[lost_rank], name
            self.opened.retire_learner(old)
        self._wait_left(self._homes[lost_rank])
        try:
            check_roles(self.client, timeout=REBUILD_WAIT_S, learners=n)  # a nanny restarts a dead worker
        except RuntimeError:
            raise LearnerWorkersGone(f"learner replica {lost_rank}: its worker was lost and {n} workers offering the "
                                     f"LEARNER resource were not there within {REBUILD_WAIT_S} s") from None
        self.restarts.append({"t": time.time(), "group": lost_rank, "cause": "lost", "error": str(err)[:500],
                              "checkpoint": paths[0], "replicas_rebuilt": n})
        self._start_replicas(len(self.restarts), paths, rebuilt=True, keep_t_run_start=self.t_run_start)
        self._published()

    @staticmethod
    def _stop_and_wait(learner, timeout_s: float) -> None:
        """Ask a learner to stop and wait until it has ended (or ``timeout_s``, or its worker is gone)."""
        deadline = time.time() + timeout_s
        try:
            learner.stop().result(timeout=30)
            while time.time() < deadline and not learner.status(5.0).result(timeout=60).done:
                pass
        except Exception:  # noqa: BLE001 - its worker went too: nothing to wait for
            return

    def _worker_name(self, address: str) -> str | None:
        worker = self.client.scheduler_info(n_workers=-1)["workers"].get(address)
        return None if worker is None else str(worker.get("name"))

    def rebuild(self, err: Exception, group: int = 0) -> None:
        """A learner's worker was lost: rebuild that learner from its newest checkpoint (lost
        before its first, from the start) on a LEARNER worker (waiting for one to come back), at
        most ``REBUILD_ATTEMPTS`` times per run. In group mode the other groups go on; the
        rebuilt learner rejoins the reducer's rounds. A learner that handed off before its
        worker went (its record in ``handoff.json``) is handed off from, not counted as lost."""
        from tianji_dask.core import checkpoint
        from tianji_dask.launch.cluster import check_roles

        if not dask_internals.scheduler_alive(self.client):  # its workers closed with it: nothing to rebuild on
            raise SchedulerLost(dask_internals.scheduler_address(self.client)) from None
        out = self.plan.out
        if self._homes:
            self._rebuild_replicas(err, group)
            return
        directory = specs.checkpoint_dirs(out, self.plan.pipeline.groups)[group]
        handoff = checkpoint.handoff_left(directory)
        if (handoff is not None and handoff.get("worker") == dask_internals.actor_address(self.learners[group])
                and all(entry.get("checkpoint") != handoff["checkpoint"] for entry in self.restarts)):
            # it handed off (a preemption) and its worker closed before this driver asked how it ended
            self._hand_off(group, handoff)
            return
        lost = sum(entry["cause"] == "lost" for entry in self.restarts)
        if lost >= REBUILD_ATTEMPTS:
            raise RunFault(f"learner: lost {lost + 1} times, giving up (last: {err}); "
                           f"`tianji-dask resume {out}` continues from the newest checkpoint") from None
        try:
            path = checkpoint.newest_loadable(directory)[0]
        except checkpoint.CheckpointError:
            path = None  # lost before its first checkpoint: it starts over (from the one this run resumed, if any)
        workers = None
        if self.opened is not None and self.opened.learner_job is not None:
            # a batch job that ended (preempted, at its walltime) does not come back: a fresh one
            name = self._successors.pop(group, None) or self._start_fresh_learner()
            workers = [self._worker_named(name)]
            old, self.names[group] = self.names[group], name
            self.opened.retire_learner(old)
        self._wait_left(dask_internals.actor_address(self.learners[group]))
        try:
            check_roles(self.client, timeout=REBUILD_WAIT_S)  # a LEARNER worker again (a nanny restarts a dead one)
        except RuntimeError:
            raise LearnerWorkersGone(f"learner: its worker was lost and no worker offering the LEARNER resource joined "
                                     f"within {REBUILD_WAIT_S} s") from None
        # the crash's lost time counts: the rebuilt learner keeps the run's start
        changes = {"keep_t_run_start": self.t_run_start}
        if path is not None:
            changes["resume_from"] = str(path.resolve())
        spec = self._make_spec(group, rebuilt=True, **changes)
        self.restarts.append({"t": time.time(), "group": group, "cause": "lost", "error": str(err)[:500],
                              "checkpoint": None if path is None else str(path)})
        self._replace(group, spec, workers)
        self._published()


def replica_rendezvous(client, worker: str) -> str:
    """Where the replicas meet: ``tcp://HOST:PORT``, a port free just now on ``worker``'s machine."""
    from distributed.comm import get_address_host

    port = client.run(free_port, workers=[worker])[worker]
    return f"tcp://{get_address_host(worker)}:{port}"


def free_port() -> int:
    """A TCP port free on this machine (run on a worker)."""
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
