"""One learner's admission in the staleness controller: its settings, its window law and replay-ratio
pacing, and the credits they grant (no Dask).

The controller decides admission here and only here: the learner names the explorer task keys it
wants to submit, and ``Admission.grant`` grants credits for some of them, the window law's window
and the replay-ratio floor allowing. Every method is O(1) or O(keys asked) and runs on the
scheduler's event loop; ``books.py`` feeds it and counts what it decides.
"""

from __future__ import annotations

import inspect

from tianji_dask.dataflow.controller.pacing import ReplayRatioLaw, replay_gate, samples_needed
from tianji_dask.dataflow.controller.settings import LawSettings, check_live
from tianji_dask.dataflow.controller.window_law import WindowLaw
from tianji_dask.dataflow.keys import is_explore_key
from tianji_dask.dataflow.messages import ControllerParams


def _taken_by(method, values: dict) -> dict:
    """The ``values`` a law's ``configure`` takes: those its signature names."""
    names = inspect.signature(method).parameters
    return {name: value for name, value in values.items() if name in names}


class Admission:
    """Credits for explorer task keys, at most a window of them out at once (``WindowLaw``) and,
    for a replaying learner, only while samples trained per env step stay at the floor
    (``ReplayRatioLaw``, ``replay_gate``). ``settings``: the ``LawSettings`` in force (those
    ``configure`` set; the window law moves the window from the one set)."""

    def __init__(self, settings: LawSettings, chunk_env_steps: int = 1):
        self.settings = settings
        self.law = WindowLaw(settings.window, staleness_target=settings.staleness_target,
                             window_min=settings.window_min, window_max=settings.window_max, gain=settings.gain)
        self.replay_law = ReplayRatioLaw(settings.replay_ratio, replay_staleness_target=settings.replay_staleness_target,
                                         gain=settings.gain)
        self.chunk_env_steps = int(chunk_env_steps)
        self.credited: set[str] = set()  # keys holding a credit right now
        self.params_version = 0
        self.progress = {"env_steps": 0, "samples_trained": 0, "warm": False}
        # samples the floor asks for the env steps booked so far, each at the floor in force when it
        # came: a floor that moves asks its new ratio of new env steps only
        self.samples_owed = 0.0
        self._env_steps_booked = 0

    @property
    def window(self) -> int:
        return self.law.window

    @property
    def chunks_in_flight(self) -> int:
        return len(self.credited)

    @property
    def rho_min(self) -> float | None:
        """The floor the replay-ratio gate admits by (the band's min, or the replay law's)."""
        return self.replay_law.bounds()[0]

    @property
    def rho_max(self) -> float | None:
        """The ceiling the learner trains up to (the band's max, or the replay law's)."""
        return self.replay_law.bounds()[1]

    # ---- credits ---------------------------------------------------------------------------
    def holds(self, key: str) -> bool:
        """``key`` holds a credit now."""
        return key in self.credited

    def take_back(self, key: str) -> bool:
        """Return ``key``'s credit; False when it held none (returned already, or never granted)."""
        held = len(self.credited)
        self.credited.discard(key)
        return len(self.credited) < held

    def take_back_unsubmitted(self, submitted) -> int:
        """Return the credits of keys not in ``submitted`` (the scheduler's tasks): a lost learner
        was granted them but never submitted them, so no transition will hand them back. How many."""
        unsubmitted = [k for k in self.credited if k not in submitted]
        self.credited.difference_update(unsubmitted)
        return len(unsubmitted)

    def grant(self, want) -> tuple[list[str], bool]:
        """Credits for the explorer task keys in ``want``, in the order asked, while the window and
        the replay-ratio floor allow: (the keys granted, whether the floor refused one)."""
        granted, prog = [], self.progress
        for key in want or ():
            if self.chunks_in_flight >= self.window:
                break
            if not replay_gate(self.rho_min, prog["samples_trained"], prog["env_steps"], self.chunks_in_flight,
                               self.chunk_env_steps, prog["warm"], prog.get("starving", False), self.samples_owed):
                return granted, True
            if is_explore_key(key) and key not in self.credited:
                self.credited.add(key)
                granted.append(key)
        return granted, False

    def next_admission_at(self) -> float | None:
        """The samples trained at which the replay-ratio floor would admit one more chunk, the
        credits as they are; None when it would admit one now (or there is no floor)."""
        prog = self.progress
        if self.rho_min is None or not prog["warm"]:
            return None
        needed = samples_needed(self.rho_min, prog["env_steps"], self.chunks_in_flight, self.chunk_env_steps,
                                self.samples_owed)
        return needed if prog["samples_trained"] < needed else None

    # ---- what the laws are fed -------------------------------------------------------------
    def report_progress(self, progress: dict) -> None:
        """A replaying learner's counters (``messages.Progress``): owe the floor's samples for the
        env steps reported since the last report, at the floor they came under."""
        env_steps = progress["env_steps"]
        rho = self.rho_min or 0.0
        new = env_steps - self._env_steps_booked
        # fewer than booked: a learner rebuilt from an older checkpoint; its counts go on from there
        self.samples_owed = rho * env_steps if new < 0 else self.samples_owed + rho * new
        self._env_steps_booked = env_steps
        self.progress = progress

    def observe_learner(self, t: float, status: dict) -> None:
        """The learner's own figures: its recent replay staleness and buffer fill, for the replay law."""
        self.replay_law.observe(t, status.get("replay_staleness_recent_mean"), status.get("replay_fill"))

    def observe_consumed(self, t: float, learner_version: int, staleness: list[int], dropped: int) -> tuple | None:
        """A report's consumed chunks (their staleness, how many were dropped), for the window law:
        the row of the window log when the law moved the window (None: it did not)."""
        if staleness and self.law.observe(t, learner_version, staleness, dropped):
            return self.law_row(t)
        return None

    def law_row(self, t: float, measured: bool = True) -> tuple:
        """The window log's row as of now: (t, window, target, and where ``measured`` (a control
        step, not a configure) the last period's mean staleness and updates per chunk, else None)."""
        last = self.law.last if measured else {}
        return t, self.law.w, self.law.staleness_target, last.get("staleness"), last.get("updates_per_chunk")

    # ---- settings --------------------------------------------------------------------------
    def params(self) -> ControllerParams:
        """What the learner applies on its side: how many chunks to ask for, the replay-ratio
        ceiling, the staleness filter."""
        return ControllerParams(window=self.window, rho_max=self.rho_max, max_staleness=self.settings.max_staleness,
                                params_version=self.params_version, target_state=self.law.verdict["state"],
                                target_reason=self.law.verdict["reason"],
                                replay_target_state=self.replay_law.verdict["state"],
                                replay_target_reason=self.replay_law.verdict["reason"])

    def values(self) -> dict:
        """Every controller setting (``settings.SETTINGS``) as admission holds it now."""
        return self.settings.values(window=self.window)

    def check(self, **settings) -> dict:
        """The values ``configure`` would apply; ValueError, one line naming the setting, if it
        would refuse them (``settings.check_live``)."""
        return check_live(settings, self.values())

    def configure(self, **settings) -> None:
        """Change the settings while a run goes on (``None`` for staleness_target, replay_ratio,
        replay_staleness_target or max_staleness switches that part off; an omitted setting is
        left as it is): each law takes the ones its ``configure`` names."""
        new = self.check(**settings)
        self.settings = self.settings.configured(new)
        self.law.configure(**_taken_by(self.law.configure, new))
        replay = _taken_by(self.replay_law.configure, new)
        if replay:  # a replay law configured starts its period and verdict anew
            self.replay_law.configure(**replay)
        self.params_version += 1
