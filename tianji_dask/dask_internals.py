"""Every use of dask/distributed that is not public API, in one place.

Each function says why the project needs it. All were checked against the dask and distributed
releases in ``CHECKED_RELEASES``; a release that breaks one breaks it here, and
``tests/test_dask_internals.py`` exercises each.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time

CHECKED_RELEASES = ("2026.8.0",)


# ---- client side -----------------------------------------------------------------------------
def on_client_loop(client, coro) -> concurrent.futures.Future:
    """Run ``coro`` on a synchronous client's event loop and return at once: the learner's
    thread keeps training while a scheduler call or a scatter is under way (``Client.sync``
    would block it). ``client.loop.asyncio_loop``: tornado's loop attribute."""
    return asyncio.run_coroutine_threadsafe(coro, client.loop.asyncio_loop)


def scatter_nowait(client, data: dict, worker: str) -> concurrent.futures.Future:
    """Scatter ``data`` to ``worker`` without waiting: ``Client._scatter`` is the coroutine behind
    ``Client.scatter``, which a synchronous client only offers blocking. The result is
    ``{key: Future}``."""
    return on_client_loop(client, client._scatter(data, hash=False, workers=[worker], direct=True))


def wait_any_completed(ac, timeout: float) -> None:
    """Block until ``as_completed`` ``ac`` has a result ready, or ``timeout`` seconds: its public
    ``next_batch(block=True)`` has no timeout, and a chunk restricted to a worker that died never
    arrives. ``as_completed.thread_condition`` is notified whenever a future completes."""
    deadline = time.monotonic() + timeout
    while not ac.has_ready() and time.monotonic() < deadline:
        with ac.thread_condition:
            ac.thread_condition.wait(timeout=min(0.1, max(0.0, deadline - time.monotonic())))


class FetchFailed(Exception):
    """What ``arrivals_in_completion_order`` hands back, as a future's result, for a task that
    finished but whose result could not be fetched (the worker holding it died meanwhile)."""


def arrivals_in_completion_order():
    """``as_completed(with_results=True, raise_errors=False)`` that hands over a future whose
    result fetch failed as ``(future, FetchFailed(...))``. Distributed's own lets that error out
    of its tracking task: logged as a traceback, and the future never comes out."""
    from distributed import as_completed
    from distributed.client import _wait
    from distributed.utils import CancelledError

    class _AsCompleted(as_completed):
        async def _track_future(self, future):  # as_completed._track_future, with results, and the except
            try:
                await _wait(future)
            except CancelledError:
                pass
            try:
                result = await future._result(raiseit=False)
            except CancelledError as exc:
                result = exc
            except Exception as err:  # noqa: BLE001 - gathering from a worker that died
                result = FetchFailed(f"{type(err).__name__}: {err}")
            with self.lock:
                if future in self.futures:
                    self.futures[future] -= 1
                    if not self.futures[future]:
                        del self.futures[future]
                    self.queue.put_nowait((future, result))
                    async with self.condition:
                        self.condition.notify()
                    with self.thread_condition:
                        self.thread_condition.notify()

    return _AsCompleted([], with_results=True, raise_errors=False)


def actor_handle(cls, address: str, key: str, worker):
    """A handle to an actor that already exists (its class, worker address and key), made inside
    another worker: a Future cannot be passed to an actor (distributed#4488), so the learner gets
    the reducer's address and key instead."""
    from distributed.actor import Actor

    return Actor(cls, address, key, worker=worker)


def worker_actors(worker) -> list:
    """The actor instances a worker holds (its state's ``actors``: key -> instance): a worker
    plugin or preload finds the learner it hosts there."""
    return list(worker.state.actors.values())


def scheduler_state(client, timeout: float = 5.0) -> str:
    """"alive": the client's scheduler answers within ``timeout`` seconds; "silent": its connection
    is open but no answer came (a stopped process, a long pause: it may come back); "gone": the
    connection broke (a client whose scheduler died says so in ``status``, "connecting" while it
    retries, then "closed"), or the answer failed otherwise."""
    if client.status != "running":
        return "gone"
    try:
        client.sync(client.scheduler.identity, callback_timeout=timeout)
    except TimeoutError:
        return "silent"
    except Exception:  # noqa: BLE001 - whatever the broken connection raises
        return "gone"
    return "alive"


