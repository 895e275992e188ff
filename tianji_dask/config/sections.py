"""The sections of a pipeline (env, algo, stop, controller, learner, cluster, ...) as typed models.

Every error a user can cause here becomes one ``PipelineError`` line naming the field and what
is allowed; the CLI prints it and exits 2 before anything starts or is written.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    create_model,
    field_serializer,
    field_validator,
    model_validator,
)

from tianji_dask.algos import ALLOWED, algorithm_label, resolve_algorithm
from tianji_dask.config.addresses import listen_address, scheduler_address
from tianji_dask.config.bundled import (  # noqa: F401 - config's API
    bundled_pipelines,
    bundled_pipelines_dir,
    resolve_pipeline_path,
)
from tianji_dask.dataflow.controller import settings as controller
from tianji_dask.errors import PipelineError
from tianji_dask.importing import spec_of

Mode = Literal["relaxed", "lockstep", "single"]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# the field env.register "shadows" ABCMeta.register (pydantic's metaclass), which no model uses
warnings.filterwarnings("ignore", 'Field name "register" in "EnvConfig" shadows', UserWarning)


class EnvConfig(StrictModel):
    id: Any = Field(description="a gymnasium id (CartPole-v1; 'module:Name-v0' imports module first, which registers it), "
                    "or 'module:Name' naming a gymnasium.Env subclass or a callable returning an env (Name is taken as a "
                    "registered id when module registered one, else as the module's attribute); from Python also the class "
                    "or callable itself, or an id registered with gymnasium.register in the calling process (a class of "
                    "__main__, such as a notebook's, travels to the workers by value)")
    register: str | None = Field(None, description="'module:callable' called with no arguments, in every process that makes "
                                 "envs, before env.id is checked or made: a third-party env's id registration, e.g. "
                                 "minatar.gym:register_envs for MinAtar/Breakout-v1 (pip install 'tianji-dask[minatar]')")
    backend: Literal["gymnasium", "envpool"] = Field(
        "gymnasium", description="what makes the explorers' vector envs: gymnasium (gymnasium.make_vec) or envpool, "
        "EnvPool's C++ vector env of one of its own ids (faster stepping; no wrappers, register or class; env.kwargs "
        "among its config keys; pip install 'tianji-dask[envpool]'); next-step autoreset either way")
    num_envs: int = Field(8, ge=1, le=4096, description="envs stepped together inside one explorer")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to gymnasium.make (a class's or factory's "
                                   "constructor arguments)")
    wrappers: list[Any] = Field(default_factory=list, description="wrappers applied in order around each single env, in "
                                "every process that makes envs: each 'module:Class' (a bare name is one of "
                                "gymnasium.wrappers) or {name: 'module:Class', kwargs: {...}}, a gymnasium.Wrapper subclass "
                                "or a callable taking the env; an env with its own vector entry point is then vectorised by "
                                "gymnasium's SyncVectorEnv over wrapped single envs")
    check: bool = Field(True, description="before training, run gymnasium's env checker (check_env) on the env in the "
                        "driver and on one explorer worker: its exceptions stop the run, its warnings are one line")
    max_errors: int | None = Field(None, ge=1, description="stop the run when its envs raise more than this many errors in "
                                   "reset or step within 60 s (all streams together); each error rebuilds that stream's "
                                   "envs and drops its chunk. null: no limit (a stream failing every chunk still stops the "
                                   "run after stop.max_explorer_failures in a row)")
    explorer_kwargs: dict[int, dict[str, Any]] = Field(
        default_factory=dict, description="per explorer stream: kwargs merged over kwargs (heterogeneous explorers); "
        "step_cost_ms and step_cost_jitter here set that stream's simulated cost")
    step_cost_ms: float = Field(0.0, ge=0, le=60_000, description="simulated extra wall time per env step, spent sleeping "
                                "(a simulator whose CPU is elsewhere; N envs stepped in sequence cost N times it); 0: none")
    step_cost_jitter: float = Field(0.0, ge=0, le=10, description="sigma of a lognormal multiplier of the step cost, with "
                                    "mean 1, drawn per chunk per explorer stream from the run's seed (stragglers)")

    @model_validator(mode="after")
    def _resolve(self):
        from tianji_dask.envs import envpool_backend, source, wrappers
        from tianji_dask.envs.vector import EnvId, register

        if self.backend == "envpool":  # what cannot combine with EnvPool is one line (envpool_backend.resolve)
            try:
                task = envpool_backend.resolve(self.id, self.register, self.wrappers, [self.kwargs, *self.explorer_kwargs.values()])
            except ValueError as err:
                raise PipelineError(str(err)) from None
            self.__dict__["id"] = EnvId(task, backend="envpool")
            return self
        try:
            register(self.register)  # here, in the driver; the other processes, before they make envs
        except ValueError as err:
            raise PipelineError(f"env.register: {err}") from None
        try:
            resolved = wrappers.resolve(self.wrappers)
        except ValueError as err:
            raise PipelineError(str(err)) from None
        try:
            env_id = source.resolve_env(self.id, self.register, resolved)
        except ValueError as err:
            raise PipelineError(f"env.id: {err}") from None
        refused = source.wrappers_refused(env_id)
        if refused:
            raise PipelineError(f"env.wrappers: {refused}")
        self.__dict__["id"] = env_id  # what the id carries to the other processes (envs.EnvId)
        return self

    @field_serializer("id", when_used="json")
    def _id_as_written(self, env_id):
        return str(env_id)  # a class or callable as its 'module:qualname' (a notebook's: __main__:Name)

    @field_serializer("wrappers", when_used="json")
    def _wrappers_as_written(self, entries):
        from tianji_dask.envs.wrappers import as_written

        return [as_written(entry) for entry in entries]


class AlgoSection(StrictModel):
    name: Any = Field(description="a bundled algorithm (dqn, impala, maddpg, ppo, sac), 'module:Class' naming a subclass "
                      "of tianji_dask.Algorithm (imported in every process; a class defined in __main__, such as a "
                      "notebook's, is given from Python as the class itself and travels to the workers by value)")
    config: dict[str, Any] = Field(default_factory=dict, description="the algorithm's hyperparameters (its Config model)")

    @field_validator("name")
    @classmethod
    def _known(cls, name):
        if not isinstance(name, (str, type)):
            raise ValueError(f"must be {ALLOWED} (got {type(name).__name__})")
        cls = resolve_algorithm(name)  # ValueError (one line) when it names no usable class
        # a class of __main__ (a notebook's, a script's) stays the class: the workers' __main__ is not the driver's
        return cls if isinstance(name, str) and name.startswith("__main__:") else name

    @field_serializer("name", when_used="json")
    def _spec(self, name):
        return name if isinstance(name, str) else spec_of(name)

    @property
    def cls(self):
        """The algorithm's class."""
        return resolve_algorithm(self.name)

    @property
    def label(self) -> str:
        """What messages call it: the bundled name, the spec, or the class's name."""
        return algorithm_label(self.name)


