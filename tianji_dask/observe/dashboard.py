"""The ``/tianji`` page of the Dask dashboard, and one page per plot for JupyterLab's Dask pane.

Installed two ways (docs/design.md, "Watching"):
- ``install()`` adds the pages to distributed's table of scheduler pages, so a scheduler built
  afterwards in the same process serves them: the run's own clusters call it before they start,
  ``dask scheduler --preload tianji_dask.preload`` calls it for an external scheduler, and
  ``tianji_dask.install_dashboard()`` is it for a cluster a user builds. Pages named
  ``/individual-*`` are listed for the JupyterLab extension.
- ``ensure_page(scheduler)``, from the controller's ``start``, adds ``/tianji`` to a scheduler
  that is already running without it (not listed for JupyterLab: the extension reads only the
  first Bokeh app).

Every page shows one run, chosen explicitly: ``?run=<run id>`` in its address, or the run
selector at its top, which lists the runs the controller holds; without either it follows the
newest run. It reads the ``tianji`` scheduler plugin twice a second on the scheduler's event loop
and only streams what is new, so an update costs O(new chunks), never O(run).
"""

from __future__ import annotations

import html
import logging

from tianji_dask import dask_internals

logger = logging.getLogger("tianji_dask.dashboard")

UPDATE_MS = 500
ROLLOVER = 5000

#: page path -> the panels it shows
PAGES = {
    "/tianji": ("returns", "rates", "staleness", "staleness_hist", "window", "learner", "explorers"),
    "/individual-tianji-returns": ("returns",),
    "/individual-tianji-throughput": ("rates",),
    "/individual-tianji-staleness": ("staleness", "staleness_hist"),
    "/individual-tianji-window": ("window",),
    "/individual-tianji-learner": ("learner",),
    "/individual-tianji-explorers": ("explorers",),
}

TITLES = {
    "returns": "tianji: mean episode return (100 episodes)",
    "rates": "tianji: env steps/s produced vs samples/s consumed",
    "staleness": "tianji: staleness of consumed chunks (versions) and target",
    "staleness_hist": "tianji: staleness histogram",
    "window": "tianji: controller window and chunks in flight",
    "learner": "tianji: learner version and busy fraction",
    "explorers": "tianji: env steps/s per explorer",
}


def _target_note(name: str, target: float | None, verdict: dict) -> str:
    """`` · NAME T: state (reason)`` for a law with a target, empty for one without."""
    if verdict["state"] == "off":
        return ""
    reason = f" ({html.escape(verdict['reason'])})" if verdict["reason"] else ""
    return f" &middot; {name} {target:g}: {verdict['state']}{reason}"


