"""The staleness controller: its law on its own, its handlers, and on a real cluster."""

import heapq
import time

import numpy as np
import pytest
from conftest import settle

from tianji_dask.config import PipelineError, load_pipeline
from tianji_dask.dataflow.controller.books import HistoryRow
from tianji_dask.dataflow.controller.plugin import StalenessController
from tianji_dask.dataflow.controller.pacing import (
    REPLAY_CEILING_MARGIN,
    REPLAY_MAX_STEP,
    REPLAY_PERIOD_S,
    ReplayRatioLaw,
    replay_gate,
)
from tianji_dask.dataflow.controller.window_law import WindowLaw
from tianji_dask.dataflow.messages import Consumption, consumptions_to_wire
from tianji_dask.run import Run
from helpers import law_wire


# ---- the law, as arithmetic ----------------------------------------------------------------
def _plant(law: WindowLaw, u: float, periods: int, t0: float = 0.0, k: float = 0.0) -> float:
    """Feed the law the staleness its own window would produce (s = W u + k) for some periods."""
    t, version = t0, 0
    for _ in range(periods):
        for _ in range(law.window):
            t += 0.1
            version += u
            law.observe(t, int(version), [int(round(law.window * u + k))])
    return t


def test_law_without_target_keeps_the_window():
    law = WindowLaw(5, staleness_target=None, window_min=1, window_max=16, gain=0.5)
    _plant(law, u=1.0, periods=20)
    assert law.window == 5
    assert law.last["staleness"] == 5  # it still measures


@pytest.mark.parametrize("start,target,u", [(12, 2, 1.0), (1, 8, 1.0), (16, 4, 2.0), (2, 6, 0.5)])
def test_law_settles_at_the_target(start, target, u):
    law = WindowLaw(start, staleness_target=target, window_min=1, window_max=32, gain=0.5)
    _plant(law, u=u, periods=40)
    assert abs(law.window * u - target) <= max(u, 1.0)


def test_law_steps_are_bounded_and_clamped():
    law = WindowLaw(8, staleness_target=0, window_min=3, window_max=10, gain=0.5)
    windows = [law.w]
    t = 0.0
    for _ in range(60):
        t += 0.1
        if law.observe(t, 0, [100]):  # far above target
            windows.append(law.w)
    steps = np.diff(windows)
    assert (steps >= -np.maximum(1, np.array(windows[:-1]) / 2) - 1e-9).all()  # at most max(1, W/2) per period
    assert min(windows) == 3 and law.window == 3  # never below w_min
    law.configure(staleness_target=1000)
    for _ in range(30):
        for _ in range(law.window):
            t += 0.1
            law.observe(t, 0, [0])
    assert law.window == 10  # nor above w_max


def test_law_leaves_out_the_chunks_admitted_before_its_move():
    # a plant with a whole window of dead time: each chunk measures the window in force when it
    # was admitted, W chunks earlier (chunks queued behind 8 explorers at a window of 64)
    law, t, version, queue = WindowLaw(64, staleness_target=32, window_min=1, window_max=128, gain=0.5), 0.0, 0, []
    moves = []
    for _ in range(2000):
        queue.append(law.window)  # admitted now, consumed a window later
        if len(queue) <= law.window:
            continue
        t, version = t + 0.05, version + 1
        admitted_under = queue.pop(0)
        if law.observe(t, version, [admitted_under]):
            moves.append(law.window)
    assert abs(law.window - 32) <= 4, moves[-10:]  # settled at the target, not swinging around it
    assert max(abs(w - 32) for w in moves[-5:]) <= 4, moves[-10:]


def test_law_settles_on_a_small_target_though_stragglers_make_single_chunks_noisy():
    # measured with stragglers (jitter 1.0, 8 explorers): window 1 gives staleness ~0.2, 2 gives
    # ~1.0, 3 ~1.35, 4 ~3.6 with a long tail (a straggler sees 7 or more updates); target 1 is held
    # at window 2. A law acting on one chunk at a time chased the zeros and the sevens.
    rng = np.random.default_rng(0)
    means = {1: 0.2, 2: 1.0, 3: 1.35, 4: 3.6}
    law, t, version, seen = WindowLaw(2, staleness_target=1, window_min=1, window_max=32, gain=0.5), 0.0, 0, []
    for _ in range(600):
        w = min(law.window, 5)
        m = means.get(w, 3.6 + 2 * (w - 4))
        tail = rng.random() < 0.1  # a straggler: seven times the mean, else a third of it (mean ~m)
        staleness = int(rng.poisson(7 * m if tail else 0.3 * m))
        t, version = t + 0.3, version + 1
        law.observe(t, version, [staleness])
        seen.append(staleness)
    second_half = float(np.mean(seen[300:]))
    assert abs(second_half - 1) <= 0.25, second_half
    assert law.verdict["state"] == "held", law.verdict


