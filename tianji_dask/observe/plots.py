"""PNG figures from recorded runs (``tianji-dask plot RUN_DIR [RUN_DIR ...]``).

Several runs go on the same axes, labelled by pipeline, mode and seed, for comparisons. Reads
only what every run writes: ``results.json``, ``episodes.csv`` and ``chunks.csv``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tianji_dask.errors import PipelineError
from tianji_dask.core.metrics import CHUNK_FIELDS, EPISODE_FIELDS

FIGURES = ("return_vs_time.png", "return_vs_env_steps.png", "staleness_hist.png", "throughput.png")


class RunDirError(PipelineError):
    """A directory that does not hold a recorded run; ``str()`` is the one line to show."""


def load_run(run_dir: str | Path) -> dict:
    d = Path(run_dir)
    missing = [name for name in ("results.json", "episodes.csv", "chunks.csv") if not (d / name).is_file()]
    if missing:
        raise RunDirError(f"run_dir: {str(d)!r} is not a recorded run (no {', '.join(missing)})")
    if len((d / "episodes.csv").read_text().strip().splitlines()) < 2:  # a header alone: numpy would warn
        raise RunDirError(f"run_dir: {str(d)!r} has no episodes to plot (the run stopped before any training "
                          "episode ended); allowed: a run with at least one episode")
    try:
        results = json.loads((d / "results.json").read_text())
        episodes = np.loadtxt(d / "episodes.csv", delimiter=",", skiprows=1, ndmin=2).reshape(-1, len(EPISODE_FIELDS))
        chunks = np.loadtxt(d / "chunks.csv", delimiter=",", skiprows=1, ndmin=2).reshape(-1, len(CHUNK_FIELDS))
    except (ValueError, json.JSONDecodeError) as err:
        raise RunDirError(f"run_dir: {str(d)!r} holds a damaged run: {err}") from None
    label = f"{results.get('pipeline', d.name)} {results.get('mode', '')} seed {results.get('seed', '?')}"
    return {"dir": d, "label": label, "results": results, "episodes": episodes, "chunks": chunks}


def _running_mean(x: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last ``window`` values at each point (fewer at the start)."""
    c = np.concatenate([[0.0], np.cumsum(x)])
    i = np.arange(1, len(x) + 1)
    lo = np.maximum(i - window, 0)
    return (c[i] - c[lo]) / (i - lo)


def write_plots(runs: list[dict], out_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs = {name: plt.subplots(figsize=(7, 4)) for name in FIGURES}
    for run in runs:
        res, eps, ch = run["results"], run["episodes"], run["chunks"]
        t0 = res["t_run_start"]
        window = res.get("pipeline_config", {}).get("stop", {}).get("window", 100)
        order = np.argsort(eps[:, 0]) if len(eps) else np.zeros(0, dtype=int)
        t_ep = eps[order, 0] - t0 if len(eps) else np.zeros(0)
        mean = _running_mean(eps[order, 1], window) if len(eps) else np.zeros(0)
        # env steps consumed by each episode's end, from the chunk log
        t_ch = ch[:, CHUNK_FIELDS.index("t_consumed")] - t0 if len(ch) else np.zeros(0)
        steps = np.cumsum(ch[:, CHUNK_FIELDS.index("env_steps")]) if len(ch) else np.zeros(0)
        steps_at_ep = np.interp(t_ep, t_ch, steps) if len(ch) else np.zeros_like(t_ep)
        figs["return_vs_time.png"][1].plot(t_ep, mean, label=run["label"])
        figs["return_vs_env_steps.png"][1].plot(steps_at_ep, mean, label=run["label"])
        stale = ch[:, CHUNK_FIELDS.index("staleness_versions")] if len(ch) else np.zeros(0)
        if len(stale):
            bins = np.arange(-0.5, stale.max() + 1.5, max(1, int(stale.max() // 40) or 1))
            figs["staleness_hist.png"][1].hist(stale, bins=bins, alpha=0.5, label=run["label"])
        if len(ch):
            edges = np.arange(0, max(t_ch.max(), 1) + 1.0, 1.0)
            per_s, _ = np.histogram(t_ch, bins=edges, weights=ch[:, CHUNK_FIELDS.index("env_steps")])
            figs["throughput.png"][1].plot(edges[:-1], per_s, label=run["label"])
        target = res.get("target_return")
        if target is not None:
            for name in ("return_vs_time.png", "return_vs_env_steps.png"):
                figs[name][1].axhline(target, color="grey", linestyle="--", linewidth=1)
    labels = {
        "return_vs_time.png": ("seconds since run start", "mean return (running, 100 episodes)"),
        "return_vs_env_steps.png": ("env steps", "mean return (running, 100 episodes)"),
        "staleness_hist.png": ("staleness (versions)", "chunks"),
        "throughput.png": ("seconds since run start", "env steps/s consumed"),
    }
    written = []
    for name, (fig, ax) in figs.items():
        ax.set_xlabel(labels[name][0])
        ax.set_ylabel(labels[name][1])
        ax.set_title(name.removesuffix(".png").replace("_", " "))
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
