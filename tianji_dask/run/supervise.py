"""A run on a cluster: start it (the cluster, the controller, the explorers' pool, the learners)
and keep its learners alive (a learner whose worker was lost is rebuilt from its checkpoint)."""

from __future__ import annotations

import time

from tianji_dask import dask_internals
from tianji_dask.config import PipelineError
from tianji_dask.errors import RunFault
from tianji_dask.run import accounting, specs

REBUILD_ATTEMPTS = 3
REBUILD_WAIT_S = 120


def start(run) -> None:
    """Open the cluster (unless the run was given one), install the controller and the env pool,
    and build one learner actor per group."""
    from tianji_dask.cluster import check_roles, default_explorer_workers, open_cluster, stop_active_memory_manager
    from tianji_dask.dataflow.controller import StalenessController
    from tianji_dask.dataflow.explorer import EnvPool, pool_name

    p = run.pipeline
    streams = range(p.explorers * p.groups)
    explorer_workers = p.cluster.explorer_workers or default_explorer_workers(len(streams))
    timeout = 60
    if run.client is None:
        threads = p.cluster.explorer_threads or -(-len(streams) // explorer_workers)  # a slot for every stream
        run._opened = open_cluster(p.cluster, len(streams), explorer_workers, learners=p.groups, explorer_threads=threads)
        run.client, run.cluster, timeout = run._opened.client, run._opened.cluster, run._opened.start_timeout
    client = run.client
    # a cluster we started has one LEARNER worker per group; on another, groups share them
    counts = check_roles(client, timeout=timeout, learners=p.groups if run._opened is not None else 1)
    run._startup["cluster"] = time.time()
    stop_active_memory_manager(client)
    run._explorer_workers = counts["EXPLORER"]
    client.register_plugin(StalenessController(run.law()["window"]), name="tianji")
    register_worker_plugin(client, name=pool_name(run.run_id), plugin=EnvPool(
        run.run_id, p.env.id, p.env.num_envs, p.env.kwargs, run._prepared.make_algo, p.seed + 7919 * run._env_seed_offset,
        explorer_kwargs={eid: p.env_kwargs_for(eid) for eid in streams if p.env_kwargs_for(eid) != p.env.kwargs},
        step_costs={eid: p.step_cost_for(eid) for eid in streams if p.step_cost_for(eid)}))
    run.dashboard_link = client.dashboard_link
    if not run.shares_cluster:  # cluster-wide figures: a run sharing its cluster leaves them out
        run._task_metrics0 = accounting.task_metrics(client)
        run._explorer_rss0 = accounting.explorer_rss(client)
    if p.groups > 1:
        from tianji_dask.dataflow.reducer import Reducer

        run._reducer_address = learner_workers(client)[0]
        run._reducer = client.submit(Reducer, p.groups, actor=True, workers=[run._reducer_address],
                                     key=specs.reducer_key(run.run_id)).result()
    futures = [submit_learner(run, run._learner_spec(group), group) for group in range(p.groups)]
    try:
        run._learners = [future.result() for future in futures]
    except RuntimeError as err:
        if str(err).startswith("learner.device:"):  # the learner's machine lacks the device
            raise PipelineError(str(err)) from None
        raise
    if not run.shares_cluster:
        run._cpu0 = accounting.cpu_seconds(client)
    if run._opened is not None:
        # bokeh's import, a large part of a start, done while the learner already runs; start-up
        # work, so the scheduler's process does not count it as the run's
        cpu = time.process_time()
        run._opened.serve_dashboard()
        if run._cpu0 is not None:
            run._cpu0["scheduler"] += time.process_time() - cpu


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


def submit_learner(run, spec, group: int, attempt: int = 0):
    """The learner actor of ``group``; with several groups each on its own LEARNER worker
    while there are enough of them (an actor does not hold its worker's resource)."""
    from tianji_dask.dataflow.learner.actor import Learner

    groups = run.pipeline.groups
    key = f"tianji-learner-{run.run_id}" + (f"-g{group}" if groups > 1 else "") + (f"-r{attempt}" if attempt else "")
    workers = None
    if run.learner_worker is not None:
        workers = [run.learner_worker]
    elif groups > 1:
        homes = learner_workers(run.client)
        workers = [homes[group % len(homes)]] if homes else None
    return run.client.submit(Learner, spec, actor=True, resources={"LEARNER": 1}, workers=workers, key=key)


def end(run) -> None:
    """A run on a cluster is over: the controller may drop its books at the next run's start, and
    its env pool leaves the workers (on a shared cluster the next runs' pools take the room).
    Best effort: a cluster that is gone has nothing left to free."""
    from tianji_dask.dataflow.explorer import pool_name

    try:
        run.client.sync(run.client.scheduler.tianji_end, run_id=run.run_id)
        if run._opened is None:  # a cluster the run opened goes with it
            run.client.unregister_worker_plugin(pool_name(run.run_id))
    except Exception:  # noqa: BLE001
        pass


def learner_statuses(run, wait_s: float = 0.0) -> list[dict] | None:
    """Every learner's status, once every learner has finished or after ``wait_s`` seconds; None
    when one was lost and has just been rebuilt."""
    group, calls, statuses = 0, [], []
    try:
        for group, learner in enumerate(run._learners):  # all asked first: they wait side by side
            calls.append(learner.status(wait_s))
        for group, call in enumerate(calls):
            statuses.append(dict(call.result(timeout=30 + wait_s)))
    except Exception as err:  # noqa: BLE001 - the learner's worker is gone
        rebuild_learner(run, err, group)
        return None
    return statuses


def rebuild_learner(run, err: Exception, group: int = 0) -> None:
    """A learner's worker was lost: rebuild that learner from its newest checkpoint (lost before
    its first, from the start) on a LEARNER worker (waiting for one to come back), at most
    ``REBUILD_ATTEMPTS`` times per run. In group mode the other groups go on; the rebuilt learner rejoins the reducer's rounds."""
    from tianji_dask import checkpoint
    from tianji_dask.cluster import check_roles

    ckpt_dir = specs.checkpoint_dirs(run.out, run.pipeline.groups)[group]
    if len(run._restarts) >= REBUILD_ATTEMPTS:
        raise RunFault(f"learner: lost {len(run._restarts) + 1} times, giving up (last: {err}); "
                       f"`tianji-dask resume {run.out}` continues from the newest checkpoint") from None
    try:
        path = checkpoint.latest(ckpt_dir)
    except checkpoint.CheckpointError:
        path = None  # lost before its first checkpoint: it starts over (from the one this run resumed, if any)
    check_roles(run.client, timeout=REBUILD_WAIT_S)  # a LEARNER worker again (a nanny restarts a dead one)
    # the crash's lost time counts: the rebuilt learner keeps the run's start
    changes = {"keep_t_run_start": run._t_run_start}
    if path is not None:
        changes["resume_from"] = str(path.resolve())
    spec = run._learner_spec(group, rebuilt=True, **changes)
    run._restarts.append({"t": time.time(), "group": group, "error": str(err)[:500],
                          "checkpoint": None if path is None else str(path)})
    run._learners[group] = submit_learner(run, spec, group, attempt=len(run._restarts)).result()