def _straggler_plant(target: int, seed: int, seconds: float = 120.0) -> float:
    """An event simulation of the pipe with stragglers: each credit starts a chunk at once (more
    explorers than the window) on the newest policy, its duration 2 s times a mean-1 lognormal of
    sigma 1 (``env.step_cost_jitter: 1.0``); the learner makes one update per chunk as it arrives.
    Returns the mean staleness of the chunks consumed in the second half."""
    rng = np.random.default_rng(seed)
    law = WindowLaw(target + 1, staleness_target=target, window_min=1, window_max=4 * target + 8, gain=0.5)
    t, version, flight, seen = 0.0, 0, [], []
    while t < seconds:
        while len(flight) < law.window:
            heapq.heappush(flight, (t + 2.0 * rng.lognormal(-0.5, 1.0), version))
        t, policy = heapq.heappop(flight)
        seen.append((t, version - policy))
        version += 1
        law.observe(t, version, [seen[-1][1]])
    return float(np.mean([s for when, s in seen if when >= seconds / 2]))


@pytest.mark.parametrize("target", [1, 2, 4, 16, 64])
def test_law_holds_its_target_where_stragglers_return_chunks_out_of_order(target):
    # a straggler holds a credit unseen while the chunks behind it come back fresh; the law must
    # neither chase the fresh ones (and land the stragglers stale) nor the stragglers
    medians = np.median([_straggler_plant(target, seed) for seed in range(9)])
    assert abs(medians - target) <= 0.25 * target, medians


def test_law_says_when_its_target_is_held_and_why_one_is_out_of_reach():
    law = WindowLaw(4, staleness_target=4, window_min=1, window_max=32, gain=0.5)
    assert law.verdict == {"state": "settling", "reason": None}
    _plant(law, u=1.0, periods=10)
    assert law.verdict == {"state": "held", "reason": None}
    # ten updates per chunk: even one chunk in flight is ten versions stale
    law = WindowLaw(4, staleness_target=4, window_min=1, window_max=32, gain=0.5)
    _plant(law, u=10.0, periods=2)
    assert law.verdict["state"] == "settling"  # not yet at its floor long enough to say
    _plant(law, u=10.0, periods=60)  # at window 1, a law period is 8 chunks: 3 of them at the floor
    assert law.window == 1 and law.verdict["state"] == "unreachable"
    assert "window_min 1" in law.verdict["reason"] and "10.00 updates per chunk" in law.verdict["reason"]
    # a window at its ceiling that is still too fresh
    law = WindowLaw(4, staleness_target=60, window_min=1, window_max=8, gain=0.5)
    _plant(law, u=1.0, periods=12)
    assert law.window == 8 and law.verdict["state"] == "unreachable" and "window_max 8" in law.verdict["reason"]
    # growth held because the learner drops what a wider window makes
    law, t = WindowLaw(4, staleness_target=40, window_min=1, window_max=64, gain=0.5), 0.0
    for version in range(1, 40):
        t += 0.3
        law.observe(t, version, [4, 4, 4, 4], dropped=2)
    assert law.window == 4 and law.verdict["state"] == "unreachable" and "lag limit" in law.verdict["reason"]
    law.configure(staleness_target=None)
    assert law.verdict == {"state": "off", "reason": None}


