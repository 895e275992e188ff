"""The learner's loop strategies, driven without a cluster: a real learner core (real algorithm,
real CartPole rollouts) and a real inline weights publisher, with small fakes of the stream of
explorer futures and of the admission client that log what the loop asks of them."""

from __future__ import annotations

import functools
import threading
import time
from collections import deque

import pytest

from tianji_dask.algos import make_algorithm
from tianji_dask.core.learner_core import LearnerCore
from tianji_dask.core.metrics import CHUNK_FIELDS
from tianji_dask.core.spec import CoreSpec
from tianji_dask.core.stop import StopRules
from tianji_dask.dataflow.learner.admission import Request
from tianji_dask.dataflow.learner.lockstep import LockstepLoop
from tianji_dask.dataflow.learner.relaxed import RelaxedLoop
from tianji_dask.dataflow.learner.spec import LearnerSpec
from tianji_dask.dataflow.learner.stream import Arrival
from tianji_dask.dataflow.learner.weights import WeightsPublisher
from tianji_dask.dataflow.messages import ControllerParams
from tianji_dask.envs.rollout import Rollout
from tianji_dask.envs.vector import env_spaces
from tianji_dask.dataflow.controller.settings import LawSettings

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPACES = env_spaces("CartPole-v1")


class Held:
    """Stands for a chunk's future: says in the log when the loop lets it go."""

    def __init__(self, key, log):
        self.key, self.log = key, log

    def __del__(self):
        self.log.append(("released", self.key))


class FakeStream:
    """Each submitted task runs at once on a real rollout of its stream; the chunk is handed out
    when ``finish`` says so (all at once by default)."""

    def __init__(self, streams, log, core, *, chunk_steps=16, num_envs=4, auto=True):
        self.streams, self.log, self.core, self.auto = list(streams), log, core, auto
        self.rollouts = {s: Rollout("CartPole-v1", num_envs, seed=s) for s in self.streams}
        self.chunk_steps = chunk_steps
        self.out: dict[str, Arrival] = {}
        self.ready: deque = deque()
        self.serial = 0
        self.broken: set[int] = set()  # streams whose tasks fail

    @property
    def in_flight(self):
        return len(self.out)

    def choose(self, n):
        keys = []
        for _ in range(n):
            load = {s: sum(1 for a in self.out.values() if a.stream == s) + sum(1 for _, c in keys if c == s)
                    for s in self.streams}
            self.serial += 1
            keys.append((f"tianji-explore-t-{self.serial}", min(self.streams, key=lambda s: load[s])))
        return keys

    def workers_moved(self, epoch):
        pass  # one process: no worker comes or goes

    def submit(self, granted, weights_version, weights, explore, version):
        for key, stream in granted:
            self.log.append(("submit", key, weights_version))
            arrival = Arrival(key, stream, version, Held(key, self.log))
            if stream in self.broken:
                arrival.lost, arrival.failed, arrival.failures = "RuntimeError: broken env", True, 99
            else:
                arrival.chunk = self.rollouts[stream].run(self.core.algo, self.chunk_steps, explore,
                                                          policy_version=weights_version, explorer_id=stream)
            self.out[key] = arrival
            if self.auto:
                self.finish(key)

    def finish(self, key):
        self.ready.append(self.out[key])

    def arrivals(self, wait_s=0.0):
        out = list(self.ready)
        self.ready.clear()
        for arrival in out:
            del self.out[arrival.key]
            self.log.append(("arrival", arrival.key))
        return out

    def cancel_all(self):
        out = [(k, a.stream) for k, a in self.out.items()]
        self.out.clear()
        return out

    def homes_by_stream(self):
        return {}


class FakeAdmission:
    """Grants every key asked for, up to the window, answering at once."""

    def __init__(self, window, log, grant_limit=None):
        self.params = ControllerParams(window=window)
        self.log, self.grant_limit = log, grant_limit
        self._request = None

    @property
    def waiting(self):
        return self._request is not None

    @property
    def asked(self):
        return len(self._request.want) if self._request else 0

    def answered(self):
        return self.waiting

    ask_again_at = None
    workers_epoch = 0

    def may_ask(self, samples_trained, starving, in_flight):
        return True

    def request(self, *, consumed, held, want, version, progress, status):
        self.log.append(("request", tuple(c.key for c in consumed), tuple(k for k, _ in want)))
        self._request = Request(answer=None, want=want, held=held)

    def reply(self):
        request, self._request = self._request, None
        want = request.want
        granted = want if self.grant_limit is None else want[: self.grant_limit]
        self.log.append(("reply", tuple(k for k, _ in granted)))
        return list(granted), request.held

    def final(self, *, consumed, version, progress, status):
        self.log.append(("final", tuple(c.key for c in consumed)))


