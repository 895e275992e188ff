"""Clusters: an embedded LocalCluster with role resources, batch jobs (Slurm, PBS), or an existing
scheduler; and what a run asks of any of them (its LEARNER workers, its worker plugins)."""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import signal
from dataclasses import dataclass, field

import dask
from distributed import Client, LocalCluster

from tianji_dask import dask_internals
from tianji_dask.dataflow import keys

LEARNER, EXPLORER = "LEARNER", "EXPLORER"


@dataclass
class Opened:
    """A cluster a run opened for itself (None: the run was given a client or an address)."""

    client: Client
    cluster: object = None
    learner_jobs: list = field(default_factory=list)
    start_timeout: float = 60
    dashboard_later: bool = False  # a local cluster whose dashboard serve_dashboard builds
    learner_job: dict | None = None  # a batch cluster's learner job settings (jobqueue_job's overrides)
    #: distributed's logs below it stay off the terminal, the cluster's close included (a cluster
    #: keeps them down only while it lives, and its comms to workers log as they close)
    log_level: int = logging.ERROR

    @property
    def starts_learners(self) -> bool:
        """This run can start a fresh learner worker: a cluster it started."""
        return self.cluster is not None

    def start_learner(self, name: str) -> None:
        """Start a fresh LEARNER worker named ``name``: a batch job (submitted, not waited for),
        or a worker process of the embedded cluster (started)."""
        if self.learner_job is not None:
            job = dask_internals.jobqueue_job(self.cluster, name, **self.learner_job)
            self.cluster.sync(job.start)
            self.learner_jobs.append(job)
        else:
            add_learner_worker(self.cluster, name)

    def retire_learner(self, name: str) -> None:
        """End the LEARNER worker named ``name`` (its job cancelled, or its process closed)."""
        if self.learner_job is not None:
            for job in [j for j in self.learner_jobs if j.name == name]:
                self.learner_jobs.remove(job)
                self.cluster.sync(job.close)
        elif name in self.cluster.worker_spec:
            del self.cluster.worker_spec[name]
            self.cluster.sync(self.cluster._correct_state)  # SpecCluster closes the workers it no longer names

    def serve_dashboard(self) -> None:
        if self.dashboard_later:
            self.dashboard_later = False
            try:
                serve_dashboard(self.cluster)
            except Exception as err:  # noqa: BLE001 - a run goes on without its dashboard
                logging.getLogger(__name__).warning("tianji: the dashboard was not built: %s", err)

    def close(self) -> None:
        with logs_held_below(self.log_level):
            self.client.close()
            for job in self.learner_jobs:
                self.cluster.sync(job.close)
            self.learner_jobs = []
            if self.cluster is not None:
                self.cluster.close()


@contextlib.contextmanager
def logs_held_below(level: int):
    """A cluster made with ``silence_logs`` lowers the level of distributed's terminal handlers
    only while it lives: its close puts back the level it found before its comms are done closing
    (a batched stream to a worker gone logs "Batched Comm Closed" with its traceback). While the
    body runs, those handlers leave out every record below ``level``, whatever their level is set
    to meanwhile."""
    handlers = [h for h in logging.getLogger("distributed").handlers if isinstance(h, logging.StreamHandler)]

    def at_level(record) -> bool:
        return record.levelno >= level

    for handler in handlers:
        handler.addFilter(at_level)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(at_level)


def open_cluster(cluster_config, explorers: int, explorer_workers: int, learners: int, explorer_threads: int = 1,
                 log_level: int = logging.ERROR) -> Opened:
    """The cluster a pipeline's ``cluster:`` section names: an existing scheduler, Slurm or PBS
    jobs, or an embedded LocalCluster; ``learners`` LEARNER workers (one per group), explorer
    workers that each run ``explorer_threads`` explorer tasks at once. ``log_level``: the embedded
    cluster's distributed logs below it are not shown."""
    kind, security = cluster_config.kind, make_security(cluster_config.security)
    if kind == "address":
        from tianji_dask.launch.connect import connect

        return Opened(connect(cluster_config.address, security))
    if kind in ("slurm", "pbs"):
        cluster, jobs = jobqueue_cluster(kind, cluster_config.jobqueue, explorers, cluster_config.dashboard_address,
                                         security, learners=learners, explorer_threads=explorer_threads,
                                         log_level=log_level)
        return Opened(Client(cluster), cluster, jobs, cluster_config.jobqueue.start_timeout,
                      learner_job=learner_job_settings(cluster_config.jobqueue), log_level=log_level)
    later = cluster_config.dashboard_address is not None
    cluster = local_cluster(explorer_workers, cluster_config.dashboard_address, security, learner_workers=learners,
                            explorer_threads=explorer_threads, dashboard_later=later, log_level=log_level)
    return Opened(Client(cluster), cluster, dashboard_later=later, log_level=log_level)


def default_explorer_workers(explorers: int) -> int:
    return max(1, min(explorers, os.cpu_count() or 1))