def test_the_verdict_counts_the_chunks_the_law_leaves_out_and_says_why_it_is_still_settling():
    # the chunks in flight at a move are left out of the law's next period, not of what the
    # learner trained on: a period at the target after four very stale chunks is not "held"; the
    # run's first window (the pipe filling, all at version 0) is left out of both
    law = WindowLaw(4, staleness_target=2, window_min=1, window_max=32, gain=0.5)
    law.observe(1.0, 0, [0, 0, 0, 0])
    assert law.observe(9.0, 8, [8] * 8) and law.window == 2  # a period at 8: the window narrows
    assert law.last["judged_chunks"] == 8 and law.verdict["reason"] == (
        "staleness 8.0 against 2, window 4 still narrowing; a control period took 8.0 s"), law.verdict
    law.observe(10.0, 12, [20] * 4)  # admitted under the window before the move: left out of the period
    assert law.observe(18.0, 20, [2] * 8)  # the period: 8 chunks at the target
    assert law.last["staleness"] == 2.0 and law.verdict["state"] == "settling"
    assert (law.last["judged_staleness"], law.last["judged_chunks"]) == (8.0, 20)
    # a window of one fed fresh chunks a second apart: the law widens it, one period per 8 s
    law = WindowLaw(1, staleness_target=1, window_min=1, window_max=32, gain=0.5)
    for i in range(1, 10):
        law.observe(float(i), i, [0])
    assert law.verdict["state"] == "settling" and "window 1 still widening; a control period took 8.0 s" in law.verdict["reason"]


def test_a_target_starts_the_window_near_it():
    from tianji_dask.run import Run

    over = {"explorers": 32, "controller.window_max": 128}
    assert [Run("cartpole_impala", overrides={**over, "controller.staleness_target": t}).law()["window"]
            for t in (1, 4, 64)] == [2, 5, 65]
    assert Run("cartpole_impala", overrides=over).law()["window"] == 32  # no target: one per explorer
    assert Run("cartpole_impala", overrides={**over, "controller.staleness_target": 4, "controller.window": 9}).law()["window"] == 9
    ppo = Run("cartpole_ppo", overrides={**over, "controller.staleness_target": 2})
    assert ppo.law()["window"] == 2 * ppo.plan.prepared.chunks_per_update + 1


def test_replay_gate():
    # warm-up and an empty pipe always admit; afterwards the ratio counting in-flight data decides
    assert replay_gate(16.0, 0, 0, 3, 256, warm=False)
    assert replay_gate(16.0, 0, 10_000, 0, 256, warm=True, starving=True)
    assert not replay_gate(16.0, 0, 10_000, 0, 256, warm=True, starving=False)  # it has work: wait
    assert not replay_gate(16.0, 16 * 10_000, 10_000, 1, 256, warm=True)
    assert replay_gate(16.0, 16 * (10_000 + 256), 10_000, 1, 256, warm=True)
    assert replay_gate(None, 0, 10_000, 5, 256, warm=True)


def _replay_plant(law: ReplayRatioLaw, k: float, periods: int, t0: float = 0.0) -> float:
    """Report to the law, twice a second, the replay staleness its ratio makes (s = k rho: a
    full buffer's C/2 env steps of age at rho / B versions per env step)."""
    t = t0
    for _ in range(int(periods * REPLAY_PERIOD_S / 0.5)):
        t += 0.5
        law.observe(t, k * law.rho)
    return t


@pytest.mark.parametrize("target,k", [(500.0, 50.0), (150.0, 10.0), (300.0, 40.0)])
def test_replay_law_settles_at_its_target(target, k):
    law = ReplayRatioLaw([6.0, 24.0], replay_staleness_target=target, gain=0.5)
    assert law.rho == 12.0 and law.verdict == {"state": "settling", "reason": None}  # the band's geometric middle
    factors, t = [], 0.0
    for _ in range(30):
        before = law.rho
        t = _replay_plant(law, k, periods=1, t0=t)
        factors.append(law.rho / before)
    assert law.rho == pytest.approx(target / k, rel=0.02) and law.verdict == {"state": "held", "reason": None}
    assert max(factors) <= REPLAY_MAX_STEP + 1e-9 and min(factors) >= 1 / REPLAY_MAX_STEP - 1e-9  # bounded steps
    floor, ceiling = law.bounds()  # the gate's floor at rho, the learner's ceiling a margin above it
    assert floor == pytest.approx(law.rho) and ceiling == pytest.approx(law.rho * REPLAY_CEILING_MARGIN)


