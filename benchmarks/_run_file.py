"""A suite cell's raw file: where it lives, what it records besides the run (the machine, the
package versions), and how it is written and read back.

A cell's file is ``<results>/<task>/<system>/seed<k>.json``, written whole or not at all (a
temporary file, then a rename). Its JSON puts the episodes one per line and the per-second
throughput on one line (readable diffs), everything else indented. A run whose file would be
``GZIP_FROM`` bytes or more (the long runs' episodes: Hopper, MinAtar, tic-tac-toe) is written
gzip-compressed instead, as ``seed<k>.json.gz``, byte for byte the same every time; every reader
here takes either.
"""

from __future__ import annotations

import gzip
import importlib.metadata as md
import json
import os
import platform
from pathlib import Path

from _report import write_atomically

#: a raw file this large or larger is stored gzip-compressed
GZIP_FROM = 64 * 1024
GZ = ".gz"


def cell_path(results: Path, task: str, system: str, seed: int) -> Path:
    """The cell's raw file, as named when plain (``stored`` finds it compressed too)."""
    return Path(results) / task / system / f"seed{seed}.json"


def stored(path: Path) -> Path | None:
    """The file holding the run of ``path`` (a ``.json`` path): it, or it compressed; None for none."""
    path = Path(path)
    zipped = path.with_name(path.name + GZ)
    return path if path.exists() else zipped if zipped.exists() else None


def dumps(doc: dict) -> str:
    """The raw file's JSON: the episodes one per line (readable diffs), the per-second throughput
    on one line, everything else indented."""
    head = json.dumps({k: v for k, v in doc.items() if k not in ("episodes", "throughput_per_s")},
                      indent=1, sort_keys=True)
    rows = ",\n  ".join(json.dumps(row, separators=(",", ":")) for row in doc["episodes"])
    episodes = f"[\n  {rows}\n ]" if rows else "[]"
    throughput = json.dumps(doc.get("throughput_per_s"), separators=(",", ":"))
    return f'{head[:-2]},\n "episodes": {episodes},\n "throughput_per_s": {throughput}\n}}\n'


def write_run(path: Path, doc: dict) -> Path:
    """Write ``doc`` as the raw file of ``path`` (a ``.json`` path), compressed when large, and
    remove the other form of it if a rerun left one; returns the file written."""
    path = Path(path)
    text = dumps(doc).encode()
    zipped = path.with_name(path.name + GZ)
    if len(text) >= GZIP_FROM:
        target, other, data = zipped, path, gzip.compress(text, compresslevel=9, mtime=0)
    else:
        target, other, data = path, zipped, text
    write_atomically(target, data)
    other.unlink(missing_ok=True)
    return target


def read_run(path: Path) -> dict:
    """One raw file, plain or compressed."""
    path = Path(path)
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if path.name.endswith(GZ) else data)


def load_runs(results: Path) -> list[dict]:
    """Every raw file under ``results``, read in sorted path order (a compressed file in its plain
    name's place)."""
    files = {}
    for p in [*Path(results).glob("*/*/seed*.json"), *Path(results).glob(f"*/*/seed*.json{GZ}")]:
        files.setdefault(p.with_name(p.name.removesuffix(GZ)), p)
    return [read_run(files[name]) for name in sorted(files)]


def machine() -> dict:
    """The CPU model, cores, memory and platform a run was measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import psutil

    return {"cpu_model": cpu, "cores": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "platform": platform.platform()}


def versions(dists=("torch", "dask", "distributed", "gymnasium", "numpy")) -> dict:
    """Python's version and each of ``dists``' (None for one not installed)."""
    v = {"python": platform.python_version()}
    for dist in dists:
        try:
            v[dist] = md.version(dist)
        except md.PackageNotFoundError:
            v[dist] = None
    return v
