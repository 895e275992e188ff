"""The staleness controller's arithmetic: the window law and the replay-ratio floor (no Dask).

Pure functions and a small class, testable without a scheduler; ``books.py`` applies them.
"""

from __future__ import annotations

#: the window does not grow while more than this fraction of consumed chunks is dropped
MAX_DROPPED_TO_GROW = 0.2
#: the window moves at most once per this many seconds, and only after half a window of chunks
CONTROL_MIN_PERIOD_S = 0.2
#: a target is held while a period's mean staleness is within this fraction of it
HOLD_TOLERANCE = 0.25
#: periods in a row at a bound, still off target, before the target is called out of reach
UNREACHABLE_PERIODS = 3


class WindowLaw:
    """The bounded rule that moves the window W (chunks in flight) toward a staleness target.

    Model (docs/design.md, "Credits and the window law"): mean staleness ~ W x u + K/2, with u the learner's updates per
    consumed chunk (consumption vs production) and K the publish interval. Once per control
    period (at least W / 2 chunks consumed and CONTROL_MIN_PERIOD_S seconds) the law measures the
    period's mean staleness s and u, and moves W by ``gain x (target - s) / u`` chunks, the step
    bounded to max(1, W / 2), the result clamped to [w_min, w_max]. Without a target W stays put.
    ``verdict`` says after each period whether the target is held (within ``HOLD_TOLERANCE``),
    still settling, or out of reach, and why: a window at its floor that is still too stale, at
    its ceiling still too fresh, or a window held because the learner drops what a wider one
    makes. Pure arithmetic: testable without a scheduler.
    """

    def __init__(self, window: int, *, target: float | None = None, w_min: int = 1, w_max: int = 64, gain: float = 0.5):
        self.target = target
        self.w_min, self.w_max, self.gain = int(w_min), int(w_max), float(gain)
        self.w = float(window if target is None else min(max(window, self.w_min), self.w_max))
        self._reset_period(None, 0)
        self.last = {"staleness": None, "updates_per_chunk": None}
        self.verdict = {"state": "off" if target is None else "settling", "reason": None}
        self._at_bound = 0  # periods in a row at a bound and off target

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
        blocked = step > 0 and drop_frac > MAX_DROPPED_TO_GROW
        if blocked:
            # a wider window only makes more chunks that the learner throws away (on-policy data
            # past its lag limit): the target is out of reach, hold the window instead
            step = 0.0
        self._judge(s, u, drop_frac, blocked)
        bound = max(1.0, self.w / 2)
        self.w = min(max(self.w + min(max(step, -bound), bound), self.w_min), self.w_max)
        return True

    def _judge(self, s: float, u: float, drop_frac: float, blocked: bool) -> None:
        """The verdict on the period just measured (``s`` its mean staleness, ``u`` its updates per
        chunk), with the window it was measured at."""
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
            self.verdict = {"state": "settling", "reason": None}

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
        self._at_bound = 0
        self.verdict = {"state": "off" if self.target is None else "settling", "reason": None}


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
    return samples_trained >= samples_needed(rho_min, env_steps, in_flight, chunk_env_steps)


def samples_needed(rho_min: float, env_steps: float, in_flight: int, chunk_env_steps: int) -> float:
    """The samples trained at which ``replay_gate`` admits one more chunk, the books as they are."""
    return rho_min * (env_steps + in_flight * chunk_env_steps)
