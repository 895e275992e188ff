"""PNG figures from recorded runs (``tianji-dask plot RUN_DIR [RUN_DIR ...]``), and the one a
run leaves in its own folder as it ends (``learning_curve.png``, ``write_learning_curve``).

Several runs go on the same axes, labelled by pipeline, mode and seed, for comparisons. Reads
only what every run writes: ``results.json``, ``episodes.csv`` and ``chunks.csv``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tianji_dask.errors import PipelineError
from tianji_dask.core.metrics import CHUNK_FIELDS, EPISODE_FIELDS, atomic_write

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


def _mean_episodes(results: dict) -> int:
    """The episodes of the solve rule's running mean the run was written with: ``stop.mean_episodes``,
    or ``stop.window`` in results written before that name."""
    stop = (results.get("pipeline_config") or {}).get("stop") or {}
    return int(stop.get("mean_episodes", stop.get("window", 100)))


def _running_mean(x: np.ndarray, n: int) -> np.ndarray:
    """Mean of the last ``n`` values at each point (fewer at the start)."""
    c = np.concatenate([[0.0], np.cumsum(x)])
    i = np.arange(1, len(x) + 1)
    lo = np.maximum(i - n, 0)
    return (c[i] - c[lo]) / (i - lo)


def _curve(results: dict, episodes: np.ndarray, chunks: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each training episode in end-time order: (seconds since run start, env steps consumed by
    then, from the chunk log, its return, the running mean of its last ``stop.mean_episodes`` returns)."""
    if not len(episodes):
        return np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0)
    t0 = results["t_run_start"]
    order = np.argsort(episodes[:, 0], kind="stable")
    t_ep, returns = episodes[order, 0] - t0, episodes[order, 1]
    if len(chunks):
        t_ch = chunks[:, CHUNK_FIELDS.index("t_consumed")] - t0
        steps = np.cumsum(chunks[:, CHUNK_FIELDS.index("env_steps")])
        steps_at_ep = np.interp(t_ep, t_ch, steps)
    else:
        steps_at_ep = np.zeros_like(t_ep)
    return t_ep, steps_at_ep, returns, _running_mean(returns, _mean_episodes(results))


def write_learning_curve(path: str | Path, results: dict, episodes: np.ndarray, chunks: np.ndarray) -> Path:
    """One PNG of a run's training returns (each episode's, and their running mean over
    ``stop.mean_episodes``) against env steps and against seconds since the run started, with the target when
    there is one; written whole or not at all. Draws without pyplot, so it may run on a thread
    of its own."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    t_ep, steps, returns, mean = _curve(results, episodes, chunks)
    n = _mean_episodes(results)
    target = results.get("target_return")
    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, x, label in ((axes[0], steps, "env steps"), (axes[1], t_ep, "seconds since run start")):
        ax.plot(x, returns, ".", markersize=2, alpha=0.25, color="tab:blue", label="episode return")
        ax.plot(x, mean, color="tab:blue", linewidth=1.5, label=f"mean of the last {n} episodes")
        if target is not None:
            ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("return")
    axes[0].legend(fontsize=8, loc="lower right")
    if results.get("solved"):
        outcome = f"solved in {results['time_to_solve_s']:.2f} s"
    else:
        outcome = "not solved" if target is not None else "no target"
    fig.suptitle(f"{results.get('pipeline', path.parent.name)}: {results.get('env_id', '')}, {results.get('algo', '')}, "
                 f"{results.get('mode', '')}, seed {results.get('seed', '?')}; {outcome}, "
                 f"{int(results.get('env_steps') or 0):,} env steps, {len(returns):,} episodes", fontsize=10)
    fig.tight_layout()
    atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=100), binary=True)
    return path


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
        t_ep, steps_at_ep, _, mean = _curve(res, eps, ch)  # env steps consumed by each episode's end
        t_ch = ch[:, CHUNK_FIELDS.index("t_consumed")] - t0 if len(ch) else np.zeros(0)
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
