"""Callbacks off the learner's path: one daemon thread and one bounded queue per learner. No Dask.

The learner only enqueues: ``emit`` never blocks, and with the queue full the event is dropped
and counted. The thread calls the hooks in the order of the events. A hook that raises is logged
in one line (the callback's class, the hook, the exception) and counted; after ``MAX_ERRORS``
errors a callback gets no more events, only ``on_end``. At the end the thread gets at most
``drain_s`` seconds to deliver what is queued (the rest is dropped and counted), then every
callback's ``on_end`` runs, waited for at most ``end_s`` seconds. A hook still running then is
reported and left to its daemon thread; training never waits for one.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from tianji_dask.callbacks.base import Callback
from tianji_dask.callbacks.entries import build, parse

logger = logging.getLogger("tianji_dask.callbacks")

QUEUE_SIZE = 4096  # events waiting for the callbacks' thread
MAX_ERRORS = 3  # a callback's errors before it gets no more events
DRAIN_S = 10.0
END_S = 30.0
HOOKS = ("on_start", "on_episodes", "on_update", "on_evaluation", "on_checkpoint")
_END = object()


@dataclass(frozen=True)
class CallbackPlan:
    """What a learner's callbacks are built from. ``entries``: ``Callback`` objects (given from
    Python) and pipeline entries (built in the learner's process); ``info``: what ``on_start``
    receives besides the learner's own version (run_id, out, pipeline, group)."""

    entries: tuple = ()
    info: dict = field(default_factory=dict)
    queue_size: int = QUEUE_SIZE
    drain_s: float = DRAIN_S
    end_s: float = END_S


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


class CallbackRunner:
    """The callbacks of one learner and the thread that calls them."""

    def __init__(self, plan: CallbackPlan):
        self.plan = plan
        self.callbacks: list[Callback] = []
        self._errors: dict[str, dict] = {}  # "Class.hook": {"count", "error"}
        self._failures: dict[int, int] = {}  # id(callback): errors so far
        self._disabled: dict[int, str] = {}  # id(callback): its class name
        for entry in plan.entries:
            if isinstance(entry, Callback):
                self.callbacks.append(entry)
                continue
            try:
                self.callbacks.append(build(entry))
            except Exception as err:  # noqa: BLE001 - checked with the pipeline; this machine may differ
                self._report(parse(entry)[0], "__init__", err)
        # a hook no callback overrides costs the learner nothing
        self._hooks = {hook: [cb for cb in self.callbacks if getattr(type(cb), hook) is not getattr(Callback, hook)]
                       for hook in HOOKS}
        self._queue: queue.Queue = queue.Queue(plan.queue_size)
        self.events = 0  # emitted, learner's thread
        self._delivered = 0  # taken by the callbacks' thread
        self._abandon = False  # past drain_s: what is still queued is dropped
        self._running: tuple[str, str] | None = None  # (class, hook) being called now
        self._results: dict = {}
        self._drained = threading.Event()
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._main, name="tianji-callbacks", daemon=True)
        self._thread.start()

    def wants(self, hook: str) -> bool:
        """Whether any callback overrides ``hook`` (else the learner need not build its event)."""
        return bool(self._hooks[hook])

    def emit(self, hook: str, *args) -> None:
        """Queue one event; never blocks (a full queue drops it)."""
        if self._hooks[hook]:
            self.events += 1
            try:
                self._queue.put_nowait((hook, args))
            except queue.Full:
                pass  # counted: events - delivered

    def end(self, results: dict) -> dict:
        """Deliver what is queued (at most ``drain_s``), call every ``on_end(results)`` (at most
        ``end_s``); returns what the run's results keep: events, dropped, errors, disabled."""
        self._results = results
        plan = self.plan
        deadline = time.monotonic() + plan.drain_s
        if not self._put_end(deadline):
            self._abandon = True  # full and not moving: drop what is queued, then end
            self._put_end(time.monotonic() + 1.0)
        drained = self._drained.wait(max(0.0, deadline - time.monotonic()))
        if not drained:
            self._abandon = True
            drained = self._drained.wait(1.0)
        running = self._running
        if not drained:
            self._report(*(running or ("callbacks", "drain")),
                         TimeoutError(f"still running after {plan.drain_s:g}s; later events dropped, on_end not waited for"))
        elif not self._ended.wait(plan.end_s):
            name, hook = self._running or ("callbacks", "on_end")
            self._report(name, hook, TimeoutError(f"still running after {plan.end_s:g}s"))
        return {"events": self.events, "dropped": self.events - self._delivered,
                "errors": {k: dict(v) for k, v in self._errors.items()}, "disabled": sorted(self._disabled.values())}

    # ---- the callbacks' thread ---------------------------------------------------------------
    def _put_end(self, deadline: float) -> bool:
        try:
            self._queue.put(_END, timeout=max(0.0, deadline - time.monotonic()))
            return True
        except queue.Full:
            return False

    def _main(self) -> None:
        while True:
            item = self._queue.get()
            if item is _END:
                break
            if self._abandon:
                continue
            self._delivered += 1
            hook, args = item
            for cb in self._hooks[hook]:
                if id(cb) not in self._disabled:
                    self._call(cb, hook, args)
        self._drained.set()
        for cb in self.callbacks:
            self._call(cb, "on_end", (self._results,))
        self._ended.set()

    def _call(self, cb: Callback, hook: str, args: tuple) -> None:
        name = type(cb).__qualname__
        self._running = (name, hook)
        try:
            getattr(cb, hook)(*args)
        except Exception as err:  # noqa: BLE001 - reported, counted; training goes on
            self._report(name, hook, err)
            n = self._failures[id(cb)] = self._failures.get(id(cb), 0) + 1
            if n >= MAX_ERRORS and id(cb) not in self._disabled:
                self._disabled[id(cb)] = name
                logger.warning("tianji: callback %s gets no more events after %d errors (on_end still runs)", name, n)
        finally:
            self._running = None

    def _report(self, name: str, hook: str, err: BaseException) -> None:
        """One line per class and hook, at its first error; every error is counted."""
        record = self._errors.setdefault(f"{name}.{hook}", {"count": 0, "error": _one_line(err)})
        record["count"] += 1
        if record["count"] == 1:
            logger.warning("tianji: callback %s.%s raised %s", name, hook, record["error"])


def pooled(summaries: list[dict | None]) -> dict | None:
    """Group mode: every group's learner's summary (``end``'s) as one, errors keyed ``g<group>.Class.hook``."""
    if all(s is None for s in summaries):
        return None
    present = [(g, s) for g, s in enumerate(summaries) if s is not None]
    return {"events": sum(s["events"] for _, s in present), "dropped": sum(s["dropped"] for _, s in present),
            "errors": {f"g{g}.{key}": value for g, s in present for key, value in s["errors"].items()},
            "disabled": sorted({f"g{g}.{name}" for g, s in present for name in s["disabled"]})}
