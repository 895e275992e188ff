"""One learner's books in the staleness controller: its admission (``admission.py``: the settings,
the laws, the credits), its accounting (``accounting.py``: the counters) and what is read of them
(``view.py``: the series, the dashboard's view, the state on the wire), composed here.

``Books`` owns no figure of its own but the learner's (its address, version, whether it is lost):
it hands each part what another part knows, so no part reads another. Every method is O(1) or
O(chunks reported) and runs on the scheduler's event loop.
"""

from __future__ import annotations

import time

from tianji_dask.dataflow.controller.accounting import Accounting
from tianji_dask.dataflow.controller.admission import Admission
from tianji_dask.dataflow.controller.settings import LawSettings
from tianji_dask.dataflow.controller.view import BooksState, BooksView, HistoryRow, Series
from tianji_dask.dataflow.messages import ControllerParams, CycleReply, consumptions_from_wire


class Books:
    """One learner's admission and accounting. A run has one per group (one without groups has
    one); the plugin routes by group."""

    def __init__(self, group: int, law: LawSettings, learner_address=None, chunk_env_steps: int = 1):
        self.group = group
        self.admission = Admission(law, chunk_env_steps)
        self.accounting = Accounting()
        self.series = Series()
        self.learner_address = learner_address
        self.learner_lost = False
        self.learner_version = 0

    # ---- the learner's round trip ------------------------------------------------------------
    def cycle(self, consumed: dict | None = None, want: list | None = None, learner_version: int | None = None,
              progress: dict | None = None, learner_status: dict | None = None, workers_epoch: int = 0) -> dict:
        """Report consumed chunks and ask credits for new explorer task keys, in one round trip.

        ``consumed``: ``messages.Consumption`` records as columns. ``progress``: a
        ``messages.Progress``, for replaying learners. ``learner_status``: the learner's own
        figures (mean return, updates, busy time, ...), for the dashboard and metrics.
        ``workers_epoch``: the controller's count of workers joined or left, passed on. Returns a
        ``messages.CycleReply``: the keys granted, in the order asked, and the current settings.
        """
        now, admission = time.time(), self.admission
        if learner_version is not None:
            self.learner_version = int(learner_version)
        if progress:
            admission.report_progress(progress)
        if learner_status:
            self.series.learner.append({**learner_status, "t": now})
            admission.observe_learner(now, learner_status)
        staleness_seen, dropped_seen = [], 0
        for row in consumptions_from_wire(consumed):
            if admission.take_back(row.key):
                self.accounting.returned("consumed")
            staleness = self.accounting.book(row)
            self.series.history.append(HistoryRow(now, self.learner_version, admission.chunks_in_flight,
                                                  admission.window, staleness, float(row.age_s)))
            staleness_seen.append(staleness)
            dropped_seen += int(bool(row.dropped))
        moved = admission.observe_consumed(now, self.learner_version, staleness_seen, dropped_seen)
        if moved is not None:
            self.series.window_log.append(moved)
        granted, refused = admission.grant(want)
        self.accounting.granted(len(granted), refused)
        return CycleReply(granted, admission.params(), admission.next_admission_at(), workers_epoch).to_wire()

    def params(self) -> ControllerParams:
        return self.admission.params()

    # ---- credits the scheduler hands back --------------------------------------------------
    def holds(self, key: str) -> bool:
        """``key`` holds one of these books' credits now."""
        return self.admission.holds(key)

    def task_ended(self, key: str, finish: str) -> None:
        """Explorer task ``key`` erred or was forgotten (``finish``) before its chunk was consumed."""
        if self.admission.take_back(key):
            self.accounting.returned(finish)

    def return_unsubmitted(self, submitted) -> None:
        """Credits a lost learner was granted but never submitted (keys not in ``submitted``, the
        scheduler's tasks): no transition will ever hand them back."""
        self.accounting.returned("unsubmitted", self.admission.take_back_unsubmitted(submitted))

    # ---- settings ----------------------------------------------------------------------------
    def settings(self) -> dict:
        """Every controller setting (``settings.SETTINGS``) as the books hold it now."""
        return self.admission.values()

    def check(self, **settings) -> dict:
        """The values ``configure`` would apply; ValueError, one line naming the setting, if it
        would refuse them (``settings.check_live``)."""
        return self.admission.check(**settings)

    def configure(self, **settings) -> dict:
        """Change the law while a run goes on (see ``Admission.configure``); the new state."""
        self.admission.configure(**settings)
        self.series.window_log.append(self.admission.law_row(time.time(), measured=False))
        return self.state()

    # ---- what is read of them ----------------------------------------------------------------
    def view(self) -> BooksView:
        return BooksView.of(self.group, self.learner_version, self.admission, self.accounting, self.series)

    def history_since(self, t: float) -> list[HistoryRow]:
        """The consumed chunks booked after ``t``, oldest first."""
        return self.series.history_since(t)

    def learner_series_since(self, t: float) -> list[dict]:
        """The learner's figures received after ``t``, oldest first."""
        return self.series.learner_since(t)

    def state(self, history: bool = False) -> dict:
        out = BooksState.of(self.group, self.learner_version, self.learner_lost, self.admission, self.accounting,
                            self.series).to_wire()
        return {**out, **self.series.to_wire()} if history else out
