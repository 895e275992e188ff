"""Measurement: time-to-solve by TianJi's rule, staleness summaries, results files (no Dask)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np

from tianji_dask.core.env_errors import FILE as ENV_ERRORS_FILE

EPISODE_FIELDS = ("t_end", "return", "length", "explorer_id")
EVAL_FIELDS = ("t", "version", "mean", "std", "episodes")  # eval.csv: one row per evaluation
CHUNK_FIELDS = (
    "t_consumed", "explorer_id", "submit_version", "policy_version", "consumed_version", "staleness_versions",
    "age_s", "env_steps", "nbytes", "t_start", "t_end",
)
#: the CSVs' columns of whole numbers (counts, ids, versions, seeds): written as integers (``12``,
#: not ``12.0``) when every value of the column is one; times, returns and the rest stay floats
WHOLE_FIELDS = frozenset({
    "length", "explorer_id", "submit_version", "policy_version", "consumed_version", "staleness_versions", "env_steps",
    "nbytes", "version", "episodes", "stream", "stream_serial", "env_seed", "updates_before", "skipped",
})


def time_to_solve(episodes: np.ndarray, target: float, mean_episodes: int = 100) -> float | None:
    """TianJi's rule: pool every training episode from every explorer, sort by end time, and
    return the first end time at which the mean of the last ``mean_episodes`` returns is ≥
    ``target`` (None if never). ``episodes`` rows are (t_end, return, ...)."""
    n = mean_episodes
    if len(episodes) < n:
        return None
    order = np.argsort(episodes[:, 0], kind="stable")
    t_end, returns = episodes[order, 0], episodes[order, 1]
    csum = np.concatenate([[0.0], np.cumsum(returns)])
    means = (csum[n:] - csum[:-n]) / n  # means[i] = mean of returns[i : i+n]
    hit = np.flatnonzero(means >= target)
    return float(t_end[hit[0] + n - 1]) if hit.size else None


def _level(values: np.ndarray) -> dict:
    """Mean, mean over the second half (in order: past the start's transient, a window or a replay
    ratio still moving from its first value) and 95th percentile of a non-empty series."""
    return {"mean": float(values.mean()), "mean_second_half": float(values[values.size // 2:].mean()),
            "p95": float(np.percentile(values, 95))}


#: the second half's standard error is taken over this many consecutive batches of it (batch
#: means: one chunk's staleness follows the last through the window, so single chunks are not
#: independent draws)
SE_BATCHES = 5


def _second_half_se(values: np.ndarray) -> float | None:
    """Standard error of the second half's mean by batch means; None under two chunks a batch."""
    half = values[values.size // 2:]
    if half.size < 2 * SE_BATCHES:
        return None
    means = [b.mean() for b in np.array_split(half, SE_BATCHES)]
    return float(np.std(means, ddof=1) / np.sqrt(SE_BATCHES))


def staleness_summary(staleness: np.ndarray) -> dict:
    """``_level`` of chunk staleness, the standard error of its second half's mean
    (``se_second_half``: how far a short run's steady state can be trusted), maximum and histogram."""
    if staleness.size == 0:
        return {"mean": None, "mean_second_half": None, "se_second_half": None, "p95": None, "max": None,
                "hist": {}}
    values, counts = np.unique(staleness.astype(np.int64), return_counts=True)
    return {**_level(staleness), "se_second_half": _second_half_se(staleness), "max": int(staleness.max()),
            "hist": {str(int(v)): int(c) for v, c in zip(values, counts)}}


def replay_staleness_summary(per_update: np.ndarray) -> dict | None:
    """``_level`` of replay staleness (per update: version minus the mean policy version of the
    samples trained on); None for an algorithm that does not replay (no update measured)."""
    return _level(per_update) if per_update.size else None


def age_summary(ages: np.ndarray) -> dict:
    """Mean, 95th percentile and max of chunk ages (seconds from produced to consumed)."""
    return {
        "mean": float(ages.mean()) if ages.size else None,
        "p95": float(np.percentile(ages, 95)) if ages.size else None,
        "max": float(ages.max()) if ages.size else None,
    }


def atomic_write(path: Path, write, binary: bool = False) -> None:
    """Write ``path`` through ``write(fh)`` to a temp file renamed over it: a reader never sees half
    of it. ``fh`` is a text file, or with ``binary`` a bytes one."""
    # opened as any file is (the user's umask), named apart by process as checkpoint.save does
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") if binary else open(tmp, "w", newline="") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_results(out_dir: str | os.PathLike, results: dict, episodes: np.ndarray, chunks: np.ndarray,
                  replay: np.ndarray | None = None) -> Path:
    """Write results.json, episodes.csv and chunks.csv into ``out_dir`` (each atomically), and
    eval.csv and replay.csv when the run has evaluations and a replay log, env_errors.txt when its
    envs raised (the tracebacks the results' ``env_errors`` carried)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    def rows(fields, table):
        def write(fh):
            w = csv.writer(fh)
            w.writerow(fields)
            w.writerows(csv_rows(fields, table))
        return write

    atomic_write(out / "episodes.csv", rows(EPISODE_FIELDS, episodes))
    atomic_write(out / "chunks.csv", rows(CHUNK_FIELDS, chunks))
    if replay is not None:
        from tianji_dask.core.exact_replay_log import REPLAY_FIELDS

        atomic_write(out / "replay.csv", rows(REPLAY_FIELDS, replay))
    if results.get("eval"):
        rows_ = np.array([[row[k] for k in EVAL_FIELDS] for row in results["eval"]], dtype=np.float64)
        atomic_write(out / "eval.csv", rows(EVAL_FIELDS, rows_))
    errors = results.get("env_errors")
    if errors:  # the env errors' tracebacks go to a file of their own, named in the results
        text, errors["file"] = errors.pop("tracebacks", None), None
        if text:
            atomic_write(out / ENV_ERRORS_FILE, lambda fh: fh.write(text))
            errors["file"] = ENV_ERRORS_FILE
    atomic_write(out / "results.json", lambda fh: json.dump(results, fh, indent=2, sort_keys=True))
    return out / "results.json"


def csv_rows(fields, table: np.ndarray):
    """``table``'s rows as lists of Python numbers, a ``WHOLE_FIELDS`` column as ints when every
    value of it is a finite whole number (a column that holds anything else stays floats)."""
    table = np.asarray(table, dtype=np.float64)
    if table.ndim != 2 or table.shape[1] != len(fields):
        return table.tolist()
    columns = []
    for j, name in enumerate(fields):
        column = table[:, j]
        whole = name in WHOLE_FIELDS and bool(np.isfinite(column).all()) and bool((column == np.trunc(column)).all())
        columns.append(column.astype(np.int64).tolist() if whole else column.tolist())
    return [list(row) for row in zip(*columns)]


def read_episodes(out_dir: str | os.PathLike) -> np.ndarray:
    return np.loadtxt(Path(out_dir) / "episodes.csv", delimiter=",", skiprows=1, ndmin=2)
