"""The Run handle: what a notebook or the CLI holds while training goes on. Where the learners
live is its backend's business (``backend.py``: this process, or a Dask cluster)."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from tianji_dask.callbacks.entries import check_objects
from tianji_dask.config import PipelineError, load_pipeline, resolve_pipeline_path
from tianji_dask.config.from_env import target_note
from tianji_dask.core.stop import StopRules
from tianji_dask.dataflow.controller import settings as controller_settings
from tianji_dask.errors import RunFault
from tianji_dask.launch import forkserver, main_guard
from tianji_dask.run import legs, picture, provenance, quiet, results_writer, run_folder, specs
from tianji_dask.run.backend import Backend, RunPlan, SingleBackend
from tianji_dask.run.checks import PipelineLike, as_pipeline, check_pipeline
from tianji_dask.run.ending import Ending
from tianji_dask.run.progress import Progress, in_notebook, show_page
from tianji_dask.run.startup import process_start_time

if TYPE_CHECKING:
    from distributed import Client

CHECKPOINT_SEED_STRIDE = 7919  # env seeds of a run started from version v: seed + stride * (v + 1)


class Run:
    """One training run.

    ``pipeline``: a Pipeline, a dict, a YAML path or a bundled name (``"cartpole_ppo"``).
    ``client``: a connected ``distributed.Client``; when None (and the pipeline does not name a
    scheduler) an embedded LocalCluster is started and closed with the run.
    ``overrides``: dotted pipeline fields, e.g. ``{"mode": "lockstep", "stop.max_seconds": 60}``.
    ``learner_worker``, ``explorer_workers``: on a cluster several runs share at once (a sweep),
    the LEARNER worker this run's learner lives on and the EXPLORER workers its streams may use;
    such a run leaves the cluster-wide figures (CPU, explorer memory, dataflow overhead) out of
    its results, since they would count the other runs too.
    ``algorithm``: the algorithm as ``algo.name`` takes it, e.g. a subclass of ``tianji_dask.Algorithm``
    defined in a notebook cell (it travels to the workers by value); ``algo.config`` must suit it.
    ``callbacks``: ``tianji_dask.Callback`` objects, called after the pipeline's own; in single mode
    these very objects, otherwise a copy in each learner's process (cloudpickled, as Dask sends it).
    ``progress``: one live line of the run's status while ``wait`` waits (in place on a terminal or in
    a notebook, every 5 s elsewhere); None (the default): only in a Jupyter notebook.
    ``verbose``: let distributed's warnings and logs below ERROR through; by default they are kept
    from the terminal and the notebook, and what matters is one ``tianji_dask`` line.
    ``imported_at``: when the caller's own imports were done (the CLI's), for the start-up record.
    A bad pipeline, setting or argument raises ``PipelineError`` (one line) before anything starts.
    """

    def __init__(self, pipeline: PipelineLike, client: Client | None = None, *, out: str | os.PathLike | None = None,
                 overrides: dict | None = None, learner_worker: str | None = None,
                 explorer_workers: list[str] | None = None, algorithm: type | str | None = None,
                 callbacks: list | None = None, progress: bool | None = None, verbose: bool = False,
                 imported_at: float | None = None, _resume_from: list[str] | None = None, _from_version: int = -1):
        # when each step of the start was reached (Unix times)
        self._startup: dict[str, float] = {"import": imported_at or time.time()}
        if algorithm is not None:  # a class (e.g. a notebook's) or 'module:Class', as algo.name
            overrides = {**(overrides or {}), "algo.name": algorithm}
        p = self.pipeline = as_pipeline(pipeline, overrides)
        #: the file the pipeline was loaded from (None: given as a dict or a Pipeline)
        self.source = resolve_pipeline_path(pipeline) if isinstance(pipeline, (str, os.PathLike)) else None
        self.progress = in_notebook() if progress is None else bool(progress)
        self.verbose = bool(verbose)
        self._provenance: dict | None = None
        self.run_id = uuid.uuid4().hex[:8]
        #: what the run's Dask keys and the controller's books go by: the run id, but each resumed
        #: leg's own (a cluster may still hold an earlier leg's keys; results keep the run id)
        self.run_key = self.run_id
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.out = Path(out) if out is not None else Path("runs") / f"{p.name}-{p.mode}-{stamp}-{self.run_id}"
        if self.out.exists() and not self.out.is_dir():
            raise PipelineError(f"out: {str(self.out)!r} exists and is not a directory")
        if _resume_from is None and self.out.exists() and any(self.out.iterdir()):
            raise PipelineError(f"out: directory {str(self.out)!r} exists and is not empty")
        #: per group, the checkpoint its learner starts from (None: from scratch)
        self.resume_from: tuple[str | None, ...] = tuple(_resume_from or (None,) * p.learner_actors)
        # a run continued from version v plays env seeds none of the first v's episodes used
        self._env_seed = CHECKPOINT_SEED_STRIDE * (1 + _from_version)
        self.learner_worker = learner_worker
        self.explorer_hosts = None if explorer_workers is None else tuple(explorer_workers)
        self._client = client
        self._backend: Backend | None = None
        self._attaching = False  # made by ``attach``: ``start`` reconnects to the run instead
        #: a resume's: the results of the leg it continues (``legs.previous_results``), None for a first leg
        self._before: dict | None = None
        #: what this leg's results say of the legs before it (``legs.history``), set as it starts
        self._earlier: dict | None = None
        self._ending: Ending | None = None  # waiting for the end, once started
        self._drawing = None  # the thread drawing learning_curve.png
        #: ``wait()`` returns once learning_curve.png is written (True), or as soon as the results
        #: are, the picture still being drawn (False): the CLI says how the run ended first, then
        #: waits for it with ``picture_written``
        self.wait_for_picture = True
        self.results: dict | None = None
        #: newer checkpoints a resume passed over, one line each (damaged files)
        self.skipped_checkpoints: list[str] = []
        self.results_path: Path | None = None
        #: seconds from the learner's stop to the results written and to the cluster closed
        self.shutdown: dict[str, float] | None = None
        self.t_process_start = process_start_time()
        self._rules = StopRules.of(p.stop)
        self._prepared = check_pipeline(p, has_client=client is not None)
        self.callbacks = check_objects(callbacks, p.mode)
        self._startup["checked"] = time.time()
        #: what the user should know of the pipeline as checked (each also said once, one line)
        self.notes: list[str] = [n for n in [target_note(p, overrides)] if n]
        for note in self.notes:
            quiet.say(note)

    @classmethod
    def resume(cls, run_dir: str | os.PathLike, client: Client | None = None, *, overrides: dict | None = None,
               imported_at: float | None = None, **options) -> "Run":
        """A Run that continues a stopped or crashed run from its newest checkpoint that loads
        (``skipped_checkpoints`` says which newer ones did not, and why), writing to the same
        directory: the learner's version, the episodes so far and the clock go on from there.
        ``overrides`` apply on top of the run's pipeline (e.g. a new time budget)."""
        from tianji_dask.core import checkpoint

        d = Path(run_dir)
        if not (d / "pipeline.yaml").is_file():
            raise PipelineError(f"run_dir: {str(d)!r} is not a run directory (no pipeline.yaml)")
        legs.check(d, overrides)  # a rule still in force: one line, nothing started or changed
        pipeline = load_pipeline(d / "pipeline.yaml", overrides=overrides)
        found = specs.newest_checkpoints(d, pipeline)  # one line when none loads
        run = cls(pipeline, client, out=d, imported_at=imported_at, _resume_from=[str(path.resolve()) for path, _, _ in found],
                  _from_version=max(int(state["version"]) for _, state, _ in found), **options)
        run.skipped_checkpoints = [line for _, _, skipped in found for line in skipped]
        run._before = legs.previous_results(d) or {}
        run.run_id = run._before.get("run_id") or run.run_id  # one run, one id, however many legs (run_key: this leg's)
        return run

    @classmethod
    def attach(cls, run_dir: str | os.PathLike, **options) -> "Run":
        """A Run for a run that trains on without its driver: one started on a scheduler of its
        own making (``cluster.kind: address``) whose driver died. ``start`` reconnects to it and
        makes this process its one driver; ``wait`` then writes its results as its first driver
        would have. PipelineError in one line for a run directory with no live run."""
        from tianji_dask.run import attach

        d = Path(run_dir)
        record = attach.read_run_file(d)
        run = cls(load_pipeline(d / "pipeline.yaml"), out=d, _resume_from=record["resume_from"], **options)
        run.run_id, run.t_process_start, run._env_seed = record["run_id"], record["t_process_start"], record["env_seed"]
        run.run_key = record.get("run_key", run.run_id)
        run._earlier = record.get("earlier")
        run._startup = dict(record["startup"])
        run._attaching = True
        return run

    @classmethod
    def from_checkpoint(cls, pipeline: PipelineLike, checkpoint_path: str | os.PathLike, client: Client | None = None, *,
                        out: str | os.PathLike, overrides: dict | None = None,
                        **placement) -> "Run":
        """A new run (its own folder) that starts from another run's checkpoint: its weights,
        optimizer moments, version and clock, with this pipeline's settings (population-based
        training's exploit step). Needs the same env and algorithm as the checkpoint's run."""
        from tianji_dask.core import checkpoint

        version = int(checkpoint.load(checkpoint_path)["version"])  # fail here, in one line, on a damaged file
        learners = as_pipeline(pipeline, overrides).learner_actors  # replicas but the first take its policy, not its books
        return cls(pipeline, client, out=out, overrides=overrides, _resume_from=[str(Path(checkpoint_path).resolve())] * learners,
                   _from_version=version, **placement)

    def law(self) -> dict:
        """The controller's settings for this run, defaults filled in."""
        return specs.law(self.pipeline, self._prepared).to_wire()

    @property
    def plan(self) -> RunPlan:
        return RunPlan(pipeline=self.pipeline, prepared=self._prepared, run_id=self.run_key, out=self.out,
                       t_process_start=self.t_process_start, env_seed=self._env_seed, resume_from=self.resume_from,
                       learner_worker=self.learner_worker, explorer_hosts=self.explorer_hosts, callbacks=self.callbacks,
                       verbose=self.verbose)

    # ---- what the backend holds ------------------------------------------------------------
    @property
    def backend(self) -> Backend | None:
        """Where the learners live, once started: ``SingleBackend`` (its ``core`` is the learner
        core, in this process) or ``DaskBackend``."""
        return self._backend

    @property
    def client(self) -> Client | None:
        """The ``distributed.Client`` the run trains on (None in single mode, or before start)."""
        return self._backend.client if self._backend is not None else self._client

    @property
    def cluster(self):
        """The cluster the run started for itself, while it is open (None otherwise)."""
        return None if self._backend is None else self._backend.cluster

    @property
    def dashboard_link(self) -> str | None:
        return None if self._backend is None else self._backend.dashboard_link

    @property
    def shares_cluster(self) -> bool:
        """Placed on a cluster that other runs use at the same time (a sweep)."""
        return self.plan.shares_cluster

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self) -> "Run":
        """Start (or join) the cluster and the learners; returns at once, the run training."""
        if self._backend is not None:
            raise RuntimeError("start: this run has already started")
        if self.pipeline.mode != "single" and self._client is None and self.pipeline.cluster.kind == "local":
            main_guard.refuse_unguarded()  # its workers would run the script again: one line, exit 2
        forkserver.quiet_resource_tracker(self.verbose)
        with quiet.kept_quiet(self.verbose):
            self._start()
        self._ending = Ending(self._backend, self._rules, self.pipeline.learner_actors, self.stop,
                              replicas=self.pipeline.learner.replicas > 1)
        moved = quiet.dashboard_moved(self.pipeline.cluster.dashboard_address, self.dashboard_link) if self.cluster else None
        if moved:
            quiet.say(f"dashboard port {moved[0]} is taken; using {moved[1]}")
        return self

    def _start(self) -> None:
        if self._attaching:
            from tianji_dask.run.dask_backend import DaskBackend

            self._backend = DaskBackend(self.plan)
            try:
                self._backend.attach()
            except BaseException:
                self._backend.close()
                raise
            return
        self._provenance = provenance.at_start(self.pipeline, self.source)
        outlives = self.pipeline.mode != "single" and self._client is None and self.pipeline.cluster.kind == "address"
        if self._before is not None:  # a resume: the last leg's records move apart before this one writes any
            legs.archive(self.out)
            self._earlier = legs.history(self.out, self._before)
        fresh = run_folder.prepare(self.out, self.pipeline, run_file={  # what `tianji-dask attach` reads back
            "run_id": self.run_id, "run_key": self.run_key, "scheduler": self.pipeline.cluster.address,
            "t_process_start": self.t_process_start,
            "startup": self._startup, "resume_from": list(self.resume_from), "env_seed": self._env_seed,
            "earlier": self._earlier,
        } if outlives else None)
        if self.pipeline.mode == "single":
            self._backend = SingleBackend(self.plan)
        else:
            from tianji_dask.run.dask_backend import DaskBackend

            self._backend = DaskBackend(self.plan, self._client)
        try:
            self._backend.start()
        except BaseException:
            if fresh:  # no cluster, no learner: nothing was trained, and a folder of one file is no run
                self.close()
                shutil.rmtree(self.out, ignore_errors=True)
            raise

    def _started(self) -> Backend:
        if self._backend is None:
            raise RuntimeError("this run has not started: call run.start() first")
        return self._backend

    def status(self) -> dict:
        """The run's live figures; in group mode pooled over groups, each group's under "groups"."""
        if self._backend is None or self._ending is None:
            return {"done": False}
        reports = self._backend.reports(0.0)
        if reports is None:  # a learner was just rebuilt
            return {"done": False}
        return self._ending.pooled(reports)

    def wait(self, timeout: float | None = None, poll_s: float = 0.25, on_status: Callable[[dict], None] | None = None) -> dict:
        """Block until the run ends (or ``timeout`` s, then stop it); write and return results.
        ``on_status(status)`` is called with each status; should it raise (or the driver's own
        supervision), the run is stopped and its results written, ``stop_reason: driver_error``."""
        if self.results is not None:
            return self.results
        backend = self._started()
        with quiet.kept_quiet(self.verbose), Progress(self.pipeline.mode, self.progress) as progress:
            ended = self._ending.wait(timeout, poll_s, on_status, progress)
        results, episodes, chunks, replay = self._ending.results(self._record(), ended)
        if ended.lost is not None:
            backend.abandon()
        self.results = results  # the caller's, in memory, even when the folder cannot take it
        try:
            self.results_path = results_writer.write(self.out, results, episodes, chunks, replay)
        except RunFault:
            self.close()
            raise
        t_written = time.time()
        self._drawing = picture.start(self.pipeline.logging.plot, self.out, results, episodes, chunks)  # as the cluster closes
        self.close()
        if ended.lost is None:
            t_stop = results["t_run_start"] + results["wall_s"]
            self.shutdown = {"results_written_s": t_written - t_stop, "closed_s": time.time() - t_stop}
        if self.wait_for_picture:
            self.picture_written()
        return results

    def picture_written(self, timeout: float = picture.WAIT_S) -> None:
        """Wait (at most ``timeout`` s) until learning_curve.png is written, or has failed to be."""
        picture.finish(self._drawing, timeout)

    def _record(self) -> results_writer.RunRecord:
        """What the results say of the run besides its learners' books (its origins read as it
        started; an attached run's now)."""
        return results_writer.RunRecord(
            pipeline=self.pipeline, run_id=self.run_id, rules=self._rules, out=self.out,
            t_process_start=self.t_process_start, startup={**self._startup, **self._backend.startup},
            provenance=self._provenance or provenance.at_start(self.pipeline, self.source), env_seed=self._env_seed,
            earlier=self._earlier)

    def _cluster_backend(self, what: str):
        from tianji_dask.run.dask_backend import DaskBackend

        if not isinstance(self._backend, DaskBackend) or self._backend.client is None:
            raise RuntimeError(f"{what}: this run has no cluster (single mode, or not started)")
        return self._backend

    def controller_state(self, history: bool = False, group: int | None = None) -> dict:
        """The controller's live state (window, targets, staleness so far, credits): group 0's,
        with every group's under "groups" in group mode, or one ``group``'s."""
        return self._cluster_backend("controller_state").controller_state(history=history, group=group)

    def live(self, height: int = 1000) -> str:
        """In Jupyter: the run's ``/tianji`` dashboard page (live, about twice a second) in the
        notebook, with links to it and to the whole dashboard."""
        if not self.dashboard_link:
            raise RuntimeError("live: this run has no dashboard (single mode, not started, or cluster.dashboard_address: null)")
        return show_page(self.dashboard_link, self.run_key, height)

    def configure(self, **settings) -> dict:
        """Change the staleness controller while the run goes on, e.g.
        ``run.configure(staleness_target=4)``. Accepts the settings
        ``dataflow.controller.settings.LIVE`` names (replay_ratio as [min, max]); ``None`` switches
        a target or filter off. Returns the controller's new state. A bad value raises ValueError,
        the line a pipeline's would read without its ``controller.``."""
        values = controller_settings.read_live(settings)
        if self.pipeline.mode != "relaxed":
            raise RuntimeError("configure: only a running relaxed-mode run has a controller to configure")
        controller_settings.window_floor(values, self._prepared.chunks_per_update, self.pipeline.algo.label)
        return self._cluster_backend("configure").configure(**settings)

    def stop(self) -> None:
        if self._backend is not None:
            self._backend.stop()

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
