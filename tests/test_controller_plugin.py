"""The staleness controller's scheduler plugin and the books behind it, without a cluster: its
handlers grant, refuse, count and route by run and group; the books' parts (admission, accounting,
what is read) compose to the state on the wire that the dashboard, Prometheus, ``run/`` and past
results read."""

import pytest

from tianji_dask.dataflow.controller.pacing import REPLAY_CEILING_MARGIN, REPLAY_PERIOD_S
from tianji_dask.dataflow.controller.plugin import StalenessController
from tianji_dask.dataflow.messages import Consumption, consumptions_to_wire
from helpers import law_wire


def test_books_hold_a_replay_target_through_the_band_and_owe_each_env_step_its_floor():
    ctl = StalenessController()
    ctl.begin("r", law_wire(window=2, replay_ratio=[8, 32], replay_staleness_target=100.0), chunk_env_steps=100)
    books = ctl.books("r").admission
    assert books.params().rho_max == 16 * REPLAY_CEILING_MARGIN and books.rho_min == 16  # rho starts at 16
    assert ctl.state("r")["replay_target_verdict"] == {"state": "settling", "reason": None}
    prog = {"env_steps": 1000, "samples_trained": 16_000, "warm": True}
    for i in range(6):  # the learner reports 400 versions: too stale, so the ratio comes down
        ctl.cycle("r", progress=prog, learner_status={"replay_staleness_recent_mean": 400.0})
        books.replay_law.p_t -= REPLAY_PERIOD_S  # a control period has passed
    assert books.rho_min == 8 and books.params().rho_max == 8 * REPLAY_CEILING_MARGIN
    # the 1,000 env steps booked at 16 still owe 16 each; only new ones owe the new floor of 8
    reply = ctl.cycle("r", progress={**prog, "env_steps": 1100}, want=["tianji-explore-r-0"])
    assert books.samples_owed == 16_000 + 8 * 100 and reply["granted"] == [] and reply["ask_again_at_samples"] == 16_800
    state = ctl.configure("r", replay_staleness_target=None)
    assert state["replay_target_verdict"] == {"state": "off", "reason": None} and books.params().rho_max == 32
    with pytest.raises(ValueError, match="^replay_staleness_target: needs a replay_ratio band"):
        ctl.configure("r", replay_ratio=None, replay_staleness_target=50)


def consumed(*rows) -> dict:
    """Consumption records (key, explorer_id, env_steps, nbytes, staleness, age_s, why dropped) as the wire carries them."""
    return consumptions_to_wire([Consumption(*row) for row in rows])


def test_handlers_grant_refuse_and_count():
    ctl = StalenessController()
    params = ctl.begin("r1", law_wire(window=2, replay_ratio=[16, 32]), chunk_env_steps=256)
    assert params["window"] == 2 and params["rho_max"] == 32 and "rho_min" not in params  # the floor is the controller's
    books = ctl.books("r1")
    admission = books.admission
    keys = [f"tianji-explore-r1-{i}" for i in range(4)]
    warm = {"env_steps": 0, "samples_trained": 0, "warm": False}
    assert ctl.cycle("r1", want=keys, progress=warm)["granted"] == keys[:2]  # the window
    # a consumed report returns the credit; the ratio is too low to admit more
    low = {"env_steps": 1000, "samples_trained": 100, "warm": True}
    reply = ctl.cycle("r1", consumed=consumed((keys[0], 0, 256, 10, 3, 0.1, None)), want=keys[2:], progress=low,
                      learner_version=3)
    assert reply["granted"] == [] and books.accounting.refused_replay_ratio == 1 and admission.chunks_in_flight == 1
    # the answer names the samples at which one more chunk would be admitted: 16 x (1000 + 1 x 256)
    assert reply["ask_again_at_samples"] == 16 * (1000 + 256)
    ok = {"env_steps": 1000, "samples_trained": 16 * 2000, "warm": True}
    reply = ctl.cycle("r1", want=keys[2:], progress=ok)
    assert reply["granted"] == keys[2:3] and reply["ask_again_at_samples"] is None  # 32,000 >= 16 x (1000 + 2 x 256)
    ctl.cycle("r1", consumed=consumed((keys[1], 1, 256, 10, 0, 0.1, "algorithm")), progress=ok)
    state = ctl.state("r1", history=True)
    assert state["chunks_consumed"] == 2 and state["chunks_dropped"] == 1
    assert state["staleness_hist"] == {"0": 1, "3": 1} and len(state["history"]) == 2
    # an erred or forgotten task gives its credit back
    ctl.transition(keys[2], "processing", "erred")
    assert admission.chunks_in_flight == 0 and state["credits_granted"] == 3