@pytest.mark.parametrize("fill_reported", [True, False], ids=["fill reported", "fill unknown"])
def test_replay_law_does_not_overshoot_while_the_buffer_fills(fill_reported):
    """A filling buffer holds younger samples: s = k rho f with f the fraction filled (here from 5%
    to full over 40 periods). Steering by s / f, rho goes straight to target / k and staleness
    rises to the target from below; steering by s alone raises rho to the band's top while the
    buffer fills, and staleness overshoots once it is full."""
    law, k, target, t, seen = ReplayRatioLaw([6.0, 24.0], replay_staleness_target=500.0, gain=0.5), 50.0, 500.0, 0.0, []
    for step in range(int(60 * REPLAY_PERIOD_S / 0.5)):
        t += 0.5
        fill = min(1.0, 0.05 + step * 0.5 / (40 * REPLAY_PERIOD_S))
        seen.append(k * law.rho * fill)
        law.observe(t, seen[-1], fill if fill_reported else None)
    assert law.verdict["state"] == "held" and law.rho == pytest.approx(target / k, rel=0.05)
    if fill_reported:
        assert max(seen) <= target * 1.02
    else:  # what the law did before the learner reported its fill
        assert max(seen) > target * 1.1


def test_replay_law_says_why_a_target_is_out_of_reach_at_either_edge_of_the_band():
    law = ReplayRatioLaw([6.0, 24.0], replay_staleness_target=10_000.0, gain=0.5)  # 50 versions per unit of ratio: even 24 is too fresh
    _replay_plant(law, 50.0, periods=2)
    assert law.verdict["state"] == "settling"  # not at its ceiling long enough to say
    _replay_plant(law, 50.0, periods=10, t0=100.0)
    assert law.rho == 24.0 and law.verdict["state"] == "unreachable"
    assert "replay_ratio's max 24" in law.verdict["reason"] and "raise that max" in law.verdict["reason"]
    assert law.bounds() == (24.0 / REPLAY_CEILING_MARGIN, 24.0)  # the floor gives way, the ceiling stays in the band
    law.configure(replay_staleness_target=10.0)  # now even the fewest samples trained per env step are too stale
    _replay_plant(law, 50.0, periods=12, t0=200.0)
    assert law.rho == 6.0 and law.verdict["state"] == "unreachable" and "replay_ratio's min 6" in law.verdict["reason"]
    law.configure(replay_staleness_target=None)
    assert law.verdict == {"state": "off", "reason": None}


def test_replay_law_without_target_applies_the_band_as_it_is():
    law = ReplayRatioLaw([6.0, 24.0], replay_staleness_target=None, gain=0.5)
    _replay_plant(law, 50.0, periods=5)
    assert law.bounds() == (6.0, 24.0) and law.rho == 12.0 and law.verdict == {"state": "off", "reason": None}
    assert law.last == pytest.approx(600.0)  # it still measures
    assert ReplayRatioLaw(None, replay_staleness_target=5.0, gain=0.5).bounds() == (None, None)  # no band: no pacing


def test_books_hold_a_replay_target_through_the_band_and_owe_each_env_step_its_floor():
    ctl = StalenessController()
    ctl.begin("r", law_wire(window=2, replay_ratio=[8, 32], replay_staleness_target=100.0), chunk_env_steps=100)
    books = ctl.books("r")
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


def test_auto_replay_ratio_is_half_to_double_the_algorithms_own():
    run = Run("cartpole_dqn", overrides={"controller.replay_ratio": "auto"})
    assert run.law()["replay_ratio"] == [8.0, 32.0]  # r = 0.125 updates/env step x 128 samples
    assert Run("cartpole_dqn", overrides={"controller.replay_ratio": None}).law()["replay_ratio"] is None  # null: no pacing
    assert Run("cartpole_ppo").law()["replay_ratio"] is None  # PPO does not replay


def consumed(*rows) -> dict:
    """Consumption records (key, explorer_id, env_steps, nbytes, staleness, age_s, why dropped) as the wire carries them."""
    return consumptions_to_wire([Consumption(*row) for row in rows])