def scheduler_alive(client, timeout: float = 5.0) -> bool:
    """Does the client's scheduler answer within ``timeout`` seconds?"""
    return scheduler_state(client, timeout) == "alive"


def scheduler_address(client) -> str:
    """The address the client connects to its scheduler at (kept after the connection is lost)."""
    return str(client.scheduler.address) if client.scheduler is not None else "?"


def quiet_reconnects() -> None:
    """Drop distributed's lines about a client that failed to reconnect to its lost scheduler (a
    traceback when the attempt is cancelled as the process ends): a run says that in its own line.
    Installed once a run has a cluster (the client may notice the loss before the run does)."""
    logging.getLogger("distributed.client").addFilter(_not_a_failed_reconnect)


def quiet_interrupted_calls():
    """Not public API: Ctrl-C that lands before a call through distributed's ``sync`` began makes
    its ``cancel`` read a name not yet bound, and the event loop logs that NameError's traceback on
    ``tornado.application``. The run stops cleanly and says so: the driver leaves that record out.
    Installed as a run starts, before its cluster (Ctrl-C may land there already); returns the
    filter."""
    logging.getLogger("tornado.application").addFilter(_not_an_interrupted_sync)
    return _not_an_interrupted_sync


def drop_client(client) -> None:
    """Let go of a client whose scheduler is gone: it gives up reconnecting after its connect
    timeout, or is cancelled as the process ends, without a line on the terminal."""
    quiet_reconnects()


def _not_an_interrupted_sync(record) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return not (isinstance(error, NameError) and "sync.<locals>.cancel" in record.getMessage())


def _not_a_failed_reconnect(record) -> bool:
    """Not the line that a client failed to reconnect, nor the traceback of its reconnection
    cancelled as the process ends."""
    import asyncio

    cancelled = record.exc_info is not None and isinstance(record.exc_info[1], asyncio.CancelledError)
    return not (cancelled or record.getMessage().startswith("Failed to reconnect to scheduler"))


def quiet_heartbeat_failures():
    """Not public API: a worker whose heartbeat finds the scheduler's connection closed logs
    "Failed to communicate with scheduler during heartbeat." on ``distributed.worker`` with a
    traceback. An embedded cluster's scheduler lives in the driver, so it is gone only as the
    driver closes the cluster (a worker's heartbeat can race the close) or dies, and the driver
    says either in a line of its own: its workers leave that record out. Returns the filter."""
    logging.getLogger("distributed.worker").addFilter(_not_a_failed_heartbeat)
    return _not_a_failed_heartbeat


def _not_a_failed_heartbeat(record) -> bool:
    return not record.getMessage().startswith("Failed to communicate with scheduler during heartbeat")


def quiet_lost_peer_transfers():
    """Not public API: a worker sending a task's result to a peer worker that dies mid-transfer (a
    learner killed while it fetched a chunk) logs "failed during get data with A -> B" on
    ``distributed.worker`` with the connection's traceback. On an embedded cluster every peer is a
    worker of the run, whose loss the run handles and records itself (a learner rebuilt from its
    checkpoint, an explorer's chunks lost): its workers leave that record out when the cause is a
    closed connection, and keep it for any other error. Returns the filter."""
    logging.getLogger("distributed.worker").addFilter(_not_a_lost_peer_transfer)
    return _not_a_lost_peer_transfer


def _not_a_lost_peer_transfer(record) -> bool:
    closed = record.exc_info is not None and isinstance(record.exc_info[1], OSError)
    return not (closed and str(record.msg).startswith("failed during get data with"))


def actor_address(actor) -> str | None:
    """The address of the worker an actor handle points to (None for no handle): Dask has no
    public name for it, and the run needs it to know which worker its learner lives on."""
    return None if actor is None else actor._address


