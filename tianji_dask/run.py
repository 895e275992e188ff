"""The Run handle: what a notebook or the CLI holds while training goes on."""

from __future__ import annotations

import functools
import os
import shutil
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

import numpy as np
import psutil

from tianji_dask.algos import make_algorithm
from tianji_dask.config import Pipeline, PipelineError, load_pipeline, parse_pipeline
from tianji_dask.envs import env_spaces
from tianji_dask.metrics import write_results


def group_dirs(run_dir: Path, name: str, groups: int) -> list[Path]:
    """Each group's folder under RUN_DIR/name (one group: RUN_DIR/name itself)."""
    d = Path(run_dir) / name
    return [d] if groups == 1 else [d / f"group-{g}" for g in range(groups)]


def checkpoint_dirs(run_dir: Path, groups: int) -> list[Path]:
    """Where each group's learner writes its checkpoints."""
    return group_dirs(run_dir, "checkpoints", groups)


def _process_start() -> float:
    return psutil.Process(os.getpid()).create_time()


class Run:
    """One training run.

    ``pipeline``: a Pipeline, a dict, a YAML path or a bundled name (``"cartpole_ppo"``).
    ``client``: a connected ``distributed.Client``; when None (and the pipeline does not name a
    scheduler) an embedded LocalCluster is started and closed with the run.
    ``overrides``: dotted pipeline fields, e.g. ``{"mode": "lockstep", "stop.max_seconds": 60}``.
    """

    def __init__(self, pipeline, client=None, *, out: str | os.PathLike | None = None, overrides: dict | None = None,
                 _resume_from: str | None = None):
        if overrides is not None and not isinstance(overrides, dict):
            raise PipelineError(f"overrides: must be a mapping of dotted fields to values, got {type(overrides).__name__}")
        if not isinstance(pipeline, (Pipeline, dict, str, os.PathLike)):
            raise PipelineError(f"pipeline: must be a Pipeline, a dict, a YAML path or a bundled name, got {type(pipeline).__name__}")
        if isinstance(pipeline, Pipeline):
            if overrides:
                pipeline = parse_pipeline(pipeline.model_dump(), overrides=overrides)
        elif isinstance(pipeline, dict):
            pipeline = parse_pipeline(pipeline, overrides=overrides)
        else:
            pipeline = load_pipeline(pipeline, overrides=overrides)
        self.pipeline: Pipeline = pipeline
        self.run_id = uuid.uuid4().hex[:8]
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.out = Path(out) if out is not None else Path("runs") / f"{pipeline.name}-{pipeline.mode}-{stamp}-{self.run_id}"
        self._resume_from = _resume_from
        if self.out.exists() and not self.out.is_dir():
            raise PipelineError(f"out: {str(self.out)!r} exists and is not a directory")
        if _resume_from is None and self.out.exists() and any(self.out.iterdir()):
            raise PipelineError(f"out: directory {str(self.out)!r} exists and is not empty")
        self.client = client
        self.cluster = None
        self._own_client = False
        self._learners: list = []  # the learner actors, one per group
        self._learner_futures: list = []
        self._learner_jobs: list = []  # the learners' batch jobs (kind slurm or pbs)
        self._reducer = None  # group mode: the Reducer actor
        self._reducer_address: str | None = None
        self._task_metrics0: dict = {}
        self._cpu0: dict | None = None  # _cpu_seconds once the learners are built
        self._group_stop: str | None = None  # why the run stopped its groups (group mode)
        self._restarts: list[dict] = []  # learners rebuilt after their worker was lost
        self._env_seed_offset = 0
        self._t_run_start: float | None = None
        self._explorer_workers = 1
        self._single = None
        self._final: list[dict] | None = None  # one per learner (single mode: one)
        self.results: dict | None = None
        self.dashboard_link: str | None = None
        self.t_process_start = _process_start()
        self._check()

    # ---- lifecycle ------------------------------------------------------------------------
    def _check(self) -> None:
        """Build the algorithm once on the client: errors surface before any cluster starts."""
        p = self.pipeline
        try:
            obs_space, act_space = env_spaces(p.env.id, **p.env.kwargs)
        except Exception as err:  # noqa: BLE001 - any failure to build the env is the user's to fix
            raise PipelineError(f"env: cannot create {p.env.id} with kwargs {p.env.kwargs}: {err}") from None
        for eid, extra in p.env.explorer_kwargs.items():
            kwargs = p.env_kwargs_for(eid)
            try:
                spaces = env_spaces(p.env.id, **kwargs)
            except Exception as err:  # noqa: BLE001
                raise PipelineError(f"env.explorer_kwargs: cannot create {p.env.id} for explorer {eid} with kwargs {kwargs}: {err}") from None
            if spaces != (obs_space, act_space):
                raise PipelineError(f"env.explorer_kwargs: explorer {eid}'s env has other spaces than the rest ({spaces})")
        self._make_algo = functools.partial(
            make_algorithm, p.algo.name, obs_space, act_space, p.algo_config.model_dump(), p.seed
        )
        try:
            algo = self._make_algo()  # fail here, before a cluster starts, if the algorithm can't be built
        except ValueError as err:
            raise PipelineError(f"algo.name: {err} ({p.env.id})") from None
        # On-policy chunks hold their credit until they are trained on, so a window smaller than
        # the chunks one update needs would deadlock (DESIGN).
        self._chunks_per_update = int(getattr(algo, "chunks_per_update", lambda: 1)())
        c = p.controller
        for field in ("window", "window_min"):
            value = getattr(c, field)
            if p.mode == "relaxed" and value is not None and value < self._chunks_per_update:
                raise PipelineError(
                    f"controller.{field}: must be >= {self._chunks_per_update}, the chunks one {p.algo.name} update "
                    f"needs (a smaller window deadlocks; got {value})"
                )
        if p.logging.tensorboard:
            from tianji_dask.observe import tensorboard

            if not tensorboard.available():
                raise PipelineError("logging.tensorboard: needs the tensorboard package (pip install tensorboard); "
                                    "tianji_dask does not install it")
        if p.learner.device.partition(":")[0] not in algo.device_types:
            raise PipelineError(f"learner.device: {p.algo.name} trains on {' or '.join(algo.device_types)} only (got {p.learner.device})")
        if p.learner.device != "cpu" and (p.mode == "single" or (self.client is None and p.cluster.kind == "local")):
            from tianji_dask.torch_setup import learner_device

            try:  # the learner will run on this machine: say now if it has no such device
                learner_device(p.learner.device)
            except RuntimeError as err:
                raise PipelineError(str(err)) from None
        r = p.reduce
        self._reduce = {"every": r.every or (1 if algo.on_policy else 16),
                        "barrier": algo.on_policy if r.barrier is None else r.barrier}
        progress = algo.replay_progress()
        if isinstance(c.replay_ratio, tuple) and progress is None:
            raise PipelineError(f"controller.replay_ratio: {p.algo.name} does not replay; remove replay_ratio")
        self._replay_ratio = None
        if progress is not None and c.replay_ratio is not None:
            # auto: [r/2, 2r]. Measured on cartpole_dqn (r = 16): unpaced explorers out-produce the
            # learner and slow its updates; a floor of r itself needs ~13k updates to solve,
            # a floor of r/2 to 3r/8 about 7-8k, and env steps are cheap next to updates here
            r = progress["ratio"]
            self._replay_ratio = list(c.replay_ratio) if c.replay_ratio != "auto" else [r / 2, 2 * r]

    def _spec(self, explorer_workers: int, group: int = 0) -> dict:
        p = self.pipeline
        make_algo = self._make_algo
        spec = {
            "run_id": self.run_id, "mode": p.mode, "explorers": p.explorers, "chunk_steps": p.chunk_steps,
            "chunk_env_steps": p.chunk_steps * p.env.num_envs, "law": self.law(),
            "publish_every": p.learner.publish_every, "updates_per_pass": p.updates_per_pass,
            "drop_on_refresh": p.learner.drop_on_refresh, "threads": p.learner.threads,
            "device": p.learner.device,
            "direct_min_bytes": None if p.learner.direct_chunks_min_mib is None else int(p.learner.direct_chunks_min_mib * 2**20),
            "inline_weights_max_bytes": None if p.learner.inline_weights_max_kib is None else int(p.learner.inline_weights_max_kib * 2**10),
            "explorer_workers": explorer_workers, "t_process_start": self.t_process_start, "stop": p.stop,
            "make_algo": make_algo,
            # written by the learner, so on the learner's machine for a remote cluster
            "tensorboard_dir": str((self.out / "tensorboard").resolve()) if p.logging.tensorboard else None,
            # the chunk log and episodes, spilled as the run goes; removed once in the results
            "rows_dir": str(group_dirs(self.out, "rows", p.groups)[group].resolve()),
            "checkpoint": {
                "dir": str(checkpoint_dirs(self.out, p.groups)[group].resolve()), "every_seconds": p.checkpoint.every_seconds,
                "every_versions": p.checkpoint.every_versions, "keep": p.checkpoint.keep, "replay": p.checkpoint.replay,
            } if p.checkpoint.enabled else None,
            "resume_from": self._resume_from[group] if isinstance(self._resume_from, list) else self._resume_from,
        }
        if p.groups > 1:
            # the run, not each learner, decides when the groups stop: solved on all groups' episodes
            # pooled, env steps and updates summed over groups (see wait)
            spec.update(group=group, streams=p.group_streams(group), reduce=self._reduce,
                        reducer=(self._reducer_address, f"tianji-reducer-{self.run_id}"),
                        stop=p.stop.model_copy(update={"on_solve": False, "max_env_steps": None, "max_updates": None}))
        return spec

    @classmethod
    def resume(cls, run_dir: str | os.PathLike, client=None, *, overrides: dict | None = None) -> "Run":
        """A Run that continues a stopped or crashed run from its newest checkpoint, writing to the
        same directory: the learner's version, the episodes so far and the clock go on from
        there. ``overrides`` apply on top of the run's pipeline (e.g. a new time budget)."""
        from tianji_dask import checkpoint

        d = Path(run_dir)
        if not (d / "pipeline.yaml").is_file():
            raise PipelineError(f"run_dir: {str(d)!r} is not a run directory (no pipeline.yaml)")
        pipeline = load_pipeline(d / "pipeline.yaml", overrides=overrides)
        paths = [checkpoint.latest(c) for c in checkpoint_dirs(d, pipeline.groups)]
        versions = [int(checkpoint.load(path)["version"]) for path in paths]  # fail here, with one line, on a damaged file
        resume_from = [str(path.resolve()) for path in paths]
        run = cls(pipeline, client, out=d, _resume_from=resume_from[0] if pipeline.groups == 1 else resume_from)
        run._env_seed_offset = 1 + max(versions)  # fresh env seeds: no replay of the first episodes
        return run

    def _write_pipeline(self) -> None:
        import yaml

        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "pipeline.yaml").write_text(yaml.safe_dump(self.pipeline.model_dump(mode="json"), sort_keys=False))

    def law(self) -> dict:
        """The controller's settings for this run, defaults filled in. Lockstep runs one chunk
        per explorer per round, so its window is the explorer count and nothing moves it."""
        p, c = self.pipeline, self.pipeline.controller
        if p.mode != "relaxed":
            return {"window": p.explorers}
        w_min = c.window_min or self._chunks_per_update
        w_max = c.window_max or max(16, 4 * p.explorers, w_min)
        return {
            "window": max(p.window, w_min), "staleness_target": c.staleness_target, "window_min": w_min, "window_max": w_max,
            "gain": c.gain, "replay_ratio": self._replay_ratio,
            "max_staleness": c.max_staleness,
        }

    def start(self) -> "Run":
        p = self.pipeline
        self._write_pipeline()  # what `tianji-dask resume` reads back
        if p.mode == "single":
            from tianji_dask.single import SingleProcessRun

            self._single = SingleProcessRun(self._spec(1), p.env.id, p.env.num_envs, p.env_kwargs_for,
                                            p.seed + 7919 * self._env_seed_offset)
            threading.Thread(target=self._run_single, name="tianji-single", daemon=True).start()
            return self
        from distributed import Client

        from tianji_dask.cluster import (
            check_roles, default_explorer_workers, jobqueue_cluster, local_cluster, make_security, stop_active_memory_manager,
        )
        from tianji_dask.dataflow.controller import StalenessController
        from tianji_dask.dataflow.explorer import EnvPool

        explorer_workers = p.cluster.explorer_workers or default_explorer_workers(p.explorers * p.groups)
        timeout = 60
        if self.client is None:
            kind, security = p.cluster.kind, make_security(p.cluster.security)
            if kind == "address":
                self.client = Client(p.cluster.address, security=security)
            elif kind in ("slurm", "pbs"):
                self.cluster, self._learner_jobs = jobqueue_cluster(
                    kind, p.cluster.jobqueue, p.explorers * p.groups, p.cluster.dashboard_address, security, learners=p.groups)
                self.client = Client(self.cluster)
                timeout = p.cluster.jobqueue.start_timeout
            else:
                self.cluster = local_cluster(explorer_workers, p.cluster.dashboard_address, security, learner_workers=p.groups)
                self.client = Client(self.cluster)
            self._own_client = True
        client = self.client
        # a cluster we started has one LEARNER worker per group; on another, groups share them
        counts = check_roles(client, explorer_workers=None, timeout=timeout, learners=p.groups if self._own_client else 1)
        explorer_workers = counts["EXPLORER"]
        stop_active_memory_manager(client)
        self._explorer_workers = explorer_workers
        spec = self._spec(explorer_workers)
        client.register_plugin(StalenessController(spec["law"]["window"]), name="tianji")
        streams = range(p.explorers * p.groups)
        client.register_plugin(
            EnvPool(self.run_id, p.env.id, p.env.num_envs, p.env.kwargs, spec["make_algo"], p.seed + 7919 * self._env_seed_offset,
                    explorer_kwargs={eid: p.env_kwargs_for(eid) for eid in streams if p.env_kwargs_for(eid) != p.env.kwargs}),
            name="tianji-envs",
        )
        self.dashboard_link = client.dashboard_link
        self._task_metrics0 = _task_metrics(client)
        if p.groups > 1:
            from tianji_dask.dataflow.reducer import Reducer

            self._reducer_address = self._learner_workers()[0]
            self._reducer = client.submit(Reducer, p.groups, actor=True, workers=[self._reducer_address],
                                          key=f"tianji-reducer-{self.run_id}").result()
        for group in range(p.groups):
            self._learner_futures.append(self._submit_learner(self._spec(explorer_workers, group), group))
        try:
            self._learners = [future.result() for future in self._learner_futures]
        except RuntimeError as err:
            if str(err).startswith("learner.device:"):  # the learner's machine lacks the device
                raise PipelineError(str(err)) from None
            raise
        self._cpu0 = _cpu_seconds(client)
        return self

    def _learner_workers(self) -> list[str]:
        workers = self.client.scheduler_info(n_workers=-1)["workers"]
        return sorted(a for a, w in workers.items() if w.get("resources", {}).get("LEARNER"))

    def _submit_learner(self, spec: dict, group: int, attempt: int = 0):
        """The learner actor of ``group``; with several groups each on its own LEARNER worker
        while there are enough of them (an actor does not hold its worker's resource)."""
        from tianji_dask.dataflow.learner import Learner

        key = f"tianji-learner-{self.run_id}" + (f"-g{group}" if self.pipeline.groups > 1 else "") + (f"-r{attempt}" if attempt else "")
        workers = None
        if self.pipeline.groups > 1:
            homes = self._learner_workers()
            workers = [homes[group % len(homes)]] if homes else None
        return self.client.submit(Learner, spec, actor=True, resources={"LEARNER": 1}, workers=workers, key=key)

    def _run_single(self) -> None:
        self._final = [self._single.run()]

    def status(self) -> dict:
        """The run's live figures; in group mode pooled over groups, each group's under "groups"."""
        if self._single is not None:
            status = self._single.status()
            status["done"] = self._final is not None
            return status
        if not self._learners:
            return {"done": False}
        return self._pool_status([dict(learner.status().result(timeout=30)) for learner in self._learners])

    def _pool_status(self, statuses: list[dict]) -> dict:
        if len(statuses) == 1:
            return statuses[0]
        stop = self.pipeline.stop
        recent = sorted(tuple(e) for s in statuses for e in s.get("recent_episodes", ()))[-stop.window:]
        mean = sum(r for _, r in recent) / len(recent) if recent else None

        def total(key):
            return sum(s.get(key) or 0 for s in statuses)

        known = [s["staleness_recent_mean"] for s in statuses if s.get("staleness_recent_mean") is not None]
        groups = [{k: v for k, v in s.items() if k != "recent_episodes"} for s in statuses]
        return {
            "version": min(s.get("version", 0) for s in statuses), "updates": total("updates"),
            "env_steps": total("env_steps"), "episodes": total("episodes"), "mean_return": mean,
            "elapsed_s": max((s.get("elapsed_s") or 0) for s in statuses), "env_steps_per_s": total("env_steps_per_s"),
            "staleness_recent_mean": sum(known) / len(known) if known else None,
            "solved": (stop.target_return is not None and len(recent) == stop.window and mean >= stop.target_return),
            "stop_reason": self._group_stop or next((s["stop_reason"] for s in statuses if s.get("stop_reason")), None),
            "chunks_lost": total("chunks_lost"), "chunks_dropped": total("chunks_dropped"),
            "chunks_in_flight": total("chunks_in_flight"), "window": total("window"),
            "fusions": min(s.get("fusions", 0) for s in statuses),
            "done": all(s.get("done") for s in statuses), "groups": groups,
        }

    def controller_state(self, history: bool = False, group: int | None = None) -> dict:
        """The controller's live state (window, targets, staleness so far, credits): group 0's,
        with every group's under "groups" in group mode, or one ``group``'s."""
        if self.client is None:
            raise RuntimeError("controller_state: this run has no cluster (single mode, or not started)")
        return self.client.sync(self.client.scheduler.tianji_state, history=history, group=group)

    def live(self, height: int = 1000):
        """In Jupyter: the run's ``/tianji`` dashboard page (live, about twice a second) in the
        notebook, with links to it and to the whole dashboard."""
        if not self.dashboard_link:
            raise RuntimeError("live: this run has no dashboard (single mode, not started, or cluster.dashboard_address: null)")
        from IPython.display import HTML, IFrame, display

        page = self.dashboard_link.rsplit("/", 1)[0] + "/tianji"
        display(HTML(f'<p>tianji run {self.run_id}: <a href="{page}" target="_blank">{page}</a> · '
                     f'<a href="{self.dashboard_link}" target="_blank">Dask dashboard</a></p>'))
        display(IFrame(page, width="100%", height=height))
        return page

    def configure(self, **settings) -> dict:
        """Change the staleness controller while the run goes on, e.g.
        ``run.configure(staleness_target=4)``. Accepts window, staleness_target, window_min,
        window_max, gain, replay_ratio ([min, max]) and max_staleness; ``None`` switches a target
        or filter off. Returns the controller's new state. Bad values raise ValueError naming the
        field."""
        allowed = ("window", "staleness_target", "window_min", "window_max", "gain", "replay_ratio", "max_staleness")
        unknown = sorted(set(settings) - set(allowed))
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown setting; allowed: {', '.join(allowed)}")
        if self.client is None or self.pipeline.mode != "relaxed":
            raise RuntimeError("configure: only a running relaxed-mode run has a controller to configure")
        wmin = settings.get("window_min")
        if wmin is not None and wmin < self._chunks_per_update:
            raise ValueError(f"window_min: must be >= {self._chunks_per_update}, the chunks one update needs (got {wmin})")
        return self.client.sync(self.client.scheduler.tianji_configure, **settings)

    def stop(self) -> None:
        if self._single is not None:
            self._single.stop()
        for learner in self._learners:
            learner.stop().result(timeout=30)

    def wait(self, timeout: float | None = None, poll_s: float = 0.25, on_status=None) -> dict:
        """Block until the run ends (or ``timeout`` s, then stop it); write and return results."""
        if self.results is not None:
            return self.results
        deadline = None if timeout is None else time.time() + timeout
        stopped = False
        while True:
            if self._single is not None:
                status = self.status()
            else:
                statuses = []
                for group, learner in enumerate(self._learners):
                    try:
                        statuses.append(dict(learner.status().result(timeout=30)))
                    except Exception as err:  # noqa: BLE001 - the learner's worker is gone
                        self._rebuild_learner(err, group)
                        break
                if len(statuses) < len(self._learners):
                    continue
                status = self._pool_status(statuses)
            if self._t_run_start is None and status.get("elapsed_s") is not None:
                self._t_run_start = time.time() - status["elapsed_s"]
            if on_status is not None:
                on_status(status)
            if status.get("done"):
                if self._single is None:
                    self._final = [learner.final().result(timeout=60) for learner in self._learners]
                break
            if not stopped and self.pipeline.groups > 1:
                self._group_stop = self._group_stop or self._groups_stop_reason(status, statuses)
                if self._group_stop:
                    self.stop()
                    stopped = True
            if deadline is not None and time.time() > deadline and not stopped:
                self.stop()
                stopped = True
            time.sleep(poll_s)
        return self._write()

    def _groups_stop_reason(self, pooled: dict, statuses: list[dict]) -> str | None:
        """Group mode: the run stops all groups together, on the pooled figures, or when one
        group has ended on its own (its time budget, an error)."""
        stop = self.pipeline.stop
        if stop.on_solve and pooled["solved"]:
            return "solved"
        if stop.max_env_steps and pooled["env_steps"] >= stop.max_env_steps:
            return "max_env_steps"
        if stop.max_updates and pooled["updates"] >= stop.max_updates:
            return "max_updates"
        ended = next((s for s in statuses if s.get("stop_reason")), None)
        if ended is None:
            return None
        return ended["stop_reason"] if ended["stop_reason"] == "max_seconds" else f"group {ended.get('group')}: {ended['stop_reason']}"

    def _rebuild_learner(self, err: Exception, group: int = 0, attempts: int = 3, wait_s: float = 120) -> None:
        """A learner's worker was lost: rebuild that learner from its newest checkpoint on a
        LEARNER worker (waiting for one to come back), at most ``attempts`` times per run. In
        group mode the other groups go on; the rebuilt learner rejoins the reducer's rounds."""
        from tianji_dask import checkpoint
        from tianji_dask.cluster import check_roles

        if self._single is not None or not self._learners:
            raise err
        ckpt_dir = checkpoint_dirs(self.out, self.pipeline.groups)[group]
        if len(self._restarts) >= attempts:
            raise RuntimeError(f"learner: lost {len(self._restarts) + 1} times, giving up (last: {err}); "
                               f"`tianji-dask resume {self.out}` continues from the newest checkpoint") from None
        try:
            path = checkpoint.latest(ckpt_dir)
        except checkpoint.CheckpointError:
            raise RuntimeError(f"learner: lost ({err}) before its first checkpoint; nothing to rebuild from") from None
        check_roles(self.client, timeout=wait_s)  # a LEARNER worker again (a nanny restarts a dead one)
        spec = self._spec(self._explorer_workers, group)
        # the crash's lost time counts: the rebuilt learner keeps the run's start
        spec.update(resume_from=str(path.resolve()), rebuilt=True, keep_t_run_start=self._t_run_start)
        self._restarts.append({"t": time.time(), "group": group, "error": str(err)[:500], "checkpoint": str(path)})
        self._learner_futures[group] = self._submit_learner(spec, group, attempt=len(self._restarts))
        self._learners[group] = self._learner_futures[group].result()

    def _write(self) -> dict:
        if len(self._final) > 1:
            results, episodes, chunks = self._pool_results(self._final)
        else:
            final = self._final[0]
            results, episodes, chunks = dict(final["results"]), final["episodes"], final["chunks"]
        p = self.pipeline
        results.update(
            run_id=self.run_id, pipeline=p.name, mode=p.mode, env_id=p.env.id, algo=p.algo.name, seed=p.seed,
            explorers=p.explorers, groups=p.groups, chunk_steps=p.chunk_steps, num_envs=p.env.num_envs,
            pipeline_config=p.model_dump(mode="json"),
        )
        results["learner_restarts"] = self._restarts
        if self._single is None:
            cpu1 = _cpu_seconds(self.client)  # first: the explorers and the scheduler are idle from here on
            results["controller"] = self._controller_final()
            results["dataflow_overhead"] = self._dataflow_overhead(results)
            results["cpu"] = self._cpu_budget(results, cpu1)
        self.results_path = write_results(self.out, results, episodes, chunks)
        shutil.rmtree(self.out / "rows", ignore_errors=True)  # what the learners spilled is in the CSVs now
        self.results = results
        self.close()
        return results

    def _pool_results(self, finals: list[dict]) -> tuple[dict, np.ndarray, np.ndarray]:
        """Group mode: the run's results over all groups' episodes and chunks pooled (time to
        solve by the same rule as one learner's), each group's own under "group_results", and
        the reducer's record of every fusion under "fusion"."""
        from tianji_dask.metrics import CHUNK_FIELDS, age_summary, staleness_summary, time_to_solve

        per = [f["results"] for f in finals]
        episodes = np.concatenate([f["episodes"] for f in finals])
        episodes = episodes[np.argsort(episodes[:, 0], kind="stable")]
        chunks = np.concatenate([f["chunks"] for f in finals])
        chunks = chunks[np.argsort(chunks[:, 0], kind="stable")]
        stop = self.pipeline.stop
        t0, tp = min(r["t_run_start"] for r in per), per[0]["t_process_start"]
        solved_at = time_to_solve(episodes, stop.target_return, stop.window) if stop.target_return is not None else None
        wall = max(r["t_run_start"] + r["wall_s"] for r in per) - t0

        def total(key):
            return sum(r[key] for r in per)

        dropped: dict[str, int] = {}
        for r in per:
            for reason, n in r["chunks_dropped"].items():
                dropped[reason] = dropped.get(reason, 0) + n
        errors = [f"group {g}: {r['error']}" for g, r in enumerate(per) if r.get("error")]
        results = dict(per[0])
        results.update(
            solved=solved_at is not None, time_to_solve_s=None if solved_at is None else solved_at - t0,
            time_to_solve_from_process_start_s=None if solved_at is None else solved_at - tp,
            stop_reason=self._group_stop or next((r["stop_reason"] for r in per if r["stop_reason"]), None),
            t_run_start=t0, wall_s=wall, env_steps=total("env_steps"), env_steps_trained=total("env_steps_trained"),
            updates=total("updates"), final_version=[r["final_version"] for r in per], episodes=len(episodes),
            final_mean_return=float(episodes[-stop.window:, 1].mean()) if len(episodes) else None,
            env_steps_per_s=total("env_steps") / wall, samples_per_s_consumed=total("samples_per_s_consumed"),
            chunks=len(chunks), chunks_per_s=len(chunks) / wall, bytes_per_s=total("bytes_per_s"),
            chunks_lost=total("chunks_lost"), lost=[x for r in per for x in r["lost"]][:100], chunks_dropped=dropped,
            learner_busy_fraction=[r["learner_busy_fraction"] for r in per],
            explorer_busy_fraction=total("explorer_busy_fraction"),
            staleness_versions=staleness_summary(chunks[:, CHUNK_FIELDS.index("staleness_versions")]),
            age_s=age_summary(chunks[:, CHUNK_FIELDS.index("age_s")]),
            error="\n".join(errors) or None, checkpoint=[r["checkpoint"] for r in per],
            fusion={**self._reduce, "rounds": self._reducer.rounds().result(timeout=60)},
            group_results=[{k: v for k, v in r.items() if k not in ("lost",)} for r in per],
        )
        return results, episodes, chunks

    def _dataflow_overhead(self, results: dict) -> dict | None:
        """Where the roles' busy time went: the learner's own split (updates, ingesting data, the
        dataflow's work) and the explorer tasks' split as Dask meters it (env stepping with
        inference vs. everything else the task did: loading weights, deserializing, threads).
        "fraction": dataflow seconds / busy seconds, summed over roles (waiting is not busy)."""
        try:
            now = _task_metrics(self.client)
        except Exception:  # noqa: BLE001 - a cluster that cannot tell costs only this figure
            return None
        explorer = {}
        for key, value in now.items():
            if key[0] == "execute" and key[1] == "tianji-explore" and key[-1] == "seconds":
                explorer[key[2]] = value - self._task_metrics0.get(key, 0.0)
        times = [r["learner_time"] for r in results.get("group_results", [results]) if r.get("learner_time")]
        learner_busy = sum(sum(t["seconds"].values()) - t["seconds"].get("wait", 0.0) for t in times)
        learner_useful = sum(t["seconds"]["learn"] + t["seconds"].get("ingest", 0.0) for t in times)
        explorer_busy = sum(explorer.values())
        explorer_useful = explorer.get("env-step", 0.0)
        busy = learner_busy + explorer_busy
        return {
            "fraction": (busy - learner_useful - explorer_useful) / busy if busy > 0 else None,
            "learner_fraction": (learner_busy - learner_useful) / learner_busy if learner_busy > 0 else None,
            "explorer_fraction": (explorer_busy - explorer_useful) / explorer_busy if explorer_busy > 0 else None,
            "explorer_task_seconds": {k: round(v, 4) for k, v in sorted(explorer.items())},
        }

    def _cpu_budget(self, results: dict, cpu1: dict | None) -> dict | None:
        """Where the processes' CPU went over the run, as cores (CPU seconds / the learner's wall
        seconds): the learner thread; the rest of the learner's process (its event loop, comms, the
        chunk sink); the explorer workers' processes, and the part of them the explorer tasks
        spent stepping envs; the scheduler's process (on a local cluster also the client and the
        nannies). A wall-time overhead (``dataflow_overhead``) misses work done beside the roles'
        main threads; this shows it. A learner rebuilt after its worker was lost counts from its
        rebuild."""
        if cpu1 is None or self._cpu0 is None:
            return None
        per = [r["learner_cpu_s"] for r in results.get("group_results", [results]) if r.get("learner_cpu_s")]
        wall = results.get("wall_s") or 0.0
        if not per or wall <= 0:
            return None
        thread = sum(c["thread_s"] for c in per)
        seconds = {
            "learner_thread": thread,
            "learner_process_other": sum(c["process_s"] for c in per) - thread,
            # per worker process: one that joined during the run counts from its start
            "explorer_processes": sum(t - self._cpu0["explorers"].get(a, 0.0) for a, t in cpu1["explorers"].items()),
            "scheduler_process": cpu1["scheduler"] - self._cpu0["scheduler"],
        }
        stepping = ((results.get("dataflow_overhead") or {}).get("explorer_task_seconds") or {}).get("env-step")
        out = {"wall_s": round(wall, 4), "seconds": {k: round(v, 4) for k, v in seconds.items()},
               "cores": {k: round(v / wall, 4) for k, v in seconds.items()},
               "cores_total": round(sum(seconds.values()) / wall, 4)}
        if stepping is not None:
            out["explorer_env_step_cores"] = round(stepping / wall, 4)  # wall seconds in tasks, an upper bound
        return out

    def _controller_final(self, settle_s: float = 5.0) -> dict:
        # cancelled explorer tasks return their credits when the scheduler forgets them
        def in_flight(state):
            return sum(g["chunks_in_flight"] for g in state.get("groups", [state]))

        deadline = time.time() + settle_s
        state = self.controller_state(history=True)
        while in_flight(state) and time.time() < deadline:
            time.sleep(0.05)
            state = self.controller_state(history=True)
        return state

    def close(self) -> None:
        if self._own_client and self.client is not None:
            self.client.close()
            self.client = None
        for job in self._learner_jobs:
            self.cluster.sync(job.close)
        self._learner_jobs = []
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _cpu_seconds(client) -> dict | None:
    """CPU seconds so far of the scheduler's process and of each explorer worker's process
    (workers without the LEARNER resource; the learner measures its own)."""
    try:
        scheduler = client.run_on_scheduler(lambda: time.process_time())
        workers = client.scheduler_info(n_workers=-1)["workers"]
        explorers = [a for a, w in workers.items() if not w.get("resources", {}).get("LEARNER")]
        per = client.run(lambda: time.process_time(), workers=explorers) if explorers else {}
    except Exception:  # noqa: BLE001 - a cluster that cannot tell costs only this figure
        return None
    return {"scheduler": scheduler, "explorers": per}


def _task_metrics(client) -> dict:
    """The scheduler's cumulative per-task-prefix metrics (Dask's fine performance metrics)."""
    def read(dask_scheduler=None):
        return {k: v for k, v in dask_scheduler.cumulative_worker_metrics.items() if isinstance(k, tuple)}

    return client.run_on_scheduler(read)


def train(pipeline, client=None, *, out=None, timeout: float | None = None, overrides: dict | None = None) -> dict:
    """One call: start a run, wait for it, return its results (also written to ``run.out``)."""
    run = Run(pipeline, client, out=out, overrides=overrides)
    try:
        run.start()
        return run.wait(timeout=timeout)
    finally:
        run.close()
