"""StalenessController: the scheduler plugin that admits explorer work and watches staleness.

There is no API to hold tasks already submitted, so throttling acts at admission: the learner
names the explorer task keys it wants to submit and the controller grants credits for some of
them (a window of chunks in flight). A credit comes back when the learner reports the chunk
consumed, or when the scheduler sees the task err or be forgotten unconsumed. Every handler is
O(1) or O(chunks reported) and never blocks the scheduler's event loop.
"""

from __future__ import annotations

import logging
import time

from distributed.diagnostics.plugin import SchedulerPlugin

from tianji_dask import dask_internals
from tianji_dask.dataflow.books import EXPLORE_PREFIX, Books
from tianji_dask.dataflow.keycache import bound_key_cache

logger = logging.getLogger("tianji_dask.controller")

#: span metadata entries kept before identical ones are folded (see update_graph)
SPAN_METADATA_MAX = 64


class StalenessController(SchedulerPlugin):
    """The scheduler plugin: one run's books, one per group, and the handlers that reach them.

    Attributes not found on the plugin are read from group 0's books, so a run without groups
    (and the dashboard, which shows group 0) reads it as one set of books."""

    name = "tianji"
    idempotent = True

    def __init__(self, window: int = 2):
        self.scheduler = None
        self.run_id = None
        self.groups: dict[int, Books] = {0: Books(0, {"window": window})}
        self.t_reset = time.time()
        self.workers_epoch = 0  # workers joined or left: the learner's streams look for their homes again

    @property
    def primary(self) -> Books:
        return self.groups[min(self.groups)]

    def __getattr__(self, name):
        groups = self.__dict__.get("groups")
        if name.startswith("_") or not groups:
            raise AttributeError(name)
        return getattr(groups[min(groups)], name)

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
            "tianji_configure": self.configure,
        })

    def transition(self, key, start, finish, *args, **kwargs):
        if finish not in ("erred", "forgotten") or not isinstance(key, str) or not key.startswith(EXPLORE_PREFIX):
            return
        for books in self.groups.values():
            if key in books.credited:
                books.credited.discard(key)
                if finish == "erred":
                    books.returned_erred += 1
                else:
                    books.returned_forgotten += 1
                return

    def update_graph(self, scheduler, *, tasks=None, **kwargs):
        """Keep the scheduler's span metadata bounded. Every submission adds its collection
        description ({"type": "Future"}) to the span its tasks join, and spans live as long as
        the scheduler (dask/distributed#7977): one dict per explorer task, for ever, about
        0.2 MiB a minute at CartPole's chunk rate. Identical entries say nothing new; keep one.
        (And Dask's key-name cache, which would keep every task's key: see keycache.)"""
        bound_key_cache()
        if tasks and isinstance(tasks[0], str) and tasks[0].startswith(EXPLORE_PREFIX):
            dask_internals.fold_span_collections(scheduler, tasks[0], SPAN_METADATA_MAX)

    def valid_workers_downscaling(self, scheduler, workers):
        """Adaptive clusters never retire the learner's worker: its actor would be lost."""
        return [ws for ws in workers if not ws.resources.get("LEARNER")]

    def add_worker(self, scheduler, worker):
        self.workers_epoch += 1

    def remove_worker(self, scheduler, worker, **kwargs):
        self.workers_epoch += 1
        for books in self.groups.values():
            if books.learner_address is not None and worker == books.learner_address:
                books.learner_lost = True
                scheduler.log_event("tianji.learner_lost", {"run_id": self.run_id, "group": books.group, "worker": worker})

    # ---- handlers (called by the learner and by clients) --------------------------------
    def begin(self, run_id: str, law: dict, learner_address: str | None = None, chunk_env_steps: int = 1,
              rebuilt: bool = False, group: int = 0) -> dict:
        """Start a run's accounting afresh (one run at a time per scheduler; each group's learner
        opens its own books); ``rebuilt``: the same run's learner came back after its worker was
        lost, so its books and law go on."""
        if rebuilt and run_id == self.run_id and group in self.groups:
            books = self.groups[group]
            books.learner_address, books.learner_lost = learner_address, False
            # credits the dead learner was granted but never submitted: the scheduler has never
            # seen those keys, so no transition will ever hand them back
            unsubmitted = [k for k in books.credited if k not in self.scheduler.tasks]
            books.credited.difference_update(unsubmitted)
            books.returned_unsubmitted += len(unsubmitted)
            self.scheduler.log_event("tianji.learner_rebuilt", {"run_id": run_id, "group": group, "worker": learner_address})
            return books.params().to_wire()
        if run_id != self.run_id:
            self.run_id, self.groups, self.t_reset = run_id, {}, time.time()
        self.groups[group] = Books(group, law, learner_address, chunk_env_steps)
        return self.groups[group].params().to_wire()

    def _books(self, group: int) -> Books:
        try:
            return self.groups[group]
        except KeyError:
            raise ValueError(f"group: run {self.run_id} has no group {group}") from None

    def cycle(self, group: int = 0, **report) -> dict:
        return self._books(group).cycle(workers_epoch=self.workers_epoch, **report)

    def configure(self, group: int | None = None, **settings) -> dict:
        """Change the law of one group, or of every group (``group=None``); see Books.configure."""
        targets = list(self.groups.values()) if group is None else [self._books(group)]
        for books in targets:
            books.check(**settings)  # all or nothing: no group is changed if one value is bad
        for books in targets:
            books.configure(**settings)
        return self.state(group=group)

    def state(self, history: bool = False, group: int | None = None) -> dict:
        """One group's state; with ``group=None``, group 0's, and every group's under "groups"
        when there are several."""
        books = self.primary if group is None else self._books(group)
        out = {"run_id": self.run_id, **books.state(history)}
        if group is None and len(self.groups) > 1:
            out["groups"] = [{"run_id": self.run_id, **b.state(history)} for _, b in sorted(self.groups.items())]
        return out