class StopConfig(StrictModel):
    target_return: float | None = Field(None, description="solved when the running mean reaches it")
    mean_episodes: int = Field(100, ge=1, description="episodes in the running mean (TianJi's rule: 100)")
    max_env_steps: int | None = Field(None, ge=1)
    max_updates: int | None = Field(None, ge=1)
    max_seconds: float | None = Field(None, gt=0)
    on_solve: bool = Field(True, description="stop as soon as the target is reached")
    on: Literal["train", "eval"] = Field("train", description="whose returns solve: training episodes' running "
                                         "mean, or the mean of an evaluation (needs the eval section)")
    max_explorer_failures: int = Field(
        10, ge=1, description="stop when one explorer stream's chunks fail this many times in a row")

    @model_validator(mode="after")
    def _some_stop(self):
        if self.target_return is None and not (self.max_env_steps or self.max_updates or self.max_seconds):
            raise ValueError("give target_return or one of max_env_steps, max_updates, max_seconds")
        return self


class EvalConfig(StrictModel):
    """Evaluation during training: episodes played apart, on explorer workers, with the newest
    published weights; never trained on, holding no window credit."""

    every_s: float | None = Field(None, gt=0, description="evaluate every this many seconds of training")
    every_versions: int | None = Field(None, ge=1, description="evaluate every this many learner versions")
    episodes: int = Field(5, ge=1, le=10_000, description="episodes per evaluation")
    deterministic: bool = Field(True, description="the most likely action (no exploration)")

    @model_validator(mode="after")
    def _when(self):
        if self.every_s is None and self.every_versions is None:
            raise ValueError("give every_s or every_versions")
        return self


