"""Watching a run: the /tianji dashboard page (in a real browser too), /metrics, plots."""

import json
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import EarlyProcess, started, starts_early

import tianji_dask  # noqa: F401 - installs the dashboard pages before the cluster starts
from tianji_dask.run import Run
from helpers import law_wire

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def dashboard_client():
    """A cluster with its dashboard on a free port (the shared test cluster has none)."""
    from distributed import Client

    from tianji_dask.launch.cluster import local_cluster

    cluster = local_cluster(explorer_workers=2, dashboard_address="127.0.0.1:0")
    client = Client(cluster)
    yield client
    client.close()
    cluster.close()


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.status, resp.read().decode()


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


@pytest.fixture(scope="module")
def live_run(dashboard_client, tmp_path_factory):
    """A DQN run that keeps going while the tests look at it; stopped at the end."""
    out = tmp_path_factory.mktemp("observe") / "run"
    run = Run("cartpole_dqn", dashboard_client, out=out, overrides={"stop.max_seconds": 120, "stop.target_return": None,
                                                                   "eval": {"every_s": 0.5, "episodes": 2}})
    run.start()
    # what the page and /metrics read, on the scheduler: the learner's figures with 20 episodes and an evaluation
    deadline = time.time() + 240  # only a hang waits this long
    while not ((learner := run.controller_state().get("learner") or {}).get("episodes", 0) >= 20
               and learner.get("eval_mean_return") is not None):
        assert time.time() < deadline, f"the learner's figures never showed 20 episodes and an evaluation: {learner}"
        time.sleep(0.2)
    yield run
    run.stop()
    run.wait(timeout=60)


def test_page_follows_the_newest_run_until_one_is_picked():
    from distributed import Scheduler

    from tianji_dask.dataflow.controller.plugin import StalenessController
    from tianji_dask.dataflow.messages import Consumption, consumptions_to_wire
    from tianji_dask.observe.dashboard import PAGES, Panels

    scheduler, ctl = Scheduler(dashboard=False), StalenessController()
    scheduler.add_plugin(ctl, name="tianji")

    def begin(run_id, explorers):
        ctl.begin(run_id, law_wire(window=4, staleness_target=explorers))
        keys = ctl.cycle(run_id, want=[f"tianji-explore-{run_id}-{i:012x}" for i in range(explorers)])["granted"]
        rows = [Consumption(key, i, 16, 10, 1, 0.1, None) for i, key in enumerate(keys)]
        ctl.cycle(run_id, consumed=consumptions_to_wire(rows), learner_version=1, learner_status={
            "env_steps": 16 * explorers, "samples_trained": 0, "learn_s": 0.0, "version": 1})

    def shown(page):
        return page.run_id, page.select.value, page.select.options, page.target_span.location, page.src["explorers"].data["explorer"]

    following, picked, asked = (Panels(scheduler, PAGES["/tianji"], chosen=c) for c in (None, None, "ra"))
    following.update()
    assert following.run_id is None and following.note.text == "no run on this scheduler yet"
    begin("ra", 1)
    begin("rb", 2)
    for page in (following, picked, asked):
        page.update()
    assert shown(following) == shown(picked) == ("rb", "rb", ["rb", "ra"], 2, [0, 1])  # the newest
    assert shown(asked) == ("ra", "ra", ["rb", "ra"], 1, [0])
    picked.select.value = "ra"  # the user picks a run in the selector
    picked.update()
    assert shown(picked) == ("ra", "ra", ["rb", "ra"], 1, [0])
    assert picked.note.text == "run ra &middot; staleness target 1: settling"  # the target, and how it goes
    begin("rc", 3)
    for page in (following, picked, asked):
        page.update()
    assert shown(following) == ("rc", "rc", ["rc", "rb", "ra"], 3, [0, 1, 2])  # a new run: the page follows it
    assert shown(picked)[:2] == shown(asked)[:2] == ("ra", "ra")  # a run picked stays
    ctl.begin("rd", law_wire(window=2, replay_ratio=[8, 32], replay_staleness_target=100.0), chunk_env_steps=100)
    replay = Panels(scheduler, PAGES["/tianji"], chosen="rd")
    replay.update()
    assert replay.note.text == "run rd &middot; replay staleness target 100: settling"  # a replay target's verdict too


