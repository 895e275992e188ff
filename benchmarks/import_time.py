"""What importing tianji_dask costs, against importing torch and gymnasium, in fresh processes.

    python benchmarks/import_time.py [--rounds 7] [--python PYTHON] [--out benchmarks/results/import_time]

Each round runs every statement once in a new interpreter started in this checkout (so it is
this checkout's package that is timed), in turn, so neighbours share the
machine's noise; it reports each statement's median wall time over the rounds, its range, and the
median of the per-round ratios to ``import torch, gymnasium``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import publish  # noqa: E402 - a sibling script

ROOT = Path(__file__).resolve().parent.parent  # the checkout whose package is timed (python -c looks in its cwd first)
BASELINE = "import torch, gymnasium"
STATEMENTS = {
    "import torch, gymnasium": BASELINE,
    "import tianji_dask": "import tianji_dask",
    "from tianji_dask import Run": "from tianji_dask import Run",
    "import distributed": "import distributed",
}


def wall(python: str, statement: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([python, "-c", statement], check=True, cwd=ROOT)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose imports are timed")
    parser.add_argument("--out", help="write OUT.json (every round) and OUT.md (the table)")
    args = parser.parse_args(argv)
    for statement in STATEMENTS.values():  # warm the disk cache once, untimed
        wall(args.python, statement)
    rounds = []
    for r in range(args.rounds):
        times = {name: wall(args.python, statement) for name, statement in STATEMENTS.items()}
        rounds.append(times)
        print(f"round {r}: " + ", ".join(f"{name} {t:.2f} s" for name, t in times.items()), flush=True)
    lines = ["| statement | median wall (s) | range (s) | ÷ `import torch, gymnasium`, median of rounds |", "|---|---|---|---|"]
    for name in STATEMENTS:
        values = [t[name] for t in rounds]
        ratio = statistics.median(t[name] / t[BASELINE] for t in rounds)
        lines.append(f"| `{name}` | {statistics.median(values):.2f} | {min(values):.2f}–{max(values):.2f} | {ratio:.2f} |")
    publish("\n".join(lines), args.out, "import_time.py", argv, args, rounds, "Import time",
            f"medians over {args.rounds} alternated rounds, each statement in a fresh interpreter")
    return 0


if __name__ == "__main__":
    sys.exit(main())