def _names(names) -> str:
    """``a``, ``b`` and ``c``."""
    quoted = [f"``{n}``" for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


ControllerFields = create_model("ControllerFields", __base__=StrictModel, __module__=__name__, **controller.model_fields())


class ControllerConfig(ControllerFields):
    __doc__ = (
        "Admission of explorer work (docs/design.md, \"Credits and the window law\").\n\n"
        "Without ``staleness_target`` the window of chunks in flight is fixed. With it, the window moves toward the "
        "target once per control period, clamped to [window_min, window_max]. For algorithms that replay (DQN), "
        "``replay_ratio`` paces explorers so that samples trained per env step stay within [min, max]: no new chunk "
        "is admitted while the ratio would fall below min, and the learner stops updating above max; with "
        "``replay_staleness_target`` the ratio instead moves within that band toward a target age, in versions, of "
        "the samples trained on. In relaxed "
        f"mode {_names(s.name for s in controller.SETTINGS if s.floored)} are at least the chunks one update needs "
        f"(a smaller window deadlocks); a running relaxed-mode run changes {_names(controller.LIVE)} with "
        "``run.configure(...)``."
    )

    @field_validator(*(s.name for s in controller.SETTINGS if s.rule is not None))
    @classmethod
    def _rule(cls, value, info):
        problem = controller.BY_NAME[info.field_name].rule(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _rules(self):
        try:
            controller.check_rules(self.model_dump())
        except ValueError as err:
            raise PipelineError(f"controller.{err}") from None
        return self


class LearnerConfig(StrictModel):
    publish_every: int = Field(1, ge=1, description="publish weights every K versions")
    updates_per_pass: int | Literal["ln_explorers"] = Field(
        1, description="updates between looks at the stream (TianJi: 1, or round(ln A) for A explorers)")
    drop_on_refresh: bool = Field(
        False, description="drop a chunk whose explorer would have received newer weights before it finished (TianJi's refresh)")
    threads: int = Field(1, ge=1, le=256, description="torch intra-op threads in the learner")
    replicas: int = Field(1, ge=1, le=256, description="data-parallel learner replicas training one policy: each on a "
                          "LEARNER worker of its own, fed by its share of the explorer streams; every gradient step "
                          "is averaged across them (torch.distributed: gloo on CPU, NCCL on CUDA)")
    replica_timeout_s: float = Field(120.0, gt=0, description="the longest a replica waits for the others in a "
                                     "collective before the run stops naming the ones that did not answer")
    simulated_step_ms: float = Field(0.0, ge=0, le=60_000, description="simulated extra wall time per gradient step, "
                                     "spent sleeping (as env.step_cost_ms for explorers): how learner replicas scale "
                                     "past this machine's cores, measured with real all-reduces and real data")
    inline_weights_max_kib: float | None = Field(
        64.0, ge=0, description="policy weights of at most this many KiB travel inside each explorer task instead of "
        "as a scattered key the explorers fetch from the learner (fewer messages per version; no wait for on-policy "
        "work); null: always scattered")
    direct_chunks_min_mib: float | None = Field(
        1.0, ge=0, description="chunks of at least this many MiB go from explorer to learner over a direct socket "
        "(a Unix socket on the learner's host, TCP elsewhere) instead of Dask's gather (plain-TCP clusters "
        "only; TLS keeps everything in Dask); null: never")
    device: str = Field("cpu", description="torch device of the learner's networks: cpu, cuda or cuda:N "
                        "(explorers always act on CPU; weights are published as CPU arrays)")
    compile: Literal["auto", "on", "off"] = Field(
        "auto", description="true/on, false/off or auto: torch.compile the algorithm's declared losses on a background thread while the learner "
        "trains eager, swapped in once compiled and checked against eager; auto: on CUDA for runs without a time "
        "budget under 120 s, eager on CPU (slower compiled here)")

    @field_validator("compile", mode="before")
    @classmethod
    def _compile(cls, value):
        return ("on" if value else "off") if isinstance(value, bool) else value  # YAML's on/off

    @field_validator("device")
    @classmethod
    def _device(cls, device: str) -> str:
        import re

        if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
            raise ValueError(f"must be cpu, cuda or cuda:N (got {device!r})")
        return device


class BalanceConfig(StrictModel):
    """TianJi's balance helper for A explorers: chunk = C / A vector steps, publish every K0 / A."""

    chunk_steps_total: int = Field(ge=1, description="C: vector steps per chunk summed over explorers")
    publish_every_total: int = Field(ge=1, description="K0: publish interval (versions) for one explorer")


class CheckpointConfig(StrictModel):
    """Full checkpoints in RUN_DIR/checkpoints (on the learner's machine), for ``tianji-dask resume``."""

    enabled: bool = True
    every_seconds: float | None = Field(60.0, gt=0, description="write one at least this often; null: not by time")
    every_versions: int | None = Field(None, ge=1, description="write one every this many learner versions")
    keep: int = Field(3, ge=1, description="newest checkpoints kept")
    replay_buffer: bool = Field(False, description="include the replay buffer (large); without it a resumed run "
                                "refills its warm-up")


class ReduceConfig(StrictModel):
    """Group mode: how the groups' learners are fused into one model (TianJi's root reducer)."""

    every: int | None = Field(None, ge=1, description="learner updates between fusions; default: 16 for off-policy "
                              "algorithms (TianJi's CartPole DQN), 1 for on-policy ones")
    barrier: bool | None = Field(None, description="a learner waits for the fused model before it trains or asks for "
                                 "explorer work again; default: on for on-policy algorithms, off (asynchronous) otherwise")


class LoggingConfig(StrictModel):
    tensorboard: bool = Field(False, description="TensorBoard scalars in RUN_DIR/tensorboard (needs the tensorboard package)")
    plot: bool = Field(True, description="RUN_DIR/learning_curve.png at the end of the run: its returns against env steps and time")


class LearnerJobConfig(StrictModel):
    cores: int = Field(1, ge=1, description="cores of the learner's job")
    memory: str = Field("4GiB", description="memory of the learner's job, e.g. 8GiB")
    job_extra_directives: list[str] = Field(default_factory=list, description="extra #SBATCH/#PBS lines, e.g. --gres=gpu:1")


class JobQueueConfig(StrictModel):
    """Explorers as an adaptive pool of batch jobs; the learner in a job of its own."""

    queue: str | None = Field(None, description="partition (Slurm) or queue (PBS)")
    account: str | None = None
    cores: int = Field(1, ge=1, description="cores per explorer job (one explorer worker each)")
    memory: str = Field("2GiB", description="memory per explorer job")
    walltime: str = Field("01:00:00", description="per job, HH:MM:SS")
    minimum_jobs: int = Field(1, ge=0, description="explorer jobs kept even when idle")
    maximum_jobs: int | None = Field(None, ge=1, description="explorer jobs at most; default: one per explorer")
    lifetime: str | None = Field(None, description="explorer workers retire gracefully after this (e.g. 55m, below walltime); adapt replaces them")
    lifetime_stagger: str = Field("2m", description="spread of lifetimes, so workers do not retire together")
    job_extra_directives: list[str] = Field(default_factory=list)
    job_script_prologue: list[str] = Field(default_factory=list, description="shell lines before the worker starts (module load, ...)")
    interface: str | None = Field(None, description="network interface of the workers, e.g. ib0")
    local_directory: str | None = None
    start_timeout: float = Field(300, gt=0, description="seconds to wait for the learner's and the first explorer's jobs")
    learner: LearnerJobConfig = Field(default_factory=LearnerJobConfig)

    @model_validator(mode="after")
    def _jobs(self):
        if self.maximum_jobs is not None and self.maximum_jobs < max(self.minimum_jobs, 1):
            raise ValueError(f"maximum_jobs ({self.maximum_jobs}) must be >= minimum_jobs and >= 1")
        return self


class TLSFiles(StrictModel):
    ca_file: str = Field(description="certificate authority (PEM)")
    cert: str = Field(description="this side's certificate (PEM)")
    key: str = Field(description="its private key (PEM)")


class ClusterConfig(StrictModel):
    kind: Literal["local", "address", "slurm", "pbs"] = "local"
    address: str | None = None
    explorer_workers: int | None = Field(None, ge=1, le=1024, description="local explorer worker processes")
    explorer_threads: int | None = Field(None, ge=1, le=1024, description="explorer tasks each explorer worker (local or "
                                         "a batch job) runs at once, one thread each; default: a slot for every explorer stream")
    dashboard_address: str | None = Field(":8787", description="dashboard address (another port is taken if busy); null for none")
    jobqueue: JobQueueConfig = Field(default_factory=JobQueueConfig, description="for kind slurm or pbs")
    security: Literal["none", "temporary"] | TLSFiles = Field(
        "none", description="none; temporary (self-signed TLS for an embedded cluster); or certificate files for tls://")
    learner_lifetime: str | None = Field(
        None, description="each learner's worker (a batch job, or the embedded cluster's learner process) is replaced "
        "after this long (e.g. 55m, below jobqueue.walltime): the learner checkpoints, hands its unconsumed chunks' "
        "credits back, and a learner on a fresh worker goes on from that checkpoint; null: never")

    @field_validator("address")
    @classmethod
    def _scheduler_address(cls, v):
        return None if v is None else scheduler_address(v)

    @field_validator("dashboard_address", mode="before")
    @classmethod
    def _dashboard_address(cls, v):
        if isinstance(v, int) and not isinstance(v, bool):
            v = f":{v}"  # a bare port, as YAML reads 8787
        return listen_address(v) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _address(self):
        if self.kind == "address" and not self.address:
            raise ValueError("kind 'address' needs address: tcp://HOST:PORT")
        if self.kind == "address" and self.security == "temporary":
            raise ValueError("security 'temporary' only works for a cluster started here; give certificate files")
        if self.learner_lifetime is not None:
            lifetime = duration_s(self.learner_lifetime, "learner_lifetime")
            if self.kind == "address":
                raise ValueError("learner_lifetime: a handoff needs a fresh learner worker, which only a cluster the run "
                                 "starts gives (kind local, slurm or pbs)")
            if self.kind in ("slurm", "pbs") and lifetime >= walltime_s(self.jobqueue.walltime):
                raise ValueError(f"learner_lifetime ({self.learner_lifetime}) must be below jobqueue.walltime "
                                 f"({self.jobqueue.walltime}), with room for a checkpoint")
        return self


def duration_s(text: str, field: str) -> float:
    """Seconds of a duration as dask writes them (``90s``, ``55m``, ``1h``, a number of seconds);
    ValueError naming ``field`` otherwise."""
    from dask.utils import parse_timedelta

    try:
        seconds = parse_timedelta(text, default="s")
    except (ValueError, KeyError, TypeError):
        seconds = None
    if not seconds or seconds <= 0:
        raise ValueError(f"{field}: not a positive duration ({text!r}); allowed: e.g. 90s, 55m, 1h")
    return float(seconds)


def walltime_s(text: str) -> float:
    """Seconds of a batch walltime, ``[D-]HH:MM:SS`` or ``MM:SS`` or minutes."""
    days, _, clock = text.rpartition("-")
    parts = [float(x) for x in clock.split(":")]
    seconds = {1: lambda p: p[0] * 60, 2: lambda p: p[0] * 60 + p[1], 3: lambda p: p[0] * 3600 + p[1] * 60 + p[2]}
    return (float(days) * 86400 if days else 0.0) + seconds[min(len(parts), 3)](parts)
