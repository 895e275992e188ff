"""The search space of a sweep: ``KEY=SPEC`` parameters, parsed, checked against the pipeline
before any trial starts, and sampled through an Optuna trial (or perturbed, for PBT).

SPEC forms: ``loguniform:LO:HI``, ``uniform:LO:HI``, ``int:LO:HI``, ``choice:A,B,C`` (each
choice read as YAML: ``choice:64,128`` gives integers, ``choice:relu,tanh`` strings).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

from tianji_dask.errors import PipelineError

KINDS = ("loguniform", "uniform", "int", "choice")
EXPONENT = re.compile(r"\s*[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+\s*")  # YAML 1.1 reads 1e-6 as a string
SPEC_FORMS = "loguniform:LO:HI, uniform:LO:HI, int:LO:HI or choice:A,B,C"


@dataclass(frozen=True)
class Param:
    key: str  # a dotted pipeline field, e.g. algo.config.lr
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    choices: tuple = ()

    @property
    def spec(self) -> str:
        if self.kind == "choice":
            return "choice:" + ",".join(str(c) for c in self.choices)
        return f"{self.kind}:{self.low:g}:{self.high:g}"

    def extremes(self) -> list:
        """The values that must all be allowed by the pipeline for every sample to be."""
        return list(self.choices) if self.kind == "choice" else [self.low, self.high]

    def suggest(self, trial):
        """A value from an Optuna trial (its sampler decides)."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high))
        return trial.suggest_float(self.key, float(self.low), float(self.high), log=self.kind == "loguniform")

    def sample(self, rng: random.Random):
        """A value drawn uniformly (on a log scale for loguniform): PBT's first population."""
        if self.kind == "choice":
            return rng.choice(self.choices)
        if self.kind == "int":
            return rng.randint(int(self.low), int(self.high))
        if self.kind == "loguniform":
            return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        return rng.uniform(float(self.low), float(self.high))

    def perturb(self, value, rng: random.Random, factors=(0.8, 1.2), resample_p: float = 0.25):
        """PBT's explore step: a number scaled by one of ``factors`` and kept in range; a choice
        drawn afresh with probability ``resample_p``."""
        if self.kind == "choice":
            return rng.choice(self.choices) if rng.random() < resample_p else value
        scaled = min(max(value * rng.choice(factors), self.low), self.high)
        return int(round(scaled)) if self.kind == "int" else float(scaled)


def parse_param(text: str) -> Param:
    """``KEY=SPEC`` to a Param; PipelineError in one line naming what is wrong and what is allowed."""
    key, sep, spec = text.partition("=")
    key = key.strip()
    if not sep or not key or not all(key.split(".")):
        raise PipelineError(f"--param: KEY=SPEC expected, with a dotted pipeline field as KEY "
                            f"(e.g. algo.config.lr=loguniform:1e-4:1e-2), got {text!r}")
    kind, _, rest = spec.strip().partition(":")
    bad = f"--param {key}: {spec!r} does not parse; allowed: {SPEC_FORMS}"
    if kind not in KINDS or not rest:
        raise PipelineError(bad)
    if kind == "choice":
        import yaml

        try:
            choices = tuple(float(c) if EXPONENT.fullmatch(c) else yaml.safe_load(c) for c in rest.split(","))
        except yaml.YAMLError:
            raise PipelineError(bad) from None
        if not choices or any(c is None or isinstance(c, (list, dict)) for c in choices) or len(set(choices)) != len(choices):
            raise PipelineError(f"{bad} (choices must be distinct numbers or words)")
        return Param(key, kind, choices=choices)
    parts = rest.split(":")
    try:
        low, high = (int(x) for x in parts) if kind == "int" else (float(x) for x in parts)
    except ValueError:
        raise PipelineError(bad + ("" if len(parts) == 2 else " (two bounds)") + (" (whole numbers)" if kind == "int" else "")) from None
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        raise PipelineError(f"--param {key}: need LO < HI, both finite (got {low:g}, {high:g})")
    if kind == "loguniform" and low <= 0:
        raise PipelineError(f"--param {key}: loguniform needs LO > 0 (got {low:g})")
    return Param(key, kind, low, high)


def check_space(base, params: list[Param]):
    """Every parameter names a field of the pipeline ``base`` and every value in its range is
    allowed there: the pipeline is loaded with each end of each range (each choice). Returns
    ``base``; PipelineError in one line otherwise."""
    from tianji_dask.config import parse_pipeline

    if not params:
        raise PipelineError("--param: give at least one KEY=SPEC to search")
    keys = [p.key for p in params]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup is not None:
        raise PipelineError(f"--param {dup}: given twice; allowed: one range per field")
    raw = base.model_dump(mode="json")
    for param in params:
        for value in param.extremes():
            try:
                parse_pipeline(raw, overrides={param.key: value})
            except PipelineError as err:
                if "unknown key" in str(err):
                    raise PipelineError(f"--param {err}") from None
                raise PipelineError(f"--param {param.key}={param.spec}: the value {value!r} is not allowed: {err}") from None
    return base
