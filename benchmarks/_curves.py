"""The learning-curve figures: the mean of the last 100 training returns against time, one
colour per system, the same colour in every figure.

- ``write_figure``: one task's figure for benchmarks/report.py, the median across seeds with the
  band between the 25th and 75th percentiles, one line per (system, settings label, env id where a
  system ran another than the task's), against env steps (where the episode rows carry them) and
  against wall time. Each run's running mean is ``learning_curve`` of its raw episode rows, read on
  a common grid as a step function: a run has no value before its first episode and holds its last
  one after it stopped (solved, or out of time). The grid of a system spans its longest run. The
  PNG is written only when its bytes change, so a second report leaves the file as it was.
- ``solve_curves`` (``suite.py curves``): one task's runs of a solve JSON, one line per run, each
  its thinned ``curve``, against the seconds since the system was built or since its launch.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np

from _episodes import learning_curve
from _systems import SYSTEMS, TASKS, system_rank
from peers.tasks import WINDOW

GRID = 300  # points per curve
PANELS = {"env_steps": "env steps (of the episodes ended so far)", "time": "seconds since the system was built"}


def run_curve(doc: dict, x: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, running mean) of one run, x the env steps (``x="env_steps"``) or the seconds since the
    system was built (``x="time"``); empty when the run's episode rows have no such column."""
    fields = doc.get("episode_fields", [])
    if x == "env_steps" and "env_steps" not in fields:
        return np.zeros(0), np.zeros(0)
    col = fields.index("env_steps") if x == "env_steps" else 0
    curve = learning_curve([(row[col], row[1]) for row in doc["episodes"]], 0.0)
    return np.array([p[0] for p in curve], dtype=float), np.array([p[1] for p in curve], dtype=float)


def band(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(grid, [25th, 50th, 75th percentile] rows) of the runs' step functions on a grid from 0 to
    the longest run; NaN where no run has a value yet."""
    grid = np.linspace(0.0, max(xs[-1] for xs, _ in curves), GRID)
    values = np.full((len(curves), GRID), np.nan)
    for i, (xs, ys) in enumerate(curves):
        idx = np.searchsorted(xs, grid, side="right") - 1
        values[i, idx >= 0] = ys[idx[idx >= 0]]
    quartiles = np.full((3, GRID), np.nan)
    have = ~np.isnan(values).all(axis=0)
    quartiles[:, have] = np.nanpercentile(values[:, have], [25, 50, 75], axis=0)
    return grid, quartiles


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def colours(plt, systems) -> dict:
    """A colour for each of ``SYSTEMS`` and of ``systems``: tab10 for the first ten, the rest from
    Dark2, so that no two share one and a system has the same in every figure."""
    others = sorted(set(systems) - set(SYSTEMS))
    return {s: plt.get_cmap("tab10")(i) if i < 10 else plt.get_cmap("Dark2")((i - 10) % 8)
            for i, s in enumerate((*SYSTEMS, *others))}


def write_figure(docs: list[dict], task: str, path: Path) -> Path:
    """Draw ``task``'s figure from its raw runs ``docs`` into ``path`` (a PNG)."""
    plt = _pyplot()
    env_id, _, target = TASKS.get(task, (task, None, None))
    groups: dict[tuple, list[dict]] = {}
    for d in sorted(docs, key=lambda d: (d["system"], d["settings"], d["seed"])):
        groups.setdefault((d["system"], d["settings"], d.get("env_id") or env_id), []).append(d)
    order = sorted(groups, key=lambda k: (system_rank(k[0]), k))
    colour = colours(plt, (k[0] for k in groups))
    panels = [p for p in PANELS if p == "time" or any("env_steps" in d.get("episode_fields", []) for d in docs)]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for system, settings, env in order:
            curves = [c for c in (run_curve(d, panel) for d in groups[(system, settings, env)]) if len(c[0])]
            if not curves:
                continue
            grid, (low, mid, high) = band(curves)
            style = "--" if settings == "same" else "-." if env != env_id else "-"
            name = system if env == env_id else f"{system} on {env}"
            ax.plot(grid, mid, color=colour[system], linestyle=style, linewidth=1.5,
                    label=f"{name} ({settings}), {len(curves)} run(s)")
            ax.fill_between(grid, low, high, color=colour[system], alpha=0.2, linewidth=0)
        if target is not None:
            ax.axhline(target, color="grey", linestyle=":", linewidth=1, label=f"target {target:g}")
        ax.set_xlabel(PANELS[panel])
        ax.set_ylabel("mean of the last 100 training returns")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    fig.suptitle(f"{task} ({env_id}): median across seeds, 25th-75th percentile band")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_bytes() != buf.getvalue():
        path.write_bytes(buf.getvalue())
    return path


def solve_curves(args) -> int:
    """One task's learning curves from a solve JSON: every run's running mean against wall time,
    one line per run, one colour per system, the target as a dashed line."""
    doc = json.loads(Path(args.json).read_text())
    runs = [r for r in doc["runs"] if r["task"] == args.task]
    if not runs:
        print(f"no runs of {args.task} in {args.json}", file=sys.stderr)
        return 1
    plt = _pyplot()
    colour = colours(plt, (r["system"] for r in runs))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    drawn = set()
    for r in runs:
        curve = r.get("curve") or []
        if not curve:
            continue
        shift = 0.0
        if args.clock == "launch":
            if r.get("build_s_from_launch") is None:
                continue
            shift = r["build_s_from_launch"]
        ax.plot([t + shift for t, _ in curve], [m for _, m in curve], color=colour[r["system"]], linewidth=1.2,
                alpha=0.85, label=None if r["system"] in drawn else r["system"])
        drawn.add(r["system"])
    env_id, _, target = TASKS.get(args.task, (args.task, None, None))
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.set_xlabel("seconds since the system was built" if args.clock == "build"
                  else "seconds since the process was launched")
    ax.set_ylabel(f"mean of the last {WINDOW} training returns")
    ax.set_title(f"{args.task} ({env_id}): one line per run")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    plt.close(fig)
    missing = [f"{r['system']} seed {r['seed']}" for r in runs if not r.get("curve")]
    print(f"wrote {args.out}: {len(runs) - len(missing)} run(s) of {args.task}"
          + (f"; no curve for {', '.join(missing)}" if missing else ""))
    return 0
