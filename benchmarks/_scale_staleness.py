"""``scale.py staleness``: mean staleness held at each target, the controller's verdict on it, and
time-to-solve against the target, over a grid of (pipeline, jitter, explorers, target) cells.

Each run keeps one file under ``--cells`` (committed, as the suite's raw files are), and a grid
started again reads those instead of rerunning them, so a grid of seeds can be spread over several
sittings; a file made with other settings is refused (``--rerun`` replaces them). Held: the mean
staleness of a run's second half (the controller's steady state, past the start's transient)
within ±25% of the target; the whole run's mean is reported beside it.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from _report import commit, commit_label, median_of, write_atomically, write_report
from _scale_runs import explorer_threads, figures, plot, train_cell


#: what each pipeline needs for a staleness target: PPO trains only on segments within its
#: ``max_policy_lag`` (dropping older ones), so the lag limit is raised to allow the target
TARGET_OVERRIDES = {"cartpole_ppo": lambda target: {"algo.config.max_policy_lag": max(1, 2 * target)}}


def _verdict(r: dict) -> dict:
    """The controller's verdict on the target at the run's end (``WindowLaw.verdict``)."""
    return (r.get("controller") or {}).get("target_verdict") or {"state": None, "reason": None}


def _judged(r: dict) -> str:
    """`` (2.4)``: the mean staleness the verdict judged (its last periods' chunks), where recorded."""
    return "" if r.get("staleness_judged") is None else f" ({r['staleness_judged']:.1f})"


def within_target(s: float | None, target: float, rs: list[dict]) -> str:
    """``yes`` when the seeds' median second-half staleness is within ±25% of the target; a miss is
    ``no, within noise`` when the seeds' median distance outside the band is under two standard
    errors of their second halves (few chunks, as stragglers make at small windows), else **no**."""
    if s is not None and abs(s - target) <= 0.25 * target:
        return "yes"
    ses = [r.get("staleness_second_half_se") for r in rs]
    if s is None or any(se is None or se == 0 for se in ses):
        return "**no**"
    out = median_of(max(abs(r["staleness_second_half"] - target) - 0.25 * target, 0.0) / se for r, se in zip(rs, ses))
    return "no, within noise" if out < 2 else "**no**"


def _halves(rows: list[dict], args) -> list[str]:
    """Per jitter and target, over every run: the second half's and the whole run's mean
    staleness as fractions of the target. A law misled at the start (its first periods see the
    fast chunks come back, the stragglers not yet, and it widens) shows as a second half above
    the target and a whole run near it."""
    out = ["", "| jitter | target | runs | second half ÷ target, mean | whole run ÷ target, mean |", "|---|---|---|---|---|"]
    for jitter in args.jitter:
        for target in args.targets:
            rs = [r for r in rows if r["jitter"] == jitter and r["target"] == target
                  and r["staleness_second_half"] is not None and r["staleness_mean"] is not None]
            if rs:
                second = sum(r["staleness_second_half"] for r in rs) / len(rs) / target
                whole = sum(r["staleness_mean"] for r in rs) / len(rs) / target
                out.append(f"| {jitter:g} | {target} | {len(rs)} | {second:.2f} | {whole:.2f} |")
    return out


def staleness(args, argv) -> int:
    """Every (pipeline, explorers, target) cell, seeds alternating the cells. Held: the mean
    staleness of the run's second half (the controller's steady state, past the start's
    transient) within ±25% of the target; the whole run's mean is reported beside it."""
    rows = []
    cells = [(pipe, jitter, n, target) for pipe in args.pipelines for jitter in args.jitter for n in args.explorers
             for target in args.targets]
    done_dir = Path(args.cells)
    for seed in args.seeds:
        for pipe, jitter, n, target in cells:
            o = {"explorers": n, "env.step_cost_ms": args.step_cost_ms, "env.step_cost_jitter": jitter,
                 "controller.staleness_target": target,
                 "controller.window_max": max(4 * n, 2 * target), "cluster.explorer_threads": explorer_threads(n),
                 **TARGET_OVERRIDES.get(pipe, lambda t: {})(target), **args.set}
            done = done_dir / f"{pipe}-jitter{jitter:g}-x{n}-target{target}-seed{seed}.json"
            if done.exists() and not args.rerun:  # resumable: a grid spreads over several sittings
                kept = json.loads(done.read_text())
                if (kept.get("overrides"), kept.get("max_seconds")) != (o, args.max_seconds):
                    print(f"scale.py staleness: {done} was run with other settings; pass --rerun to replace it, "
                          "or --cells DIR for a grid of its own", file=sys.stderr)
                    return 2
                rows.append(kept)
                continue
            r = train_cell(pipe, o, seed, "relaxed", args.max_seconds)
            row = {**figures(r), "pipeline": pipe, "jitter": jitter, "target": target, "verdict": _verdict(r),
                   "staleness_second_half": (r.get("staleness_versions") or {}).get("mean_second_half"),
                   "staleness_second_half_se": (r.get("staleness_versions") or {}).get("se_second_half"),
                   "staleness_judged": ((r.get("controller") or {}).get("last_period") or {}).get("judged_staleness"),
                   "commit": commit(), "max_seconds": args.max_seconds, "overrides": o}
            rows.append(row)
            write_atomically(done, json.dumps(row, indent=1) + "\n")
            print(f"seed {seed} {pipe} jitter {jitter:g} explorers {n} target {target}: staleness {row['staleness_mean']} "
                  f"(second half {row['staleness_second_half']}), {row['verdict']['state']}, "
                  f"solved {row['solved']} in {row['time_to_solve_s']} s", flush=True)
    lines = ["| pipeline | jitter | explorers | target | second-half mean staleness, median (by seed) | whole run "
             "| within ±25% | controller's verdict (its last periods' mean), by seed | time-to-solve, median (s) | env steps/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    series = {}
    for pipe, jitter, n, target in cells:
        rs = [r for r in rows if (r["pipeline"], r["jitter"], r["explorers"], r["target"]) == (pipe, jitter, n, target)]
        s = median_of(r["staleness_second_half"] for r in rs)
        whole = median_of(r["staleness_mean"] for r in rs)
        tts = median_of(r["time_to_solve_s"] if r["solved"] else args.max_seconds for r in rs)
        by_seed = ", ".join("–" if r["staleness_second_half"] is None else f"{r['staleness_second_half']:.1f}"
                            + ("" if r.get("staleness_second_half_se") is None else f"±{r['staleness_second_half_se']:.1f}")
                            for r in rs)
        held = within_target(s, target, rs)
        # each seed's verdict, in seed order, with its reason where it gave one
        verdicts = " · ".join((r["verdict"]["state"] or "–") + _judged(r) + (f": {r['verdict']['reason']}"
                                                                              if r["verdict"]["reason"] else "") for r in rs)
        lines.append(f"| {pipe} | {jitter:g} | {n} | {target} | {'–' if s is None else f'{s:.1f}'} ({by_seed}) | "
                     f"{'–' if whole is None else f'{whole:.1f}'} | {held} | "
                     f"{verdicts} | {tts:.1f} | "
                     f"{median_of(r['env_steps_per_s'] for r in rs):,.0f} |")
        if s is not None:
            series.setdefault(f"{pipe}, jitter {jitter:g}, {n} explorers", []).append((target, s))
    lines += _halves(rows, args)
    # a grid resumed from its files may span checkouts: say which commits its runs were made at
    made_at = Counter(commit_label(r["commit"]) for r in rows if r.get("commit"))
    lines.append("\nRuns at " + ", ".join(f"{c} ({n})" for c, n in sorted(made_at.items())) + ".")
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        write_report(args.out, "scale.py", argv, args, rows, "Staleness held at its target (simulated env cost)",
                     f"seeds {args.seeds}, {', '.join(args.pipelines)}", text)
        plot(Path(args.out).with_suffix(".png"), series, "staleness target (versions)",
              "mean staleness, second half (versions)", "staleness held against its target (simulated)", logx=True,
              linear={"target": [(t, t) for t in args.targets]})
    return 0
