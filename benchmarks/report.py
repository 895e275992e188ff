"""The rliable-protocol section of docs/benchmarks.md, regenerated from benchmarks/suite.py's raw runs.

    python benchmarks/report.py [--results benchmarks/results/suite] [--doc docs/benchmarks.md]
                                [--images docs/images] [--reps 2000] [--check]
    python benchmarks/report.py --runs TASK     # each raw run of TASK at its end, printed

Reads every raw file (``<task>/<system>/seed<k>.json``, or ``.json.gz``) under ``--results`` and rewrites the text
of ``--doc`` between the markers ``<!-- suite-report:begin -->`` and ``<!-- suite-report:end -->``,
plus one figure per task, ``suite-<task>.png`` in ``--images`` (``_curves.py`` draws them).
Nothing outside the markers changes. The section is generated whole, no number in it typed by
hand, and deterministically (inputs sorted, the bootstrap seeded, no date of generation), so
running it again on the same files changes nothing. ``--check`` writes nothing and exits 1 when
the section in the file is not the one the raw files give, 0 when it is current.

The statistics follow Agarwal et al. (2021), "Deep RL at the edge of the statistical precipice",
with their library, rliable: per task and per (system, settings label, env id), the interquartile
mean (IQM) of the runs' time-to-solve with a stratified-bootstrap 95% confidence interval, and the
probability of improvement of tianji_dask over each other system (over tianji_dask on the row's env
id where a row ran another one than the task's, as Sample Factory and PufferLib do). An unsolved run
has no time-to-solve: it counts at its budget, a censored value, and a figure that depends on one is
marked as a lower bound. Beside the time from build, each row gives the median time from launch
(the harness starting the run's process).
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import ROOT, commit_label  # noqa: E402
from _run_file import load_runs  # noqa: E402
from _systems import OURS_ON_OLDER_ENVS, OWN_VENV_PEERS, REFERENCE, TASKS, system_rank, task_rank  # noqa: E402
from peers.tasks import WINDOW  # noqa: E402

BEGIN, END = "<!-- suite-report:begin -->", "<!-- suite-report:end -->"
#: tianji_dask systems that are the reference for the rows on their env id
REFERENCES = (REFERENCE, *OURS_ON_OLDER_ENVS)
#: said of a system's rows under its task's table, after the settings its runs record
BUILD_NOTES = {
    "pufferlib": "PufferLib 3.0.0 is a patched build: its published sdist does not install (it downloads raylib "
                 "while building, and fails with NameError: c_extension_paths when told not to), so "
                 "`benchmarks/peers/setup pufferlib` adds `c_extension_paths = []` and builds it with NO_OCEAN=1 (no "
                 "Ocean C envs) and its advantage kernel for the CPU",
}
SEED = 0  # the bootstrap's; fixed so the section is the same every time
REPS = 2000


def censored_time(doc: dict) -> tuple[float, bool]:
    """(time-to-solve, False) for a solved run; (its budget, True) for an unsolved one."""
    run = doc["run"]
    if run.get("solved") and run.get("time_to_solve_s") is not None:
        return float(run["time_to_solve_s"]), False
    return float(doc["max_seconds"]), True


def censored_launch_time(doc: dict) -> tuple[float, bool]:
    """(time-to-solve from launch, False) for a solved run; (its budget plus its build time from
    launch, True) for an unsolved one, or one whose file has no time from launch."""
    run = doc["run"]
    if run.get("solved") and run.get("time_to_solve_from_launch_s") is not None:
        return float(run["time_to_solve_from_launch_s"]), False
    return float(doc["max_seconds"]) + float(run.get("build_s_from_launch") or 0.0), True


def env_of(doc: dict) -> str:
    """The env id a run trained on: its file's ``env_id``, else (older files) its task's."""
    return doc.get("env_id") or TASKS.get(doc["task"], (doc["task"],))[0]


def _bootstrap(scores, func, reps: int) -> tuple[float, float, float]:
    """(point, low, high): rliable's stratified-bootstrap 95% interval of ``func`` (percentile
    method). rliable draws its resamples from numpy's global generator, so that is seeded before
    every call: each interval is the same whatever was computed before it."""
    from rliable import library

    np.random.seed(SEED)
    point, interval = library.get_interval_estimates({"x": scores}, func, reps=reps)
    return float(np.ravel(point["x"])[0]), float(interval["x"][0][0]), float(interval["x"][1][0])


def _lower_bound(pairs: list[tuple[float, bool]], keep: slice) -> bool:
    """Whether a censored value is among the sorted (value, censored) pairs that ``keep`` selects."""
    return any(c for _, c in sorted(pairs)[keep])


def _row_rank(system: str, settings: str, env: str, task_env: str) -> tuple:
    """The task's env first, then any other; within each, its tianji_dask reference, then the systems
    in ``system_rank`` order."""
    return env != task_env, env, system not in REFERENCES, system_rank(system), settings


def summarise(docs: list[dict], reps: int = REPS) -> list[dict]:
    """One row per (system, settings label, env id) of one task's runs: counts, IQM and its interval,
    median, median from launch, probability of improvement of tianji_dask over the row's system,
    throughput per core and the commits measured at."""
    from rliable import metrics

    groups: dict[tuple, list[dict]] = {}
    for d in docs:
        groups.setdefault((d["system"], d["settings"], env_of(d)), []).append(d)
    task_env = TASKS.get(docs[0]["task"], (env_of(docs[0]),))[0] if docs else None
    rows = []
    for (system, settings, env), ds in sorted(groups.items(), key=lambda kv: _row_rank(*kv[0], task_env)):
        pairs = sorted(censored_time(d) for d in ds)
        launch = sorted(censored_launch_time(d) for d in ds)
        times = np.array([t for t, _ in pairs])
        n, cut = len(pairs), int(0.25 * len(pairs))  # scipy's trim_mean(x, 0.25) drops int(n / 4) each side
        iqm, low, high = _bootstrap(times[:, None], lambda s: np.array([metrics.aggregate_iqm(s)]), reps)
        mid = slice((n - 1) // 2, n // 2 + 1)
        per_core = [d["run"]["env_steps_per_s"] / d["machine"]["cores"] for d in ds
                    if d["run"].get("env_steps_per_s") and d.get("machine", {}).get("cores")]
        commits = sorted({commit_label(d["commit"]) for d in ds})
        rows.append({
            "system": system, "settings": settings, "env": env, "task_env": task_env, "runs": n,
            "solved": sum(not c for _, c in pairs), "times": times,
            "iqm": iqm, "iqm_low": low, "iqm_high": high, "iqm_lower_bound": _lower_bound(pairs, slice(cut, n - cut)),
            "median": float(np.median(times)), "median_lower_bound": _lower_bound(pairs, mid),
            "median_launch": float(np.median([t for t, _ in launch])), "median_launch_lower_bound": _lower_bound(launch, mid),
            "per_core": float(np.median(per_core)) if per_core else None, "commits": commits,
            "errors": [(d["seed"], d["run"]["error"]) for d in sorted(ds, key=lambda d: d["seed"])
                       if d["run"].get("error")],
        })
    def reference(rows_of_env: list[dict]) -> dict | None:
        ours = [r for r in rows_of_env if r["system"] in REFERENCES]
        return next((r for r in ours if r["settings"] == "tuned"), next(iter(ours), None))

    main = reference([r for r in rows if r["system"] == REFERENCE and r["env"] == task_env])
    for row in rows:
        # a row's reference: tianji_dask on the row's env id, where there is such a row, else on the task's
        row["ref"] = reference([r for r in rows if r["env"] == row["env"]]) or main
        row["poi"] = None
        if row["ref"] is not None and row is not row["ref"]:
            ref = row["ref"]
            # scores: the negative time-to-solve, so that higher is better as rliable expects
            row["poi"] = _bootstrap([-ref["times"][:, None], -row["times"][:, None]],
                                    lambda x, y: np.array([metrics.probability_of_improvement(x, y)]), reps)
    return rows


def _row_name(row: dict) -> str:
    """A table's system cell: the system, and the env id where it is not the task's."""
    return row["system"] if row["env"] == row["task_env"] else f"{row['system']} ({row['env']})"


# ---------------------------------------------------------------------------------------------
# the markdown

def _secs(value: float, lower: bool) -> str:
    return f"{'≥ ' if lower else ''}{value:.1f} s"


def _per_core(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:,.0f}" if value >= 10 else f"{value:.2f}"


def _last_line(error: str) -> str:
    """An error's last line, cut short, with no backquote to end its code span early."""
    return error.strip().splitlines()[-1][:200].replace("`", "'")