def test_handlers_grant_refuse_and_count():
    ctl = StalenessController()
    params = ctl.begin("r1", law_wire(window=2, replay_ratio=[16, 32]), chunk_env_steps=256)
    assert params["window"] == 2 and params["rho_max"] == 32 and "rho_min" not in params  # the floor is the controller's
    books = ctl.books("r1")
    keys = [f"tianji-explore-r1-{i}" for i in range(4)]
    warm = {"env_steps": 0, "samples_trained": 0, "warm": False}
    assert ctl.cycle("r1", want=keys, progress=warm)["granted"] == keys[:2]  # the window
    # a consumed report returns the credit; the ratio is too low to admit more
    low = {"env_steps": 1000, "samples_trained": 100, "warm": True}
    reply = ctl.cycle("r1", consumed=consumed((keys[0], 0, 256, 10, 3, 0.1, None)), want=keys[2:], progress=low,
                      learner_version=3)
    assert reply["granted"] == [] and books.refused_replay_ratio == 1 and books.chunks_in_flight == 1
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
    assert books.chunks_in_flight == 0 and state["credits_granted"] == 3


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
    assert ctl.state("r1")["credits_returned"]["forgotten"] == 1 and ctl.books("r1").chunks_in_flight == 0


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
        watched.update(books.credited)
        books.credited = watched
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


@pytest.mark.parametrize("overrides,message", [
    ({"controller.window_min": 1, "algo.config.segments_per_batch": 2},
     "controller.window_min: must be >= 2, the chunks one ppo update needs"),
    ({"controller.window": 1, "algo.config.segments_per_batch": 3},
     "controller.window: must be >= 3, the chunks one ppo update needs"),
    ({"controller.replay_ratio": [1, 2]}, "controller.replay_ratio: ppo does not replay"),
    ({"controller.replay_staleness_target": 50}, "controller.replay_staleness_target: ppo does not replay"),
])
def test_window_below_one_update_is_refused(overrides, message):
    with pytest.raises(PipelineError, match=message):
        Run("cartpole_ppo", overrides=overrides)


# ---- on a real cluster -----------------------------------------------------------------------
#: explorer-heavy, learner-slow: 64-step chunks from two explorers, a 128x128 PPO learner that
#: makes 8 epochs over each; every chunk is used (no lag limit) so staleness shows the window
SLOW_LEARNER = {
    "env.num_envs": 4, "chunk_steps": 16, "algo.config.hidden": [128, 128], "algo.config.update_epochs": 8,
    "algo.config.num_minibatches": 4, "algo.config.max_policy_lag": 1000, "stop.target_return": None,
    "stop.max_seconds": 120,
}


def _staleness_of_chunks(results, first, last):
    """Mean staleness of consumed chunks number ``first`` to ``last`` (in consumption order)."""
    h = [HistoryRow(*row) for row in results["controller"]["history"]]
    assert len(h) >= last, f"only {len(h)} chunks consumed"
    return float(np.mean([row.staleness_versions for row in h[first:last]]))


def _wait_for_chunks(run, n, timeout=120):
    """Block until the controller has booked ``n`` consumed chunks (the timeout only guards a hang)."""
    deadline = time.time() + timeout
    while run.controller_state()["chunks_consumed"] < n:
        assert time.time() < deadline, f"fewer than {n} chunks consumed in {timeout} s"
        time.sleep(0.1)
    return run.controller_state()


@pytest.mark.slow
def test_staleness_target_is_held_and_followed(tianji_client, tmp_path):
    settle(tianji_client)
    # the controller off, a wide fixed window: staleness grows to about the window
    run = Run("cartpole_ppo", tianji_client, out=tmp_path / "off", overrides={**SLOW_LEARNER, "controller.window": 12})
    run.start()
    _wait_for_chunks(run, 80)
    run.stop()
    off = run.wait(timeout=60)
    assert off["controller"]["staleness_target"] is None and off["controller"]["window"] == 12
    assert _staleness_of_chunks(off, 30, 80) > 6

    # target 2: held after warm-up; then moved to 6 from outside, and followed
    run = Run("cartpole_ppo", tianji_client, out=tmp_path / "on", overrides={**SLOW_LEARNER, "controller.staleness_target": 2})
    run.start()
    _wait_for_chunks(run, 80)
    assert run.status()["staleness_target"]["state"] in ("held", "settling")  # reachable: the learner says so live
    state = run.configure(staleness_target=6)
    moved_at = state["chunks_consumed"]
    assert state["staleness_target"] == 6
    live = _wait_for_chunks(run, moved_at + 120)
    run.stop()
    on = run.wait(timeout=60)
    assert abs(_staleness_of_chunks(on, 30, moved_at) - 2) <= 1
    assert abs(_staleness_of_chunks(on, moved_at + 60, moved_at + 120) - 6) <= 1.5
    assert live["window"] > 3  # the window followed the new target
    log = np.array([row for row in on["controller"]["window_log"] if row[3] is not None], dtype=float)
    assert len(log) >= 5 and (log[:, 1] >= 1).all()
    assert on["controller"]["chunks_in_flight"] == 0
    assert on["controller"]["target_verdict"]["state"] in ("held", "settling")
    assert off["controller"]["target_verdict"] == {"state": "off", "reason": None}


