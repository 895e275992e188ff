"""A run's training episodes as the results keep them: the learning curve (thinned), every
episode's row (its columns named by ``episode_fields``), and, for tianji_dask, the episodes and the
env steps consumed each second, read from its run folder.

The learning curve: [seconds since the system was built, mean of the last 100 training returns
(of all so far, before 100)] at the end of each episode, episodes pooled and sorted by end time,
thinned to at most ``CURVE_POINTS`` points spread over the run's time.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from peers.tasks import WINDOW

#: a run's learning curve in a solve JSON keeps at most this many points
CURVE_POINTS = 400


def learning_curve(episodes, t0: float, window: int = WINDOW, points: int = CURVE_POINTS) -> list[list[float]]:
    """[seconds since ``t0``, mean of the last ``window`` returns] at the end of each episode
    ((end time, return) pairs, pooled and sorted by end time; before ``window`` episodes, the mean
    of all so far), thinned to at most ``points``: the last episode of each of ``points`` equal
    slices of the run's time, and the last episode always."""
    eps = sorted((float(ep[0]), float(ep[1])) for ep in episodes)
    if not eps:
        return []
    means, total = [], 0.0
    for i, (_, r) in enumerate(eps):
        total += r
        if i >= window:
            total -= eps[i - window][1]
        means.append(total / min(i + 1, window))
    t_first, t_last = eps[0][0], eps[-1][0]
    span = (t_last - t_first) or 1.0
    keep = {}
    for i, (t, _) in enumerate(eps):  # the last episode in each time slice
        keep[min(int((t - t_first) / span * points), points - 1)] = i
    return [[round(eps[i][0] - t0, 3), round(means[i], 4)] for i in sorted(keep.values())]


def episode_rows(episodes, t0: float, t_process: float | None = None) -> list[list[float]]:
    """Every episode, sorted by end time, as [seconds since ``t0``, return], and when the episodes
    carry their length ((end time, return, length) triples) the env steps of all episodes ended so
    far as a third column, and with ``t_process`` the seconds since then as the last: the full
    record that ``learning_curve`` thins. ``episode_fields`` names the columns."""
    rows, steps = [], 0
    for ep in sorted(episodes):
        row = [round(ep[0] - t0, 3), round(ep[1], 4)]
        if len(ep) > 2:
            steps += int(ep[2])
            row.append(steps)
        if t_process is not None:
            row.append(round(ep[0] - t_process, 3))
        rows.append(row)
    return rows


def episode_fields(episodes, t_process: float | None = None) -> list[str]:
    """The names of ``episode_rows``' columns."""
    return ["seconds_since_built", "return", *(["env_steps"] if episodes and len(episodes[0]) > 2 else []),
            *(["seconds_since_process_start"] if t_process is not None else [])]


def our_episodes(run_dir: Path, lengths: bool = False) -> list[tuple]:
    """(end time, return) of every training episode in a run folder's episodes.csv (columns
    t_end, return, length, explorer_id; end times in seconds since the epoch), with the length
    as a third item when ``lengths``."""
    path = run_dir / "episodes.csv"
    if not path.exists():
        return []
    with open(path, newline="") as fh:
        return [(float(row["t_end"]), float(row["return"]), *((float(row["length"]),) if lengths else ()))
                for row in csv.DictReader(fh)]


def our_throughput(run_dir: Path, t0: float, wall_s: float) -> list[int]:
    """Env steps the learner consumed in each whole second since ``t0`` (chunks.csv's t_consumed
    and env_steps), over the run's ``wall_s``."""
    path = run_dir / "chunks.csv"
    per_s = [0] * max(1, math.ceil(wall_s or 0))
    if path.exists():
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                i = int(float(row["t_consumed"]) - t0)
                if 0 <= i < len(per_s):
                    per_s[i] += int(float(row["env_steps"]))
    return per_s
