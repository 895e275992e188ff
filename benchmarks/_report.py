"""What the benchmark scripts share: writing a run's JSON and its markdown table side by side,
and the median of what was measured (runs that did not measure a figure left out)."""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path


def median_of(values):
    """The median of the values that are not None; None when there are none."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def write_report(out: str, script: str, argv, args, rows: list[dict], title: str, about: str, text: str) -> None:
    """OUT.json: the arguments, the core count and every run; OUT.md: the command that made it,
    ``about`` (what the medians are over) and the table ``text``."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps({"args": vars(args), "cores": os.cpu_count(), "runs": rows}, indent=2))
    cmd = f"python benchmarks/{script} " + " ".join(argv if argv is not None else sys.argv[1:])
    path.with_suffix(".md").write_text(f"# {title}\n\nMade by `{cmd}` on {os.cpu_count()} cores; {about}.\n\n{text}\n")
