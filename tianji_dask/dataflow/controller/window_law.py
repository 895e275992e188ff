"""The window law: the bounded rule that moves the window (chunks in flight) toward a staleness
target (no Dask). Pure arithmetic, testable without a scheduler; ``books.py`` applies it."""

from __future__ import annotations

from collections import deque

from tianji_dask.dataflow.controller.verdict import Verdict

#: the window does not grow while more than this fraction of consumed chunks is dropped
MAX_DROPPED_TO_GROW = 0.2
#: the window moves at most once per this many seconds, and only after half a window of chunks
CONTROL_MIN_PERIOD_S = 0.2
#: and never on fewer chunks than this: one chunk's staleness is one draw (0, or a straggler's 7),
#: and a law that acts on single draws wanders around a small target instead of settling on it
MIN_PERIOD_CHUNKS = 8
#: the window law's verdict reads the mean staleness of this many periods, not the last one alone
VERDICT_PERIODS = 4


class WindowLaw:
    """The bounded rule that moves the window W (chunks in flight) toward a staleness target.

    Model (docs/design.md, "Credits and the window law"): mean staleness ~ (W - 1) x u + K/2, with u the learner's updates per
    consumed chunk (consumption vs production) and K the publish interval. Once per control
    period (at least W / 2 and MIN_PERIOD_CHUNKS chunks consumed, and CONTROL_MIN_PERIOD_S seconds) the law measures the
    period's mean staleness s and u, and moves W by ``gain x (target - s) / u`` chunks, the step
    bounded to max(1, W / 2), the result clamped to [window_min, window_max]. After a move the chunks already in flight (the old W)
    are left out of the next period: admitted under the old window, they would measure it, and a
    law acting on them overshoots once W exceeds the explorers (chunks queue behind their streams
    and the dead time is a whole window). Without a target W stays put.
    ``verdict`` says after each period whether the target is held (the mean staleness of every
    chunk consumed in the last ``VERDICT_PERIODS`` periods within ``HOLD_TOLERANCE``, the chunks
    the law leaves out after a move included: the learner trained on them; the run's first window,
    the pipe filling, not), still settling (toward which
    side, and how long a period takes), or out of reach, and why: a window at its floor that is
    still too stale, at its ceiling still too fresh, or a window held because the learner drops
    what a wider one makes. Pure arithmetic: testable without a scheduler.
    """

    def __init__(self, window: int, *, staleness_target: float | None, window_min: int, window_max: int, gain: float):
        self.staleness_target = staleness_target
        self.window_min, self.window_max, self.gain = int(window_min), int(window_max), float(gain)
        self.w = float(window if staleness_target is None else min(max(window, self.window_min), self.window_max))
        self._reset_period(None, 0)
        self.v_staleness, self.v_chunks = 0.0, 0  # every chunk consumed since the last period, for the verdict
        # chunks still to leave out: after a move, those admitted under the window before it; at
        # the start, the first window (all admitted at version 0, their staleness only the fill's)
        self.p_skip = self.window if staleness_target is not None else 0
        self.last = {"staleness": None, "updates_per_chunk": None}
        self._verdict = Verdict(on=staleness_target is not None)
        self._recent = deque(maxlen=VERDICT_PERIODS)  # (staleness sum, chunks) of the last periods
        self._carry = 0.0  # what the last step's bound cut off, taken with the next

    @property
    def verdict(self) -> dict:
        """{"state": off, settling, held or unreachable, "reason": why, or None}."""
        return self._verdict.as_dict()

    @property
    def window(self) -> int:
        return max(1, int(round(self.w)))

    def _reset_period(self, t, version):
        self.p_t, self.p_version, self.p_chunks, self.p_staleness, self.p_dropped = t, version, 0, 0.0, 0

    def _wait_out(self, chunks: int) -> None:
        """Leave the next ``chunks`` consumed chunks out of the periods: they were admitted under
        the window before the last move, so they measure it, not the new one."""
        self.p_skip = max(int(chunks), 0)

    def observe(self, t: float, learner_version: int, staleness: list[int], dropped: int = 0) -> bool:
        """Feed a report's consumed staleness values (and how many of those chunks were dropped);
        True when W was adjusted."""
        if not (self.p_skip and self.last["staleness"] is None):  # left out before any period: the pipe filling
            self.v_staleness += sum(staleness)
            self.v_chunks += len(staleness)
        if self.p_skip:
            self.p_skip = max(self.p_skip - len(staleness), 0)
            self._reset_period(t, learner_version)  # the next period starts after them
            return False
        if self.p_t is None:
            self._reset_period(t, learner_version)
        self.p_chunks += len(staleness)
        self.p_staleness += sum(staleness)
        self.p_dropped += dropped
        if self.p_chunks < max(MIN_PERIOD_CHUNKS, (self.window + 1) // 2) or t - self.p_t < CONTROL_MIN_PERIOD_S:
            return False
        s = self.p_staleness / self.p_chunks
        self._recent.append((self.v_staleness, self.v_chunks))
        self.v_staleness, self.v_chunks = 0.0, 0
        u = max(learner_version - self.p_version, 0) / self.p_chunks
        drop_frac = self.p_dropped / self.p_chunks
        self.last = {"staleness": s, "updates_per_chunk": u, "dropped_fraction": drop_frac}
        period_s = t - self.p_t
        self._reset_period(t, learner_version)
        if self.staleness_target is None:
            return False
        step = self.gain * (self.staleness_target - s) / max(u, 0.25)
        blocked = step > 0 and drop_frac > MAX_DROPPED_TO_GROW
        if blocked:
            # a wider window only makes more chunks that the learner throws away (on-policy data
            # past its lag limit): the target is out of reach, hold the window instead
            step = 0.0
        judged_chunks = sum(b for _, b in self._recent)
        judged = sum(a for a, _ in self._recent) / judged_chunks
        self.last.update(judged_staleness=judged, judged_chunks=judged_chunks)
        self._judge(judged, u, drop_frac, blocked, period_s)
        bound = max(1.0, self.w / 2)
        before = self.window
        # a step cut to its bound keeps the rest for the next period (at most one bound more): a
        # straggler's period wants a large cut, and dropping what exceeds the bound biased the law
        # upward, as single periods of no staleness pushed it up unbounded
        want = step + self._carry
        taken = min(max(want, -bound), bound)
        self._carry = min(max(want - taken, -bound), bound)
        self.w = min(max(self.w + taken, self.window_min), self.window_max)
        if self.window != before:
            self._wait_out(before)  # the loop's dead time: what is in flight still holds the old window
        return True

    def _judge(self, s: float, u: float, drop_frac: float, blocked: bool, period_s: float) -> None:
        """The verdict after the period just measured (``s`` the mean staleness of the last
        periods' chunks, ``u`` this one's updates per chunk, ``period_s`` its length), with the
        window it was measured at."""
        target, at_bound = self.staleness_target, None
        if s > target and self.window <= self.window_min:
            at_bound = (f"staleness {s:.1f} with the fewest chunks in flight (window_min {self.window_min}, "
                        f"{u:.2f} updates per chunk): smaller chunks or fewer updates per chunk lower it")
        elif s < target and blocked:
            at_bound = (f"{drop_frac:.0%} of chunks dropped past the algorithm's lag limit: a wider window only "
                        "makes more of them (raise the algorithm's max_policy_lag to allow the target)")
        elif s < target and self.window >= self.window_max:
            at_bound = f"staleness {s:.1f} with the most chunks in flight (window_max {self.window_max}): raise window_max"
        # a period lasts MIN_PERIOD_CHUNKS chunks: where stragglers hold the few credits of a small
        # window that is seconds, and a short run ends while the law is still on its way
        self._verdict.judge(s, target, at_bound, settling=(
            f"staleness {s:.1f} against {target:g}, window {self.window} still "
            f"{'widening' if s < target else 'narrowing'}; a control period took {period_s:.1f} s"))

    def configure(self, *, staleness_target=..., window_min=None, window_max=None, gain=None, window=None) -> None:
        """Change settings (named as ``settings.SETTINGS`` names them; ``...`` or None: as they are,
        except a None ``staleness_target``, which switches the target off)."""
        if staleness_target is not ...:
            self.staleness_target = None if staleness_target is None else float(staleness_target)
        if window_min is not None:
            self.window_min = int(window_min)
        if window_max is not None:
            self.window_max = int(window_max)
        if gain is not None:
            self.gain = float(gain)
        if window is not None:
            self.w = float(window)
        if self.staleness_target is not None:
            self.w = min(max(self.w, self.window_min), self.window_max)
            self._wait_out(self.window)  # what is in flight was admitted under the settings before
        self._recent.clear()
        self.v_staleness, self.v_chunks = 0.0, 0
        self._carry = 0.0
        self._verdict.reset(on=self.staleness_target is not None)
