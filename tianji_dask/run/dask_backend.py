"""A run on a Dask cluster: open the cluster (unless given one), install the controller and the
explorers' env pool, build one learner actor per group, keep them alive (a learner whose worker
was lost is rebuilt from its checkpoint), and read the cluster's own figures at the end."""

from __future__ import annotations

import time

from tianji_dask import dask_internals
from tianji_dask.callbacks.entries import parse as parse_callback
from tianji_dask.errors import PipelineError, RunFault
from tianji_dask.run import accounting, specs
from tianji_dask.run.backend import Backend, RunPlan

REBUILD_ATTEMPTS = 3
REBUILD_WAIT_S = 120


def named_modules(p) -> dict[str, str]:
    """The modules a pipeline names by ``module:attr`` that the workers will import: {module: field}."""
    named = {}
    if isinstance(p.algo.name, str) and ":" in p.algo.name:
        named[p.algo.name.partition(":")[0]] = "algo.name"
    if isinstance(p.algo.config.get("encoder"), str):
        named.setdefault(p.algo.config["encoder"].partition(":")[0], "algo.config.encoder")
    for i, entry in enumerate(p.callbacks):  # validated with the pipeline
        named.setdefault(parse_callback(entry)[0].partition(":")[0], f"callbacks[{i}]")
    return named


def _import_errors(modules: list[str]) -> dict[str, str]:
    import importlib

    errors = {}
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - whatever the import raises is the reason
            errors[module] = f"{type(err).__name__}: {err}"
    return errors


def check_worker_imports(client, p) -> None:
    """PipelineError (one line) when a worker cannot import a module the pipeline names: said
    before any learner or explorer fails on it."""
    named = named_modules(p)
    if not named:
        return
    for address, errors in sorted(client.run(_import_errors, sorted(named)).items()):
        for module, why in errors.items():
            raise PipelineError(f"{named[module]}: worker {address} cannot import module {module!r} ({why}); install it "
                                "on the workers or put it on their PYTHONPATH (a class given from Python travels by value)")