def make_loop(strategy, algo="ppo", algo_config=None, *, streams=(0, 1), stop=None, publish_every=1, window=2,
              max_failures=10, log=None, auto=True):
    log = [] if log is None else log
    core = LearnerCore(CoreSpec(
        make_algo=functools.partial(make_algorithm, algo, *SPACES, algo_config or {}, 0),
        stop=stop or StopRules(max_updates=4), t_process_start=time.time(),
    ))
    learn = core.learn_once
    parts = {}

    def logged_learn():
        learn()
        log.append(("learn", core.version, parts["stream"].in_flight + parts["admission"].asked))

    core.learn_once = logged_learn
    spec = LearnerSpec(run_id="t", mode="lockstep" if strategy is LockstepLoop else "relaxed", core=core.spec,
                       streams=tuple(streams), chunk_steps=16, chunk_env_steps=64, law=LawSettings(window=window, window_min=1, window_max=64),
                       publish_every=publish_every, max_explorer_failures=max_failures)
    stream = parts["stream"] = FakeStream(streams, log, core, auto=auto)
    publisher = WeightsPublisher(client=None, worker_address="", tag="t", inline=True)
    admission = parts["admission"] = FakeAdmission(window, log)
    loop = strategy(spec=spec, core=core, stream=stream, publisher=publisher, admission=admission, fusion=None,
                    stop_event=threading.Event(), on_status=lambda s: None)
    return loop, log


def column(rows, name):
    """A column of the ledger's chunk rows, by its name in CHUNK_FIELDS."""
    return rows[:, CHUNK_FIELDS.index(name)]


def kinds(log, *names):
    return [e for e in log if e[0] in names]


def test_lockstep_trains_only_on_a_whole_round_and_broadcasts_each_version():
    loop, log = make_loop(LockstepLoop, "ppo", {"segments_per_batch": 2}, streams=(0, 1, 2),
                          stop=StopRules(max_updates=6))
    loop.run()
    rounds = []  # a round: its submissions, then what happened until the next ones
    for event in kinds(log, "submit", "arrival", "learn"):
        if event[0] == "submit" and (not rounds or rounds[-1][-1][0] != "submit"):
            rounds.append([])
        rounds[-1].append(event)
    assert len(rounds) >= 3
    for r in rounds[:-1]:  # the last one may be cut by the stop
        names = [e[0] for e in r]
        assert names.count("submit") == 3  # one chunk for each stream
        assert names.count("arrival") == 3 and names.index("learn") > max(i for i, n in enumerate(names) if n == "arrival")
    assert all(e[2] == 0 for e in kinds(log, "learn"))  # nothing out or asked for while it trains
    versions = [e[2] for e in kinds(log, "submit")]  # every round acts with the version the last one made
    assert versions[:3] == [0, 0, 0] and len(set(versions[3:6])) == 1 and versions[3] > 0
    assert loop.core.stop_reason() == "max_updates"


def test_relaxed_keeps_explorers_busy_while_it_trains():
    loop, log = make_loop(RelaxedLoop, "dqn", {"learning_starts": 64, "batch_size": 16},
                          stop=StopRules(max_updates=40))
    loop.run()
    learns = kinds(log, "learn")
    assert len(learns) == 40 and loop.core.stop_reason() == "max_updates"
    # the next chunks were asked for before the pass's updates: work was out or on its way at every one
    assert all(in_flight > 0 for _, _, in_flight in learns)


def test_consumed_futures_are_released_only_after_the_answer_submits_its_work():
    loop, log = make_loop(RelaxedLoop, "dqn", {"learning_starts": 64, "batch_size": 16},
                          stop=StopRules(max_updates=30))
    loop.run()
    index = {(e[0], e[1]): i for i, e in enumerate(log) if e[0] == "submit"}
    releases = [(i, e[1]) for i, e in enumerate(log) if e[0] == "released"]
    assert len(releases) >= 3
    for i, key in releases:
        reported = next(j for j, e in enumerate(log) if e[0] in ("request", "final") and key in e[1])
        assert i > reported  # held until the controller has its consumption on record
        if log[reported][0] == "request":
            answer = next(j for j in range(reported, len(log)) if log[j][0] == "reply")
            assert all(index[("submit", granted)] < i for granted in log[answer][1])