def make_security(setting):
    """None, a temporary self-signed Security, or one from certificate files (``TLSFiles``)."""
    if setting in (None, "none"):
        return None
    from distributed.security import Security

    if setting == "temporary":
        return Security.temporary()
    return Security(tls_ca_file=setting.ca_file, tls_client_cert=setting.cert, tls_client_key=setting.key,
                    tls_scheduler_cert=setting.cert, tls_scheduler_key=setting.key,
                    tls_worker_cert=setting.cert, tls_worker_key=setting.key, require_encryption=True)


def local_cluster(explorer_workers: int, dashboard_address: str | None = ":8787", security=None,
                  learner_workers: int = 1, explorer_threads: int = 1, dashboard_later: bool = False,
                  log_level: int = logging.ERROR) -> LocalCluster:
    """``learner_workers`` LEARNER worker processes (one per group, one thread each) plus
    ``explorer_workers`` EXPLORER worker processes that run ``explorer_threads`` explorer tasks at
    once, with the active memory manager off (it deletes the weight replicas explorers read),
    ignoring Ctrl-C (the driver handles it). With ``security`` every connection is TLS. With
    ``dashboard_later`` the scheduler's HTTP server takes ``dashboard_address`` but the dashboard
    is built by ``serve_dashboard``: importing bokeh is a large part of a start, and a run does
    it once its learner runs. ``log_level``: distributed's logs below it, in this process and the
    workers', are not shown."""
    from tianji_dask.launch import forkserver
    from tianji_dask.observe.dashboard import install

    # workers fork from a process that has imported torch and gymnasium once (the CLI started it early)
    method = "forkserver" if forkserver.start() else "spawn"
    if not dashboard_later:
        install()  # the /tianji pages, before the scheduler is built (JupyterLab lists only those)
    tls = {} if security is None else {"security": security, "protocol": "tls://"}
    with dask.config.set({"distributed.scheduler.active-memory-manager.start": False}):
        # no dashboard (None): distributed still serves /metrics and /health over HTTP, at the default
        # port unless told otherwise; a free port then, so a run without a dashboard takes no known one
        cluster = LocalCluster(
            n_workers=0, threads_per_worker=1, processes=True,
            dashboard_address=":0" if dashboard_address is None else dashboard_address, silence_logs=log_level,
            scheduler_kwargs={"dashboard": False} if dashboard_later or dashboard_address is None else None, **tls,
        )
    logging.getLogger("distributed.scheduler").addFilter(_handled_elsewhere)
    template = dask_internals.worker_template(cluster)
    # a terminal's Ctrl-C is for the driver, which stops the run cleanly (see worker_preload)
    template["options"]["preload"] = ["tianji_dask.launch.worker_preload"]
    specs = {}
    for i in range(learner_workers):
        learner = copy.deepcopy(template)
        learner["options"].update(resources={LEARNER: 1}, memory_limit=0)
        specs[keys.learner_worker_name(i)] = learner
    for i in range(explorer_workers):
        explorer = copy.deepcopy(template)
        explorer["options"].update(resources={EXPLORER: explorer_threads}, nthreads=explorer_threads)
        specs[keys.explorer_worker_name(i)] = explorer
    if method == "forkserver":
        # for good, not for this block: a Nanny reads it again to restart a lost worker, which forks too
        dask.config.set({"distributed.worker.multiprocessing-method": method})
    try:
        # spawned workers go without forkserver.LEFT_OUT too (each Nanny reads this as it is made)
        with forkserver.interrupts_held(method), dask.config.set(forkserver.left_out_config()):
            dask_internals.add_workers(cluster, specs)
    except KeyboardInterrupt:  # a Ctrl-C held while they started: the run stops now that it can
        cluster.close()
        raise
    except RuntimeError as err:  # worker processes died as they started, time after time
        cluster.close()
        from tianji_dask.errors import RunFault

        raise RunFault(f"cluster: worker processes died while the cluster started ({err}); "
                       "see the system's log for what ended them (memory, a signal)") from None
    return cluster


def _handled_elsewhere(record: logging.LogRecord) -> bool:
    """Drop the scheduler's errors for a worker lost mid-call: a result lost with it (the learner
    reports that chunk lost, with its reason, in the run's results) and a call to every worker
    (the run's own calls go on without a dead worker's answer)."""
    message = record.getMessage()
    return not (message.startswith("Couldn't gather keys")
                or (message.startswith("broadcast to ") and "CommClosedError" in message))


def serve_dashboard(cluster) -> None:
    """Build the dashboard, the /tianji pages with it, of a local cluster made with
    ``dashboard_later``; nothing without bokeh."""
    from tianji_dask.observe.dashboard import install

    if dask_internals.scheduler_page_table() is None:
        return
    install()

    async def on_the_loop():
        dask_internals.serve_dashboard(cluster.scheduler)

    cluster.sync(on_the_loop)


