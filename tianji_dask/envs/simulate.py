"""A simulator's cost without its CPU: extra wall time per env step, spent sleeping (no Dask).

It stands for a simulator whose CPU is on another machine, so that many explorer streams can be
run on a small machine and the dataflow measured as if each had a core of its own. The env's
dynamics, rewards and learning stay real. A vector of N envs stepped in sequence costs N times
the per-step cost. With jitter, each chunk of a stream costs its own multiple of it: a lognormal
multiplier with mean 1, drawn from the run's seed and the stream's id (stragglers).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

#: the keys of ``env.explorer_kwargs`` that set a stream's cost instead of reaching gymnasium.make
KEYS = ("step_cost_ms", "step_cost_jitter")


@dataclass(frozen=True)
class StepCost:
    ms: float = 0.0
    jitter: float = 0.0

    def __bool__(self) -> bool:
        return self.ms > 0

    def describe(self) -> str:
        return f"{self.ms:g} ms per env step" + (f", lognormal jitter sigma {self.jitter:g} per chunk" if self.jitter else "")


class StepCostClock:
    """One stream's cost: ``chunk()`` draws the next chunk's seconds per vector step, ``step()``
    spends them."""

    def __init__(self, cost: StepCost, num_envs: int, seed: int, stream: int):
        self.cost, self.num_envs = cost, num_envs
        self._rng = np.random.default_rng([seed, stream])
        self.seconds_per_step = cost.ms * 1e-3 * num_envs

    def chunk(self) -> float:
        sigma = self.cost.jitter
        multiplier = float(np.exp(self._rng.normal(-0.5 * sigma * sigma, sigma))) if sigma else 1.0  # mean 1
        self.seconds_per_step = self.cost.ms * 1e-3 * self.num_envs * multiplier
        return self.seconds_per_step

    def step(self) -> None:
        time.sleep(self.seconds_per_step)
