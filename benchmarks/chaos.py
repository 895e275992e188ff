"""Fault injection: a real, short training run with one fault injected at a moment drawn from a
seed, every invariant checked after it, and the table of what held (needs root for the external
setup and the full disk: namespaces, a tmpfs).

    python benchmarks/chaos.py --list
    python benchmarks/chaos.py --fault explorer-kill [--setup embedded] [--seed 0] [--runs 3]
    python benchmarks/chaos.py --fault all --runs 2          # every class, seeds 0 and 1
    python benchmarks/chaos.py --fault all --setup slurm     # every class that runs on Slurm
    python benchmarks/chaos.py report                        # the table, from the files the runs wrote

Each run trains ``cartpole_ppo`` (``--pipeline``) for ``--env-steps`` env steps at most
``--budget`` seconds, with a checkpoint every ``--every-versions`` versions, on the class's setup
(``embedded``: ``tianji-dask train`` with the LocalCluster it starts; ``external``: a scheduler, a
learner worker and explorer workers started by hand, each on a host of its own made of Linux
network namespaces by netns.py; ``slurm``: ``cluster.kind: slurm`` on a running Slurm, the
learner and each explorer a batch job, chaos_slurm.py). Once the learner has written a checkpoint at or past a version
drawn from the seed, the fault is injected (chaos_faults.py: which class does what). The driver
must then end within a bound; then the invariants are checked (chaos_checks.py), and ``tianji-dask
resume`` continues the run from its newest checkpoint on a fresh embedded cluster.

One file per run, ``OUT/<class>/seed<k>.json`` (``seed<k>-<setup>.json`` on the class's other
setup), written atomically; ``report`` reads them all. The same class and seed replay the same
fault at the same version. Bad input is one line and exit 2. Whatever ends the harness (an error,
Ctrl-C, SIGTERM), every process it started is ended, every namespace removed, every mount undone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import commit, commit_label, median_of, write_atomically
from chaos_checks import NAMES
from chaos_faults import CLASSES, plan

OUT = "benchmarks/results/chaos"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        print(f"chaos: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _span(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    if not sep or not lo.isdigit() or not hi.isdigit() or not 1 <= int(lo) <= int(hi):
        raise argparse.ArgumentTypeError(f"LO:HI with 1 <= LO <= HI expected, got {text!r}")
    return int(lo), int(hi)


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value <= 0:
            raise argparse.ArgumentTypeError(f"a number > 0 expected, got {text!r}")
        return value
    return parse


def _natural(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"a whole number >= 0 expected, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="chaos.py", description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="list the fault classes and exit")
    parser.add_argument("--fault", help="a class, several separated by commas, or all")
    parser.add_argument("--setup", choices=("embedded", "external", "slurm"), help="default: the class's first setup")
    parser.add_argument("--seed", type=_natural, default=0, help="the first seed (default 0)")
    parser.add_argument("--runs", type=_positive(int), default=1, help="seeds SEED, SEED+1, ... (default 1)")
    parser.add_argument("--pipeline", default="cartpole_ppo")
    parser.add_argument("--budget", type=_positive(float), default=120, help="stop.max_seconds of each run (default 120)")
    parser.add_argument("--env-steps", type=_positive(int), default=1_500_000, help="stop.max_env_steps (default 1500000)")
    parser.add_argument("--every-versions", type=_positive(int), default=10, help="checkpoint.every_versions (default 10)")
    parser.add_argument("--at-versions", type=_span, default=(10, 300),
                        help="the fault comes once a checkpoint at or past a version drawn from LO:HI is written")
    parser.add_argument("--explorers", type=_positive(int), default=2)
    parser.add_argument("--out", default=OUT, help=f"where the run files go (default {OUT})")
    parser.add_argument("--keep", action="store_true", help="keep each run's scratch folder (run folder, logs)")
    parser.add_argument("--replay", action="store_true",
                        help="also replay (tianji-dask replay) each run whose results say it can be, before resuming it")
    return parser


def _classes(text: str) -> list[str]:
    names = list(CLASSES) if text == "all" else [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in CLASSES]
    if unknown or not names:
        raise ValueError(f"--fault: unknown class {unknown[0] if unknown else text!r}; allowed: all, "
                         + ", ".join(CLASSES))
    return names


def run_file(out: Path, fault: str, setup: str, seed: int) -> Path:
    suffix = "" if setup == CLASSES[fault].setups[0] else f"-{setup}"
    return out / fault / f"seed{seed}{suffix}.json"


def _checked(args) -> list[tuple[str, str]]:
    """(class, setup) pairs to run; ValueError (one line) for what cannot be."""
    from chaos_slurm import slurm_answers

    pairs, no_slurm = [], []
    for name in _classes(args.fault):
        setup = args.setup or CLASSES[name].setups[0]
        if args.fault == "all" and not args.setup and setup == "slurm" and not slurm_answers():
            no_slurm.append(name)
            continue
        if setup not in CLASSES[name].setups:
            if args.setup and args.fault == "all":
                continue
            raise ValueError(f"--setup: {name} runs on {', '.join(CLASSES[name].setups)}, not {setup}")
        pairs.append((name, setup))
    if no_slurm:
        print(f"chaos: {', '.join(no_slurm)} left out: they run on Slurm, and no Slurm answers here (sinfo)",
              file=sys.stderr)
    needs_root = [n for n, setup in pairs if setup == "external" or n == "disk-full"]
    if needs_root and os.geteuid() != 0:
        raise ValueError(f"{needs_root[0]}: needs root (network namespaces, a tmpfs mount)")
    if any(CLASSES[n].action == "clock" for n, _ in pairs) and shutil.which("cc") is None:
        raise ValueError("the clock classes build a small LD_PRELOAD library: no C compiler (cc) found")
    for tool in ("ip", "mount") if needs_root else ():
        if shutil.which(tool) is None:
            raise ValueError(f"{needs_root[0]}: needs {tool}")
    if any(setup == "slurm" for _, setup in pairs):
        if not slurm_answers():
            raise ValueError("--setup slurm: no Slurm answers here (sinfo); .ci/slurm-up starts a one-node one")
    if args.at_versions[0] < args.every_versions:
        raise ValueError(f"--at-versions: from {args.every_versions} (the first checkpoint, --every-versions) up")
    return pairs


def tested_commit() -> dict:
    """The commit of the tianji_dask the runs import (an editable install may point at another
    tree than this one's) and whether its tracked files differ from it."""
    from chaos_procs import package_root

    where = package_root()
    if where is None:
        return {"sha": None, "dirty": None}

    def git(*args):
        proc = subprocess.run(["git", "-C", where, *args], capture_output=True, text=True, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else None

    # the run files a sweep writes into the checkout change nothing a run imports
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results")
    return {"sha": git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def portable(text: str) -> str:
    """A run file's text with this machine's folders named, not spelled out, so it can be committed
    and read elsewhere: each run's scratch folder is $SCRATCH, the checkout ".", the virtual
    environment $VENV, Python's own install $PYTHON, the home folder ~."""
    from chaos_procs import package_root

    text = re.sub(re.escape(tempfile.gettempdir()) + r"/tianji-chaos-[A-Za-z0-9_]+", "$SCRATCH", text)
    venv = sys.prefix if sys.prefix != sys.base_prefix else None
    for where, name in ((package_root(), "."), (venv, "$VENV"), (sys.base_prefix, "$PYTHON"), (str(Path.home()), "~")):
        if where and where != "/":
            text = re.sub(re.escape(where) + r"(?=[/\s\"'`]|$)", name, text)
    return text


def _on_signal(signum, frame):  # the runs' finally blocks undo what they made
    raise SystemExit(128 + signum)


def run(args, pairs: list[tuple[str, str]]) -> int:
    from chaos_run import Settings, run_one

    settings = Settings(pipeline=args.pipeline, budget_s=args.budget, env_steps=args.env_steps,
                        every_versions=args.every_versions, at_versions=args.at_versions, explorers=args.explorers,
                        keep=args.keep, replay=args.replay)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    out = Path(args.out)
    failed_any = False
    for seed in range(args.seed, args.seed + args.runs):
        for name, setup in pairs:
            made = {"harness": commit(), "tianji_dask": tested_commit()}  # the tree tested may change between runs
            rec = run_one(plan(name, setup, seed, args.at_versions), settings, log=lambda s: print(s, flush=True))
            after = tested_commit()
            rec["commit"] = made if after == made["tianji_dask"] else {**made, "tianji_dask_after": after}
            rec["command"] = "python benchmarks/chaos.py " + " ".join(
                [f"--fault {name}", f"--setup {setup}", f"--seed {seed}"]
                + [a for a in _passed_on(args)])
            text = json.dumps(rec, indent=2, default=str)
            write_atomically(run_file(out, name, setup, seed), text if args.keep else portable(text))
            said = "held every invariant" if rec["held"] else (
                "not injected" if rec["held"] is None else "FAILED " + ", ".join(rec["failed"]))
            print(f"chaos: {name} seed {seed} ({setup}): {said}; {run_file(out, name, setup, seed)}", flush=True)
            failed_any |= rec["held"] is False
    return 1 if failed_any else 0


def _passed_on(args) -> list[str]:
    """The flags that change a run, as given (for the replay command of each run file)."""
    defaults = build_parser().parse_args([])
    flags = []
    for flag in ("pipeline", "budget", "env_steps", "every_versions", "at_versions", "explorers", "replay"):
        value = getattr(args, flag)
        if value != getattr(defaults, flag):
            shown = f"{value[0]}:{value[1]}" if flag == "at_versions" else f"{value:g}" if isinstance(value, float) else value
            flags.append(f"--{flag.replace('_', '-')}" + ("" if value is True else f" {shown}"))
    return flags


# ---- the table ------------------------------------------------------------------------------------
def report(out: Path) -> str:
    recs = []
    for path in sorted(out.glob("*/seed*.json")):
        try:
            recs.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    if not recs:
        return f"no chaos run files under {out}"
    groups: dict[tuple[str, str], list[dict]] = {}
    for rec in recs:
        groups.setdefault((rec["fault"], rec["setup"]), []).append(rec)
    order = {name: i for i, name in enumerate(CLASSES)}
    header = ("| class | setup | runs injected | held every invariant | median s, fault to next update (or exit) "
              "| median longest stall, s | chunks lost per fault | invariants failed (runs) |")
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for (fault, setup), group in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0][1])):
        injected = [r for r in group if r.get("held") is not None]
        held = sum(1 for r in injected if r["held"])
        recovery = median_of([r.get("recovery_s") for r in injected])
        stall = median_of([r.get("stall_s") for r in injected])
        lost = [r.get("chunks_lost") for r in injected]
        lost_text = ", ".join("-" if x is None else str(x) for x in lost) or "-"
        failed = Counter(name for r in injected for name in r.get("failed", []))
        failed_text = ", ".join(f"{n} ({failed[n]})" for n in NAMES if failed[n]) or "none"
        lines.append(f"| {fault} | {setup} | {len(injected)}{f' (+{len(group) - len(injected)} not)' if len(group) > len(injected) else ''} "
                     f"| {held} | {'-' if recovery is None else f'{recovery:.1f}'} | {'-' if stall is None else f'{stall:.1f}'} "
                     f"| {lost_text} | {failed_text} |")
    commits = sorted({commit_label((r.get("commit") or {}).get("tianji_dask") or {}) for r in recs})
    lines.append("")
    lines.append(f"{len(recs)} runs of tianji_dask at {', '.join(commits)}; `python benchmarks/chaos.py report` "
                 f"made this from {out}/<class>/seed<k>.json.")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:
        parser = _Parser(prog="chaos.py report")
        parser.add_argument("--out", default=OUT)
        print(report(Path(parser.parse_args(argv[1:]).out)))
        return 0
    args = build_parser().parse_args(argv)
    if args.list:
        width, setups = max(map(len, CLASSES)), max(len("/".join(c.setups)) for c in CLASSES.values())
        for cls in CLASSES.values():
            print(f"{cls.name:<{width}}  {'/'.join(cls.setups):<{setups}}  {cls.about}")
        return 0
    if not args.fault:
        print("chaos: error: --fault: give a class (see --list), several separated by commas, or all", file=sys.stderr)
        return 2
    try:
        pairs = _checked(args)
    except ValueError as err:
        print(f"chaos: error: {err}", file=sys.stderr)
        return 2
    try:
        return run(args, pairs)
    except KeyboardInterrupt:
        code = 130
    except SystemExit as stop:  # SIGTERM or SIGHUP (_on_signal): the runs have undone what they made
        if stop.code not in (128 + signal.SIGTERM, 128 + signal.SIGHUP):
            raise
        code = stop.code
    print("chaos: interrupted; the processes, namespaces and mounts of the run are gone", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