def jobqueue_cluster(kind: str, jq, explorers: int, dashboard_address: str | None, security=None, learners: int = 1,
                     explorer_threads: int = 1, log_level: int = logging.ERROR):
    """A dask-jobqueue cluster (``kind`` slurm or pbs): explorer workers are batch jobs in an
    adaptive pool (EXPLORER resource, optional graceful lifetime with stagger), each learner (one
    per group) a job of its own (LEARNER resource) outside the pool, so adapting never touches
    it. Returns ``(cluster, learner_jobs)``; close the jobs, then the cluster. ``log_level``: the
    in-process scheduler's distributed logs below it are not shown."""
    import sys

    from dask_jobqueue import PBSCluster, SLURMCluster

    from tianji_dask.observe.dashboard import install

    install()

    cls = SLURMCluster if kind == "slurm" else PBSCluster
    explorer_args = ["--resources", f"{EXPLORER}={explorer_threads}", "--nthreads", str(explorer_threads)]
    if jq.lifetime:
        explorer_args += ["--lifetime", jq.lifetime, "--lifetime-stagger", jq.lifetime_stagger]
    common = {
        "processes": 1, "walltime": jq.walltime, "queue": jq.queue, "account": jq.account,
        "job_script_prologue": jq.job_script_prologue, "interface": jq.interface,
        "local_directory": jq.local_directory, "python": sys.executable,
    }
    if security is not None:
        common.update(security=security, protocol="tls://")
    with dask.config.set({"distributed.scheduler.active-memory-manager.start": False}):
        cluster = cls(
            cores=jq.cores, memory=jq.memory, job_name=keys.EXPLORER_JOB_NAME, worker_extra_args=explorer_args,
            job_extra_directives=jq.job_extra_directives, scheduler_options={"dashboard_address": dashboard_address},
            silence_logs=log_level, **common,
        )
    # the scheduler lives in this process, as a local cluster's does: its errors for a worker lost mid-call go too
    logging.getLogger("distributed.scheduler").addFilter(_handled_elsewhere)
    learner_job = learner_job_settings(jq)
    learner_jobs = []
    for i in range(learners):
        job = dask_internals.jobqueue_job(cluster, keys.learner_job_worker_name(i), **learner_job)
        cluster.sync(job.start)
        learner_jobs.append(job)
    cluster.adapt(minimum_jobs=jq.minimum_jobs, maximum_jobs=jq.maximum_jobs or explorers)
    return cluster, learner_jobs


def learner_job_settings(jq) -> dict:
    """What a learner's batch job differs in from an explorer's: its cores, memory and
    directives, the LEARNER resource, and the preload that turns the batch system's SIGTERM into
    a handoff (``launch.preemption``)."""
    return {
        "cores": jq.learner.cores, "memory": jq.learner.memory, "job_name": keys.LEARNER_JOB_NAME,
        "worker_extra_args": ["--resources", f"{LEARNER}=1", "--nthreads", "1", "--memory-limit", "0",
                              "--preload", "tianji_dask.launch.preemption"],
        "job_extra_directives": jq.job_extra_directives + jq.learner.job_extra_directives,
    }


@contextlib.contextmanager
def local_client(explorer_workers: int = 2, **options):
    """A Client of an embedded cluster (``local_cluster``'s; no dashboard unless given one), both
    closed on leaving: several runs on one cluster, as the tests and the studies share one."""
    cluster = local_cluster(explorer_workers, dashboard_address=options.pop("dashboard_address", None), **options)
    client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


def add_learner_worker(cluster, name: str) -> None:
    """One more LEARNER worker process in an embedded cluster, made as ``local_cluster`` makes its first."""
    from tianji_dask.launch import forkserver

    first = next(spec for spec in cluster.worker_spec.values() if spec["options"].get("resources", {}).get(LEARNER))
    with forkserver.ignoring(signal.SIGINT), dask.config.set(forkserver.left_out_config()):
        dask_internals.add_workers(cluster, {name: copy.deepcopy(first)})


def stop_active_memory_manager(client: Client) -> None:
    """Turn the AMM off on a scheduler we did not start (weights live in one place on purpose)."""

    def _stop(dask_scheduler=None):
        amm = dask_scheduler.extensions.get("amm")
        if amm is not None and amm.running:
            amm.stop()

    client.run_on_scheduler(_stop)


def check_roles(client: Client, explorer_workers: int | None = None, timeout: float = 60, learners: int = 1) -> dict:
    """Wait until the cluster offers ``learners`` LEARNER workers and an EXPLORER worker; return
    their counts."""
    import time

    deadline = time.time() + timeout
    while True:
        info = client.scheduler_info(n_workers=-1)
        counts = {LEARNER: 0, EXPLORER: 0}
        for w in info["workers"].values():
            for role in counts:
                if w.get("resources", {}).get(role, 0) > 0:
                    counts[role] += 1
        if counts[LEARNER] >= learners and counts[EXPLORER] >= (explorer_workers or 1):
            return counts
        if time.time() > deadline:
            missing = "LEARNER" if counts[LEARNER] < learners else "EXPLORER"
            raise RuntimeError(
                f"cluster: no worker offers the {missing} resource after {timeout:.0f}s; start workers with "
                f"`dask worker ADDRESS --resources {missing}=1`"
            )
        time.sleep(0.1)


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
