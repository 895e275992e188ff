"""``tianji-dask train ... --seeds 0 1 2``: one run per seed, one after another (each on a cluster
of its own, as a single ``train`` would start it), then a summary: each seed's time-to-solve and
their interquartile mean."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tianji_dask.cli.output import unsolved
from tianji_dask.cli.parser import overrides, source
from tianji_dask.cli.signals import EXIT_TERMINATED, Invocation
from tianji_dask.cli.train import new_run, start_workers_early, train_run
from tianji_dask.errors import PipelineError


def iqm(values: list[float]) -> float:
    """The interquartile mean: the mean of what is left once the lowest and the highest quarter
    (``int(n / 4)`` values each) are cut, as ``scipy.stats.trim_mean(values, 0.25)`` and
    rliable's IQM compute it."""
    ordered = sorted(values)
    cut = int(0.25 * len(ordered))
    kept = ordered[cut:len(ordered) - cut]
    return math.fsum(kept) / len(kept)


def _row(seed: int, run) -> dict:
    r = run.results or {}
    return {"seed": seed, "out": str(run.out), "solved": bool(r.get("solved")), "target_return": r.get("target_return"),
            "stop_reason": r.get("stop_reason"), "time_to_solve_s": r.get("time_to_solve_s"), "wall_s": r.get("wall_s"),
            "env_steps": r.get("env_steps"), "final_mean_return": r.get("final_mean_return"), "error": r.get("error")}


def summary(rows: list[dict], stopped_by: str = "Ctrl-C") -> tuple[list[str], dict]:
    """The lines that end a ``--seeds`` invocation, and what ``seeds.json`` holds. Time-to-solve's
    IQM counts an unsolved seed at the time it stopped: then it is a lower bound, and says so.
    ``stopped_by``: what stopped a seed that was asked to stop (Ctrl-C, SIGTERM)."""
    lines = []
    for r in rows:
        if r["solved"]:
            lines.append(f"seed {r['seed']}: solved in {r['time_to_solve_s']:.2f} s, {r['env_steps']:,} env steps ({r['out']})")
        else:
            lines.append(f"seed {r['seed']}: {unsolved(r, stopped_by)} ({r['out']})")
    solved = sum(r["solved"] for r in rows)
    times = [r["time_to_solve_s"] if r["solved"] else r["wall_s"] for r in rows if r["wall_s"] is not None]
    value = iqm(times) if times else None
    record = {"seeds": rows, "solved": solved, "time_to_solve_iqm_s": value, "iqm_is_lower_bound": solved < len(rows)}
    if value is not None:
        bound = ("" if solved == len(rows) else
                 f", at least: {len(rows) - solved} unsolved counted at the time they stopped")
        lines.append(f"time-to-solve IQM {value:.2f} s over {len(rows)} seeds, {solved} solved{bound}")
    return lines, record


def cmd_seeds(args, invocation: Invocation) -> int:
    if len(set(args.seeds)) != len(args.seeds):
        raise PipelineError(f"--seeds: each seed once (got {' '.join(map(str, args.seeds))})")
    out = Path(args.out) if args.out is not None else None
    if out is not None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PipelineError(f"out: {str(out)!r} exists and is not an empty directory; allowed: an empty or new "
                            "directory, which gets seed-S for each seed")
    t_ready = start_workers_early(overrides(args), args.verbose)
    pipeline, settings = source(args)
    rows, code = [], 0
    for i, seed in enumerate(args.seeds):
        print(f"tianji-dask: seed {seed} ({i + 1} of {len(args.seeds)})", flush=True)
        run = new_run(pipeline, {**settings, "seed": seed}, args, out=None if out is None else out / f"seed-{seed}",
                      imported_at=t_ready)
        status = train_run(run, invocation, args.verbose)
        rows.append(_row(seed, run))
        code = max(code, status)
        if status == EXIT_TERMINATED or rows[-1]["stop_reason"] == "stopped":  # Ctrl-C or SIGTERM: no more seeds
            break
    lines, record = summary(rows, "SIGTERM" if invocation.sigterm.received else "Ctrl-C")
    for line in lines:
        print(f"tianji-dask: {line}", flush=True)
    if out is not None:
        (out / "seeds.json").write_text(json.dumps(record, indent=2))
        print(f"tianji-dask: summary {out / 'seeds.json'}", flush=True)
    return code