@pytest.mark.slow
def test_a_target_out_of_reach_is_said_live_and_in_the_results_with_its_reason(tianji_client, tmp_path):
    # two chunks in flight at most cannot be 40 versions stale
    settle(tianji_client)
    run = Run("cartpole_ppo", tianji_client, out=tmp_path / "far", overrides={
        **SLOW_LEARNER, "controller.staleness_target": 40, "controller.window_max": 2})
    run.start()
    deadline = time.time() + 90
    while (live := run.status())["staleness_target"]["state"] != "unreachable":
        assert time.time() < deadline, f"never called out of reach: {live['staleness_target']}"
        time.sleep(0.2)
    assert "window_max 2" in live["staleness_target"]["reason"]
    run.stop()
    results = run.wait(timeout=60)
    verdict = results["controller"]["target_verdict"]
    assert verdict["state"] == "unreachable" and "raise window_max" in verdict["reason"]


@pytest.mark.slow
def test_slow_explorer_does_not_stall_relaxed_ppo(tianji_client, tmp_path):
    # explorer 0 sleeps 10 ms per env step (about 0.6 s per chunk), explorer 1 runs at full speed
    overrides = {
        "env.id": "sleepy_env:SleepyCartPole-v0", "env.num_envs": 4, "chunk_steps": 16,
        "env.explorer_kwargs": {0: {"sleep_s": 0.01}}, "stop.target_return": None, "stop.max_seconds": 6,
    }
    settle(tianji_client)  # a worker restarted by an earlier test would slow the fast explorer
    relaxed = Run("cartpole_ppo", tianji_client, out=tmp_path / "relaxed", overrides=overrides).start().wait()
    lockstep = Run("cartpole_ppo", tianji_client, out=tmp_path / "lockstep",
                   overrides={**overrides, "mode": "lockstep"}).start().wait()
    per_explorer = relaxed["controller"]["per_explorer_env_steps"]
    slow_chunks = per_explorer.get("0", 0) // 64
    # lockstep waits for the slow explorer every round; relaxed updates at the fast one's pace
    lock_slow = lockstep["controller"]["per_explorer_env_steps"]["0"] // 64
    assert lockstep["updates"] <= 2 * (lock_slow + 1)  # one chunk per explorer per round, one update each
    assert relaxed["updates"] >= 5 * max(slow_chunks, 1)
    assert relaxed["updates"] >= 3 * lockstep["updates"]
    # the slow explorer's late segments were dropped (max_policy_lag 1) and counted
    assert relaxed["chunks_dropped"].get("algorithm", 0) >= 1
    assert relaxed["algo_counters"]["dropped_segments"] >= relaxed["chunks_dropped"]["algorithm"]


@pytest.mark.slow
def test_max_staleness_filter_drops_and_counts(tianji_client, tmp_path):
    run = Run("cartpole_ppo", tianji_client, out=tmp_path / "filter",
              overrides={**SLOW_LEARNER, "controller.window": 12, "controller.max_staleness": 3, "stop.max_seconds": 6})
    results = run.start().wait()
    dropped = results["chunks_dropped"].get("max_staleness", 0)
    assert dropped >= 5
    assert results["controller"]["chunks_dropped"] == sum(results["chunks_dropped"].values())
    assert results["env_steps_trained"] < results["env_steps"]
    # nothing staler than the bound was trained on
    from tianji_dask.core.metrics import CHUNK_FIELDS
    chunks = np.loadtxt(run.out / "chunks.csv", delimiter=",", skiprows=1, ndmin=2)
    assert chunks[:, CHUNK_FIELDS.index("staleness_versions")].max() > 3  # some arrived too stale ...
    assert results["updates"] <= results["chunks"] - dropped  # ... and only the rest fed updates