# ---- key-name cache ----------------------------------------------------------------------------
def key_cache_size() -> int:
    """Entries in ``dask.utils.key_split``'s ``lru_cache``: every process that handles a task calls
    it on the task's key, and every explorer task has a key of its own."""
    from dask.utils import key_split

    return key_split.cache_info().currsize


def clear_key_cache() -> None:
    """Drop ``key_split``'s cache (a pure function's: nothing is lost but recomputation)."""
    from dask.utils import key_split

    key_split.cache_clear()


# ---- scheduler side ------------------------------------------------------------------------------
def add_scheduler_handlers(scheduler, handlers: dict) -> None:
    """RPC handlers on the scheduler, called as ``client.scheduler.<name>(...)``: the way
    distributed's own P2P shuffle extension adds its calls (``Scheduler.handlers``)."""
    scheduler.handlers.update(handlers)


def fold_span_collections(scheduler, key: str, max_entries: int) -> None:
    """Keep the span of task ``key`` from growing by one collection description per submission
    (spans live as long as the scheduler, distributed#7977): identical entries are folded into
    one. ``Span._metadata`` and ``TaskGroup.span_id`` are private."""
    spans = scheduler.extensions.get("spans")
    ts = scheduler.tasks.get(key)
    if spans is None or ts is None:
        return
    span = spans.spans.get(ts.group.span_id)
    collections = (getattr(span, "_metadata", None) or {}).get("collections")
    if collections is not None and len(collections) > max_entries:
        collections[:] = list({repr(c): c for c in collections}.values())


def task_prefix_metrics(scheduler) -> dict:
    """The scheduler's cumulative fine performance metrics per task prefix (what the dashboard's
    "Fine Performance Metrics" page shows), as ``{(context, prefix, activity, unit): value}``:
    ``Scheduler.cumulative_worker_metrics`` has no public reader."""
    return {k: v for k, v in scheduler.cumulative_worker_metrics.items() if isinstance(k, tuple)}


def worker_plugin_names(client) -> list[str]:
    """The worker plugins the scheduler hands to every worker that joins."""
    return list(client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.worker_plugins)))


# ---- clusters --------------------------------------------------------------------------------------
def add_workers(cluster, specs: dict, attempts: int = 3) -> None:
    """Add named worker specs to a ``SpecCluster`` (a LocalCluster is one) and start them: worker
    processes with different resources, which ``LocalCluster(n_workers=...)`` cannot make.
    ``SpecCluster._correct_state`` is what ``scale`` calls. A worker whose process dies while it
    starts fails its Nanny's start; it is dropped and started again, up to ``attempts`` times
    in all, and the last failure raised."""
    from distributed.core import Status

    cluster.worker_spec.update(specs)
    for attempt in range(attempts):
        try:
            cluster.sync(cluster._correct_state)
            return
        except RuntimeError:
            if attempt == attempts - 1:
                raise
            for name in [n for n, w in cluster.workers.items() if n in specs and w.status != Status.running]:
                del cluster.workers[name]  # its failed start closed it; the next pass opens a new one


def worker_spawn_environ() -> dict[str, str]:
    """The variables a Nanny puts in the environment before it starts a worker process
    (``distributed.nanny.pre-spawn-environ``: OMP_NUM_THREADS=1, MALLOC_TRIM_THRESHOLD_, ...;
    a variable already set wins), read without importing distributed: the forkserver workers
    fork from starts before distributed is imported, and its children inherit its environment,
    not the one the Nanny prepares. The defaults are distributed's ``distributed.yaml``, which
    only ``import distributed`` adds to dask's config."""
    return {k: os.environ.get(k, str(v)) for k, v in nanny_environ_config().items() if v is not None}