def _method(reps: int) -> str:
    """The paragraphs that say how the tables and figures are made, wrapped as the page is."""
    paragraphs = [
        "Each row: one system on one task with one settings label (\"tuned\": the system's own settings, "
        "as its authors publish them, else its defaults, and for tianji_dask its bundled pipeline; "
        "\"same\": our pipeline's network, batch and update ratio; \"zoo\": RL-Zoo's settings for the "
        "task on the system's own trainer, where the system publishes none; \"adapted\": the system's "
        "published settings for another task of the kind, adapted, as the notes under the table say), "
        "its runs made by `benchmarks/suite.py`, one fresh process a run, systems alternated seed by "
        "seed. A system named with an env id in brackets ran that one, not the task's: Sample Factory "
        "and PufferLib pin gymnasium<1.0, which has LunarLander-v2 and Hopper-v4, not v3 and v5 "
        "(tianji-v4: tianji_dask's pipeline on Hopper-v4, beside them). Time-to-solve: "
        "seconds from the moment the system is built to the end of the training episode at which the "
        "mean of the last 100 training returns reaches the target, every episode pooled and sorted by "
        "end time, the same rule for every system. Median from launch: the same end, in seconds from the "
        "moment the harness started the run's process (interpreter start, imports and the system's "
        "build included; unsolved: the budget plus the build, a lower bound).",
        f"**Unsolved runs count at their budget (censored).** IQM: the interquartile mean of the runs' "
        f"times (rliable `aggregate_iqm`, the mean of the middle half; with fewer than 4 runs, the mean of "
        f"all), with a 95% stratified-bootstrap interval (rliable `get_interval_estimates`, percentile "
        f"method, {reps:,} resamples, seed {SEED}). A figure marked ≥ includes a censored run and is a "
        f"lower bound; an unsolved run in the top quarter, which the IQM leaves out, leaves it exact. "
        f"P(tianji faster): rliable's `probability_of_improvement` of tianji_dask over the row's system "
        f"on the negative time-to-solve (censored as above): the chance that a tianji_dask run picked at "
        f"random solves sooner than one of the row's, ties counting half, with its bootstrap interval "
        f"(each system's runs resampled apart); against tianji_dask on the row's env id where it ran that "
        f"one too (\"vs tianji-v4\"). Env steps/s per core: a run's env steps ÷ its seconds "
        f"from build to the end ÷ the machine's cores, the median over the row's runs. Measured at: the "
        f"commit(s) of the runs, \"dirty\" where the tree had uncommitted changes.",
        "Curves: the mean of the last 100 training returns (of all so far, before 100), the median "
        "across seeds with the band between the 25th and 75th percentiles; a run that stopped, solved or "
        "out of time, holds its last value. Against env steps: the env steps of the episodes ended so "
        "far, where a system's episode rows carry them.",
    ]
    return "\n\n".join(textwrap.fill(p, width=100, break_long_words=False, break_on_hyphens=False)
                       for p in paragraphs)


