"""StalenessController: the scheduler plugin that admits explorer work and watches staleness.

There is no API to hold tasks already submitted, so throttling acts at admission: the learner
names the explorer task keys it wants to submit and the controller grants credits for some of
them (a window of chunks in flight). A credit comes back when the learner reports the chunk
consumed, or when the scheduler sees the task err or be forgotten unconsumed, the run and group
holding it read from its key. Every handler names its run; each is O(1) or O(chunks reported)
and never blocks the scheduler's event loop.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from distributed.diagnostics.plugin import SchedulerPlugin

from tianji_dask import dask_internals
from tianji_dask.dataflow import keys
from tianji_dask.dataflow.controller.books import Books
from tianji_dask.dataflow.controller.settings import LawSettings
from tianji_dask.dataflow.keycache import bound_key_cache

logger = logging.getLogger("tianji_dask.controller")

#: span metadata entries kept before identical ones are folded (see update_graph)
SPAN_METADATA_MAX = 64


#: runs whose books are kept at once; the oldest ended (then the oldest) go first past it
MAX_RUNS = 64


@dataclass
class RunBooks:
    """One run's books, one per group, and when they were opened."""

    groups: dict[int, Books] = field(default_factory=dict)
    t_reset: float = field(default_factory=time.time)
    ended: bool = False