def nanny_environ_config() -> dict:
    """``distributed.nanny.pre-spawn-environ`` as configured (distributed.yaml's defaults when
    distributed is not imported yet), before the environment's own values win."""
    import sys

    import dask.config

    config = dask.config.get("distributed.nanny.pre-spawn-environ", default=None)
    if "distributed" not in sys.modules:
        import importlib.util
        from pathlib import Path

        import yaml

        path = Path(importlib.util.find_spec("distributed").origin).with_name("distributed.yaml")
        defaults = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        config = {**defaults["distributed"]["nanny"]["pre-spawn-environ"], **(config or {})}
    return dict(config or {})


def worker_template(cluster) -> dict:
    """A copy of the spec of the workers a ``SpecCluster`` makes (``SpecCluster.new_spec``)."""
    import copy

    return copy.deepcopy(cluster.new_spec)


def jobqueue_job(cluster, name: str, **overrides):
    """A batch job of a dask-jobqueue cluster outside its adaptive pool (the learner's), made like
    the pool's own: ``JobQueueCluster._job_kwargs`` and ``job_cls`` are not public."""
    return cluster.job_cls(scheduler=cluster.scheduler_address, name=name, **{**cluster._job_kwargs, **overrides})


# ---- dashboard ---------------------------------------------------------------------------------------
def scheduler_page_table() -> dict | None:
    """``distributed.dashboard.scheduler.applications``: the pages every scheduler built later in
    this process serves; there is no documented extension point (distributed#3503). None
    without bokeh."""
    try:
        from distributed.dashboard import scheduler as dashboard_scheduler
    except ImportError:
        return None
    return dashboard_scheduler.applications


def add_page_to_running_scheduler(scheduler, path: str, make_doc) -> bool:
    """Serve a Bokeh page at ``path`` on a scheduler that is already running (one started before
    the page table had it). False when the scheduler has no dashboard or already serves it."""
    http = getattr(scheduler, "http_application", None)
    pages = [getattr(app, "_applications", None) for app in getattr(http, "applications", [])]
    pages = [p for p in pages if p is not None]
    if not pages or any(path in p for p in pages):  # HTTP routes but no Bokeh app: no dashboard
        return False
    from distributed.dashboard.core import BokehApplication
    from tornado.ioloop import IOLoop

    app = BokehApplication({path: make_doc}, scheduler, prefix="/")
    http.add_application(app)
    app.initialize(IOLoop.current())
    app.start()
    return True


def serve_dashboard(scheduler) -> None:
    """Build Dask's dashboard, with every page in the page table, on a running scheduler made
    with ``dashboard=False``, whose HTTP server is already up: what ``Scheduler.__init__`` does
    when it makes one (``distributed.dashboard.scheduler.connect``), so that bokeh can be
    imported after the cluster has started. Call it on the scheduler's event loop."""
    from distributed.dashboard.scheduler import connect

    connect(scheduler.http_application, scheduler.http_server, scheduler, prefix="/")


def dashboard_template():
    """The dashboard's own page template, so a page has its navigation bar; None if it moved."""
    try:
        from distributed.dashboard.components.scheduler import env

        return env.get_template("simple.html")
    except Exception:  # noqa: BLE001 - a plain page is fine
        return None


class _QuietTaskErrors(logging.Filter):
    """Leaves out the "Compute Failed" record (the task, its exception and traceback) distributed's
    worker logs for each erred task whose key starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Compute Failed"):
            return True
        key = record.args[0] if isinstance(record.args, tuple) and record.args else None
        return not (isinstance(key, str) and key.startswith(self.prefixes))


def quiet_task_errors(prefixes: tuple[str, ...]) -> logging.Filter:
    """Not public API: the worker logs an erred task as a message "Compute Failed" on its module's
    logger, ``distributed.worker``, with the key as the first argument, and a LocalCluster's workers
    write it to the driver's terminal. A run that reports what its tasks raised in one line of its
    own (explorer and evaluation tasks) leaves those records out on its workers; the filter is
    returned for ``loud_task_errors``."""
    quiet = _QuietTaskErrors(tuple(prefixes))
    logging.getLogger("distributed.worker").addFilter(quiet)
    return quiet


def loud_task_errors(quiet: logging.Filter) -> None:
    logging.getLogger("distributed.worker").removeFilter(quiet)