def test_plot_command_writes_pngs(tmp_path):
    from tianji_dask.cli import main

    runs = []
    for seed in (0, 1):
        out = tmp_path / f"run{seed}"
        Run("cartpole_ppo", out=out, overrides={"mode": "single", "seed": seed, "stop.max_env_steps": 4_096}).start().wait()
        runs.append(str(out))
    assert main(["plot", *runs, "--out", str(tmp_path / "plots")]) == 0
    names = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert names == ["return_vs_env_steps.png", "return_vs_time.png", "staleness_hist.png", "throughput.png"]
    for name in names:
        assert (tmp_path / "plots" / name).stat().st_size > 5_000
    # a directory that is not a run: one line, exit 2, nothing written
    assert main(["plot", str(tmp_path / "nowhere"), "--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()


def test_tensorboard_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    Run("cartpole_ppo", out=out, overrides={"mode": "single", "stop.max_env_steps": 20_000,
                                             "logging.tensorboard": True}).start().wait()
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"tianji/mean_return", "tianji/updates", "tianji/env_steps_per_s"} <= tags
    returns = acc.Scalars("tianji/mean_return")
    assert len(returns) >= 2 and returns[-1].step >= 20_000


def test_live_view_needs_a_dashboard():
    run = Run("cartpole_ppo", overrides={"mode": "single", "stop.max_env_steps": 1000})
    with pytest.raises(RuntimeError, match="^live: this run has no dashboard"):
        run.live()


def _scheduler(*extra) -> EarlyProcess:
    return EarlyProcess(lambda _: [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                   "--port", "0", "--dashboard-address", "127.0.0.1:0", "--no-show", *extra], log=True,
                        ready=lambda early: "dashboard at" in early.log.read_text())


# `dask-scheduler` processes of their own (each spends seconds importing), one per test below
starts_early("preloaded_scheduler")(lambda: _scheduler("--preload", "tianji_dask.preload"))
starts_early("plain_scheduler")(lambda: _scheduler())


def _addresses(name: str):
    """The scheduler's address and its dashboard's, once its log names both; it ends with the test."""
    early = started(name)
    deadline = time.time() + 60
    address = dashboard = None
    while time.time() < deadline and not (address and dashboard):
        text = early.log.read_text()
        m = re.search(r"Scheduler at:\s+(tcp://\S+)", text)
        d = re.search(r"dashboard at:\s+\S*?:(\d+)/status", text)
        address = m.group(1) if m else None
        dashboard = f"http://127.0.0.1:{d.group(1)}" if d else None
        if not (address and dashboard):
            time.sleep(0.2)
    assert address and dashboard, early.log.read_text()
    try:
        yield address, dashboard
    finally:
        early.close()


@pytest.fixture
def preloaded_scheduler():
    yield from _addresses("preloaded_scheduler")


@pytest.fixture
def plain_scheduler():
    yield from _addresses("plain_scheduler")


def test_preloaded_external_scheduler_serves_the_pages(preloaded_scheduler):
    from distributed import Client

    address, dashboard = preloaded_scheduler
    plots = json.loads(_get(f"{dashboard}/individual-plots.json")[1])
    assert any("tianji" in name.lower() for name in plots), plots  # listed for JupyterLab
    assert _get(f"{dashboard}/tianji")[0] == 200
    with Client(address) as client:  # the controller is in place before any run
        assert client.run_on_scheduler(lambda dask_scheduler: "tianji" in dask_scheduler.plugins)


def test_running_scheduler_gets_the_page_when_the_controller_arrives(plain_scheduler):
    from distributed import Client

    from tianji_dask.dataflow.controller.plugin import StalenessController

    address, dashboard = plain_scheduler
    with pytest.raises(urllib.error.HTTPError):
        _get(f"{dashboard}/tianji")
    with Client(address) as client:
        client.register_plugin(StalenessController(), name="tianji")
    assert _get(f"{dashboard}/tianji")[0] == 200


# ---- on a cluster with a dashboard: last in the module, so that the live run (module-scoped,
# training until the module ends) runs only under the tests that read it ----------------------
def _base(client) -> str:
    return client.dashboard_link.rsplit("/", 1)[0]


def _by_run(text: str, name: str) -> dict[str, float]:
    """Group 0's value of one /metrics series for every run: {run id: value}."""
    out = {}
    for m in re.finditer(rf"^{name}{{([^}}]*)}} (\S+)$", text, re.MULTILINE):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("group") == "0":
            out[labels["run"]] = float(m.group(2))
    return out


def _page(base: str, **arguments) -> dict:
    """What a fresh /tianji session shows (``arguments``: the address's ``?key=value``)."""
    from bokeh.client import pull_session
    from bokeh.models import ColumnDataSource, Div, Select, Span

    with pull_session(url=f"{base}/tianji", arguments=arguments or None) as session:
        doc = session.document
        (select,), (span,), (note,) = (list(doc.select({"type": t})) for t in (Select, Span, Div))
        explorers = next(s for s in doc.select({"type": ColumnDataSource}) if "rate" in s.data)
        return {"run": select.value, "options": list(select.options), "target": span.location if span.visible else None,
                "explorers": list(explorers.data["explorer"]), "note": note.text}


@pytest.mark.slow  # two runs on a real cluster: the full suite (CI) runs it
def test_two_runs_on_one_scheduler_keep_their_books_pages_and_series_apart(dashboard_client, tmp_path):
    client, base = dashboard_client, _base(dashboard_client)
    runs = [Run("cartpole_ppo", client, out=tmp_path / f"run{i}", overrides={
        "explorers": explorers, "controller.staleness_target": target, "stop.target_return": None, "stop.max_seconds": 60})
        for i, (explorers, target) in enumerate(((1, 2), (2, 6)))]
    a, b = runs
    try:
        for run in runs:
            run.start()
        deadline = time.time() + 60  # only a hang waits this long
        while not all(len(s["per_explorer_env_steps"]) == run.pipeline.explorers and s["learner"]
                      for run in runs for s in [run.controller_state()]):
            assert time.time() < deadline, "the two runs did not both consume chunks from every explorer"
            time.sleep(0.2)
        before = [run.controller_state() for run in runs]
        metrics = _get(f"{base}/metrics")[1]
        after = [run.controller_state() for run in runs]
        pages = {"a": _page(base, run=a.run_id), "b": _page(base, run=b.run_id), "default": _page(base),
                 "unknown": _page(base, run="nosuch")}
        # a call that names no run is refused, in one line naming the runs held
        with pytest.raises(ValueError, match="^run_id: name the run; runs on this scheduler: ") as refused:
            client.sync(client.scheduler.tianji_state)
        assert "\n" not in str(refused.value) and a.run_id in str(refused.value) and b.run_id in str(refused.value)
        held = client.sync(client.scheduler.tianji_runs)
        moved = a.configure(staleness_target=3)  # one run's law moves; the other's stays
        b_after = b.controller_state()
    finally:
        for run in runs:
            run.stop()
        results = [run.wait(timeout=60) for run in runs]
    # each run's controller state is its own books
    assert [s["run_id"] for s in before] == [a.run_id, b.run_id] and [s["staleness_target"] for s in before] == [2, 6]
    assert [sorted(s["per_explorer_env_steps"]) for s in before] == [["0"], ["0", "1"]]
    assert held.index(a.run_id) < held.index(b.run_id)  # in the order they began
    assert moved["run_id"] == a.run_id and moved["staleness_target"] == 3 and b_after["staleness_target"] == 6
    assert [r["controller"]["run_id"] for r in results] == [a.run_id, b.run_id]
    # /metrics: every series names its run; each run's series read that run's books
    samples = [line for line in metrics.splitlines() if line.startswith("tianji_")]
    assert samples and all(re.search(r'run="[^"]+"', line) for line in samples), samples[:5]
    targets, consumed = _by_run(metrics, "tianji_staleness_target"), _by_run(metrics, "tianji_chunks_consumed_total")
    assert (targets[a.run_id], targets[b.run_id]) == (2, 6)
    for run, s0, s1 in zip(runs, before, after):
        assert s0["chunks_consumed"] <= consumed[run.run_id] <= s1["chunks_consumed"]
    # /tianji: ?run= picks the run, the selector lists every run (newest first), the default is the newest
    for page, run, target, explorers in ((pages["a"], a, 2, [0]), (pages["b"], b, 6, [0, 1])):
        assert (page["run"], page["target"], page["explorers"]) == (run.run_id, target, explorers)
        assert re.fullmatch(rf"run {run.run_id} &middot; staleness target {target}: (held|(settling|unreachable) \(.+\)|settling)",
                            page["note"]), page["note"]  # the run's own target and how it goes
        assert page["options"].index(b.run_id) < page["options"].index(a.run_id)
    assert pages["default"]["run"] == b.run_id and pages["default"]["target"] == 6
    assert pages["default"]["note"].startswith(f"run {b.run_id} (the newest; pick another above) &middot; staleness target 6: ")
    assert pages["unknown"]["run"] == "" and pages["unknown"]["explorers"] == []
    assert pages["unknown"]["note"].startswith("run nosuch: not on this scheduler; runs on it: ")


def test_tianji_page_serves_plots_with_data(live_run, dashboard_client):
    from bokeh.client import pull_session
    from bokeh.models import ColumnDataSource, Plot

    base = _base(dashboard_client)
    status, html = _get(f"{base}/tianji")
    assert status == 200 and "tianji" in html
    with pull_session(url=f"{base}/tianji") as session:
        doc = session.document
        titles = {p.title.text for p in doc.select({"type": Plot})}
        assert {"tianji: mean episode return (100 episodes)", "tianji: staleness histogram",
                "tianji: controller window and chunks in flight",
                "tianji: env steps/s produced vs samples/s consumed"} <= titles
        sources = list(doc.select({"type": ColumnDataSource}))
        filled = [s for s in sources if s.data and len(next(iter(s.data.values()))) > 0]
        assert len(filled) >= 5, f"only {len(filled)} of {len(sources)} plot sources hold data"
        returns = [s for s in sources if "mean_return" in s.data][0]
        assert np.nanmax(np.asarray(returns.data["mean_return"], dtype=float)) > 0
        assert np.nanmax(np.asarray(returns.data["eval_return"], dtype=float)) > 0  # the evaluations' points
    plots = json.loads(_get(f"{base}/individual-plots.json")[1])
    assert any("tianji" in name.lower() for name in plots), plots


def test_metrics_carry_tianji_series_that_move(live_run, dashboard_client):
    base = _base(dashboard_client)
    first = _get(f"{base}/metrics")[1]
    deadline = time.time() + 60  # only a hang waits this long: the run makes versions many times a second
    while True:
        time.sleep(0.2)
        second = _get(f"{base}/metrics")[1]
        moved = all(_metric(second, name) > _metric(first, name)
                    for name in ("tianji_learner_version", "tianji_env_steps_consumed_total"))
        if moved or time.time() > deadline:
            break
    for name in ("tianji_learner_version", "tianji_chunks_consumed_total", "tianji_env_steps_consumed_total",
                 "tianji_chunks_in_flight", "tianji_window", "tianji_staleness_versions_count",
                 "tianji_staleness_versions_sum", "tianji_mean_return", "tianji_eval_return"):
        _metric(second, name)
    assert _metric(second, "tianji_learner_version") > _metric(first, "tianji_learner_version")
    assert _metric(second, "tianji_eval_return") > 0
    assert _metric(second, "tianji_env_steps_consumed_total") > _metric(first, "tianji_env_steps_consumed_total")


@pytest.mark.slow  # a real browser: the full suite (CI) runs it
def test_tianji_page_renders_in_a_real_browser(live_run, dashboard_client, tmp_path):
    if CHROMIUM is None:
        if os.environ.get("TIANJI_REQUIRE_BROWSER"):
            pytest.fail("chromium is required here (TIANJI_REQUIRE_BROWSER) but not installed")
        pytest.skip("needs Debian's chromium (.ci/run installs it)")
    import io

    from browser import Browser
    from PIL import Image

    shot = Path(os.environ.get("TIANJI_ARTIFACTS", tmp_path)) / "tianji-dashboard.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    browser = Browser(CHROMIUM, tmp_path / "profile")
    try:
        # the plot titles as the page's Bokeh document holds them (Bokeh draws them on canvas)
        titles, png = browser.visit(
            f"{_base(dashboard_client)}/tianji",
            script="window.Bokeh ? Bokeh.documents.flatMap(d => [...d.all_models])"
                   ".filter(m => m.type == 'Title').map(m => m.text) : []",
            ready=lambda titles, png: bool(titles) and _plot_pixels(png) > 200,
        )
    finally:
        browser.close()
    shot.write_bytes(png)
    print(f"dashboard screenshot: {shot}")
    assert "tianji: mean episode return (100 episodes)" in titles and len(titles) >= 7, titles
    # the plots drew: lines in the plot colour, and a page that is far from one flat colour
    assert _plot_pixels(png) > 200, f"no plot lines in {shot}"
    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 50  # far from one flat colour


def _plot_pixels(png: bytes) -> int:
    """Pixels of a screenshot in the plots' line colour (#1f77b4)."""
    import io

    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    return int(((abs(img[..., 0] - 0x1F) < 30) & (abs(img[..., 1] - 0x77) < 30) & (abs(img[..., 2] - 0xB4) < 30)).sum())