@pytest.mark.slow
def test_replay_ratio_band_paces_explorers(tianji_client, tmp_path):
    run = Run("cartpole_dqn", tianji_client, out=tmp_path / "rho",
              overrides={"stop.target_return": None, "stop.max_seconds": 8})
    results = run.start().wait()
    ctrl = results["controller"]
    lo, hi = ctrl["replay_ratio"]
    assert (lo, hi) == (6.0, 24.0)  # the pipeline's band
    prog = results["replay_progress"]
    rho = prog["samples_trained"] / prog["env_steps"]
    # at most a chunk's worth of data (per explorer) beyond the floor; never above the ceiling
    chunk = run.pipeline.chunk_steps * run.pipeline.env.num_envs
    assert lo * (prog["env_steps"] - 2 * chunk) / prog["env_steps"] <= rho <= hi
    assert ctrl["refused_replay_ratio"] > 0  # explorers were held back, not the learner


@pytest.mark.slow
def test_a_replay_staleness_target_moves_the_replay_ratio_within_the_band(tianji_client, tmp_path):
    run = Run("cartpole_dqn", tianji_client, out=tmp_path / "replay-target", overrides={
        "stop.target_return": None, "stop.max_seconds": 10, "controller.replay_staleness_target": 500})
    run.start()
    deadline = time.time() + 60
    while (live := run.status()).get("replay_staleness_target", {}).get("state") in (None, "off"):
        assert time.time() < deadline and not live.get("done"), f"never judged live: {live.get('replay_staleness_target')}"
        time.sleep(0.2)
    assert live["replay_staleness_target"]["state"] in ("settling", "held", "unreachable")
    assert live["staleness_target"] == {"state": "off", "reason": None}  # no window target here
    results = run.wait()
    summary = results["replay_staleness_versions"]
    assert set(summary) == {"mean", "mean_second_half", "p95"} and 0 < summary["mean"] <= summary["p95"]
    ctrl = results["controller"]
    assert ctrl["replay_staleness_target"] == 500 and ctrl["replay_staleness_last_period"] is not None
    assert ctrl["replay_target_verdict"]["state"] in ("settling", "held", "unreachable")  # judged, not off
    lo, hi = ctrl["replay_ratio"]
    assert lo <= ctrl["replay_ratio_effective"] <= hi


