"""A run on a Dask cluster: open the cluster (unless given one), install the controller and the
explorers' env pool, have the learners built and kept alive (``supervisor.py``), and read the
cluster's own figures at the end. On a scheduler of its own making the run outlives this process
(``attach.py``): ``attach`` drives a run whose driver died."""

from __future__ import annotations

import time

from tianji_dask.dataflow import keys
from tianji_dask.dataflow.learner.closing import LearnerCloseGuard
from tianji_dask.dataflow.learner.finals import read_final
from tianji_dask.dataflow.learner.report import LearnerReport
from tianji_dask import dask_internals
from tianji_dask.errors import LearnerWorkersGone, PipelineError, SchedulerLost
from tianji_dask.launch.cluster import learner_workers, register_worker_plugin
from tianji_dask.run import accounting, preflight, specs
from tianji_dask.run.backend import Backend, Gone, RunPlan
from tianji_dask.run.quiet import distributed_log_level
from tianji_dask.run.supervisor import LearnerSupervisor
from tianji_dask.run.worker_checks import check_worker_imports


class DaskBackend(Backend):
    """The learner actors of one run (one per group) and the cluster they live on."""

    def __init__(self, plan: RunPlan, client=None):
        self.plan = plan
        self.client = client
        self.cluster = None
        self.startup = {}
        self._opened = None  # the cluster this backend started for itself (launch.cluster.Opened)
        self.learners: LearnerSupervisor | None = None  # the learner actors, once the cluster is up
        self._reducer = None  # group mode: the Reducer actor
        self._reducer_future = None
        self._reducer_address: str | None = None
        self._explorer_workers = 1
        self._task_metrics0: dict = {}
        self._explorer_rss0: dict | None = None  # the explorer workers' memory before the first chunk
        self._cpu0: dict | None = None  # accounting.cpu_seconds once the learners are built
        self._ended = False  # the controller has been told this run is over
        #: on a scheduler of its own making the run trains on if this process dies, its state published there
        self.outlives_driver = client is None and plan.pipeline.cluster.kind == "address"

    # ---- start ------------------------------------------------------------------------------
    def start(self) -> None:
        from tianji_dask.dataflow.controller.plugin import StalenessController
        from tianji_dask.dataflow.explorer.pool import EnvPool
        from tianji_dask.launch.cluster import check_roles, default_explorer_workers, open_cluster, stop_active_memory_manager

        plan, p = self.plan, self.plan.pipeline
        dask_internals.quiet_interrupted_calls()  # Ctrl-C may land in the cluster's start already
        streams = range(p.explorers * p.groups)
        explorer_workers = p.cluster.explorer_workers or default_explorer_workers(len(streams))
        timeout = 60
        if self.client is None:
            threads = p.cluster.explorer_threads or -(-len(streams) // explorer_workers)  # a slot for every stream
            self._opened = open_cluster(p.cluster, len(streams), explorer_workers, learners=p.learner_actors,
                                        explorer_threads=threads, log_level=distributed_log_level(plan.verbose))
            self.client, self.cluster, timeout = self._opened.client, self._opened.cluster, self._opened.start_timeout
        client = self.client
        dask_internals.quiet_reconnects()
        # a cluster we started has one LEARNER worker per group or replica; on another, groups share
        # them, and replicas need one each (one process group a process)
        own = self._opened is not None or p.learner.replicas > 1
        counts = check_roles(client, timeout=timeout, learners=p.learner_actors if own else 1)
        self.startup["cluster"] = time.time()
        stop_active_memory_manager(client)
        self._explorer_workers = counts["EXPLORER"]
        check_worker_imports(client, p)
        preflight.check_worker(client, plan)  # the env made, stepped and checked on an explorer worker
        client.register_plugin(StalenessController(), name="tianji")
        # a learner whose worker closes under it (its scheduler lost) checkpoints and writes its books first
        register_worker_plugin(client, name=keys.closing_guard_name(plan.run_id), plugin=LearnerCloseGuard(plan.run_id))
        register_worker_plugin(client, name=keys.pool_name(plan.run_id), plugin=EnvPool(
            plan.run_id, p.env.id, p.env.num_envs, p.env.kwargs, plan.prepared.make_algo, p.seed + plan.env_seed,
            explorer_kwargs={eid: p.env_kwargs_for(eid) for eid in streams if p.env_kwargs_for(eid) != p.env.kwargs},
            step_costs={eid: p.step_cost_for(eid) for eid in streams if p.step_cost_for(eid)}))
        self.dashboard_link = client.dashboard_link
        if not plan.shares_cluster:  # cluster-wide figures: a run sharing its cluster leaves them out
            self._task_metrics0 = accounting.task_metrics(client)
            self._explorer_rss0 = accounting.explorer_rss(client)
        if p.groups > 1:
            from tianji_dask.dataflow.learner.reducer import Reducer

            self._reducer_address = learner_workers(client)[0]
            self._reducer_future = client.submit(Reducer, p.groups, actor=True, workers=[self._reducer_address],
                                                 key=keys.reducer_key(plan.run_id))
            self._reducer = self._reducer_future.result()
        self.learners = self._supervisor()
        try:
            self.learners.build(p.learner_actors)
        except RuntimeError as err:
            if str(err).startswith("learner.device:"):  # the learner's machine lacks the device
                raise PipelineError(str(err)) from None
            raise
        if not plan.shares_cluster:
            self._cpu0 = accounting.cpu_seconds(client)
        if self.outlives_driver:
            from tianji_dask.run import attach

            attach.drive(client, plan.run_id)
            self._publish()
        if self._opened is not None:
            # bokeh's import, a large part of a start, done while the learner already runs; start-up
            # work, so the scheduler's process does not count it as the run's
            cpu = time.process_time()
            self._opened.serve_dashboard()
            if self._cpu0 is not None:
                self._cpu0["scheduler"] += time.process_time() - cpu

    # ---- a run that outlives its driver -------------------------------------------------------
    def _publish(self) -> None:
        """On a scheduler of its own making: publish what this driver keeps of the run (again
        after each learner rebuilt), for a driver that attaches once this one is gone."""
        if not self.outlives_driver:
            return
        from tianji_dask.run import attach

        attach.publish(self.client, self.plan.run_id, {
            "learners": list(self.learners.futures), "reducer": self._reducer_future, "reducer_address": self._reducer_address,
            "learner_names": list(self.learners.names), "restarts": self.learners.restarts,
            "explorer_workers": self._explorer_workers,
            "startup": self.startup, "task_metrics0": self._task_metrics0, "explorer_rss0": self._explorer_rss0,
            "cpu0": self._cpu0})

    def attach(self) -> None:
        """Drive a run whose driver died: connect to its scheduler, become its one driver and
        take up what the last driver published; PipelineError in one line when the scheduler is
        unreachable, holds no such run, or another driver drives it."""
        from tianji_dask.launch.cluster import Opened, make_security
        from tianji_dask.launch.connect import connect
        from tianji_dask.run import attach

        plan, cluster = self.plan, self.plan.pipeline.cluster
        client = connect(cluster.address, make_security(cluster.security), field="attach",
                         hint=f"the run's scheduler is unreachable; `tianji-dask resume {plan.out} --scheduler ADDRESS` "
                              "continues it from its newest checkpoint on a running one")
        self._opened, self.client = Opened(client), client
        state = attach.claim(client, plan.run_id, cluster.address, plan.out)
        self._reducer_future, self._reducer_address = state["reducer"], state["reducer_address"]
        self._explorer_workers, self.startup = state["explorer_workers"], state["startup"]
        self._task_metrics0, self._explorer_rss0, self._cpu0 = state["task_metrics0"], state["explorer_rss0"], state["cpu0"]
        self.dashboard_link = client.dashboard_link
        self.learners = self._supervisor()
        try:
            if self._reducer_future is not None:
                self._reducer = self._reducer_future.result(timeout=60)
            self.learners.take_over(state)
        except BaseException:
            self.learners.learners = []  # not this driver's to end: closed, it leaves the run on the cluster
            raise

    def _supervisor(self) -> LearnerSupervisor:
        return LearnerSupervisor(self.client, self.plan, self._opened, self._learner_spec, self._publish)

    def _learner_spec(self, group: int, *, rebuilt: bool = False, **core_changes):
        plan = self.plan
        core = plan.core_spec(group, explorer_workers=self._explorer_workers, **core_changes)
        return specs.learner_spec(plan.pipeline, plan.prepared, core, run_id=plan.run_id, group=group,
                                  reducer_address=self._reducer_address, rebuilt=rebuilt,
                                  explorer_hosts=plan.explorer_hosts)

    # ---- while it trains ----------------------------------------------------------------------
    def reports(self, wait_s: float) -> list[LearnerReport] | None:
        reports = self.learners.reports(wait_s)
        if self.learners.t_run_start is None and reports:
            elapsed = reports[0].status.get("elapsed_s")
            if elapsed is not None:  # the learners' clock, which a rebuilt learner keeps
                self.learners.t_run_start = time.time() - elapsed
        return reports

    def finals_left(self, wait_s: float) -> list[dict | None]:
        """The scheduler is gone, and the learners with their workers: each group's final books as
        its learner wrote them while its worker closed (waited for up to ``wait_s``; None for a
        learner that wrote none: its worker killed outright)."""
        dirs = specs.rows_dirs(self.plan.out, self.plan.pipeline)
        deadline = time.time() + wait_s
        while True:
            finals = [read_final(d) for d in dirs]
            if all(f is not None for f in finals) or time.time() >= deadline:
                return finals
            time.sleep(0.2)

    def abandon(self) -> None:
        """The scheduler is gone: drop the client without waiting on it (it would retry to reconnect)."""
        dask_internals.drop_client(self.client)
        self._opened = None
        self.client = self.cluster = None

    def stop(self) -> None:
        """Ask every learner to stop, each one even when another cannot be asked (its worker gone);
        the first such error raised after."""
        failed = None
        for learner in self.learners.learners:
            try:
                learner.stop().result(timeout=30)
            except Exception as err:  # noqa: BLE001 - the others still stop
                failed = failed or err
        if failed is not None:
            raise failed

    def controller_state(self, history: bool = False, group: int | None = None) -> dict:
        return self.client.sync(self.client.scheduler.tianji_state, history=history, group=group,
                                run_id=self.plan.run_id)

    def configure(self, **settings) -> dict:
        return self.client.sync(self.client.scheduler.tianji_configure, run_id=self.plan.run_id, **settings)

    # ---- the end ------------------------------------------------------------------------------
    def finals(self, keep_going: bool = False) -> list:
        """Each learner's results once all have ended; ClusterLost when one's worker went before
        they were fetched (the driver then reads the books the learners wrote as they closed),
        or with ``keep_going`` a ``Gone`` in its place, the others' fetched all the same."""
        finals: list = []
        for learner in self.learners.learners:
            try:
                finals.append(learner.final().result(timeout=60))
            except Exception as err:  # noqa: BLE001 - the learner's worker went between its last report and this call
                if not dask_internals.scheduler_alive(self.client):
                    raise SchedulerLost(dask_internals.scheduler_address(self.client)) from None
                why = f"its worker went as the run ended, before its results were fetched ({type(err).__name__}: {err})"
                if not keep_going:
                    raise LearnerWorkersGone(f"learner: {why}") from None
                finals.append(Gone(why))
        return finals

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
        figures: dict = {"learner_restarts": self.learners.restarts}
        if self.plan.shares_cluster:
            figures["controller"] = self._controller_final()
            figures["chunk_accounting"] = accounting.chunk_accounting(figures["controller"], learner_chunks=self._chunks_this_run(results))
            figures["cluster_shared"] = True
            return figures
        cpu1 = accounting.cpu_seconds(self.client)  # first: the explorers and the scheduler are idle from here on
        figures["explorer_memory"] = accounting.explorer_memory(
            self._explorer_rss0, accounting.explorer_rss(self.client), p.explorers * p.groups)
        figures["controller"] = self._controller_final()
        figures["chunk_accounting"] = accounting.chunk_accounting(figures["controller"], learner_chunks=self._chunks_this_run(results))
        figures["dataflow_overhead"] = accounting.dataflow_overhead(self.client, results, self._task_metrics0)
        figures["cpu"] = accounting.cpu_budget({**results, **figures}, self._cpu0, cpu1)  # reads the overhead's split
        return figures

    def controller_figures(self, results: dict) -> dict | None:
        """The controller's final books and the accounting they give, for a run whose learners'
        workers are gone while its scheduler lives; None when the scheduler does not answer."""
        if not dask_internals.scheduler_alive(self.client):
            return None
        try:
            controller = self._controller_final()
        except Exception:  # noqa: BLE001 - the scheduler went meanwhile: the learners' own books stay
            return None
        return {"controller": controller,
                "chunk_accounting": accounting.chunk_accounting(controller, learner_chunks=self._chunks_this_run(results))}

    def _chunks_this_run(self, results: dict) -> int | None:
        """The chunks this run's learners have in their books (a resumed run's books also hold the
        earlier runs' chunks, which the controller did not see: None then)."""
        return None if any(self.plan.resume_from) else results["chunks"]

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
        if self.client is not None and self.learners is not None and self.learners.learners and not self._ended:
            self._ended = True
            self._end()
        if self._opened is not None:
            self._opened.close()
            self._opened = None
            self.client = self.cluster = None

    def _end(self) -> None:
        """The run is over: the controller may drop its books at the next run's start, its env
        pool leaves the workers (on a shared cluster the next runs' pools take the room), and
        what it published (on a scheduler of its own making) goes. Best effort: a cluster that is
        gone has nothing left to free."""
        from tianji_dask.run import attach

        try:
            self.client.sync(self.client.scheduler.tianji_end, run_id=self.plan.run_id)
            if self.outlives_driver:
                attach.unpublish(self.client, self.plan.run_id)
            if self._opened is None or self._opened.cluster is None:  # a cluster the backend started goes with it
                self.client.unregister_worker_plugin(keys.pool_name(self.plan.run_id))
                self.client.unregister_worker_plugin(keys.closing_guard_name(self.plan.run_id))
        except Exception:  # noqa: BLE001
            pass

