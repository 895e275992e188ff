"""One run of benchmarks/scale.py and what its tables read of it: a fresh ``tianji-dask train``
of a pipeline with overrides (``train_cell``), the throughput figures and per-chunk costs of its
results (``figures``), the explorer threads that spread many explorer streams over the cores, and
the plot every subcommand draws.
"""

from __future__ import annotations

import os
from pathlib import Path

from time_to_solve import pipeline_copy, run_once


def explorer_threads(n: int) -> int:
    return -(-n // min(n, os.cpu_count() or 1))


def figures(r: dict) -> dict:
    """One run's throughput figures and the per-chunk costs behind them."""
    chunks = max(r["chunks"], 1)
    split = (r.get("learner_time") or {}).get("seconds", {})
    dataflow = sum(v for k, v in split.items() if k not in ("learn", "ingest", "wait"))
    cpu = r.get("cpu") or {}
    return {
        "chunks": r["chunks"], "scheduler_cpu_s": cpu.get("seconds", {}).get("scheduler_process", 0.0),
        "learner_dataflow_s": dataflow, "learner_ingest_s": split.get("ingest", 0.0),
        "explorers": r["explorers"], "seed": r["seed"], "mode": r["mode"], "env_steps_per_s": r["env_steps_per_s"],
        "chunks_per_s": r["chunks_per_s"], "learner_busy": r["learner_busy_fraction"], "updates": r["updates"],
        "staleness_mean": (r.get("staleness_versions") or {}).get("mean"), "chunks_lost": r["chunks_lost"],
        "scheduler_cpu_ms_per_chunk": 1e3 * (cpu.get("seconds", {}).get("scheduler_process", 0.0)) / chunks,
        "learner_dataflow_ms_per_chunk": 1e3 * dataflow / chunks,
        "learner_ingest_ms_per_chunk": 1e3 * split.get("ingest", 0.0) / chunks,
        "learner_process_other_cores": (cpu.get("cores") or {}).get("learner_process_other"),
        "bytes_per_chunk": r["bytes_per_s"] / max(r["chunks_per_s"], 1e-9),
        "explorer_bytes_per_stream": (r.get("explorer_memory") or {}).get("bytes_per_stream"),
        "time_to_solve_s": r.get("time_to_solve_s"), "solved": r.get("solved"), "wall_s": r["wall_s"],
    }


def train_cell(pipeline: str, overrides: dict, seed: int, mode: str, seconds: float, extra=()) -> dict:
    with pipeline_copy(pipeline, overrides) as path:
        return run_once(path, seed, mode, seconds, list(extra))


def plot(path: Path, series: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str, title: str,
          logx: bool = False, linear: dict | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for label, points in series.items():
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, marker="o", label=label)
    for label, points in (linear or {}).items():
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, linestyle="--", color="grey", linewidth=1, label=label)
    if logx:
        ax.set_xscale("log", base=2)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