class StalenessController(SchedulerPlugin):
    """The scheduler plugin: the books of every run on this scheduler (one per group of each), and
    the handlers that reach them. Several runs can train on one cluster at once, so every handler
    that acts on or reads a run's books names its run: a call that names none, or a run the
    controller does not hold, is refused with the runs it holds."""

    name = "tianji"
    idempotent = True

    def __init__(self):
        self.scheduler = None
        self.runs: dict[str, RunBooks] = {}  # in the order they began
        self.drivers: dict[str, str] = {}  # run id -> the client that drives it (see drive)
        self.workers_epoch = 0  # workers joined or left: the learner's streams look for their homes again

    def run_ids(self) -> list[str]:
        """The runs whose books the controller holds, in the order they began."""
        return list(self.runs)

    def run(self, run_id: str | None) -> RunBooks:
        """One run's books; ValueError, naming the runs held, when ``run_id`` is None or unknown."""
        run = self.runs.get(run_id) if run_id is not None else None
        if run is None:
            held = ", ".join(self.runs) or "none"
            if run_id is None:
                raise ValueError(f"run_id: name the run; runs on this scheduler: {held}")
            raise ValueError(f"run_id: no run {run_id!r} on this scheduler; runs on this scheduler: {held}")
        return run

    def books(self, run_id: str | None, group: int = 0) -> Books:
        """One group's books of one run; ValueError naming what is missing."""
        run = self.run(run_id)
        try:
            return run.groups[group]
        except KeyError:
            raise ValueError(f"group: run {run_id} has no group {group}; its groups: {sorted(run.groups)}") from None

    def all_books(self):
        """(run_id, books) for every group of every run."""
        for run_id, run in self.runs.items():
            for books in run.groups.values():
                yield run_id, books

    def holder(self, key: str) -> Books | None:
        """The books holding the credit of explorer task ``key``, found from the tag in the key
        (its run, and ``-g<group>`` in group mode): O(1), whatever the runs held."""
        tag = keys.explore_tag(key)
        run = self.runs.get(tag)
        if run is not None and 0 in run.groups and run.groups[0].holds(key):
            return run.groups[0]
        run_id, group = keys.tag_group(tag) or (None, None)
        run = None if run_id is None else self.runs.get(run_id)
        books = None if run is None else run.groups.get(group)
        return books if books is not None and books.holds(key) else None

    # ---- plugin hooks -------------------------------------------------------------------
    async def start(self, scheduler):
        self.scheduler = scheduler
        # what a user watches: tianji_* series on /metrics and the /tianji dashboard page (here
        # as the fallback route when the page was not installed before the scheduler started);
        # neither may stop the controller from working
        try:
            from tianji_dask.observe import dashboard, prometheus

            prometheus.watch(self)
            dashboard.ensure_page(scheduler)
        except Exception as err:  # noqa: BLE001
            logger.warning("tianji: dashboard page or metrics not installed: %s", err)
        dask_internals.add_scheduler_handlers(scheduler, {
            "tianji_begin": self.begin, "tianji_cycle": self.cycle, "tianji_state": self.state,
            "tianji_configure": self.configure, "tianji_end": self.end, "tianji_runs": self.run_ids,
            "tianji_drive": self.drive,
        })

    def transition(self, key, start, finish, *args, **kwargs):
        if finish not in ("erred", "forgotten") or not keys.is_explore_key(key):
            return
        books = self.holder(key)
        if books is None:  # consumed already, or a run whose books have gone
            return
        books.task_ended(key, finish)

    def update_graph(self, scheduler, *, tasks=None, **kwargs):
        """Keep the scheduler's span metadata bounded. Every submission adds its collection
        description ({"type": "Future"}) to the span its tasks join, and spans live as long as
        the scheduler (dask/distributed#7977): one dict per explorer task, for ever, about
        0.2 MiB a minute at CartPole's chunk rate. Identical entries say nothing new; keep one.
        (And Dask's key-name cache, which would keep every task's key: see keycache.)"""
        bound_key_cache()
        if tasks and keys.is_explore_key(tasks[0]):
            dask_internals.fold_span_collections(scheduler, tasks[0], SPAN_METADATA_MAX)

    def valid_workers_downscaling(self, scheduler, workers):
        """Adaptive clusters never retire the learner's worker: its actor would be lost."""
        return [ws for ws in workers if not ws.resources.get("LEARNER")]

    def add_worker(self, scheduler, worker):
        self.workers_epoch += 1

    def remove_worker(self, scheduler, worker, **kwargs):
        self.workers_epoch += 1
        for run_id, books in self.all_books():
            if books.learner_address is not None and worker == books.learner_address:
                books.learner_lost = True
                scheduler.log_event("tianji.learner_lost", {"run_id": run_id, "group": books.group, "worker": worker})

    # ---- handlers (called by the learner and by clients) --------------------------------
    def begin(self, run_id: str, law: dict, learner_address: str | None = None, chunk_env_steps: int = 1,
              rebuilt: bool = False, group: int = 0) -> dict:
        """Open a group's books for a run (each group's learner opens its own; other runs' books
        are untouched). ``law``: its ``LawSettings``, as they travel. ``rebuilt``: the run's learner
        came back after its worker was lost, so its books and law go on."""
        run = self.runs.get(run_id)
        if rebuilt and run is not None and group in run.groups:
            books = run.groups[group]
            books.return_unsubmitted(self.scheduler.tasks)
            books.learner_address, books.learner_lost = learner_address, False
            self.scheduler.log_event("tianji.learner_rebuilt", {"run_id": run_id, "group": group, "worker": learner_address})
            return books.params().to_wire()
        if run is None:  # a new run: the books of runs that ended go now (readable until then)
            for old in [rid for rid, r in self.runs.items() if r.ended]:
                del self.runs[old]
            while len(self.runs) >= MAX_RUNS:  # runs whose driver went without saying they ended
                del self.runs[next(iter(self.runs))]
            for old in [rid for rid in self.drivers if rid not in self.runs]:
                del self.drivers[old]
            run = self.runs[run_id] = RunBooks()
        run.groups[group] = Books(group, LawSettings.from_wire(law), learner_address, chunk_env_steps)
        return run.groups[group].params().to_wire()

    def end(self, run_id: str | None = None) -> None:
        """A run has written its results: its books go when the next run begins (books that
        went already, past MAX_RUNS, leave nothing to do)."""
        if run_id is None:
            self.run(run_id)  # refused: it names no run
        if run_id in self.runs:
            self.runs[run_id].ended = True
        self.drivers.pop(run_id, None)

    def drive(self, run_id: str, client_id: str) -> str | None:
        """Make client ``client_id`` the one driver of run ``run_id`` (the process that polls its
        learners and writes its results), unless another client still connected drives it:
        that client's id then, else None. A driver that died has left the scheduler's clients."""
        held = self.drivers.get(run_id)
        if held is not None and held != client_id and held in self.scheduler.clients:
            return held
        self.drivers[run_id] = client_id
        return None

    def cycle(self, run_id: str | None = None, group: int = 0, **report) -> dict:
        return self.books(run_id, group).cycle(workers_epoch=self.workers_epoch, **report)

    def configure(self, run_id: str | None = None, group: int | None = None, **settings) -> dict:
        """Change the law of one group of a run, or of every group (``group=None``); see
        Books.configure."""
        run = self.run(run_id)
        targets = list(run.groups.values()) if group is None else [self.books(run_id, group)]
        for books in targets:
            books.check(**settings)  # all or nothing: no group is changed if one value is bad
        for books in targets:
            books.configure(**settings)
        return self.state(run_id, group=group)

    def state(self, run_id: str | None = None, history: bool = False, group: int | None = None) -> dict:
        """One run's state: one group's; with ``group=None``, its first group's, and every
        group's under "groups" when there are several. "runs" lists the runs whose books the
        controller holds."""
        run = self.run(run_id)
        for lost in run.groups.values():  # a lost learner's books, as a run that ends without it reads them
            if lost.learner_lost:
                lost.return_unsubmitted(self.scheduler.tasks)
        books = run.groups[min(run.groups)] if group is None else self.books(run_id, group)
        out = {"run_id": run_id, **books.state(history), "runs": self.run_ids()}
        if group is None and len(run.groups) > 1:
            out["groups"] = [{"run_id": run_id, **b.state(history)} for _, b in sorted(run.groups.items())]
        return out