def test_explorer_errors_return_their_credits(tianji_client, tmp_path):
    # explorer 0's envs break after 1.25 chunks' steps: every other chunk fails and its envs are rebuilt
    steps = load_pipeline("cartpole_dqn").chunk_steps
    run = Run("cartpole_dqn", tianji_client, out=tmp_path / "fail", overrides={
        "env.id": "sleepy_env:FailingCartPole-v0", "env.explorer_kwargs": {0: {"fail_after": steps + steps // 4}},
        "stop.target_return": None, "stop.max_seconds": 2,
    })
    results = run.start().wait()
    ctrl = results["controller"]
    erred = [lost for lost in results["lost"] if "FailingCartPole: broke" in lost["reason"]]
    assert erred and all(lost["explorer_id"] == 0 for lost in erred)
    assert erred[0]["reason"].startswith("explorer 0, env sleepy_env:FailingCartPole-v0: RuntimeError")
    assert ctrl["credits_returned"]["erred"] >= len(erred)
    assert ctrl["chunks_in_flight"] == 0 and ctrl["credits_granted"] == sum(ctrl["credits_returned"].values())
    assert results["stop_reason"] == "max_seconds" and results["updates"] > 0
    assert ctrl["per_explorer_env_steps"]["0"] > 0  # the rebuilt envs produced chunks again


def test_an_explorer_that_always_fails_stops_the_run(tianji_client, tmp_path):
    run = Run("cartpole_dqn", tianji_client, out=tmp_path / "broken", overrides={
        "env.id": "sleepy_env:FailingCartPole-v0", "env.explorer_kwargs": {1: {"fail_after": 0}},
        "stop.target_return": None, "stop.max_seconds": 60, "stop.max_explorer_failures": 3,
    })
    results = run.start().wait()
    assert results["stop_reason"] == "explorer_failures"
    assert results["error"].startswith("explorer 1 failed 3 chunks in a row; last: explorer 1")
    assert (tmp_path / "broken" / "error.txt").read_text().count("Traceback") == 1  # the explorer's, in the run folder
    failed = [lost for lost in results["lost"] if lost["explorer_id"] == 1 and "FailingCartPole" in lost["reason"]]
    assert len(failed) >= 3  # it stopped on the failures, not on its time budget
    assert results["controller"]["chunks_in_flight"] == 0
    assert (run.out / "results.json").exists()


# ---- TianJi's levers ---------------------------------------------------------------------------
def test_balance_helper_and_updates_per_pass():
    import yaml

    from tianji_dask.config import bundled_pipelines_dir, parse_pipeline

    data = yaml.safe_load((bundled_pipelines_dir() / "tianji_cartpole_dqn.yaml").read_text())
    del data["chunk_steps"], data["learner"]["publish_every"]
    data["balance"] = {"chunk_steps_total": 64, "publish_every_total": 512}
    for explorers, chunk, publish in ((1, 64, 512), (4, 16, 128), (8, 8, 64)):
        p = parse_pipeline({**data, "explorers": explorers})
        assert (p.chunk_steps, p.learner.publish_every) == (chunk, publish)
    data["learner"]["updates_per_pass"] = "ln_explorers"
    assert [parse_pipeline({**data, "explorers": a}).updates_per_pass for a in (1, 2, 4, 8, 16)] == [1, 1, 1, 2, 3]
    with pytest.raises(PipelineError, match="^balance: derives chunk_steps"):
        parse_pipeline({**data, "chunk_steps": 32})


def test_epsilon_can_follow_learner_updates():
    from tianji_dask.algos.dqn import DQN, DQNConfig
    from tianji_dask.envs.vector import env_spaces

    spaces = env_spaces("CartPole-v1")
    by_steps = DQN(*spaces, DQNConfig(eps_decay_steps=1000))
    by_updates = DQN(*spaces, DQNConfig(eps_decay_steps=1000, eps_decay_on="updates"))
    assert by_steps.exploration(env_steps=1000, updates=0)["epsilon"] == pytest.approx(0.04)
    assert by_updates.exploration(env_steps=1000, updates=0)["epsilon"] == pytest.approx(1.0)
    assert by_updates.exploration(env_steps=0, updates=500)["epsilon"] == pytest.approx(0.52)


@pytest.mark.slow
def test_tianji_pipeline_runs_and_drops_on_refresh(tianji_client, tmp_path):
    # TianJi's setting, publishing every update so refreshes happen during most chunks
    run = Run("tianji_cartpole_dqn", tianji_client, out=tmp_path / "tianji", overrides={
        "learner.publish_every": 1, "stop.target_return": None, "stop.max_seconds": 5, "stop.max_updates": None,
    })
    results = run.start().wait()
    assert results["error"] is None and results["explorers"] == 4 and results["updates"] > 0
    dropped = results["chunks_dropped"].get("refresh", 0)
    assert dropped > 0 and results["env_steps_trained"] < results["env_steps"]
    # the same run without the lever keeps everything
    run = Run("tianji_cartpole_dqn", tianji_client, out=tmp_path / "keep", overrides={
        "learner.publish_every": 1, "learner.drop_on_refresh": False, "stop.target_return": None,
        "stop.max_seconds": 3, "stop.max_updates": None,
    })
    results = run.start().wait()
    assert results["chunks_dropped"] == {} and results["env_steps_trained"] == results["env_steps"]


def test_law_does_not_widen_a_window_whose_chunks_are_dropped():
    law = WindowLaw(2, staleness_target=8, window_min=1, window_max=32, gain=0.5)
    t = 0.0
    for i in range(40):  # staleness stuck near 1: staler chunks are thrown away at consumption
        t += 0.3
        law.observe(t, i, [1, 1, 3], dropped=1)
    assert law.window == 2 and law.last["dropped_fraction"] > 0.2
    for i in range(40):  # the same staleness without drops: the window opens toward the target
        t += 0.3
        law.observe(t, 40 + i, [1, 1, 1], dropped=0)
    assert law.window > 8