def test_rebuilt_learner_hands_back_credits_it_never_submitted():
    # a learner that dies between a grant and its submit leaves keys the scheduler never saw:
    # no transition returns them, so the rebuilt learner's begin does
    from distributed import Scheduler

    ctl = StalenessController()
    ctl.scheduler = Scheduler(dashboard=False)
    ctl.begin("r1", law_wire(window=4), learner_address="tcp://learner:1", chunk_env_steps=16)
    keys = [f"tianji-explore-r1-{i}" for i in range(3)]
    assert ctl.cycle("r1", want=keys)["granted"] == keys
    ctl.scheduler.tasks[keys[0]] = object()  # submitted: its transition will return it
    ctl.remove_worker(ctl.scheduler, "tcp://learner:1")
    assert ctl.state("r1")["learner_lost"]
    ctl.begin("r1", law_wire(window=4), learner_address="tcp://learner:2", rebuilt=True)
    state = ctl.state("r1")
    assert state["chunks_in_flight"] == 1 and state["credits_returned"]["unsubmitted"] == 2
    assert not state["learner_lost"] and state["window"] == 4
    ctl.transition(keys[0], "processing", "forgotten")
    assert ctl.state("r1")["credits_returned"]["forgotten"] == 1 and ctl.books("r1").admission.chunks_in_flight == 0


class _WatchedKeys(set):
    """A credit set that records every key looked up in it."""

    def __init__(self, seen: list):
        super().__init__()
        self.seen = seen

    def __contains__(self, key):
        self.seen.append(key)
        return super().__contains__(key)


def test_a_transition_reaches_only_the_books_its_key_names():
    # the run (and group) is read from the key's tag: the other runs' books are never looked at
    ctl = StalenessController()
    for run_id in ("ra", "rb", "rc"):
        ctl.begin(run_id, law_wire(window=4))
    ctl.begin("rg", law_wire(window=4), group=0)
    ctl.begin("rg", law_wire(window=4), group=1)  # group mode: keys carry the group too
    keys = {run_id: ctl.cycle(run_id, want=[f"tianji-explore-{run_id}-{i:012x}" for i in range(3)])["granted"]
            for run_id in ("ra", "rb", "rc")}
    g1 = ctl.cycle("rg", group=1, want=[f"tianji-explore-rg-g1-{i:012x}" for i in range(2)])["granted"]
    seen = {}
    for run_id, books in ctl.all_books():
        seen[run_id, books.group] = []
        watched = _WatchedKeys(seen[run_id, books.group])
        watched.update(books.admission.credited)
        books.admission.credited = watched
    before = {run_id: ctl.state(run_id) for run_id in ("rb", "rc")}
    before_g0 = ctl.state("rg", group=0)
    ctl.transition(keys["ra"][0], "processing", "erred")
    ctl.transition(keys["ra"][1], "memory", "forgotten")
    ctl.transition(g1[0], "processing", "erred")
    ctl.transition("tianji-explore-gone-000000000000", "processing", "erred")  # a run whose books have gone
    assert seen == {("ra", 0): keys["ra"][:2], ("rb", 0): [], ("rc", 0): [], ("rg", 0): [], ("rg", 1): g1[:1]}
    ra = ctl.state("ra")
    assert ra["credits_returned"]["erred"] == 1 and ra["credits_returned"]["forgotten"] == 1 and ra["chunks_in_flight"] == 1
    assert ctl.state("rg", group=1)["credits_returned"]["erred"] == 1
    assert {run_id: ctl.state(run_id) for run_id in ("rb", "rc")} == before
    assert ctl.state("rg", group=0) == before_g0  # the run's other group too


def test_a_handler_call_must_name_a_run_the_controller_holds():
    ctl = StalenessController()
    with pytest.raises(ValueError, match="^run_id: name the run; runs on this scheduler: none$"):
        ctl.state()
    ctl.begin("ra", law_wire(window=2))
    ctl.begin("rb", law_wire(window=3))
    for call in (ctl.state, ctl.cycle, ctl.configure, ctl.end):
        with pytest.raises(ValueError, match="^run_id: name the run; runs on this scheduler: ra, rb$"):
            call()
    with pytest.raises(ValueError, match="^run_id: no run 'rz' on this scheduler; runs on this scheduler: ra, rb$"):
        ctl.cycle("rz", want=["tianji-explore-rz-000000000000"])
    with pytest.raises(ValueError, match=r"^group: run ra has no group 1; its groups: \[0\]$"):
        ctl.state("ra", group=1)
    ctl.end("gone")  # a run whose books went already (past MAX_RUNS): nothing to mark
    assert [ctl.state(r)["window"] for r in ("ra", "rb")] == [2, 3] and ctl.run_ids() == ["ra", "rb"]
    assert not hasattr(ctl, "window") and not hasattr(ctl, "history")  # no run's books stand in for the plugin's


