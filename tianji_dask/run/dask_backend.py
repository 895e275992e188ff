"""A run on a Dask cluster: open the cluster (unless given one), install the controller and the
explorers' env pool, build one learner actor per group, keep them alive (a learner whose worker
was lost is rebuilt from its checkpoint; one whose worker reaches its lifetime, or is preempted,
hands off to a learner on a fresh worker), and read the cluster's own figures at the end. On a
scheduler of its own making the run outlives this process (``attach.py``): ``attach`` drives a
run whose driver died."""

from __future__ import annotations

import time

from tianji_dask import dask_internals
from tianji_dask.errors import PipelineError, RunFault
from tianji_dask.launch.cluster import learner_workers, register_worker_plugin
from tianji_dask.run import accounting, preflight, specs
from tianji_dask.run.backend import Backend, RunPlan
from tianji_dask.run.worker_checks import check_worker_imports

REBUILD_ATTEMPTS = 3
REBUILD_WAIT_S = 120
HANDOFF_LEAD_S = 30.0  # a fresh learner worker is started this long before a learner's handoff


class DaskBackend(Backend):
    """The learner actors of one run (one per group) and the cluster they live on."""

    def __init__(self, plan: RunPlan, client=None):
        self.plan = plan
        self.client = client
        self.cluster = None
        self.startup = {}
        #: learners rebuilt: after their worker was lost (cause "lost": when, which group, why, from
        #: which checkpoint), or handed off (cause "lifetime" or "preempted": also when the old one
        #: stopped, the chunks lost with it, and the seconds to the new one's first update)
        self.restarts: list[dict] = []
        self._learner_names: list = []  # each group's learner worker, by name
        self._successors: dict[int, str] = {}  # group -> the fresh learner worker started for its handoff
        self._fresh = 0  # fresh learner workers started
        self._opened = None  # the cluster this backend started for itself (launch.cluster.Opened)
        self._learners: list = []
        self._futures: list = []  # the learner actors' futures, one per group
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
        from tianji_dask.dataflow.explorer.pool import EnvPool, pool_name
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
        preflight.check_worker(client, plan)  # the env made, stepped and checked on an explorer worker
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
            from tianji_dask.dataflow.learner.reducer import Reducer

            self._reducer_address = learner_workers(client)[0]
            self._reducer_future = client.submit(Reducer, p.groups, actor=True, workers=[self._reducer_address],
                                                 key=specs.reducer_key(plan.run_id))
            self._reducer = self._reducer_future.result()
        self._futures = [self._submit_learner(self._learner_spec(group), group) for group in range(p.groups)]
        try:
            self._learners = [future.result() for future in self._futures]
        except RuntimeError as err:
            if str(err).startswith("learner.device:"):  # the learner's machine lacks the device
                raise PipelineError(str(err)) from None
            raise
        self._learner_names = [self._worker_name(dask_internals.actor_address(learner)) for learner in self._learners]
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
            "learners": list(self._futures), "reducer": self._reducer_future, "reducer_address": self._reducer_address,
            "learner_names": list(self._learner_names), "restarts": self.restarts, "explorer_workers": self._explorer_workers,
            "startup": self.startup, "task_metrics0": self._task_metrics0, "explorer_rss0": self._explorer_rss0,
            "cpu0": self._cpu0})

    def attach(self) -> None:
        """Drive a run whose driver died: connect to its scheduler, become its one driver and
        take up what the last driver published; PipelineError in one line when the scheduler is
        unreachable, holds no such run, or another driver drives it."""
        from tianji_dask.launch.cluster import Opened, connect, make_security
        from tianji_dask.run import attach

        plan, cluster = self.plan, self.plan.pipeline.cluster
        client = connect(cluster.address, make_security(cluster.security), field="attach",
                         hint=f"the run's scheduler is unreachable; `tianji-dask resume {plan.out} --scheduler ADDRESS` "
                              "continues it from its newest checkpoint on a running one")
        self._opened, self.client = Opened(client), client
        state = attach.claim(client, plan.run_id, cluster.address, plan.out)
        self._futures, self._reducer_future = list(state["learners"]), state["reducer"]
        self._reducer_address, self._learner_names = state["reducer_address"], list(state["learner_names"])
        self.restarts, self._explorer_workers, self.startup = list(state["restarts"]), state["explorer_workers"], state["startup"]
        self._task_metrics0, self._explorer_rss0, self._cpu0 = state["task_metrics0"], state["explorer_rss0"], state["cpu0"]
        self.dashboard_link = client.dashboard_link
        try:
            if self._reducer_future is not None:
                self._reducer = self._reducer_future.result(timeout=60)
            lost = []
            for group, future in enumerate(self._futures):
                try:
                    self._learners.append(future.result(timeout=60))
                except Exception as err:  # noqa: BLE001 - its worker was lost while no driver watched
                    self._learners.append(None)
                    lost.append((group, err))
            for group, err in lost:
                self._rebuild_learner(err, group)
        except BaseException:
            self._learners = []  # not this driver's to end: closed, it leaves the run on the cluster
            raise

    def _learner_spec(self, group: int, *, rebuilt: bool = False, **core_changes):
        plan = self.plan
        core = plan.core_spec(group, explorer_workers=self._explorer_workers, **core_changes)
        return specs.learner_spec(plan.pipeline, plan.prepared, core, run_id=plan.run_id, group=group,
                                  reducer_address=self._reducer_address, rebuilt=rebuilt,
                                  explorer_hosts=plan.explorer_hosts)

    def _submit_learner(self, spec, group: int, attempt: int = 0, workers: list[str] | None = None):
        """The learner actor of ``group`` (on ``workers`` when given); with several groups each on
        its own LEARNER worker while there are enough of them (an actor does not hold its worker's
        resource)."""
        from tianji_dask.dataflow.learner.actor import Learner

        groups, run_id = self.plan.pipeline.groups, self.plan.run_id
        key = f"tianji-learner-{run_id}" + (f"-g{group}" if groups > 1 else "") + (f"-r{attempt}" if attempt else "")
        if workers is not None:
            pass
        elif self.plan.learner_worker is not None:
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
        now = time.time()
        for group, status in enumerate(statuses):
            self._note_first_update(group, status)
            if status.get("handoff"):
                self._hand_off(group, status["handoff"])
                return None
            at = status.get("handoff_at")
            if at is not None and group not in self._successors and not status.get("done") and now >= at - self._lead_s():
                self._successors[group] = self._start_fresh_learner()  # ready when the handoff comes
        return statuses

    # ---- handoffs -----------------------------------------------------------------------------
    def _hand_off(self, group: int, handoff: dict) -> None:
        """A learner stopped for a handoff (its worker's lifetime, or a preemption) and wrote a
        checkpoint: build its successor from it on a fresh learner worker, then end the old one."""
        name = self._successors.pop(group, None) or self._start_fresh_learner()
        address = self._worker_named(name)
        # the run's clock goes on as the old learner kept it, the handoff's gap counted
        spec = self._learner_spec(group, rebuilt=True, keep_t_run_start=handoff["t_run_start"],
                                  resume_from=handoff["checkpoint"])
        entry = {"t": time.time(), "group": group, "cause": handoff["cause"], "checkpoint": handoff["checkpoint"],
                 "version": handoff["version"], "t_expiry": handoff["t_expiry"], "chunks_lost": handoff["chunks_lost"],
                 "worker": handoff["worker"], "new_worker": address, "next_update_s": None}
        self.restarts.append(entry)
        self._futures[group] = self._submit_learner(spec, group, attempt=len(self.restarts), workers=[address])
        self._learners[group] = self._futures[group].result()
        old, self._learner_names[group] = self._learner_names[group], name
        self._opened.retire_learner(old)
        self._publish()

    def _note_first_update(self, group: int, status: dict) -> None:
        """Seconds from a handoff's expiry to the successor's first update, once it has made one."""
        if status.get("first_update_t") is None:
            return
        for entry in reversed(self.restarts):
            if entry["group"] == group:
                if entry.get("next_update_s", 0) is None:
                    entry["next_update_s"] = status["first_update_t"] - entry["t_expiry"]
                return

    def _lead_s(self) -> float:
        """How long before a handoff its fresh worker starts: a batch job's walltime runs from its
        start, so a quarter of the lifetime at most (the successor's own lifetime stays long)."""
        from tianji_dask.config.sections import duration_s

        return min(HANDOFF_LEAD_S, duration_s(self.plan.pipeline.cluster.learner_lifetime, "learner_lifetime") / 4)

    def _start_fresh_learner(self) -> str:
        """Start a fresh LEARNER worker (a batch job, or an embedded worker process); its name."""
        self._fresh += 1
        name = f"tianji-learner-n{self._fresh}"
        self._opened.start_learner(name)
        return name

    def _worker_named(self, name: str) -> str:
        timeout = max(REBUILD_WAIT_S, self._opened.start_timeout)
        deadline = time.time() + timeout
        while True:
            for address, w in self.client.scheduler_info(n_workers=-1)["workers"].items():
                if str(w.get("name")) == name:
                    return address
            if time.time() > deadline:
                raise RunFault(f"learner: the fresh learner worker {name} did not start within {timeout:.0f}s; "
                               f"`tianji-dask resume {self.plan.out}` continues from the newest checkpoint")
            time.sleep(0.2)

    def _worker_name(self, address: str) -> str | None:
        worker = self.client.scheduler_info(n_workers=-1)["workers"].get(address)
        return None if worker is None else str(worker.get("name"))

    def _rebuild_learner(self, err: Exception, group: int = 0) -> None:
        """A learner's worker was lost: rebuild that learner from its newest checkpoint (lost
        before its first, from the start) on a LEARNER worker (waiting for one to come back), at
        most ``REBUILD_ATTEMPTS`` times per run. In group mode the other groups go on; the
        rebuilt learner rejoins the reducer's rounds. A learner that handed off before its
        worker went (its record in ``handoff.json``) is handed off from, not counted as lost."""
        from tianji_dask.core import checkpoint
        from tianji_dask.launch.cluster import check_roles

        out = self.plan.out
        directory = specs.checkpoint_dirs(out, self.plan.pipeline.groups)[group]
        handoff = checkpoint.handoff_left(directory)
        if (handoff is not None and handoff.get("worker") == dask_internals.actor_address(self._learners[group])
                and all(entry.get("checkpoint") != handoff["checkpoint"] for entry in self.restarts)):
            # it handed off (a preemption) and its worker closed before this driver asked how it ended
            self._hand_off(group, handoff)
            return
        lost = sum(entry["cause"] == "lost" for entry in self.restarts)
        if lost >= REBUILD_ATTEMPTS:
            raise RunFault(f"learner: lost {lost + 1} times, giving up (last: {err}); "
                           f"`tianji-dask resume {out}` continues from the newest checkpoint") from None
        try:
            path = checkpoint.newest_loadable(directory)[0]
        except checkpoint.CheckpointError:
            path = None  # lost before its first checkpoint: it starts over (from the one this run resumed, if any)
        workers = None
        if self._opened is not None and self._opened.learner_job is not None:
            # a batch job that ended (preempted, at its walltime) does not come back: a fresh one
            name = self._successors.pop(group, None) or self._start_fresh_learner()
            workers = [self._worker_named(name)]
            old, self._learner_names[group] = self._learner_names[group], name
            self._opened.retire_learner(old)
        check_roles(self.client, timeout=REBUILD_WAIT_S)  # a LEARNER worker again (a nanny restarts a dead one)
        # the crash's lost time counts: the rebuilt learner keeps the run's start
        changes = {"keep_t_run_start": self.t_run_start}
        if path is not None:
            changes["resume_from"] = str(path.resolve())
        spec = self._learner_spec(group, rebuilt=True, **changes)
        self.restarts.append({"t": time.time(), "group": group, "cause": "lost", "error": str(err)[:500],
                              "checkpoint": None if path is None else str(path)})
        self._futures[group] = self._submit_learner(spec, group, attempt=len(self.restarts), workers=workers)
        self._learners[group] = self._futures[group].result()
        self._publish()

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
            figures["chunk_accounting"] = accounting.chunk_accounting(figures["controller"])
            figures["cluster_shared"] = True
            return figures
        cpu1 = accounting.cpu_seconds(self.client)  # first: the explorers and the scheduler are idle from here on
        figures["explorer_memory"] = accounting.explorer_memory(
            self._explorer_rss0, accounting.explorer_rss(self.client), p.explorers * p.groups)
        figures["controller"] = self._controller_final()
        figures["chunk_accounting"] = accounting.chunk_accounting(figures["controller"])
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
        """The run is over: the controller may drop its books at the next run's start, its env
        pool leaves the workers (on a shared cluster the next runs' pools take the room), and
        what it published (on a scheduler of its own making) goes. Best effort: a cluster that is
        gone has nothing left to free."""
        from tianji_dask.dataflow.explorer.pool import pool_name
        from tianji_dask.run import attach

        try:
            self.client.sync(self.client.scheduler.tianji_end, run_id=self.plan.run_id)
            if self.outlives_driver:
                attach.unpublish(self.client, self.plan.run_id)
            if self._opened is None or self._opened.cluster is None:  # a cluster the backend started goes with it
                self.client.unregister_worker_plugin(pool_name(self.plan.run_id))
        except Exception:  # noqa: BLE001
            pass

