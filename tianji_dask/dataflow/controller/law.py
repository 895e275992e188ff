"""The staleness controller's arithmetic: the window law, the replay-ratio floor and the replay
staleness law (no Dask).

Pure functions and a small class, testable without a scheduler; ``books.py`` applies them.
"""

from __future__ import annotations

from collections import deque

#: the window does not grow while more than this fraction of consumed chunks is dropped
MAX_DROPPED_TO_GROW = 0.2
#: the window moves at most once per this many seconds, and only after half a window of chunks
CONTROL_MIN_PERIOD_S = 0.2
#: and never on fewer chunks than this: one chunk's staleness is one draw (0, or a straggler's 7),
#: and a law that acts on single draws wanders around a small target instead of settling on it
MIN_PERIOD_CHUNKS = 8
#: a target is held while a period's mean staleness is within this fraction of it
HOLD_TOLERANCE = 0.25
#: periods in a row at a bound, still off target, before the target is called out of reach
UNREACHABLE_PERIODS = 3
#: the window law's verdict reads the mean staleness of this many periods, not the last one alone
VERDICT_PERIODS = 4


class WindowLaw:
    """The bounded rule that moves the window W (chunks in flight) toward a staleness target.

    Model (docs/design.md, "Credits and the window law"): mean staleness ~ (W - 1) x u + K/2, with u the learner's updates per
    consumed chunk (consumption vs production) and K the publish interval. Once per control
    period (at least W / 2 and MIN_PERIOD_CHUNKS chunks consumed, and CONTROL_MIN_PERIOD_S seconds) the law measures the
    period's mean staleness s and u, and moves W by ``gain x (target - s) / u`` chunks, the step
    bounded to max(1, W / 2), the result clamped to [w_min, w_max]. After a move the chunks already in flight (the old W)
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

    def __init__(self, window: int, *, target: float | None = None, w_min: int = 1, w_max: int = 64, gain: float = 0.5):
        self.target = target
        self.w_min, self.w_max, self.gain = int(w_min), int(w_max), float(gain)
        self.w = float(window if target is None else min(max(window, self.w_min), self.w_max))
        self._reset_period(None, 0)
        self.v_staleness, self.v_chunks = 0.0, 0  # every chunk consumed since the last period, for the verdict
        # chunks still to leave out: after a move, those admitted under the window before it; at
        # the start, the first window (all admitted at version 0, their staleness only the fill's)
        self.p_skip = self.window if target is not None else 0
        self.last = {"staleness": None, "updates_per_chunk": None}
        self.verdict = {"state": "off" if target is None else "settling", "reason": None}
        self._at_bound = 0  # periods in a row at a bound and off target
        self._recent = deque(maxlen=VERDICT_PERIODS)  # (staleness sum, chunks) of the last periods
        self._carry = 0.0  # what the last step's bound cut off, taken with the next

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
        if self.target is None:
            return False
        step = self.gain * (self.target - s) / max(u, 0.25)
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
        self.w = min(max(self.w + taken, self.w_min), self.w_max)
        if self.window != before:
            self._wait_out(before)  # the loop's dead time: what is in flight still holds the old window
        return True

    def _judge(self, s: float, u: float, drop_frac: float, blocked: bool, period_s: float) -> None:
        """The verdict after the period just measured (``s`` the mean staleness of the last
        periods' chunks, ``u`` this one's updates per chunk, ``period_s`` its length), with the
        window it was measured at."""
        target = self.target
        if abs(s - target) <= HOLD_TOLERANCE * target:
            self._at_bound = 0
            self.verdict = {"state": "held", "reason": None}
            return
        reason = None
        if s > target and self.window <= self.w_min:
            reason = (f"staleness {s:.1f} with the fewest chunks in flight (window_min {self.w_min}, "
                      f"{u:.2f} updates per chunk): smaller chunks or fewer updates per chunk lower it")
        elif s < target and blocked:
            reason = (f"{drop_frac:.0%} of chunks dropped past the algorithm's lag limit: a wider window only "
                      "makes more of them (raise the algorithm's max_policy_lag to allow the target)")
        elif s < target and self.window >= self.w_max:
            reason = f"staleness {s:.1f} with the most chunks in flight (window_max {self.w_max}): raise window_max"
        self._at_bound = self._at_bound + 1 if reason else 0
        if reason and self._at_bound >= UNREACHABLE_PERIODS:
            self.verdict = {"state": "unreachable", "reason": reason}
        else:
            # a period lasts MIN_PERIOD_CHUNKS chunks: where stragglers hold the few credits of a small
            # window that is seconds, and a short run ends while the law is still on its way
            self.verdict = {"state": "settling", "reason": reason or (
                f"staleness {s:.1f} against {target:g}, window {self.window} still "
                f"{'widening' if s < target else 'narrowing'}; a control period took {period_s:.1f} s")}

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
            self._wait_out(self.window)  # what is in flight was admitted under the settings before
        self._at_bound = 0
        self._recent.clear()
        self.v_staleness, self.v_chunks = 0.0, 0
        self._carry = 0.0
        self.verdict = {"state": "off" if self.target is None else "settling", "reason": None}


def replay_gate(rho_min: float | None, samples_trained: float, env_steps: float, in_flight: int,
                chunk_env_steps: int, warm: bool, starving: bool = False, owed: float | None = None) -> bool:
    """May one more chunk be admitted under the replay-ratio floor?

    ``env_steps`` counts env steps ingested past the algorithm's warm-up and ``samples_trained``
    the samples trained on since. Admit while the ratio, counting the data already in flight,
    stays at or above ``rho_min``. Always admit during warm-up, and when nothing is in flight
    while the learner cannot train (``starving``: its ceiling holds it), so the pipe never
    empties into a deadlock. ``owed``: see ``samples_needed``."""
    if rho_min is None or not warm or (in_flight == 0 and starving):
        return True
    return samples_trained >= samples_needed(rho_min, env_steps, in_flight, chunk_env_steps, owed)


def samples_needed(rho_min: float, env_steps: float, in_flight: int, chunk_env_steps: int,
                   owed: float | None = None) -> float:
    """The samples trained at which ``replay_gate`` admits one more chunk, the books as they are.
    ``owed``: the samples the env steps so far ask for, each at the floor in force when it came
    (a floor that moved asks its new ratio of new env steps only); default ``rho_min x env_steps``."""
    owed = rho_min * env_steps if owed is None else owed
    return owed + rho_min * in_flight * chunk_env_steps


#: the replay ratio moves at most this factor, up or down, per control period
REPLAY_MAX_STEP = 1.5
#: a replay control period lasts at least this long: a new ratio reaches the samples trained on
#: only as new data turns the buffer over
REPLAY_PERIOD_S = 2.0
#: under a replay staleness target the learner's ceiling is this factor above the floor the gate
#: admits by: with the two equal the learner could never get ahead of the chunks in flight, and the
#: floor would admit one only when none is
REPLAY_CEILING_MARGIN = 1.25


class ReplayRatioLaw:
    """Moves an effective replay ratio rho within the band [rho_min, rho_max] toward a replay
    staleness target: the mean age, in versions, of the samples the learner trains on.

    Model (docs/design.md, "Credits and the window law"): a full buffer of C transitions sampled
    uniformly holds samples C/2 env steps old on average, and the learner makes rho / B versions
    per env step (B samples per update), so replay staleness ~ (C/2) x rho / B: proportional to
    rho. Once per control period (REPLAY_PERIOD_S, over the learner's reports of its recent
    replay staleness) the law measures the period's mean s and multiplies rho by
    ``(target / s) ** gain``, the factor bounded to [1 / REPLAY_MAX_STEP, REPLAY_MAX_STEP], rho
    clamped to the band. While the buffer fills (the learner reports the fraction held, f < 1) its
    samples are younger than a full buffer's by that fraction, so the law steers by s / f, the
    staleness the same rho gives once full, rather than raising rho only to overshoot later.
    ``bounds`` gives what the books apply: the floor the gate admits by and the learner's ceiling.
    ``verdict`` as ``WindowLaw``'s: held, settling, or unreachable with why (rho at the band's min
    still too stale, at its max still too fresh). Without a target the band applies as it is and
    the verdict is off. Pure arithmetic: testable without a scheduler.
    """

    def __init__(self, band: tuple[float, float] | list | None, *, target: float | None = None, gain: float = 0.5):
        self.band, self.rho, self.target, self.gain = None, None, None, float(gain)
        self.last: float | None = None  # the last period's mean replay staleness
        self.configure(band=band, target=target)

    def observe(self, t: float, staleness: float | None, fill: float | None = None) -> bool:
        """Feed the learner's report of its recent replay staleness (None: no update replayed
        yet) and of the fraction of its buffer filled (None: unknown, taken as full); True when
        rho was moved."""
        if staleness is None or self.band is None:
            return False
        if self.p_t is None:
            self.p_t = t
        full = 1.0 if fill is None else min(max(float(fill), 0.0), 1.0)
        self.p_sum, self.p_n, self.p_fill = self.p_sum + float(staleness), self.p_n + 1, self.p_fill + full
        if t - self.p_t < REPLAY_PERIOD_S:
            return False
        s, f = self.p_sum / self.p_n, self.p_fill / self.p_n
        self.last = s
        self.p_t, self.p_sum, self.p_n, self.p_fill = t, 0.0, 0, 0.0
        if self.target is None:
            return False
        s_full = s / f if f > 0 else s  # what this rho gives once the buffer is full
        self._judge(s, s_full)
        factor = (self.target / s_full) ** self.gain if s_full > 0 else REPLAY_MAX_STEP
        factor = min(max(factor, 1 / REPLAY_MAX_STEP), REPLAY_MAX_STEP)
        self.rho = min(max(self.rho * factor, self.band[0]), self.band[1])
        return True

    def _judge(self, s: float, s_full: float) -> None:
        """The verdict on the period just measured (``s`` its mean replay staleness, ``s_full``
        what its rho gives with the buffer full), at the rho it was measured at: held only on
        what was measured; out of reach on what a full buffer will give."""
        target, (lo, hi) = self.target, self.band
        if abs(s - target) <= HOLD_TOLERANCE * target:
            self._at_bound = 0
            self.verdict = {"state": "held", "reason": None}
            return
        reason = None
        if s_full > target and self.rho <= lo:
            reason = (f"replay staleness {s_full:.1f} with the replay ratio at replay_ratio's min {lo:g}: lower that min, "
                      "or a smaller buffer or larger batch (staleness ~ buffer / 2 x ratio / batch)")
        elif s_full < target and self.rho >= hi:
            reason = (f"replay staleness {s_full:.1f} with the replay ratio at replay_ratio's max {hi:g}: raise that max, "
                      "or a larger buffer (staleness ~ buffer / 2 x ratio / batch)")
        self._at_bound = self._at_bound + 1 if reason else 0
        if reason and self._at_bound >= UNREACHABLE_PERIODS:
            self.verdict = {"state": "unreachable", "reason": reason}
        else:
            self.verdict = {"state": "settling", "reason": None}

    def bounds(self) -> tuple[float | None, float | None]:
        """(floor, ceiling) on samples trained per env step: the band itself without a target;
        with one, the floor at rho and the ceiling REPLAY_CEILING_MARGIN above it, both within
        the band (at the band's top the floor gives way to keep the margin; a band narrower
        than the margin applies as it is)."""
        if self.band is None:
            return None, None
        lo, hi = self.band
        if self.target is None:
            return lo, hi
        ceiling = min(hi, self.rho * REPLAY_CEILING_MARGIN)
        return max(lo, min(self.rho, ceiling / REPLAY_CEILING_MARGIN)), ceiling

    def configure(self, *, band=..., target=..., gain=None) -> None:
        """Change the band, the target or the gain (``...``: as it is). rho starts at the band's
        geometric middle (the algorithm's own ratio for an ``auto`` band) and is kept in it."""
        if band is not ...:
            self.band = None if band is None else (float(band[0]), float(band[1]))
        if target is not ...:
            self.target = None if target is None else float(target)
        if gain is not None:
            self.gain = float(gain)
        if self.band is None:
            self.rho = None
        else:
            lo, hi = self.band
            rho = self.rho if self.rho is not None else ((lo * hi) ** 0.5 if lo > 0 else hi / 2)
            self.rho = min(max(rho, lo), hi)
        self.p_t, self.p_sum, self.p_n, self.p_fill = None, 0.0, 0, 0.0
        self._at_bound = 0
        self.verdict = {"state": "off" if self.target is None or self.band is None else "settling", "reason": None}