def render(docs: list[dict], reps: int, links: dict[str, str]) -> str:
    """The section between the markers: a method note, then per task a table, the runs that
    reported an error, and the figure ``links[task]``."""
    if not docs:
        return "No suite runs recorded yet: `python benchmarks/suite.py run cartpole` makes some."
    tasks = sorted({d["task"] for d in docs}, key=task_rank)
    out = [_method(reps)]
    for task in tasks:
        ds = sorted((d for d in docs if d["task"] == task), key=lambda d: (system_rank(d["system"]), d["seed"]))
        env_id, _, target = TASKS.get(task, (task, None, None))
        rows = summarise(ds, reps)
        budgets = ", ".join(f"{b:g}" for b in sorted({float(d["max_seconds"]) for d in ds}))
        goal = "" if target is None else f", target {target:g}"
        out += ["", f"### {task}", "", f"{env_id}{goal}; budget {budgets} s a run; {len(ds)} runs.",
                "", "| system | settings | seeds | solved | time-to-solve IQM [95% CI] | median "
                "| median from launch | P(tianji faster) [95% CI] | env steps/s per core | measured at |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if r["poi"] is None:
                poi = "reference" if r["ref"] is r else "–"
            else:
                vs = "" if r["ref"]["system"] == REFERENCE and r["ref"]["env"] == r["task_env"] else \
                    f" vs {_row_name(r['ref'])}"
                poi = f"{r['poi'][0]:.2f} [{r['poi'][1]:.2f}, {r['poi'][2]:.2f}]{vs}"
            out.append(f"| {_row_name(r)} | {r['settings']} | {r['runs']} | {r['solved']}/{r['runs']} | "
                       f"{_secs(r['iqm'], r['iqm_lower_bound'])} [{r['iqm_low']:.1f}, {r['iqm_high']:.1f}] | "
                       f"{_secs(r['median'], r['median_lower_bound'])} | "
                       f"{_secs(r['median_launch'], r['median_launch_lower_bound'])} | {poi} | "
                       f"{_per_core(r['per_core'])} | {', '.join(r['commits'])} |")
        notes = _settings_notes(ds, task, rows)
        if notes:
            out += ["", "The settings of these rows (those of the peers in their own venvs, and tianji-v4):", "", *notes]
        errors = [f"- {_row_name(r)} ({r['settings']}) seed {seed}: `{_last_line(err)}`"
                  for r in rows for seed, err in r["errors"]]
        if errors:
            out += ["", "Runs that reported an error (counted as measured, unsolved if they did not solve):", ""]
            out += errors
        if task in links:
            out += ["", f"![{task}: mean of the last 100 returns, median and IQR across seeds]({links[task]})"]
            steps = sorted({d["system"] for d in ds if "env_steps" in d.get("episode_fields", [])}, key=system_rank)
            missing = sorted({d["system"] for d in ds} - set(steps), key=system_rank)
            if not steps:
                out += ["", "No run of this task records env steps per episode: wall time only."]
            elif missing:
                out += ["", f"Env steps panel: {', '.join(steps)} only ({', '.join(missing)} record(s) no env "
                        "steps per episode)."]
    return "\n".join(out)


def _settings_notes(docs: list[dict], task: str, rows: list[dict]) -> list[str]:
    """One line per row of a peer with its own venv (or of tianji_dask on another env id): the
    settings its runs record (``config["source"]``); then what ``BUILD_NOTES`` says of their systems."""
    lines = []
    for r in rows:
        if r["system"] not in (*OWN_VENV_PEERS, *OURS_ON_OLDER_ENVS):
            continue
        ds = sorted((d for d in docs if (d["system"], d["settings"], env_of(d)) == (r["system"], r["settings"], r["env"])),
                    key=lambda d: d["seed"])
        sources = sorted({str((d["run"].get("config") or {}).get("source")) for d in ds
                          if (d["run"].get("config") or {}).get("source")})
        if r["system"] in OURS_ON_OLDER_ENVS:
            sources = sources or [f"tianji_dask's bundled {task} pipeline with env.id {r['env']}"]
        text = "; ".join(sources) or "no settings recorded"
        lines.append(f"- {_row_name(r)} ({r['settings']}): {text}.")
    systems = sorted({r["system"] for r in rows} & set(BUILD_NOTES), key=system_rank)
    return lines + [f"- {BUILD_NOTES[s]}." for s in systems] if lines else []


def splice(text: str, section: str) -> str:
    """``text`` with everything between the markers replaced by ``section``."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"the page needs one {BEGIN} line and, after it, one {END} line")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{section}\n{END}{tail}"


def run_table(docs: list[dict], task: str, window: int = WINDOW) -> str:
    """A markdown table, one line per raw run of ``task``: its end as the raw file records it (env
    steps, the last and the best mean of ``window`` returns, and, where the rows carry env steps, the
    last ``window`` episodes' mean length and return per env step: env steps between their ends,
    exact with one env, on average where several envs' episodes interleave)."""
    lines = [f"| system | seed | solved | env steps | final {window}-episode mean | best | "
             f"last {window} episodes: mean length | return per step |", "|---|---|---|---|---|---|---|---|"]
    for d in sorted((d for d in docs if d["task"] == task), key=lambda d: (system_rank(d["system"]), d["seed"])):
        rows = np.array(sorted(d["episodes"]), dtype=float)
        means = (np.convolve(rows[:, 1], np.ones(window) / window, "valid") if len(rows) >= window
                 else np.array([rows[:, 1].mean()]))
        t, lower = censored_time(d)
        length = per_step = "–"
        if "env_steps" in d["episode_fields"] and len(rows) > window:
            steps = rows[-window - 1:, d["episode_fields"].index("env_steps")]
            length, per_step = f"{np.diff(steps).mean():,.0f}", f"{rows[-window:, 1].sum() / (steps[-1] - steps[0]):.2f}"
        env_steps = f"{int(d['run']['env_steps']):,}" if d["run"].get("env_steps") is not None else "–"
        task_env = TASKS.get(task, (env_of(d),))[0]
        name = d["system"] if env_of(d) == task_env else f"{d['system']} ({env_of(d)})"
        lines.append(f"| {name} | {d['seed']} | {'no' if lower else f'{t:.1f} s'} | {env_steps} | "
                     f"{means[-1]:,.0f} | {means.max():,.0f} | {length} | {per_step} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "suite",
                        help="the raw runs (suite.py's)")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks.md", help="the page to update")
    parser.add_argument("--images", type=Path, default=ROOT / "docs" / "images", help="where the figures go")
    parser.add_argument("--reps", type=int, default=REPS, help="bootstrap resamples per interval")
    parser.add_argument("--runs", metavar="TASK", help="print each raw run of TASK at its end; write nothing")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the page's section is not the one the raw files give")
    args = parser.parse_args(argv)
    if args.runs:
        docs = [d for d in load_runs(args.results) if d["task"] == args.runs]
        if not docs:
            print(f"report.py: --runs: no raw runs of {args.runs!r} under {args.results}", file=sys.stderr)
            return 2
        print(run_table(docs, args.runs))
        return 0
    if not args.doc.is_file():
        print(f"report.py: no page {args.doc}", file=sys.stderr)
        return 2
    docs = load_runs(args.results)
    tasks = sorted({d["task"] for d in docs}, key=task_rank)
    links = {t: Path(os.path.relpath(args.images / f"suite-{t}.png", args.doc.parent)).as_posix() for t in tasks}
    text = args.doc.read_text()
    try:
        new = splice(text, render(docs, args.reps, links))
    except ValueError as err:
        print(f"report.py: {args.doc}: {err}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(f"report.py: {args.doc}'s suite report is out of date: run python benchmarks/report.py",
                  file=sys.stderr)
            return 1
        print(f"{args.doc}: the suite report is current")
        return 0
    import _curves

    for task in tasks:
        _curves.write_figure([d for d in docs if d["task"] == task], task, args.images / f"suite-{task}.png")
    if new != text:
        args.doc.write_text(new)
    print(f"{args.doc}: suite report of {len(docs)} run(s), {len(tasks)} task(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
