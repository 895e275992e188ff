"""When a run stops: one set of rules, for one learner's books and for groups pooled (no Dask)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tianji_dask.core.metrics import time_to_solve


@dataclass(frozen=True)
class StopRules:
    """``target_return`` reached by the mean of the last ``mean_episodes`` episodes is TianJi's
    solve rule (see ``metrics.time_to_solve``); the budgets stop a run whether or not it solved."""

    target_return: float | None = None
    mean_episodes: int = 100
    on_solve: bool = True
    max_env_steps: int | None = None
    max_updates: int | None = None
    max_seconds: float | None = None
    on_eval: bool = False  # the target is judged on evaluations' means, not training returns

    @classmethod
    def of(cls, stop) -> "StopRules":
        """From a pipeline's ``StopConfig``."""
        return cls(target_return=stop.target_return, mean_episodes=stop.mean_episodes, on_solve=stop.on_solve,
                   max_env_steps=stop.max_env_steps, max_updates=stop.max_updates, max_seconds=stop.max_seconds,
                   on_eval=stop.on == "eval")

    def for_group(self) -> "StopRules":
        """A group's learner stops on its time budget only: solving and the step and update
        budgets are judged on all groups pooled, by the run, with these same rules."""
        return replace(self, on_solve=False, max_env_steps=None, max_updates=None)

    def reason(self, *, solved: bool, env_steps: int, updates: int, elapsed_s: float) -> str | None:
        """Why the run stops now, or None to go on."""
        if self.on_solve and solved:
            return "solved"
        if self.max_env_steps and env_steps >= self.max_env_steps:
            return "max_env_steps"
        if self.max_updates and updates >= self.max_updates:
            return "max_updates"
        if self.max_seconds and elapsed_s >= self.max_seconds:
            return "max_seconds"
        return None

    def solved_at(self, episodes: np.ndarray, evals: list[dict] = ()) -> float | None:
        """The end time of the episode that solved (rows ``(t_end, return, ...)``), or with
        ``on_eval`` the time of the first evaluation (rows with "t" and "mean") that did; None."""
        if self.target_return is None:
            return None
        if self.on_eval:
            return next((row["t"] for row in evals if row["mean"] >= self.target_return), None)
        return time_to_solve(episodes, self.target_return, self.mean_episodes)

    def eval_solves(self, mean: float) -> bool:
        return self.on_eval and self.target_return is not None and mean >= self.target_return

    def running_mean_solves(self, returns) -> bool:
        """Do the last ``mean_episodes`` ``returns``, all of them there, reach the target? (The
        cheap check that gates the exact rule, which sorts every episode by end time.)"""
        return (not self.on_eval and self.target_return is not None and len(returns) == self.mean_episodes
                and sum(returns) / self.mean_episodes >= self.target_return)
