"""What the benchmark scripts share: writing a run's JSON and its markdown table side by side,
a raw file written whole or not at all, the commit it was measured at, and the median of what was
measured (runs that did not measure a figure left out)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps({"args": vars(args), "cores": os.cpu_count(), "runs": rows}, indent=2))
    cmd = f"python benchmarks/{script} " + " ".join(argv if argv is not None else sys.argv[1:])
    path.with_suffix(".md").write_text(f"# {title}\n\nMade by `{cmd}` on {os.cpu_count()} cores; {about}.\n\n{text}\n")


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


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
