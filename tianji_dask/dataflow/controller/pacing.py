"""Replay-ratio pacing (no Dask): the gate that admits a replaying learner's chunks at or above a
floor of samples trained per env step, and the law that moves that ratio within its band toward a
replay staleness target. Pure arithmetic, testable without a scheduler; ``books.py`` applies it."""

from __future__ import annotations

from tianji_dask.dataflow.controller.verdict import Verdict


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

    def __init__(self, replay_ratio: tuple[float, float] | list | None, *, replay_staleness_target: float | None,
                 gain: float):
        self.band, self.rho, self.replay_staleness_target, self.gain = None, None, None, float(gain)
        self.last: float | None = None  # the last period's mean replay staleness
        self._verdict = Verdict(on=False)
        self.configure(replay_ratio=replay_ratio, replay_staleness_target=replay_staleness_target)

    @property
    def verdict(self) -> dict:
        """{"state": off, settling, held or unreachable, "reason": why, or None}."""
        return self._verdict.as_dict()

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
        if self.replay_staleness_target is None:
            return False
        s_full = s / f if f > 0 else s  # what this rho gives once the buffer is full
        self._judge(s, s_full)
        factor = (self.replay_staleness_target / s_full) ** self.gain if s_full > 0 else REPLAY_MAX_STEP
        factor = min(max(factor, 1 / REPLAY_MAX_STEP), REPLAY_MAX_STEP)
        self.rho = min(max(self.rho * factor, self.band[0]), self.band[1])
        return True

    def _judge(self, s: float, s_full: float) -> None:
        """The verdict on the period just measured (``s`` its mean replay staleness, ``s_full``
        what its rho gives with the buffer full), at the rho it was measured at: held only on
        what was measured; out of reach on what a full buffer will give."""
        target, (lo, hi) = self.replay_staleness_target, self.band
        at_bound = None
        if s_full > target and self.rho <= lo:
            at_bound = (f"replay staleness {s_full:.1f} with the replay ratio at replay_ratio's min {lo:g}: lower that min, "
                        "or a smaller buffer or larger batch (staleness ~ buffer / 2 x ratio / batch)")
        elif s_full < target and self.rho >= hi:
            at_bound = (f"replay staleness {s_full:.1f} with the replay ratio at replay_ratio's max {hi:g}: raise that max, "
                        "or a larger buffer (staleness ~ buffer / 2 x ratio / batch)")
        self._verdict.judge(s, target, at_bound)

    def bounds(self) -> tuple[float | None, float | None]:
        """(floor, ceiling) on samples trained per env step: the band itself without a target;
        with one, the floor at rho and the ceiling REPLAY_CEILING_MARGIN above it, both within
        the band (at the band's top the floor gives way to keep the margin; a band narrower
        than the margin applies as it is)."""
        if self.band is None:
            return None, None
        lo, hi = self.band
        if self.replay_staleness_target is None:
            return lo, hi
        ceiling = min(hi, self.rho * REPLAY_CEILING_MARGIN)
        return max(lo, min(self.rho, ceiling / REPLAY_CEILING_MARGIN)), ceiling

    def configure(self, *, replay_ratio=..., replay_staleness_target=..., gain=None) -> None:
        """Change the band, the target or the gain (named as ``settings.SETTINGS`` names them;
        ``...``: as it is). rho starts at the band's geometric middle (the algorithm's own ratio
        for an ``auto`` band) and is kept in it."""
        if replay_ratio is not ...:
            self.band = None if replay_ratio is None else (float(replay_ratio[0]), float(replay_ratio[1]))
        if replay_staleness_target is not ...:
            self.replay_staleness_target = None if replay_staleness_target is None else float(replay_staleness_target)
        if gain is not None:
            self.gain = float(gain)
        if self.band is None:
            self.rho = None
        else:
            lo, hi = self.band
            rho = self.rho if self.rho is not None else ((lo * hi) ** 0.5 if lo > 0 else hi / 2)
            self.rho = min(max(rho, lo), hi)
        self.p_t, self.p_sum, self.p_n, self.p_fill = None, 0.0, 0, 0.0
        self._verdict.reset(on=self.replay_staleness_target is not None and self.band is not None)