def test_span_metadata_stays_bounded_over_many_submissions():
    # the scheduler appends one metadata entry per submission to a span that lives for ever
    # (dask/distributed#7977); the controller folds identical ones for explorer tasks
    from distributed import Client, LocalCluster

    from tianji_dask.dataflow.controller.plugin import SPAN_METADATA_MAX

    def collections(dask_scheduler, key):
        span = dask_scheduler.extensions["spans"].spans[dask_scheduler.tasks[key].group.span_id]
        return len(span._metadata["collections"])

    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster, Client(cluster) as client:
        plain = [client.submit(abs, -i, key=f"plain-{i}") for i in range(3 * SPAN_METADATA_MAX)]
        client.gather(plain)
        # what it does unchecked: an entry per submission message (the client may batch a few)
        assert client.run_on_scheduler(collections, key=plain[-1].key) > 2 * SPAN_METADATA_MAX
        client.register_plugin(StalenessController())
        held = [client.submit(abs, -i, key=f"tianji-explore-t-{i}") for i in range(3 * SPAN_METADATA_MAX)]
        client.gather(held)
        assert client.run_on_scheduler(collections, key=held[-1].key) <= SPAN_METADATA_MAX + 1


def test_key_name_cache_stays_bounded_over_many_submissions(monkeypatch):
    # Dask caches key_split for 100,000 keys; every explorer task has a key of its own, so the
    # scheduler would keep each one (~160 bytes) for hours; the controller clears it past LIMIT
    from dask.utils import key_split
    from distributed import Client, LocalCluster

    from tianji_dask.dataflow import keycache

    monkeypatch.setattr(keycache, "LIMIT", 20)
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster, Client(cluster) as client:
        key_split.cache_clear()
        client.gather([client.submit(abs, -i, key=f"plain-{i}") for i in range(80)])
        assert key_split.cache_info().currsize >= 80  # what it does unchecked
        client.register_plugin(StalenessController())
        for i in range(80):  # one submission each, as the learner's
            client.submit(abs, -i, key=f"tianji-explore-t-{i}").result()
        assert key_split.cache_info().currsize <= keycache.LIMIT + 5


@pytest.mark.parametrize("settings,field", [
    ({"window": 0}, "window"),
    ({"window_min": 5, "window_max": 2}, "window_min"),
    ({"staleness_target": -1}, "staleness_target"),
    ({"gain": 3}, "gain"),
    ({"replay_ratio": [4, 2]}, "replay_ratio"),
    ({"max_staleness": -2}, "max_staleness"),
    # a good value before the bad one in the same call: it is not applied either
    ({"window": 3, "gain": 3}, "gain"),
    ({"window": 5, "window_max": 6, "staleness_target": 1, "max_staleness": None, "replay_ratio": [4, 2]}, "replay_ratio"),
])
def test_configure_rejects_bad_values(settings, field):
    ctl = StalenessController()
    ctl.begin("r", law_wire(window=2, max_staleness=4, replay_ratio=[8, 16]), chunk_env_steps=64)
    before, params = ctl.state("r", history=True), ctl.books("r").params()
    with pytest.raises(ValueError, match=f"^{field}"):
        ctl.configure("r", **settings)
    # nothing half-applied: every setting, the law and the books are as they were
    assert ctl.state("r", history=True) == before and ctl.books("r").params() == params
    assert before["window"] == 2 and before["max_staleness"] == 4 and before["replay_ratio"] == [8, 16]


def test_configure_moves_the_target_and_switches_filters():
    ctl = StalenessController()
    ctl.begin("r", law_wire(window=4, staleness_target=2, window_min=1, window_max=8, max_staleness=5))
    state = ctl.configure("r", staleness_target=6, max_staleness=None, window_max=12)
    assert state["staleness_target"] == 6 and state["max_staleness"] is None and state["window_max"] == 12
    assert ctl.books("r").params().params_version == 1
    state = ctl.configure("r", staleness_target=None)
    assert state["staleness_target"] is None and state["window"] == 4


