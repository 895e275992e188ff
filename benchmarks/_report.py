"""What the benchmark scripts share: the flags of a script of training runs (seeds, budget, out),
writing a run's JSON and its markdown table side by side, a raw file written whole or not at all,
the commit and the machine it was measured on, and the median of what was measured (runs that did
not measure a figure left out)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def runs_parser(doc: str, *, seeds=(0, 1, 2), max_seconds: float = 300, out: str | None = None):
    """The argument parser of a script of training runs, described by ``doc``'s first line, with
    ``--seeds``, ``--max-seconds`` (each run's budget) and ``--out`` given these defaults."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=list(seeds))
    parser.add_argument("--max-seconds", type=float, default=max_seconds, help="each run's budget (unsolved past it)")
    parser.add_argument("--out", default=out, help="write OUT.json (every run) and OUT.md (the tables)")
    return parser


def median_of(values):
    """The median of the values that are not None; None when there are none."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value, spec: str = ".2f", none: str = "–") -> str:
    """``value`` formatted by ``spec``; ``none`` for a figure not measured."""
    return none if value is None else format(value, spec)


def write_report(out: str, script: str, argv, args, rows: list[dict], title: str, about: str, text: str) -> None:
    """OUT.json: the arguments, the core count and every run; OUT.md: the command that made it,
    ``about`` (what the medians are over) and the table ``text``."""
    path = Path(out)
    write_atomically(path.with_suffix(".json"), json.dumps({"args": vars(args), "cores": os.cpu_count(), "runs": rows},
                                                           indent=2))
    cmd = f"python benchmarks/{script} " + " ".join(argv if argv is not None else sys.argv[1:])
    write_atomically(path.with_suffix(".md"), f"# {title}\n\nMade by `{cmd}` on {os.cpu_count()} cores; {about}.\n\n{text}\n")


def publish(text: str, out: str | None, script: str, argv, args, runs: list[dict], title: str, about: str) -> None:
    """Print the table ``text``; with ``out``, stamp every run with the commit it was measured at
    and write OUT.json and OUT.md (``write_report``)."""
    print("\n" + text)
    if out:
        for run in runs:
            run["commit"] = commit()
        write_report(out, script, argv, args, runs, title, about, text)


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def commit() -> dict:
    """HEAD and whether tracked files differ from it (the suite's own results left out: they change
    as it runs)."""
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results")
    return {"sha": _git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def commit_label(c: dict) -> str:
    """A run file's ``commit`` as a table names it: the short sha, "(dirty)" where it was."""
    return (c.get("sha") or "?")[:7] + (" (dirty)" if c.get("dirty") else "")


def machine_line() -> str:
    """The machine in a few words: cores, architecture, Python."""
    return f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}"


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, "?" where the system has none."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def measured(script: str, argv) -> dict:
    """Where and when a result was measured: the command (``argv``: the script's arguments, None for
    this process's), the machine, the UTC time, the load."""
    argv = sys.argv[1:] if argv is None else argv
    return {"command": f"python benchmarks/{script} " + " ".join(argv), "machine": machine_line(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_start": load_average()}


def write_outputs(out: str, doc: dict, markdown: str) -> None:
    """OUT.json (``doc``) and OUT.md (``markdown``), each whole or not at all, and a line saying so."""
    write_atomically(Path(f"{out}.json"), json.dumps(doc, indent=1))
    write_atomically(Path(f"{out}.md"), markdown + "\n")
    print(f"wrote {out}.json and {out}.md")


def write_atomically(path: Path, text: str | bytes) -> None:
    """``text`` (or bytes) into ``path``, whole or not at all: a temporary file, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    try:
        if isinstance(text, bytes):
            tmp.write_bytes(text)
        else:
            tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
