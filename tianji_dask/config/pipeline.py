"""The pipeline: its sections (``sections.py``) together and the rules between them, validated from
YAML; loading, overrides and the resolved YAML. What a user gets wrong is one ``PipelineError``
line, as in the sections.
"""

from __future__ import annotations

import os
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from tianji_dask.algos import config_model, validate_config
from tianji_dask.config.bundled import resolve_pipeline_path
from tianji_dask.config.extras import check_env
from tianji_dask.config.renamed import renamed, renamed_overrides
from tianji_dask.config.sections import (
    AlgoSection,
    BalanceConfig,
    CheckpointConfig,
    ClusterConfig,
    ControllerConfig,
    EnvConfig,
    EvalConfig,
    LearnerConfig,
    LoggingConfig,
    Mode,
    ReduceConfig,
    StopConfig,
    StrictModel,
)
from tianji_dask.config.validation import one_line
from tianji_dask.errors import PipelineError


class Pipeline(StrictModel):
    name: str = "run"
    env: EnvConfig
    algo: AlgoSection
    mode: Mode = "relaxed"
    seed: int = Field(0, ge=0, le=2**31 - 1)
    explorers: int = Field(2, ge=1, le=4096, description="explorer streams (each a vector env)")
    chunk_steps: int = Field(64, ge=1, le=1_000_000, description="vector steps per chunk")
    groups: int = Field(1, ge=1, le=256, description="learner groups, each a learner with `explorers` explorer streams "
                        "of its own; their models are averaged every reduce.every updates")
    reduce: ReduceConfig = Field(default_factory=ReduceConfig, description="group mode: model fusion")
    stop: StopConfig
    controller: ControllerConfig = Field(default_factory=ControllerConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    balance: BalanceConfig | None = Field(None, description="TianJi's balance helper: derive chunk_steps and publish_every from the explorer count")
    eval: EvalConfig | None = Field(None, description="evaluation during training (relaxed and lockstep modes, one group)")
    callbacks: list[Any] = Field(default_factory=list, description="callbacks the learner calls as the run goes: each "
                                 "'module:Class' or {class: 'module:Class', kwargs: {...}} naming a subclass of "
                                 "tianji_dask.Callback, built in the learner's process")

    @model_validator(mode="after")
    def _callbacks(self):
        from tianji_dask.callbacks.entries import check

        try:
            check(self.callbacks)
        except ValueError as err:
            raise PipelineError(str(err)) from None
        return self

    @model_validator(mode="after")
    def _eval(self):
        if self.eval is not None and (self.mode == "single" or self.groups > 1):
            raise PipelineError("eval: runs on explorer workers beside one learner; allowed: mode relaxed or lockstep, groups 1")
        if self.stop.on == "eval" and (self.eval is None or self.stop.target_return is None):
            raise PipelineError("stop.on: 'eval' solves on evaluations; give an eval section and stop.target_return")
        return self

    @model_validator(mode="after")
    def _balance(self):
        if self.balance is None:
            return self
        if "chunk_steps" in self.model_fields_set or "publish_every" in self.learner.model_fields_set:
            raise PipelineError("balance: derives chunk_steps and learner.publish_every; give either balance or those, not both")
        a = self.explorers
        # assignment re-runs validators; set through __dict__ to avoid recursion
        self.__dict__["chunk_steps"] = max(1, round(self.balance.chunk_steps_total / a))
        self.learner.__dict__["publish_every"] = max(1, round(self.balance.publish_every_total / a))
        return self

    @model_validator(mode="after")
    def _groups(self):
        if self.groups > 1 and self.mode == "single":
            raise PipelineError("groups: single mode runs one learner in one process; use mode relaxed or lockstep "
                                f"for {self.groups} groups")
        return self

    @model_validator(mode="after")
    def _replicas(self):
        n = self.learner.replicas
        if n == 1:
            return self
        why = None
        if self.mode == "single":
            why = "single mode runs one learner in one process; use mode relaxed or lockstep"
        elif self.groups > 1:
            why = "not with groups > 1 (each group's learner would need replicas of its own); allowed: groups 1"
        elif self.explorers < n:
            why = f"each replica needs explorer streams of its own: explorers {self.explorers} < replicas {n}"
        elif self.eval is not None:
            why = "not with eval yet (evaluation runs beside one learner); allowed: no eval section"
        elif self.cluster.learner_lifetime is not None:
            why = "not with cluster.learner_lifetime yet (a handoff moves one learner); allowed: no learner_lifetime"
        if why is not None:
            raise PipelineError(f"learner.replicas: {n}: {why}")
        return self

    @model_validator(mode="after")
    def _explorer_kwargs(self):
        from tianji_dask.envs.simulate import KEYS

        bad = [i for i in self.env.explorer_kwargs if not 0 <= i < self.explorers]
        if bad:
            raise PipelineError(f"env.explorer_kwargs: explorer {bad[0]} does not exist; allowed 0..{self.explorers - 1}")
        for i, kwargs in self.env.explorer_kwargs.items():
            for key in KEYS:
                value = kwargs.get(key, 0.0)
                if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= (60_000 if key == "step_cost_ms" else 10):
                    raise PipelineError(f"env.explorer_kwargs.{i}.{key}: must be a number >= 0 (got {value!r})")
        return self

    def env_kwargs_for(self, explorer_id: int) -> dict:
        """Gymnasium kwargs of explorer stream ``explorer_id`` (streams are numbered across groups:
        group g owns g x explorers ... (g + 1) x explorers - 1; explorer_kwargs are per group)."""
        from tianji_dask.envs.simulate import KEYS

        merged = {**self.env.kwargs, **self.env.explorer_kwargs.get(explorer_id % self.explorers, {})}
        return {k: v for k, v in merged.items() if k not in KEYS}

    def step_cost_for(self, explorer_id: int):
        """Stream ``explorer_id``'s simulated cost (``simulate.StepCost``; false when none)."""
        from tianji_dask.envs.simulate import StepCost

        own = self.env.explorer_kwargs.get(explorer_id % self.explorers, {})
        return StepCost(float(own.get("step_cost_ms", self.env.step_cost_ms)),
                        float(own.get("step_cost_jitter", self.env.step_cost_jitter)))

    def simulated(self) -> dict | None:
        """What results and the dashboard say of a run whose env steps carry a simulated cost."""
        costs = {eid: self.step_cost_for(eid) for eid in range(self.explorers * self.groups)}
        if not any(costs.values()):
            return None
        return {"step_cost_ms": self.env.step_cost_ms, "step_cost_jitter": self.env.step_cost_jitter,
                "per_stream": {eid: {"step_cost_ms": c.ms, "step_cost_jitter": c.jitter} for eid, c in costs.items()
                               if (c.ms, c.jitter) != (self.env.step_cost_ms, self.env.step_cost_jitter)},
                "about": "env dynamics, rewards and learning are real; each env step also sleeps its simulated cost"}

    @property
    def learner_actors(self) -> int:
        """Learner actors the run builds: one per group, or one per replica (never both)."""
        return self.groups * self.learner.replicas

    def group_streams(self, group: int) -> list[int]:
        """The explorer streams learner ``group`` feeds on: a group's own ``explorers`` streams, or a
        replica's share of the ``explorers`` (every ``replicas``-th, from its index)."""
        replicas = self.learner.replicas
        if replicas > 1:
            return list(range(group, self.explorers, replicas))
        return list(range(group * self.explorers, (group + 1) * self.explorers))

    @property
    def updates_per_pass(self) -> int:
        import math

        u = self.learner.updates_per_pass
        return max(1, round(math.log(self.explorers))) if u == "ln_explorers" else int(u)

    @model_validator(mode="after")
    def _algo_config(self):
        try:
            config = validate_config(self.algo.cls, self.algo.config)
        except ValidationError as err:
            raise PipelineError(one_line(err, prefix="algo.config", model=config_model(self.algo.cls),
                                         elsewhere=[("", type(self))])) from None
        # every hyperparameter with its value, defaults included: what pipeline.yaml and results
        # record, so a later default cannot change a resumed run (a config that would not load
        # back the same, e.g. one holding objects, stays as given)
        try:
            full = config.model_dump(mode="json")
            if validate_config(self.algo.cls, full) == config:
                self.algo.__dict__["config"] = full
        except (ValueError, TypeError):
            pass
        return self

    @property
    def algo_config(self):
        return validate_config(self.algo.cls, self.algo.config)


def parse_pipeline(data: Any, *, source: str = "pipeline", overrides: dict | None = None) -> Pipeline:
    """Validate a dict (as loaded from YAML) into a Pipeline, applying ``overrides`` (dotted keys).
    A renamed field's old name (``renamed.RENAMED``), in either, is read as its new name."""
    if not isinstance(data, dict):
        raise PipelineError(f"{source}: must be a mapping of fields, got {type(data).__name__}")
    overrides = renamed_overrides(overrides or {})
    data = apply_overrides(renamed(data), overrides)
    check_env(data.get("env"))  # an optional package the env needs: its install command, before the env is looked up
    try:
        pipeline = Pipeline.model_validate(data)
    except PipelineError:
        raise
    except ValidationError as err:
        raise PipelineError(one_line(err, model=Pipeline, overrides=overrides, elsewhere=_algo_model(data))) from None
    return pipeline


def _algo_model(data: dict) -> list[tuple[str, type]]:
    """Where an unknown key may belong besides the pipeline's sections: the named algorithm's
    hyperparameters, when it names one that resolves."""
    from tianji_dask.algos import resolve_algorithm

    try:
        return [("algo.config.", config_model(resolve_algorithm(data["algo"]["name"])))]
    except (KeyError, TypeError, ValueError):
        return []


def apply_overrides(data: dict, overrides: dict) -> dict:
    """A copy of ``data`` with each dotted key of ``overrides`` set (missing or null sections made)."""
    import copy

    data = copy.deepcopy(data)
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            if node.get(part) is None:  # absent, or null as a resolved pipeline writes an unset section
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise PipelineError(f"{dotted}: cannot set inside {part!r}, which is not a mapping")
        node[leaf] = value
    return data


def pipeline_yaml(pipeline: Pipeline) -> str:
    """The resolved pipeline as YAML that loads back to an equal pipeline (every field, defaults
    filled in)."""
    data = pipeline.model_dump(mode="json")
    if pipeline.balance is not None:  # derived from balance: giving them too is an error
        data.pop("chunk_steps")
        data["learner"].pop("publish_every")
    return yaml.safe_dump(data, sort_keys=False)


def load_pipeline(path: str | os.PathLike, overrides: dict | None = None) -> Pipeline:
    """Load a pipeline YAML file (``yaml.safe_load``) or a bundled pipeline name like
    ``cartpole_ppo``."""
    p = resolve_pipeline_path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise PipelineError(f"pipeline: cannot read {str(path)!r}: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "malformed YAML"
        raise PipelineError(f"pipeline: malformed YAML in {p.name}{where}: {problem}") from None
    return parse_pipeline(data, source=p.name, overrides=overrides)
