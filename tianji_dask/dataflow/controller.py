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
from collections import Counter, deque

from distributed.diagnostics.plugin import SchedulerPlugin

from tianji_dask.dataflow.keycache import bound_key_cache

logger = logging.getLogger("tianji_dask.controller")

EXPLORE_PREFIX = "tianji-explore-"
HISTORY_LEN = 2000
SERIES_LEN = 3000
WINDOW_LOG_LEN = 2000
#: the window does not grow while more than this fraction of consumed chunks is dropped
MAX_DROPPED_TO_GROW = 0.2
#: the window moves at most once per this many seconds, and only after half a window of chunks
CONTROL_MIN_PERIOD_S = 0.2


class WindowLaw:
    """The bounded rule that moves the window W (chunks in flight) toward a staleness target.

    Model (DESIGN, measured): mean staleness ~ W x u + K/2, with u the learner's updates per
    consumed chunk (consumption vs production) and K the publish interval. Once per control
    period (at least W / 2 chunks consumed and CONTROL_MIN_PERIOD_S seconds) the law measures the
    period's mean staleness s and u, and moves W by ``gain x (target - s) / u`` chunks, the step
    bounded to max(1, W / 2), the result clamped to [w_min, w_max]. Without a target W stays put.
    Pure arithmetic: testable without a scheduler.
    """

    def __init__(self, window: int, *, target: float | None = None, w_min: int = 1, w_max: int = 64, gain: float = 0.5):
        self.target = target
        self.w_min, self.w_max, self.gain = int(w_min), int(w_max), float(gain)
        self.w = float(window if target is None else min(max(window, self.w_min), self.w_max))
        self._reset_period(None, 0)
        self.last = {"staleness": None, "updates_per_chunk": None}

    @property
    def window(self) -> int:
        return max(1, int(round(self.w)))

    def _reset_period(self, t, version):
        self.p_t, self.p_version, self.p_chunks, self.p_staleness, self.p_dropped = t, version, 0, 0.0, 0

    def observe(self, t: float, learner_version: int, staleness: list[int], dropped: int = 0) -> bool:
        """Feed a report's consumed staleness values (and how many of those chunks were dropped);
        True when W was adjusted."""
        if self.p_t is None:
            self._reset_period(t, learner_version)
        self.p_chunks += len(staleness)
        self.p_staleness += sum(staleness)
        self.p_dropped += dropped
        if self.p_chunks < max(1, (self.window + 1) // 2) or t - self.p_t < CONTROL_MIN_PERIOD_S:
            return False
        s = self.p_staleness / self.p_chunks
        u = max(learner_version - self.p_version, 0) / self.p_chunks
        drop_frac = self.p_dropped / self.p_chunks
        self.last = {"staleness": s, "updates_per_chunk": u, "dropped_fraction": drop_frac}
        self._reset_period(t, learner_version)
        if self.target is None:
            return False
        step = self.gain * (self.target - s) / max(u, 0.25)
        if step > 0 and drop_frac > MAX_DROPPED_TO_GROW:
            # a wider window only makes more chunks that the learner throws away (on-policy data
            # past its lag limit): the target is out of reach, hold the window instead
            step = 0.0
        bound = max(1.0, self.w / 2)
        self.w = min(max(self.w + min(max(step, -bound), bound), self.w_min), self.w_max)
        return True

    def configure(self, *, target=..., w_min=None, w_max=None, gain=None, window=None) -> None:
        if target is not ...:
            self.target = None if target is None else float(target)
        if w_min is not None:
            self.w_min = int(w_min)
        if w_max is not None:
            self.w_max = int(w_max)
        if gain is not None:
            self.gain = float(gain)
        if window is not None:
            self.w = float(window)
        if self.target is not None:
            self.w = min(max(self.w, self.w_min), self.w_max)


def replay_gate(rho_min: float | None, samples_trained: float, env_steps: float, in_flight: int,
                chunk_env_steps: int, warm: bool, starving: bool = False) -> bool:
    """May one more chunk be admitted under the replay-ratio floor?

    ``env_steps`` counts env steps ingested past the algorithm's warm-up and ``samples_trained``
    the samples trained on since. Admit while the ratio, counting the data already in flight,
    stays at or above ``rho_min``. Always admit during warm-up, and when nothing is in flight
    while the learner cannot train (``starving``: its ceiling holds it), so the pipe never
    empties into a deadlock."""
    if rho_min is None or not warm or (in_flight == 0 and starving):
        return True
    return samples_trained >= rho_min * (env_steps + in_flight * chunk_env_steps)


class Books:
    """One learner's admission and accounting: its window law, credits, counters and history.
    A run has one per group (one without groups has one); the plugin routes by group."""

    def __init__(self, group: int, law: dict, learner_address=None, chunk_env_steps: int = 1):
        self.group = group
        self.law = WindowLaw(
            law["window"], target=law.get("staleness_target"), w_min=law.get("window_min") or 1,
            w_max=law.get("window_max") or max(64, law["window"]), gain=law.get("gain", 0.5),
        )
        rho = law.get("replay_ratio")
        self.rho_min, self.rho_max = (None, None) if rho is None else (float(rho[0]), float(rho[1]))
        self.max_staleness = law.get("max_staleness")
        self.params_version = 0
        self.chunk_env_steps = int(chunk_env_steps)
        self.learner_address = learner_address
        self.learner_lost = False
        self.learner_version = 0
        self.progress = {"env_steps": 0, "samples_trained": 0, "warm": False}
        self.credited: set[str] = set()  # keys holding a credit right now
        self.granted_total = 0
        self.refused_replay_ratio = 0
        self.returned_consumed = 0
        self.returned_erred = 0
        self.returned_forgotten = 0
        self.returned_unsubmitted = 0  # granted to a learner that died before it submitted them
        self.chunks_consumed = 0
        self.chunks_dropped = 0
        self.env_steps_consumed = 0
        self.bytes_consumed = 0
        self.staleness_hist: Counter[int] = Counter()
        self.staleness_max = 0
        self.staleness_sum = 0
        self.age_sum_s = 0.0
        self.age_max_s = 0.0
        self.per_explorer_steps: Counter[int] = Counter()
        # (t, learner_version, chunks_in_flight, window, staleness_versions, age_s) per consumed chunk
        self.history: deque[tuple] = deque(maxlen=HISTORY_LEN)
        # (t, window, target, mean staleness of the period, updates per chunk) at every control step
        self.window_log: deque[tuple] = deque(maxlen=WINDOW_LOG_LEN)
        # the learner's own figures, sent about twice a second: dicts with "t" added
        self.learner_series: deque[dict] = deque(maxlen=SERIES_LEN)

    @property
    def window(self) -> int:
        return self.law.window

    @property
    def chunks_in_flight(self) -> int:
        return len(self.credited)

    def params(self) -> dict:
        """What the learner applies on its side (it pre-checks admission locally, so an
        idle learner does not ask the scheduler on every pass)."""
        return {
            "window": self.window, "rho_min": self.rho_min, "rho_max": self.rho_max,
            "max_staleness": self.max_staleness, "params_version": self.params_version,
        }

    def cycle(self, consumed: list | None = None, want: list | None = None, learner_version: int | None = None,
              progress: dict | None = None, learner_status: dict | None = None) -> dict:
        """Report consumed chunks and ask credits for new explorer task keys, in one round trip.

        ``consumed``: rows ``(key, explorer_id, env_steps, nbytes, staleness_versions, age_s,
        dropped)``. ``progress``: the learner's replay counters (``env_steps`` past warm-up,
        ``samples_trained``, ``warm``). ``learner_status``: the learner's own figures (mean return,
        updates, busy time, ...), for the dashboard and metrics. Returns the keys granted, in the
        order asked, and the current parameters.
        """
        now = time.time()
        if learner_status:
            self.learner_series.append({**learner_status, "t": now})
        if learner_version is not None:
            self.learner_version = int(learner_version)
        if progress:
            self.progress = progress
        staleness_seen, dropped_seen = [], 0
        for key, explorer_id, env_steps, nbytes, staleness, age_s, dropped in consumed or ():
            if key in self.credited:
                self.credited.discard(key)
                self.returned_consumed += 1
            self.chunks_consumed += 1
            self.chunks_dropped += int(bool(dropped))
            self.env_steps_consumed += int(env_steps)
            self.bytes_consumed += int(nbytes)
            self.per_explorer_steps[int(explorer_id)] += int(env_steps)
            self.staleness_hist[int(staleness)] += 1
            self.staleness_sum += int(staleness)
            self.staleness_max = max(self.staleness_max, int(staleness))
            self.age_sum_s += float(age_s)
            self.age_max_s = max(self.age_max_s, float(age_s))
            self.history.append((now, self.learner_version, self.chunks_in_flight, self.window, int(staleness), float(age_s)))
            staleness_seen.append(int(staleness))
            dropped_seen += int(bool(dropped))
        if staleness_seen and self.law.observe(now, self.learner_version, staleness_seen, dropped_seen):
            self.window_log.append((now, self.law.w, self.law.target, self.law.last["staleness"], self.law.last["updates_per_chunk"]))
        granted = []
        prog = self.progress
        for key in want or ():
            if self.chunks_in_flight >= self.window:
                break
            if not replay_gate(self.rho_min, prog["samples_trained"], prog["env_steps"], self.chunks_in_flight,
                               self.chunk_env_steps, prog["warm"], prog.get("starving", False)):
                self.refused_replay_ratio += 1
                break
            if key.startswith(EXPLORE_PREFIX) and key not in self.credited:
                self.credited.add(key)
                granted.append(key)
        self.granted_total += len(granted)
        return {"granted": granted, **self.params()}

    def check(self, window: int | None = None, staleness_target=..., window_min: int | None = None,
              window_max: int | None = None, gain: float | None = None, replay_ratio=...,
              max_staleness=...) -> None:
        """Raise ValueError naming the field if ``configure`` would refuse these settings."""
        def bad(msg):
            raise ValueError(msg)

        w_min = self.law.w_min if window_min is None else window_min
        w_max = self.law.w_max if window_max is None else window_max
        if window is not None and int(window) < 1:
            bad(f"window: must be >= 1 (got {window})")
        if int(w_min) < 1 or int(w_min) > int(w_max):
            bad(f"window_min, window_max: need 1 <= window_min <= window_max (got {w_min}, {w_max})")
        if staleness_target not in (..., None) and float(staleness_target) < 0:
            bad(f"staleness_target: must be >= 0 or None (got {staleness_target})")
        if gain is not None and not 0 < float(gain) <= 2:
            bad(f"gain: must be in (0, 2] (got {gain})")
        if replay_ratio not in (..., None):
            lo, hi = (float(x) for x in replay_ratio)
            if not (0 <= lo <= hi) or hi <= 0:
                bad(f"replay_ratio: must be [min, max] with 0 <= min <= max and max > 0 (got {list(replay_ratio)})")
        if max_staleness not in (..., None) and int(max_staleness) < 0:
            bad(f"max_staleness: must be >= 0 or None (got {max_staleness})")

    def configure(self, window: int | None = None, staleness_target=..., window_min: int | None = None,
                  window_max: int | None = None, gain: float | None = None, replay_ratio=...,
                  max_staleness=...) -> dict:
        """Change the law while a run goes on (``None`` for staleness_target, replay_ratio or
        max_staleness switches that part off; an omitted argument is left as it is)."""
        self.check(window, staleness_target, window_min, window_max, gain, replay_ratio, max_staleness)
        self.law.configure(target=staleness_target, w_min=window_min, w_max=window_max, gain=gain, window=window)
        if replay_ratio is not ...:
            self.rho_min, self.rho_max = (None, None) if replay_ratio is None else (float(replay_ratio[0]), float(replay_ratio[1]))
        if max_staleness is not ...:
            self.max_staleness = None if max_staleness is None else int(max_staleness)
        self.params_version += 1
        self.window_log.append((time.time(), self.law.w, self.law.target, None, None))
        return self.state()

    def state(self, history: bool = False) -> dict:
        n = self.chunks_consumed
        out = {
            "group": self.group,
            "window": self.window,
            "window_min": self.law.w_min,
            "window_max": self.law.w_max,
            "staleness_target": self.law.target,
            "gain": self.law.gain,
            "replay_ratio": None if self.rho_min is None else [self.rho_min, self.rho_max],
            "max_staleness": self.max_staleness,
            "last_period": dict(self.law.last),
            "chunks_in_flight": self.chunks_in_flight,
            "learner_version": self.learner_version,
            "learner_lost": self.learner_lost,
            "learner_progress": dict(self.progress),
            "credits_granted": self.granted_total,
            "refused_replay_ratio": self.refused_replay_ratio,
            "credits_returned": {
                "consumed": self.returned_consumed,
                "erred": self.returned_erred,
                "forgotten": self.returned_forgotten,
                "unsubmitted": self.returned_unsubmitted,
            },
            "chunks_consumed": n,
            "chunks_dropped": self.chunks_dropped,
            "env_steps_consumed": self.env_steps_consumed,
            "bytes_consumed": self.bytes_consumed,
            "staleness_mean": self.staleness_sum / n if n else None,
            "staleness_max": self.staleness_max if n else None,
            "staleness_hist": {str(k): v for k, v in sorted(self.staleness_hist.items())},
            "age_mean_s": self.age_sum_s / n if n else None,
            "age_max_s": self.age_max_s if n else None,
            "per_explorer_env_steps": {str(k): v for k, v in sorted(self.per_explorer_steps.items())},
        }
        out["learner"] = dict(self.learner_series[-1]) if self.learner_series else None
        if history:
            out["history"] = [list(row) for row in self.history]
            out["window_log"] = [list(row) for row in self.window_log]
            out["learner_series"] = list(self.learner_series)
        return out


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
        scheduler.handlers.update(
            {
                "tianji_begin": self.begin,
                "tianji_cycle": self.cycle,
                "tianji_state": self.state,
                "tianji_configure": self.configure,
            }
        )

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
        if not tasks or not isinstance(tasks[0], str) or not tasks[0].startswith(EXPLORE_PREFIX):
            return
        spans = scheduler.extensions.get("spans")
        ts = scheduler.tasks.get(tasks[0])
        if spans is None or ts is None:
            return
        span = spans.spans.get(ts.group.span_id)
        collections = (getattr(span, "_metadata", None) or {}).get("collections")
        if collections is not None and len(collections) > SPAN_METADATA_MAX:
            collections[:] = list({repr(c): c for c in collections}.values())

    def valid_workers_downscaling(self, scheduler, workers):
        """Adaptive clusters never retire the learner's worker: its actor would be lost."""
        return [ws for ws in workers if not ws.resources.get("LEARNER")]

    def remove_worker(self, scheduler, worker, **kwargs):
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
            return books.params()
        if run_id != self.run_id:
            self.run_id, self.groups, self.t_reset = run_id, {}, time.time()
        self.groups[group] = Books(group, law, learner_address, chunk_env_steps)
        return self.groups[group].params()

    def _books(self, group: int) -> Books:
        try:
            return self.groups[group]
        except KeyError:
            raise ValueError(f"group: run {self.run_id} has no group {group}") from None

    def cycle(self, group: int = 0, **report) -> dict:
        return self._books(group).cycle(**report)

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