def _passes(loop, n):
    for _ in range(n):
        loop.step()


def test_relaxed_on_policy_consumes_a_chunk_only_when_an_update_takes_it():
    loop, _ = make_loop(RelaxedLoop, "ppo", {"segments_per_batch": 1, "max_policy_lag": 1}, window=2, auto=False)
    core, stream = loop.core, loop.stream
    _passes(loop, 2)  # asks for two chunks; the answer submits them
    assert stream.in_flight == 2
    for key in list(stream.out):
        stream.finish(key)
    loop.step()  # both arrive: one is taken by an update, the other waits for the next
    assert core.ledger.updates == 1 and len(core.ledger.chunk_rows) == 1 and loop.chunks_waiting == 1
    loop.step()  # the waiting one is consumed one version later (staleness 1, still usable)
    rows = core.ledger.chunk_rows.all()
    assert core.ledger.updates == 2 and list(column(rows, "staleness_versions")) == [0, 1] and not core.ledger.dropped


def test_on_policy_chunks_too_stale_are_dropped_at_once_and_counted():
    loop, _ = make_loop(RelaxedLoop, "ppo", {"segments_per_batch": 1, "max_policy_lag": 0}, window=2, auto=False)
    core, stream = loop.core, loop.stream
    _passes(loop, 2)
    first, second = list(stream.out)
    stream.finish(first)
    loop.step()  # trains on the first: version 1
    stream.finish(second)
    loop.step()  # the second was made by version 0: one version stale, past the lag limit of 0
    assert core.ledger.dropped == {"algorithm": 1} and core.ledger.updates == 1


def test_publish_every_k_versions_explorers_act_with_up_to_k_minus_1_old_weights():
    loop, log = make_loop(RelaxedLoop, "dqn", {"learning_starts": 64, "batch_size": 16}, publish_every=4,
                          stop=StopRules(max_updates=60))
    loop.run()
    versions = sorted({e[2] for e in kinds(log, "submit")})
    assert len(versions) > 2 and all(b - a >= 4 for a, b in zip(versions, versions[1:]))
    rows = loop.core.ledger.chunk_rows.all()
    lag = column(rows, "submit_version") - column(rows, "policy_version")  # learner at submission - policy
    assert lag.min() >= 0 and lag.max() <= 3 and lag.max() > 0


def test_a_stream_that_keeps_failing_stops_the_run_naming_it():
    loop, _ = make_loop(RelaxedLoop, "ppo", {"segments_per_batch": 1}, max_failures=3, stop=StopRules(max_updates=50))
    loop.stream.broken.add(1)
    loop.run()
    assert loop.core.stop_reason() == "explorer_failures"
    assert loop.core.error.startswith("explorer 1 failed 99 chunks in a row; last: RuntimeError: broken env")
    assert any(lost["explorer_id"] == 1 for lost in loop.core.ledger.lost)


def test_at_stop_waiting_chunks_and_tasks_still_out_are_on_record_as_lost():
    loop, log = make_loop(RelaxedLoop, "ppo", {"segments_per_batch": 1}, window=3, auto=False)
    _passes(loop, 2)
    keys = list(loop.stream.out)
    loop.stream.finish(keys[0])
    loop.stream.finish(keys[1])
    loop.step()  # one trained on and reported, one waiting; the third still out; one more asked for
    loop.drain()
    reasons = sorted(lost["reason"] for lost in loop.core.ledger.lost)
    assert reasons == ["cancelled at stop", "cancelled at stop", "received, not trained on at stop"]
    assert kinds(log, "final")[-1][1] == ()  # the consumed one had been reported


def test_status_carries_the_window_and_chunks_in_flight():
    loop, _ = make_loop(RelaxedLoop, "ppo", {"segments_per_batch": 1}, window=2, auto=False)
    _passes(loop, 2)
    status = loop.status(time.time())
    assert status["window"] == 2 and status["chunks_in_flight"] == 2 and status["version"] == 0
