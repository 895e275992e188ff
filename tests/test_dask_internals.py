"""Every use of dask/distributed beyond its public API, exercised on the installed release: a Dask
upgrade that breaks one of them fails here, by name, before anything else."""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster, as_completed

from tianji_dask import dask_internals


@pytest.fixture(scope="module")
def client():
    with LocalCluster(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        yield client


def test_a_scatter_and_a_scheduler_call_leave_without_blocking(client):
    worker = next(iter(client.scheduler_info()["workers"]))
    done = dask_internals.scatter_nowait(client, {"tianji-test-w": np.arange(3)}, worker)
    future = done.result(timeout=10)["tianji-test-w"]
    assert np.array_equal(future.result(), np.arange(3)) and future.key == "tianji-test-w"
    identity = dask_internals.on_client_loop(client, client.scheduler.identity()).result(timeout=10)
    assert worker in identity["workers"]


def test_waiting_on_as_completed_ends_at_its_timeout_or_at_a_result(client):
    ac = as_completed([], with_results=True)
    dask_internals.wait_any_completed(ac, 0.2)  # returns although nothing will ever complete
    assert not ac.has_ready()
    ac.add(client.submit(lambda: 42, pure=False))
    dask_internals.wait_any_completed(ac, 30)
    assert ac.has_ready() and ac.next_batch(block=False)[0][1] == 42


def test_the_key_name_cache_can_be_read_and_cleared():
    from dask.utils import key_split

    key_split("tianji-explore-abc-0123456789ab")
    assert dask_internals.key_cache_size() >= 1
    dask_internals.clear_key_cache()
    assert dask_internals.key_cache_size() == 0


def test_scheduler_handlers_span_folding_and_task_metrics(client):
    def install(dask_scheduler=None):
        dask_internals.add_scheduler_handlers(dask_scheduler, {"tianji_test_echo": lambda value=None: value})

    client.run_on_scheduler(install)
    assert client.sync(client.scheduler.tianji_test_echo, value=7) == 7
    futures = [client.submit(lambda: 1, key=f"tianji-explore-fold-{i}", pure=False) for i in range(8)]
    client.gather(futures)

    def fold(dask_scheduler=None):
        ts = dask_scheduler.tasks["tianji-explore-fold-0"]
        span = dask_scheduler.extensions["spans"].spans[ts.group.span_id]
        before = len(span._metadata["collections"])
        dask_internals.fold_span_collections(dask_scheduler, "tianji-explore-fold-0", 2)
        return before, len(span._metadata["collections"])

    before, after = client.run_on_scheduler(fold)
    assert before >= 8 and after == 1  # identical descriptions folded into one
    deadline = time.time() + 30  # workers send their metrics with their heartbeats
    while not any(k[0] == "execute" and k[1] == "tianji-explore-fold" and k[-1] == "seconds" for k in
                  client.run_on_scheduler(lambda dask_scheduler=None: dask_internals.task_prefix_metrics(dask_scheduler))):
        assert time.time() < deadline, "no fine performance metrics for the tasks"
        time.sleep(0.1)


def test_a_spec_cluster_takes_named_workers_of_its_template():
    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster:
        spec = dask_internals.worker_template(cluster)
        spec["options"].update(resources={"EXPLORER": 1})
        dask_internals.add_workers(cluster, {"tianji-test-explorer": spec})
        assert list(cluster.workers) == ["tianji-test-explorer"]
        assert cluster.new_spec["options"].get("resources") is None  # the template itself unchanged


def test_a_jobqueue_job_outside_the_pool_is_made_like_the_pools_own():
    from dask_jobqueue import SLURMCluster

    with SLURMCluster(cores=1, memory="1GiB", processes=1, scheduler_options={"dashboard_address": None}) as cluster:
        job = dask_internals.jobqueue_job(cluster, "tianji-learner-0", cores=2, memory="2GiB", job_name="tianji-learner",
                                          worker_extra_args=["--resources", "LEARNER=1"])
        script = job.job_script()
        assert "tianji-learner" in script and "LEARNER=1" in script and cluster.scheduler_address in script


def test_dashboard_pages_go_into_the_table_and_onto_a_running_scheduler():
    from distributed import Scheduler

    table = dask_internals.scheduler_page_table()
    assert isinstance(table, dict) and "/status" in table
    assert dask_internals.dashboard_template() is not None

    async def scenario():
        async with Scheduler(dashboard_address=":0", dashboard=True) as scheduler:
            def make(scheduler, extra, doc):  # how the dashboard calls a page's maker
                doc.title = "test"

            assert dask_internals.add_page_to_running_scheduler(scheduler, "/tianji-test", make)
            assert not dask_internals.add_page_to_running_scheduler(scheduler, "/tianji-test", make)  # already there

    import asyncio

    asyncio.run(scenario())


def test_an_actor_handle_from_its_address_and_key(client):
    class Counter:
        n = 0

        def add(self):
            self.n += 1
            return self.n

    actor = client.submit(Counter, actor=True, key="tianji-test-counter").result()
    worker = next(iter(client.scheduler_info()["workers"]))

    def call_from_worker():
        from distributed import get_worker

        handle = dask_internals.actor_handle(Counter, worker, "tianji-test-counter", get_worker())
        return handle.add().result()

    assert actor.add().result() == 1
    assert client.submit(call_from_worker, pure=False).result() == 2
    assert dask_internals.actor_address(actor) == worker and dask_internals.actor_address(None) is None


def test_the_environment_a_nanny_gives_its_workers_is_read_before_distributed_is_imported():
    # the forkserver starts before the CLI imports distributed, and must start with the Nanny's variables
    import json
    import subprocess
    import sys

    code = ("import json, sys; from tianji_dask import dask_internals; before = dask_internals.worker_spawn_environ(); "
            "assert 'distributed' not in sys.modules; import distributed; "
            "print(json.dumps([before, dask_internals.worker_spawn_environ()]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after = json.loads(proc.stdout)
    assert before == after and "OMP_NUM_THREADS" in before


def test_a_dashboard_is_built_later_on_a_scheduler_made_without_one():
    # a run's own cluster builds its dashboard once the learner runs (cluster.serve_dashboard)
    from distributed import Scheduler

    def make(scheduler, extra, doc):
        doc.title = "test"

    async def scenario():
        async with Scheduler(dashboard_address=":0", dashboard=False) as scheduler:
            assert not dask_internals.add_page_to_running_scheduler(scheduler, "/tianji-later", make)  # none yet
            dask_internals.serve_dashboard(scheduler)
            pages = [app._applications for app in scheduler.http_application.applications if hasattr(app, "_applications")]
            assert len(pages) == 1 and "/status" in pages[0]
            assert dask_internals.add_page_to_running_scheduler(scheduler, "/tianji-later", make)

    import asyncio

    asyncio.run(scenario())


def _refuse_to_load():
    raise OSError("the bytes of this result cannot be read here")


class _Unloadable:
    def __reduce__(self):
        return (_refuse_to_load, ())


def test_a_result_that_cannot_be_fetched_comes_out_marked_and_the_rest_go_on():
    # distributed's own as_completed lets a failed fetch escape its tracking task: a logged
    # traceback, and the future never comes out (the learner would wait on it for ever)
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None, processes=True) as cluster, \
            Client(cluster) as client:
        ac = dask_internals.arrivals_in_completion_order()
        ac.add(client.submit(_Unloadable, pure=False))
        ac.add(client.submit(lambda: 7, pure=False))
        got = []
        deadline = time.time() + 60
        while len(got) < 2 and time.time() < deadline:
            dask_internals.wait_any_completed(ac, 1.0)
            got += ac.next_batch(block=False)
        results = sorted((type(r).__name__ for _, r in got))
        assert results == ["FetchFailed", "int"], got


def test_a_runs_workers_start_without_the_nannys_malloc_trim_threshold(tianji_client):
    """distributed's Nanny sets MALLOC_TRIM_THRESHOLD_; with it glibc maps and unmaps every large
    tensor afresh (a MinAtar PPO update 1.5x as long), so a run's own workers go without it."""
    import os
    from unittest import mock

    from tianji_dask.launch import forkserver

    env = tianji_client.run(lambda: {k: os.environ.get(k) for k in ("MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS")})
    assert len(env) == 3 and all(e == {"MALLOC_TRIM_THRESHOLD_": None, "OMP_NUM_THREADS": "1"} for e in env.values()), env
    # spawned workers: the Nanny is told to leave it unset, even once a plain Nanny in this process
    # (another LocalCluster) has written its value into this process's environment
    with mock.patch.dict(os.environ, {"MALLOC_TRIM_THRESHOLD_": "65536"}):
        assert forkserver.left_out_config() == {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}
        assert "MALLOC_TRIM_THRESHOLD_" not in forkserver.worker_environ()
    with mock.patch.dict(os.environ, {"MALLOC_TRIM_THRESHOLD_": "1000000"}):  # the user's own: it wins
        assert forkserver.left_out_config() == {}
        assert forkserver.worker_environ()["MALLOC_TRIM_THRESHOLD_"] == "1000000"


def test_the_workers_log_of_erred_tasks_leaves_out_the_keys_it_is_told(client):
    def boom():
        raise RuntimeError("boom")

    quiet = dask_internals.quiet_task_errors(("tianji-explore-quiet1-",))  # the worker runs in this process
    try:
        for key in ("tianji-explore-quiet1-0123456789ab", "tianji-other-quiet1"):
            with pytest.raises(RuntimeError):
                client.submit(boom, key=key, pure=False).result(timeout=30)
    finally:
        dask_internals.loud_task_errors(quiet)
    logged = [m for records in client.get_worker_logs().values() for _, m in records if "Compute Failed" in m]
    assert any("tianji-other-quiet1" in m for m in logged), logged
    assert not any("tianji-explore-quiet1" in m for m in logged), logged


@contextlib.contextmanager
def _errors_logged(name: str, install_filter):
    """The ERROR records logger ``name`` lets through while the filter ``install_filter()`` installs
    on it is in place; the filter and the collecting handler are gone afterwards."""
    logger, seen = logging.getLogger(name), []
    handler = logging.Handler(logging.ERROR)
    handler.emit = seen.append
    logger.addHandler(handler)
    quiet = install_filter()
    try:
        yield logger, seen
    finally:
        logger.removeFilter(quiet)
        logger.removeHandler(handler)


def test_an_embedded_workers_heartbeat_that_raced_the_close_is_left_out_and_its_other_errors_are_not():
    import distributed.worker

    # the message the filter knows is the one the installed release logs
    assert "Failed to communicate with scheduler during heartbeat." in inspect.getsource(distributed.worker.Worker.heartbeat)
    with _errors_logged("distributed.worker", dask_internals.quiet_heartbeat_failures) as (logger, seen):
        try:
            raise OSError("Stream is closed")
        except OSError:
            logger.exception("Failed to communicate with scheduler during heartbeat.")
            logger.exception("Unexpected exception during heartbeat. Closing worker.")
    assert [r.getMessage() for r in seen] == ["Unexpected exception during heartbeat. Closing worker."]


def test_an_embedded_workers_transfer_to_a_peer_that_died_is_left_out_and_its_other_errors_are_not():
    import distributed.worker
    from distributed.comm.core import CommClosedError

    # the message the filter knows is the one the installed release logs, for an OSError
    source = inspect.getsource(distributed.worker.Worker.get_data)
    assert "except OSError:" in source and '"failed during get data with %s -> %s"' in source
    with _errors_logged("distributed.worker", dask_internals.quiet_lost_peer_transfers) as (logger, seen):
        for error in (CommClosedError("in <TCP (closed)>: ConnectionResetError: [Errno 104] Connection reset by peer"),
                      RuntimeError("a result that cannot be serialised")):
            try:
                raise error
            except Exception:
                logger.exception("failed during get data with %s -> %s", "tcp://127.0.0.1:37779", None)
        logger.error("failed during get data with %s -> %s", "tcp://127.0.0.1:37779", None)  # no exception: kept
    assert [type(r.exc_info[1]).__name__ if r.exc_info else None for r in seen] == ["RuntimeError", None]


def test_a_runs_own_workers_carry_both_filters(tianji_client):
    def filters(dask_worker):
        return sorted(getattr(f, "__name__", type(f).__name__) for f in logging.getLogger("distributed.worker").filters)

    on_workers = tianji_client.run(filters)
    assert len(on_workers) == 3, on_workers
    assert all({"_not_a_failed_heartbeat", "_not_a_lost_peer_transfer"} <= set(names) for names in on_workers.values()), on_workers


def test_a_call_ctrl_c_interrupted_before_it_began_leaves_no_traceback_from_the_loop():
    import distributed.utils

    # the installed release's sync() still cancels through a name bound only once the call began
    assert "def cancel() -> None:\n        if future is not None:" in inspect.getsource(distributed.utils.sync)
    with _errors_logged("tornado.application", dask_internals.quiet_interrupted_calls) as (logger, seen):
        for error in (NameError("cannot access free variable 'future'"), ValueError("a callback of the run's own")):
            try:
                raise error
            except Exception:
                logger.exception("Exception in callback functools.partial(<function sync.<locals>.cancel at 0x7f18>)")
    assert [type(r.exc_info[1]).__name__ for r in seen] == ["ValueError"]


def test_a_clusters_close_keeps_distributeds_lines_below_the_run_s_level_on_the_terminal():
    from tianji_dask.launch.cluster import Opened

    # the terminal handler distributed's default config gives its logger outside pytest, at INFO
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s - %(levelname)s - %(message)s"))
    logging.getLogger("distributed").addHandler(handler)
    try:
        cluster = LocalCluster(n_workers=0, processes=False, dashboard_address=":0", silence_logs=logging.ERROR)
        opened = Opened(Client(cluster), cluster, log_level=logging.ERROR)
        close = cluster.close

        def close_then_a_comm_logs(*args, **kwargs):
            close(*args, **kwargs)
            # the cluster has put its handlers' level back; a comm to a worker gone logs as it closes
            assert handler.level < logging.ERROR
            logging.getLogger("distributed.batched").info("Batched Comm Closed <TCP (closed)>", exc_info=True)
            logging.getLogger("distributed.batched").error("an error of the close still shows")

        cluster.close = close_then_a_comm_logs
        opened.close()
        logging.getLogger("distributed.batched").info("after the close: shown again")
    finally:
        logging.getLogger("distributed").removeHandler(handler)
    text = stream.getvalue()
    assert "Batched Comm Closed" not in text and "an error of the close still shows" in text, text
    assert [line for line in text.splitlines() if " - INFO - " in line] == [
        line for line in text.splitlines() if "after the close: shown again" in line], text