class Panels:
    """The figures of one page, the run selector, and the incremental update that feeds them."""

    def __init__(self, scheduler, panels: tuple[str, ...], chosen: str | None = None):
        from bokeh.models import (
            ColumnDataSource,
            Div,
            LinearAxis,
            Range1d,
            Select,
            Span,
        )
        from bokeh.plotting import figure

        self.scheduler = scheduler
        self.chosen = chosen  # the run asked for; None: the newest, whichever that is
        self.run_id = None  # the run shown
        self.select = Select(title="run", options=[], value="", width=220)
        self.showing = False  # the page sets the selector's value itself
        self.select.on_change("value", self._picked)
        self.note = Div(text="")
        self.t_hist = 0.0  # newest history row shown
        self.t_series = 0.0  # newest learner row shown
        self.prev = None  # previous learner row, for rates
        S = ColumnDataSource
        self.src = {
            "returns": S({"t": [], "mean_return": [], "eval_return": []}),
            "rates": S({"t": [], "produced": [], "consumed": []}),
            "staleness": S({"t": [], "staleness": []}),
            "hist": S({"left": [], "right": [], "count": []}),
            "window": S({"t": [], "window": [], "in_flight": []}),
            "learner": S({"t": [], "version": [], "busy": []}),
            "explorers": S({"explorer": [], "rate": []}),
        }
        self.figures = []
        self.names = list(panels)
        self.labels_shown = (1, False)  # (groups, simulated) the titles say
        kw = {"height": 260, "sizing_mode": "stretch_width", "tools": "pan,wheel_zoom,box_zoom,reset,save"}
        xl = "seconds since run start"
        for name in panels:
            f = figure(title=TITLES[name], x_axis_label=xl, **kw)
            if name == "returns":
                f.line("t", "mean_return", source=self.src["returns"], line_width=2, legend_label="training, 100-episode mean")
                f.scatter("t", "eval_return", source=self.src["returns"], size=6, color="#2ca02c", legend_label="evaluation")
                f.legend.location = "top_left"
                f.yaxis.axis_label = "return"
            elif name == "rates":
                f.line("t", "produced", source=self.src["rates"], line_width=2, color="#1f77b4", legend_label="env steps/s produced")
                f.line("t", "consumed", source=self.src["rates"], line_width=2, color="#d62728", legend_label="samples/s consumed")
                f.legend.location = "top_left"
            elif name == "staleness":
                f.scatter("t", "staleness", source=self.src["staleness"], size=3, alpha=0.5)
                self.target_span = Span(location=0, dimension="width", line_color="#d62728", line_dash="dashed",
                                        line_width=2, visible=False)
                f.add_layout(self.target_span)
                f.yaxis.axis_label = "versions"
            elif name == "staleness_hist":
                f.xaxis.axis_label = "staleness (versions)"
                f.quad(left="left", right="right", bottom=0, top="count", source=self.src["hist"], alpha=0.7)
            elif name == "window":
                f.step("t", "window", source=self.src["window"], line_width=2, color="#2ca02c", legend_label="window", mode="after")
                f.line("t", "in_flight", source=self.src["window"], color="#7f7f7f", legend_label="in flight")
                f.legend.location = "top_left"
            elif name == "learner":
                f.line("t", "version", source=self.src["learner"], line_width=2, legend_label="version")
                f.extra_y_ranges = {"busy": Range1d(0, 1.05)}
                f.add_layout(LinearAxis(y_range_name="busy", axis_label="busy fraction"), "right")
                f.line("t", "busy", source=self.src["learner"], y_range_name="busy", color="#ff7f0e", legend_label="busy")
                f.legend.location = "top_left"
            elif name == "explorers":
                f.xaxis.axis_label = "explorer"
                f.vbar(x="explorer", top="rate", width=0.7, source=self.src["explorers"])
            self.figures.append(f)

    def _picked(self, attr, old, new) -> None:
        if not self.showing:  # the user's choice, not the page naming the run it shows
            self.chosen = new or None

    def update(self) -> None:
        ctl = self.scheduler.plugins.get("tianji")
        runs = [] if ctl is None else ctl.run_ids()
        options = runs[::-1]  # the newest first
        if self.select.options != options:
            self.select.options = options
        want = self.chosen if self.chosen is not None else (runs[-1] if runs else None)
        if want is None or want not in runs:
            self.note.text = ("no run on this scheduler yet" if want is None else
                              f"run {want}: not on this scheduler; runs on it: {', '.join(options) or 'none'}")
            return
        if want != self.run_id:  # another run: start the plots afresh
            self.run_id, self.t_hist, self.t_series, self.prev = want, 0.0, 0.0, None
            for src in self.src.values():
                src.data = {k: [] for k in src.data}
            self.showing = True
            self.select.value = want
            self.showing = False
            self.labels_shown = None
        run = ctl.run(want)
        first = min(run.groups)
        books = run.groups[first]  # the run's first group's
        view = books.view()
        self.note.text = (f"run {want}" + ("" if self.chosen is not None else " (the newest; pick another above)")
                          + _target_note("staleness target", view.staleness_target, view.target_verdict)
                          + _target_note("replay staleness target", view.replay_staleness_target, view.replay_target_verdict))
        groups, simulated = len(run.groups), view.simulated
        if (groups, simulated) != self.labels_shown:  # say whose books these are, and a simulated env cost
            self.labels_shown = (groups, simulated)
            for name, f in zip(self.names, self.figures):
                f.title.text = (TITLES[name] + (f" (group {first} of {groups})" if groups > 1 else "")
                                + (" [simulated env step cost]" if simulated else ""))
        t0 = run.t_reset
        new_hist = books.history_since(self.t_hist)
        if new_hist:
            self.t_hist = new_hist[-1].t
            ts = [row.t - t0 for row in new_hist]
            self.src["staleness"].stream({"t": ts, "staleness": [row.staleness_versions for row in new_hist]}, ROLLOVER)
            self.src["window"].stream({"t": ts, "window": [row.window for row in new_hist],
                                       "in_flight": [row.chunks_in_flight for row in new_hist]}, ROLLOVER)
            hist = sorted(view.staleness_hist.items())
            self.src["hist"].data = {"left": [k - 0.4 for k, _ in hist], "right": [k + 0.4 for k, _ in hist],
                                     "count": [v for _, v in hist]}
        if hasattr(self, "target_span"):
            target = view.staleness_target
            self.target_span.visible = target is not None
            if target is not None:
                self.target_span.location = target
        new_series = books.learner_series_since(self.t_series)
        if new_series:
            self.t_series = new_series[-1]["t"]
            t = [row["t"] - t0 for row in new_series]
            self.src["returns"].stream({"t": t, "mean_return": [_num(row.get("mean_return")) for row in new_series],
                                        "eval_return": [_num(row.get("eval_mean_return")) for row in new_series]}, ROLLOVER)
            produced, consumed, busy = [], [], []
            for row in new_series:
                prev = self.prev or row
                dt = max(row["t"] - prev["t"], 1e-9)
                produced.append((row["env_steps"] - prev["env_steps"]) / dt if prev is not row else float("nan"))
                consumed.append((row["samples_trained"] - prev["samples_trained"]) / dt if prev is not row else float("nan"))
                busy.append((row["learn_s"] - prev["learn_s"]) / dt if prev is not row else float("nan"))
                self.prev = row
            self.src["rates"].stream({"t": t, "produced": produced, "consumed": consumed}, ROLLOVER)
            self.src["learner"].stream({"t": t, "version": [row["version"] for row in new_series], "busy": busy}, ROLLOVER)
            elapsed = max(new_series[-1]["t"] - t0, 1e-9)
            steps = sorted(view.per_explorer_steps.items())
            self.src["explorers"].data = {"explorer": [k for k, _ in steps], "rate": [v / elapsed for _, v in steps]}


