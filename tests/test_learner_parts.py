"""The learner's parts one by one, on a real in-process Dask cluster (a scheduler with the staleness
controller, explorer workers running the real ``explore_chunk`` on CartPole) but without a
learner actor: the stream of explorer futures, the admission client, the weights publisher, and
the fusion client with a real reducer."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time

import numpy as np
import pytest
import sleepy_env  # noqa: F401 - registers the test envs in this process, where the workers run
from distributed import Client, LocalCluster

from tianji_dask.algos import make_algorithm
from tianji_dask.core.learner_core import LearnerCore
from tianji_dask.core.spec import CoreSpec
from tianji_dask.core.stop import StopRules
from tianji_dask.dataflow.controller.plugin import StalenessController
from tianji_dask.dataflow.explorer.pool import EnvPool
from tianji_dask.dataflow.keys import pool_name
from tianji_dask.dataflow.learner.admission import AdmissionClient
from tianji_dask.dataflow.learner.fusion import FusionClient
from tianji_dask.dataflow.learner.spec import FusionSpec
from tianji_dask.dataflow.learner.stream import ExplorerStream
from tianji_dask.dataflow.learner.weights import WeightsPublisher
from tianji_dask.dataflow.messages import Consumption, Progress
from tianji_dask.dataflow.learner.reducer import Reducer
from tianji_dask.envs.vector import env_spaces
from tianji_dask.dataflow.controller.settings import LawSettings

SPACES = env_spaces("CartPole-v1")
MAKE_PPO = functools.partial(make_algorithm, "ppo", *SPACES, {"segments_per_batch": 1}, 0)


@pytest.fixture(scope="module")
def cluster():
    """One scheduler and two explorer workers in this process."""
    with LocalCluster(processes=False, n_workers=2, threads_per_worker=1, resources={"EXPLORER": 1},
                      dashboard_address=None) as cluster, Client(cluster) as client:
        yield cluster, client


def _pool(client, run_id, env_id="CartPole-v1", explorer_kwargs=None):
    client.register_plugin(EnvPool(run_id, env_id, 2, {}, MAKE_PPO, 0, explorer_kwargs=explorer_kwargs),
                           name=pool_name(run_id))


def _stream(client, run_id, streams=(0, 1), direct_min_bytes=None):
    return ExplorerStream(client, run_id=run_id, tag=run_id, group=0, streams=streams, chunk_steps=8,
                          worker_address="tcp://127.0.0.1:1", direct_min_bytes=direct_min_bytes)


def _collect(stream, n, timeout=60):
    got, deadline = [], time.time() + timeout
    while len(got) < n:
        assert time.time() < deadline, f"{len(got)} of {n} arrivals"
        got += stream.arrivals(wait_s=0.5)
    return got


# ---- the stream of explorer futures ---------------------------------------------------------
def test_the_stream_spreads_work_over_streams_and_hands_back_real_chunks(cluster):
    _, client = cluster
    _pool(client, "s1")
    stream = _stream(client, "s1")
    chosen = stream.choose(4)
    assert [s for _, s in chosen] == [0, 1, 0, 1]  # least loaded first, ties to the one served longest ago
    weights = MAKE_PPO().get_weights()
    stream.submit(chosen, 0, weights, {}, version=3)
    assert stream.in_flight == 4
    arrivals = _collect(stream, 4)
    assert sorted(a.key for a in arrivals) == sorted(k for k, _ in chosen) and stream.in_flight == 0
    for a in arrivals:
        assert a.lost is None and a.chunk["explorer_id"] == a.stream and a.submit_version == 3
        assert a.chunk["policy_version"] == 0 and a.chunk["env_steps"] > 0
    homes = stream.homes_by_stream()
    assert sorted(homes) == [0, 1] and homes[0] != homes[1]  # each stream has a worker of its own


def test_failed_chunks_count_in_a_row_per_stream(cluster):
    _, client = cluster
    _pool(client, "s2", "sleepy_env:FailingCartPole-v0", explorer_kwargs={1: {"fail_after": 0}})
    stream = _stream(client, "s2")
    weights = MAKE_PPO().get_weights()
    failures = []
    for _ in range(3):
        stream.submit(stream.choose(2), 0, weights, {}, version=0)
        for a in _collect(stream, 2):
            if a.stream == 1:
                assert a.failed and a.chunk is None and a.lost.startswith("explorer 1, env sleepy_env:FailingCartPole-v0: RuntimeError")
                failures.append(a.failures)
            else:
                assert not a.failed and a.chunk is not None
    assert failures == [1, 2, 3]


def test_cancelling_at_stop_names_every_task_still_out(cluster):
    _, client = cluster
    _pool(client, "s3", "sleepy_env:SleepyCartPole-v0", explorer_kwargs={0: {"sleep_s": 0.05}, 1: {"sleep_s": 0.05}})
    stream = _stream(client, "s3")
    chosen = stream.choose(4)
    stream.submit(chosen, 0, MAKE_PPO().get_weights(), {}, version=0)
    out = stream.cancel_all()
    assert sorted(out) == sorted(chosen) and stream.in_flight == 0


def test_a_read_that_raises_leaves_its_whole_batch_in_flight(cluster, monkeypatch):
    # the scheduler lost while a batch of arrivals is read: none may leave the books; the
    # learner's drain counts what is still in flight as lost
    _, client = cluster
    _pool(client, "s3b")
    stream = _stream(client, "s3b")
    chosen = stream.choose(2)
    stream.submit(chosen, 0, MAKE_PPO().get_weights(), {}, version=0)
    deadline = time.time() + 60
    while stream._ac.queue.qsize() < 2:  # both finished and fetched, not yet read
        assert time.time() < deadline, "the two tasks did not finish"
        time.sleep(0.05)
    read = stream._arrival
    calls = []

    def second_raises(future, result):
        calls.append(future.key)
        if len(calls) == 2:
            raise OSError("the scheduler went")
        return read(future, result)

    monkeypatch.setattr(stream, "_arrival", second_raises)
    with pytest.raises(OSError):
        stream.arrivals()
    assert len(calls) == 2 and stream.in_flight == 2
    assert sorted(stream.forget_all()) == sorted(chosen) and stream.in_flight == 0


def test_a_direct_chunk_arrives_whole_through_the_sink(cluster):
    _, client = cluster
    _pool(client, "s4")
    stream = _stream(client, "s4", direct_min_bytes=0)  # every chunk the short way
    try:
        stream.submit(stream.choose(2), 0, MAKE_PPO().get_weights(), {}, version=0)
        arrivals = _collect(stream, 2)
        assert all(a.chunk is not None and "obs" in a.chunk for a in arrivals)
        assert stream.direct_stats()["chunks"] == 2
    finally:
        stream.close()


# ---- the admission client against the real controller -------------------------------------------
def test_admission_asks_only_when_the_controllers_floor_can_grant(cluster):
    _, client = cluster
    client.register_plugin(StalenessController(), name="tianji")
    adm = AdmissionClient(client, run_id="a1", group=0, law=LawSettings(window=2, window_min=1, window_max=64, replay_ratio=(16, 32)),
                          learner_address="tcp://127.0.0.1:1", chunk_env_steps=256)
    assert adm.params.window == 2 and adm.params.rho_max == 32
    want = [("tianji-explore-a1-0", 0), ("tianji-explore-a1-1", 1)]
    adm.request(consumed=[], held=[], want=want, version=0, progress=None, status=None)
    assert adm.waiting and adm.asked == 2
    granted, _ = adm.reply()
    assert granted == want and not adm.waiting  # warm-up: everything the window allows
    # warm, too few samples trained: nothing granted, and the answer says when to ask again
    low = Progress(env_steps=1000, samples_trained=100, warm=True)
    consumed = [Consumption(want[0][0], 0, 256, 10, 1, 0.01, None)]
    adm.request(consumed=consumed, held=[], want=[("tianji-explore-a1-2", 0)], version=5, progress=low, status=None)
    granted, _ = adm.reply()
    assert granted == [] and not adm.may_ask(low.samples_trained, starving=False, in_flight=1)
    assert adm.may_ask(16 * (1000 + 256), starving=False, in_flight=1)  # the floor reached
    assert adm.may_ask(100, starving=True, in_flight=0)  # nothing out and starving: always
    adm.final(consumed=[Consumption(want[1][0], 1, 256, 10, 0, 0.01, "algorithm")], version=6, progress=low, status={})
    state = client.sync(client.scheduler.tianji_state, run_id="a1")
    assert state["chunks_consumed"] == 2 and state["chunks_in_flight"] == 0 and state["chunks_dropped"] == 1
    adm.set_window(5)
    assert client.sync(client.scheduler.tianji_state, run_id="a1")["window"] == 5


# ---- the weights publisher ------------------------------------------------------------------------
def test_scattered_weights_reach_the_cluster(cluster):
    cl, client = cluster
    worker = next(iter(cl.workers.values())).address
    publisher = WeightsPublisher(client, worker, "w1", inline=False)
    weights = {"w": np.arange(6, dtype=np.float32)}
    publisher.publish(0, weights, wait=True)
    newest = publisher.newest()
    assert newest.version == 0 and np.array_equal(newest.weights.result()["w"], weights["w"])
    assert newest.weights.key == "tianji-weights-w1-0" and publisher.counts == {"inline": 0, "scattered": 1}
    publisher.close()


def test_one_scatter_at_a_time_and_tasks_get_the_newest_completed(monkeypatch):
    from tianji_dask import dask_internals

    scatters = []  # the scatter call, held until the test completes it

    def scatter_nowait(client, data, worker):
        scatters.append((concurrent.futures.Future(), data))
        return scatters[-1][0]

    monkeypatch.setattr(dask_internals, "scatter_nowait", scatter_nowait)
    publisher = WeightsPublisher(None, "tcp://learner:1", "w3", inline=False)

    def complete(i):
        future, data = scatters[i]
        future.set_result({key: f"ref-{key}" for key in data})

    publisher.publish(0, {"w": np.zeros(1)})
    complete(0)
    assert publisher.newest().version == 0
    publisher.publish(1, {"w": np.ones(1)})
    assert publisher.scattering and publisher.newest().version == 0  # tasks go on with version 0 meanwhile
    publisher.publish(2, {"w": np.ones(1)})  # one under way: skipped, the next submission publishes anew
    assert len(scatters) == 2 and publisher.counts["scattered"] == 2 and publisher.version == 1
    complete(1)
    newest = publisher.newest()
    assert (newest.version, newest.weights) == (1, "ref-tianji-weights-w3-1") and not publisher.scattering
    publisher.publish(3, {"w": np.ones(1)})
    assert len(scatters) == 3


def test_inline_weights_and_what_a_refresh_would_have_dropped():
    publisher = WeightsPublisher(None, "", "w2", inline=True)
    assert WeightsPublisher.fits_inline({"w": np.zeros(10, np.float32)}, 40) and not WeightsPublisher.fits_inline({"w": np.zeros(11, np.float32)}, 40)
    publisher.publish(0, {"w": np.zeros(2)})
    t_between = time.time()
    time.sleep(0.01)
    publisher.publish(1, {"w": np.ones(2)})
    assert publisher.newest().version == 1 and publisher.counts["inline"] == 2
    # a chunk of version 0 that ended after version 1 was out would have been dropped by TianJi's explorer
    assert publisher.superseded_before(0, time.time() + 1)
    assert not publisher.superseded_before(0, t_between) and not publisher.superseded_before(1, time.time() + 1)


# ---- the fusion client, with a real reducer ---------------------------------------------------------
class SyncHandle:
    """A Reducer's async methods as calls returning finished futures, as an actor handle's do."""

    def __init__(self, reducer):
        self._reducer, self._loop = reducer, asyncio.new_event_loop()

    def __getattr__(self, name):
        method = getattr(self._reducer, name)

        def call(*args):
            future = concurrent.futures.Future()
            coro = method(*args, timeout=0) if name == "take" else method(*args)
            future.set_result(self._loop.run_until_complete(coro))
            return future

        return call


def _dqn_core():
    make = functools.partial(make_algorithm, "dqn", *SPACES, {}, 0)
    return LearnerCore(CoreSpec(make_algo=make, stop=StopRules(max_updates=10), t_process_start=time.time()))


@pytest.mark.parametrize("barrier", [True, False])
def test_fusion_installs_the_mean_of_one_model_per_group(barrier):
    reducer = SyncHandle(Reducer(2))
    spec = FusionSpec(reducer_address="", reducer_key="", every=2, barrier=barrier)
    cores = [_dqn_core(), _dqn_core()]
    for i, core in enumerate(cores):  # two groups whose models differ
        core.algo.load_model_state({k: np.full_like(v, i + 1.0) for k, v in core.algo.model_state().items()})
    clients = [FusionClient(spec, g, reducer) for g in range(2)]
    clients[0].updated()
    assert not clients[0].poll(cores[0]) and not clients[0].waiting  # one update: not due yet
    clients[0].updated()
    clients[1].updated()
    clients[1].updated()
    for client, core in zip(clients, cores):
        assert not client.poll(core) and client.waiting and client.holding == barrier  # offered
    assert not clients[0].poll(cores[0])  # the offer is taken: now the round's model is asked for
    assert not clients[1].poll(cores[1])
    if not barrier:  # group 0 learnt on while it waited: that difference is kept
        cores[0].algo.load_model_state({k: v + 0.5 for k, v in cores[0].algo.model_state().items()})
    for client, core in zip(clients, cores):
        assert client.poll(core)  # installed: a new version
        assert core.version == 1 and not client.waiting and client.installed[0]["round"] == 0
    expected = 1.5 + (0.0 if barrier else 0.5)
    assert all(np.allclose(v, expected) for v in cores[0].algo.model_state().values())
    assert all(np.allclose(v, 1.5) for v in cores[1].algo.model_state().values())


def test_chunks_pinned_to_a_worker_that_left_come_back_cancelled_and_the_stream_moves():
    with LocalCluster(processes=False, n_workers=2, threads_per_worker=1, resources={"EXPLORER": 1},
                      dashboard_address=None) as cl, Client(cl) as client:
        # stream 1's chunks take 0.8 s each, so that its worker closes under them; stream 0's are quick
        _pool(client, "s5", "sleepy_env:SleepyCartPole-v0", explorer_kwargs={1: {"sleep_s": 0.1}})
        stream = _stream(client, "s5")
        stream.submit(stream.choose(4), 0, MAKE_PPO().get_weights(), {}, version=0)
        gone = stream.homes_by_stream()[1]
        name = next(n for n, w in cl.workers.items() if w.address == gone)
        cl.sync(cl.workers[name].close)
        arrivals = _collect(stream, 4)
        lost = [a for a in arrivals if a.lost is not None]
        assert lost and all(a.stream == 1 and a.lost == "cancelled: its explorer worker left" for a in lost)
        assert stream.homes_by_stream()[1] != gone  # the stream now lives on the worker that is left


def test_a_stream_leaves_a_worker_as_soon_as_the_controller_says_workers_moved():
    # the controller counts workers joining and leaving; a learner that sees the count move looks
    # again at once, rather than at its next periodic look (a dead home would get chunks meanwhile)
    with LocalCluster(processes=False, n_workers=2, threads_per_worker=1, resources={"EXPLORER": 1},
                      dashboard_address=None) as cl, Client(cl) as client:
        ctl = StalenessController()
        client.register_plugin(ctl)
        epoch = lambda: client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["tianji"].workers_epoch)  # noqa: E731
        before = epoch()
        _pool(client, "s6")  # no chunk is out while the worker closes: CartPole's own speed will do
        stream = _stream(client, "s6")
        stream.workers_moved(before)
        gone = stream.homes_by_stream()[1]
        looked_at = stream.homes_looked_up_at
        stream.workers_moved(before)  # the same count: no new look
        assert stream.homes_looked_up_at == looked_at
        cl.sync(cl.workers[next(n for n, w in cl.workers.items() if w.address == gone)].close)
        deadline = time.time() + 30
        while epoch() == before:
            assert time.time() < deadline, "the controller never saw the worker leave"
            time.sleep(0.05)
        stream.workers_moved(epoch())
        assert gone not in stream.homes_by_stream().values()  # both streams on the worker that is left
        stream.submit(stream.choose(2), 0, MAKE_PPO().get_weights(), {}, version=0)
        assert all(a.chunk is not None for a in _collect(stream, 2))
