"""A controller target's verdict, as both laws judge theirs: held, settling, or out of reach and
why (no Dask)."""

from __future__ import annotations

#: a target is held while a period's mean is within this fraction of it
HOLD_TOLERANCE = 0.25
#: periods in a row at a bound, still off target, before the target is called out of reach
UNREACHABLE_PERIODS = 3


class Verdict:
    """``state``: off (no target), settling, held or unreachable; ``reason``: why, where there is
    one. ``judge`` after each control period."""

    def __init__(self, on: bool):
        self.reset(on)

    def reset(self, on: bool) -> None:
        self.state, self.reason = ("settling" if on else "off"), None
        self._at_bound = 0  # periods in a row at a bound and off target

    def judge(self, measured: float, target: float, at_bound: str | None, settling: str | None = None) -> None:
        """``measured`` against ``target``; ``at_bound``: why the law cannot move further toward
        the target (None: it can), which called out ``UNREACHABLE_PERIODS`` periods in a row makes
        the target unreachable; ``settling``: what to say meanwhile."""
        if abs(measured - target) <= HOLD_TOLERANCE * target:
            self._at_bound = 0
            self.state, self.reason = "held", None
            return
        self._at_bound = self._at_bound + 1 if at_bound else 0
        if at_bound and self._at_bound >= UNREACHABLE_PERIODS:
            self.state, self.reason = "unreachable", at_bound
        else:
            self.state, self.reason = "settling", at_bound or settling

    def as_dict(self) -> dict:
        return {"state": self.state, "reason": self.reason}