def _num(x):
    return float("nan") if x is None else x


def _asked_run(doc) -> str | None:
    """The run named by ``?run=<run id>`` in the page's address, if any."""
    request = doc.session_context.request if doc.session_context is not None else None
    values = (request.arguments if request is not None else {}).get("run") or [b""]
    value = values[0].decode() if isinstance(values[0], bytes) else str(values[0])
    return value or None


def _doc(panels: tuple[str, ...]):
    def make(scheduler, extra, doc):
        from bokeh.layouts import column, gridplot, row

        page = Panels(scheduler, panels, chosen=_asked_run(doc))
        page.update()
        if len(page.figures) > 2:
            plots = gridplot([page.figures[i:i + 2] for i in range(0, len(page.figures), 2)], sizing_mode="stretch_width")
        else:
            plots = column(*page.figures, sizing_mode="stretch_width")
        doc.title = "tianji"
        doc.add_root(column(row(page.select, page.note), plots, sizing_mode="stretch_width"))
        doc.add_periodic_callback(page.update, UPDATE_MS)
        template = dask_internals.dashboard_template()  # the dashboard's own navigation bar
        if template is not None:
            doc.template = template
            doc.template_variables.update(extra)

    return make


def install() -> None:
    """Add the pages to every scheduler created later in this process."""
    table = dask_internals.scheduler_page_table()
    if table is None:  # no bokeh: no dashboard at all
        return
    for path, panels in PAGES.items():
        table.setdefault(path, _doc(panels))


def ensure_page(scheduler) -> None:
    """Add ``/tianji`` to a running scheduler's dashboard if it is not there yet."""
    if dask_internals.add_page_to_running_scheduler(scheduler, "/tianji", _doc(PAGES["/tianji"])):
        logger.info("tianji: /tianji page added to the running dashboard")
