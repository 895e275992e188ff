"""What a learner tells the driver each time it is asked: its status (the figures a user sees)
and, apart from them, what the driver acts on (ended, a handoff made or due, its first update)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LearnerReport:
    """``status``: the learner's live figures (what ``Run.status`` shows). ``done``: it has ended
    and its results are ready (``final``). ``handoff``: what a handoff left (its checkpoint, the
    worker, why), once the learner has stopped for one. ``handoff_at``: when it will hand off
    (unix s; None: never). ``first_update_t``: when it made its first update (None: not yet).
    ``worker_closed``: its worker is closing under it (its scheduler lost, its nanny stopped): once
    done, its results are in the books it wrote into the run folder, and the learner is lost."""

    status: dict = field(default_factory=dict)
    done: bool = False
    handoff: dict | None = None
    handoff_at: float | None = None
    first_update_t: float | None = None
    worker_closed: bool = False