# ---- the state on the wire ---------------------------------------------------------------------
#: one group's state as ``tianji_state`` answers it, keys in this order, each value's type (a dict's
#: own keys and types within), as the books before their split into admission, accounting and view
#: answered it: the dashboard's clients, Prometheus, ``run/`` (its chunk accounting, results.json's
#: "controller") and past results read these names
WIRE = {
    "run_id": "str", "group": "int", "simulated": "bool",
    "window": "int", "staleness_target": "float", "window_min": "int", "window_max": "int", "gain": "float",
    "replay_ratio": "list", "replay_staleness_target": "float", "max_staleness": "int",
    "last_period": {"staleness": "NoneType", "updates_per_chunk": "NoneType"},
    "target_verdict": {"state": "str", "reason": "NoneType"},
    "replay_target_verdict": {"state": "str", "reason": "NoneType"},
    "replay_ratio_effective": "float", "replay_staleness_last_period": "NoneType",
    "chunks_in_flight": "int", "learner_version": "int", "learner_lost": "bool",
    "learner_progress": {"env_steps": "int", "samples_trained": "int", "warm": "bool"},
    "credits_granted": "int", "refused_replay_ratio": "int",
    "credits_returned": {"consumed": "int", "erred": "int", "forgotten": "int", "unsubmitted": "int"},
    "chunks_consumed": "int", "chunks_dropped": "int", "env_steps_consumed": "int", "bytes_consumed": "int",
    "staleness_mean": "float", "staleness_max": "int", "staleness_hist": {"0": "int", "1": "int", "2": "int"},
    "age_mean_s": "float", "age_max_s": "float", "per_explorer_env_steps": {"0": "int", "1": "int"},
    "learner": {"mean_return": "float", "replay_staleness_recent_mean": "float", "t": "float"},
    "runs": "list",
}
#: figures of the consumed chunks, None before the first
NONE_BEFORE_THE_FIRST_CHUNK = ("staleness_mean", "staleness_max", "age_mean_s", "age_max_s", "learner")


def _shape(value):
    return {k: _shape(v) for k, v in value.items()} if isinstance(value, dict) else type(value).__name__


def test_the_state_on_the_wire_keeps_its_keys_order_and_types():
    ctl = StalenessController()
    ctl.begin("r", law_wire(window=4, staleness_target=2.0, replay_ratio=[8, 32], replay_staleness_target=100.0,
                            max_staleness=5), chunk_env_steps=64)
    first = ctl.state("r")
    assert list(first) == list(WIRE) and all(first[k] is None for k in NONE_BEFORE_THE_FIRST_CHUNK)
    assert first["staleness_hist"] == first["per_explorer_env_steps"] == {}
    keys = [f"tianji-explore-r-{i:012x}" for i in range(4)]
    ctl.cycle("r", want=keys, progress={"env_steps": 0, "samples_trained": 0, "warm": False})
    rows = [Consumption(k, i % 2, 64, 100, i, 0.1 * i, None if i else "algorithm", 64) for i, k in enumerate(keys[:3])]
    ctl.cycle("r", consumed=consumptions_to_wire(rows), learner_version=3,
              learner_status={"mean_return": 9.5, "replay_staleness_recent_mean": 50.0})
    ctl.transition(keys[3], "processing", "erred")
    ctl.configure("r", staleness_target=3, window_max=12)
    state = ctl.state("r", history=True)
    series = {k: state.pop(k) for k in ("history", "window_log", "learner_series")}
    assert list(state) == list(WIRE) and _shape(state) == WIRE
    assert [_shape(dict(enumerate(row))) for row in series["history"][:1]] == [
        {0: "float", 1: "int", 2: "int", 3: "int", 4: "int", 5: "float"}]  # HistoryRow's fields, in order
    assert len(series["window_log"]) == 1 and series["window_log"][0][3:] == [None, None]  # the configure's row
    assert series["learner_series"][0]["mean_return"] == 9.5
    assert (state["chunks_consumed"], state["chunks_dropped"], state["credits_granted"], state["chunks_in_flight"]) == (3, 1, 4, 0)
    assert state["credits_returned"] == {"consumed": 3, "erred": 1, "forgotten": 0, "unsubmitted": 0}
    assert state["staleness_hist"] == {"0": 1, "1": 1, "2": 1} and state["per_explorer_env_steps"] == {"0": 128, "1": 64}


def test_the_books_hold_their_law_settings_and_a_configure_replaces_them():
    ctl = StalenessController()
    ctl.begin("r", law_wire(window=4, staleness_target=2.0, max_staleness=5))
    admission = ctl.books("r").admission
    before = admission.settings
    assert (before.window, before.staleness_target, before.max_staleness) == (4, 2.0, 5)
    ctl.configure("r", staleness_target=6, max_staleness=None)
    after = admission.settings
    assert (after.staleness_target, after.max_staleness, after.window_max) == (6.0, None, before.window_max)
    assert before.staleness_target == 2.0  # a record, replaced, not changed
    assert ctl.books("r").settings() == after.values(window=admission.window)
    assert admission.params().max_staleness is None and admission.law.staleness_target == 6.0