class DaskBackend(Backend):
    """The learner actors of one run (one per group) and the cluster they live on."""

    def __init__(self, plan: RunPlan, client=None):
        self.plan = plan
        self.client = client
        self.cluster = None
        self.startup = {}
        #: learners rebuilt after their worker was lost: when, which group, why, from which checkpoint
        self.restarts: list[dict] = []
        self._opened = None  # the cluster this backend started for itself (launch.cluster.Opened)
        self._learners: list = []
        self._reducer = None  # group mode: the Reducer actor
        self._reducer_address: str | None = None
        self._explorer_workers = 1
        self._task_metrics0: dict = {}
        self._explorer_rss0: dict | None = None  # the explorer workers' memory before the first chunk
        self._cpu0: dict | None = None  # accounting.cpu_seconds once the learners are built
        self._ended = False  # the controller has been told this run is over

    # ---- start ------------------------------------------------------------------------------
    def start(self) -> None:
        from tianji_dask.dataflow.controller import StalenessController
        from tianji_dask.dataflow.explorer import EnvPool, pool_name
        from tianji_dask.launch.cluster import check_roles, default_explorer_workers, open_cluster, stop_active_memory_manager

        plan, p = self.plan, self.plan.pipeline
        streams = range(p.explorers * p.groups)
        explorer_workers = p.cluster.explorer_workers or default_explorer_workers(len(streams))
        timeout = 60
        if self.client is None:
            threads = p.cluster.explorer_threads or -(-len(streams) // explorer_workers)  # a slot for every stream
            self._opened = open_cluster(p.cluster, len(streams), explorer_workers, learners=p.groups,
                                        explorer_threads=threads)
            self.client, self.cluster, timeout = self._opened.client, self._opened.cluster, self._opened.start_timeout
        client = self.client
        # a cluster we started has one LEARNER worker per group; on another, groups share them
        counts = check_roles(client, timeout=timeout, learners=p.groups if self._opened is not None else 1)
        self.startup["cluster"] = time.time()
        stop_active_memory_manager(client)
        self._explorer_workers = counts["EXPLORER"]
        check_worker_imports(client, p)
        client.register_plugin(StalenessController(), name="tianji")
        register_worker_plugin(client, name=pool_name(plan.run_id), plugin=EnvPool(
            plan.run_id, p.env.id, p.env.num_envs, p.env.kwargs, plan.prepared.make_algo, p.seed + plan.env_seed,
            explorer_kwargs={eid: p.env_kwargs_for(eid) for eid in streams if p.env_kwargs_for(eid) != p.env.kwargs},
            step_costs={eid: p.step_cost_for(eid) for eid in streams if p.step_cost_for(eid)}))
        self.dashboard_link = client.dashboard_link
        if not plan.shares_cluster:  # cluster-wide figures: a run sharing its cluster leaves them out
            self._task_metrics0 = accounting.task_metrics(client)
            self._explorer_rss0 = accounting.explorer_rss(client)
        if p.groups > 1:
            from tianji_dask.dataflow.reducer import Reducer

            self._reducer_address = learner_workers(client)[0]
            self._reducer = client.submit(Reducer, p.groups, actor=True, workers=[self._reducer_address],
                                          key=specs.reducer_key(plan.run_id)).result()
        futures = [self._submit_learner(self._learner_spec(group), group) for group in range(p.groups)]
        try:
            self._learners = [future.result() for future in futures]
        except RuntimeError as err:
            if str(err).startswith("learner.device:"):  # the learner's machine lacks the device
                raise PipelineError(str(err)) from None
            raise
        if not plan.shares_cluster:
            self._cpu0 = accounting.cpu_seconds(client)
        if self._opened is not None:
            # bokeh's import, a large part of a start, done while the learner already runs; start-up
            # work, so the scheduler's process does not count it as the run's
            cpu = time.process_time()
            self._opened.serve_dashboard()
            if self._cpu0 is not None:
                self._cpu0["scheduler"] += time.process_time() - cpu

    def _learner_spec(self, group: int, *, rebuilt: bool = False, **core_changes):
        plan = self.plan
        core = plan.core_spec(group, explorer_workers=self._explorer_workers, **core_changes)
        return specs.learner_spec(plan.pipeline, plan.prepared, core, run_id=plan.run_id, group=group,
                                  reducer_address=self._reducer_address, rebuilt=rebuilt,
                                  explorer_hosts=plan.explorer_hosts)

    def _submit_learner(self, spec, group: int, attempt: int = 0):
        """The learner actor of ``group``; with several groups each on its own LEARNER worker
        while there are enough of them (an actor does not hold its worker's resource)."""
        from tianji_dask.dataflow.learner.actor import Learner

        groups, run_id = self.plan.pipeline.groups, self.plan.run_id
        key = f"tianji-learner-{run_id}" + (f"-g{group}" if groups > 1 else "") + (f"-r{attempt}" if attempt else "")
        workers = None
        if self.plan.learner_worker is not None:
            workers = [self.plan.learner_worker]
        elif groups > 1:
            homes = learner_workers(self.client)
            workers = [homes[group % len(homes)]] if homes else None
        return self.client.submit(Learner, spec, actor=True, resources={"LEARNER": 1}, workers=workers, key=key)

    # ---- while it trains ----------------------------------------------------------------------
    def statuses(self, wait_s: float) -> list[dict] | None:
        """Every learner's status, once every learner has finished or after ``wait_s`` seconds;
        None when one was lost and has just been rebuilt."""
        group, calls, statuses = 0, [], []
        try:
            for group, learner in enumerate(self._learners):  # all asked first: they wait side by side
                calls.append(learner.status(wait_s))
            for group, call in enumerate(calls):
                statuses.append(dict(call.result(timeout=30 + wait_s)))
        except Exception as err:  # noqa: BLE001 - the learner's worker is gone
            self._rebuild_learner(err, group)
            return None
        return statuses

    def _rebuild_learner(self, err: Exception, group: int = 0) -> None:
        """A learner's worker was lost: rebuild that learner from its newest checkpoint (lost
        before its first, from the start) on a LEARNER worker (waiting for one to come back), at
        most ``REBUILD_ATTEMPTS`` times per run. In group mode the other groups go on; the
        rebuilt learner rejoins the reducer's rounds."""
        from tianji_dask.core import checkpoint
        from tianji_dask.launch.cluster import check_roles

        out = self.plan.out
        if len(self.restarts) >= REBUILD_ATTEMPTS:
            raise RunFault(f"learner: lost {len(self.restarts) + 1} times, giving up (last: {err}); "
                           f"`tianji-dask resume {out}` continues from the newest checkpoint") from None
        try:
            path = checkpoint.newest_loadable(specs.checkpoint_dirs(out, self.plan.pipeline.groups)[group])[0]
        except checkpoint.CheckpointError:
            path = None  # lost before its first checkpoint: it starts over (from the one this run resumed, if any)
        check_roles(self.client, timeout=REBUILD_WAIT_S)  # a LEARNER worker again (a nanny restarts a dead one)
        # the crash's lost time counts: the rebuilt learner keeps the run's start
        changes = {"keep_t_run_start": self.t_run_start}
        if path is not None:
            changes["resume_from"] = str(path.resolve())
        spec = self._learner_spec(group, rebuilt=True, **changes)
        self.restarts.append({"t": time.time(), "group": group, "error": str(err)[:500],
                              "checkpoint": None if path is None else str(path)})
        self._learners[group] = self._submit_learner(spec, group, attempt=len(self.restarts)).result()

    def stop(self) -> None:
        for learner in self._learners:
            learner.stop().result(timeout=30)

    def controller_state(self, history: bool = False, group: int | None = None) -> dict:
        return self.client.sync(self.client.scheduler.tianji_state, history=history, group=group,
                                run_id=self.plan.run_id)

    def configure(self, **settings) -> dict:
        return self.client.sync(self.client.scheduler.tianji_configure, run_id=self.plan.run_id, **settings)

    # ---- the end ------------------------------------------------------------------------------
    def finals(self) -> list[dict]:
        return [learner.final().result(timeout=60) for learner in self._learners]

    def fusion(self) -> dict | None:
        if self._reducer is None:
            return None
        prepared = self.plan.prepared
        return {"every": prepared.reduce_every, "barrier": prepared.reduce_barrier,
                "rounds": self._reducer.rounds().result(timeout=60)}

    def figures(self, results: dict) -> dict:
        """The controller's final state; on a cluster of its own, the explorers' memory, the
        dataflow's overhead and the CPU budget too (a run sharing its cluster leaves them out,
        since they would count the other runs)."""
        p = self.plan.pipeline
        figures: dict = {"learner_restarts": self.restarts}
        if self.plan.shares_cluster:
            figures["controller"] = self._controller_final()
            figures["cluster_shared"] = True
            return figures
        cpu1 = accounting.cpu_seconds(self.client)  # first: the explorers and the scheduler are idle from here on
        figures["explorer_memory"] = accounting.explorer_memory(
            self._explorer_rss0, accounting.explorer_rss(self.client), p.explorers * p.groups)
        figures["controller"] = self._controller_final()
        figures["dataflow_overhead"] = accounting.dataflow_overhead(self.client, results, self._task_metrics0)
        figures["cpu"] = accounting.cpu_budget({**results, **figures}, self._cpu0, cpu1)  # reads the overhead's split
        return figures

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
        if self.client is not None and self._learners and not self._ended:
            self._ended = True
            self._end()
        if self._opened is not None:
            self._opened.close()
            self._opened = None
            self.client = self.cluster = None

    def _end(self) -> None:
        """The run is over: the controller may drop its books at the next run's start, and its
        env pool leaves the workers (on a shared cluster the next runs' pools take the room).
        Best effort: a cluster that is gone has nothing left to free."""
        from tianji_dask.dataflow.explorer import pool_name

        try:
            self.client.sync(self.client.scheduler.tianji_end, run_id=self.plan.run_id)
            if self._opened is None:  # a cluster the backend opened goes with it
                self.client.unregister_worker_plugin(pool_name(self.plan.run_id))
        except Exception:  # noqa: BLE001
            pass


def register_worker_plugin(client, name: str, plugin) -> None:
    """Register a worker plugin. The scheduler keeps it for every worker that joins later; a
    worker that dies while the plugin is handed to the workers fails the call after that, and
    its replacement gets the plugin when it joins, so that failure is not the run's."""
    try:
        client.register_plugin(plugin, name=name)
    except OSError:  # distributed's CommClosedError: a worker went away mid-broadcast
        if name not in dask_internals.worker_plugin_names(client):
            raise


def learner_workers(client) -> list[str]:
    workers = client.scheduler_info(n_workers=-1)["workers"]
    return sorted(a for a, w in workers.items() if w.get("resources", {}).get("LEARNER"))
