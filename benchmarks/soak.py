"""Soak: one long run, the resident memory (RSS) of every role over time, and its slope.

    python benchmarks/soak.py [--pipeline cartpole_dqn] [--minutes 10] [--warmup-minutes 2]
                              [--every 5] [--out benchmarks/results/soak]

The run never solves (no target), so it trains for the whole time. Every few seconds the RSS of
the scheduler's process (here also the client's), the learner's worker process and each explorer
worker process is sampled. After warm-up a least-squares line is fitted per role; the slope
(MiB per minute) says whether memory is flat. Writes ``<out>.json``, ``<out>.md`` and ``<out>.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

#: the controller's bounded histories in a soak (unless --dask-defaults): full within 2 minutes
SHORT_HISTORY = 240


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="cartpole_dqn")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--warmup-minutes", type=float, default=2)
    parser.add_argument("--every", type=float, default=5, help="seconds between samples")
    parser.add_argument("--out", default="benchmarks/results/soak")
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="N",
                        help="trace Python allocations in every process from the end of warm-up, and report the N "
                             "call sites whose live memory grew most between a baseline taken a third of the way "
                             "through the rest of the run and its end (slows the run)")
    parser.add_argument("--heap-every", type=float, default=30, metavar="S",
                        help="seconds between samples of where each process's memory is (pymalloc, malloc, other)")
    parser.add_argument("--dask-defaults", action="store_true",
                        help="keep Dask's own history lengths (system monitor: 1 hour; worker profiles and logs: "
                             "1000 entries) and the controller's (learner figures: 25 minutes), which fill for up to "
                             "an hour and read as growth in a shorter soak")
    args = parser.parse_args(argv)
    if args.minutes <= args.warmup_minutes:
        parser.error("--minutes must be larger than --warmup-minutes")

    import dask
    import numpy as np
    import psutil
    from distributed import Client

    from tianji_dask.launch.cluster import local_cluster
    from tianji_dask.run import Run

    if not args.dask_defaults:
        # Dask's bounded histories (up to an hour to fill) shortened to be full before warm-up; nannies pass it on
        dask.config.set({"distributed.admin.system-monitor.log-length": 240,
                         "distributed.admin.low-level-log-length": 120})
        # ... and so are the controller's, which runs in this process beside the scheduler
        from tianji_dask.dataflow.controller import books

        books.SERIES_LEN = books.HISTORY_LEN = books.WINDOW_LOG_LEN = SHORT_HISTORY
    cluster = local_cluster(2, dashboard_address=None)
    client = Client(cluster)
    workers = client.scheduler_info(n_workers=-1)["workers"]
    roles = {}
    pids = client.run(os.getpid)
    for addr, pid in pids.items():
        res = workers[addr]["resources"]
        roles["learner" if res.get("LEARNER") else f"explorer {workers[addr]['name']}"] = pid
    roles["scheduler (+ client)"] = os.getpid()
    procs = {role: psutil.Process(pid) for role, pid in roles.items()}
    samples = {role: [] for role in procs}
    heap = {role: [] for role in procs}  # (t, _heap() of that process)
    role_of = {addr: next(r for r, pid in roles.items() if pid == pids[addr]) for addr in pids}
    last_heap = -float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        run = Run(args.pipeline, client, out=Path(tmp) / "soak", overrides={
            "stop.target_return": None, "stop.max_seconds": args.minutes * 60, "stop.max_env_steps": None,
            "checkpoint.every_seconds": 60})
        run.start()
        t0 = time.time()
        tracing = marked = False
        # baseline later than tracing's start: a full buffer's untraced entries replaced by traced ones read as growth
        mark_at = args.warmup_minutes * 60 + (args.minutes - args.warmup_minutes) * 60 / 3
        while True:
            if args.tracemalloc and not tracing and time.time() - t0 >= args.warmup_minutes * 60:
                client.run(_trace_start)
                _trace_start()
                tracing = True
            if tracing and not marked and time.time() - t0 >= mark_at:
                client.run(_trace_mark)
                _trace_mark()
                marked = True
            status = run.status()
            now = time.time() - t0
            for role, proc in procs.items():
                samples[role].append((now, proc.memory_info().rss / 2**20))
            print(f"{now:6.0f} s  " + "  ".join(f"{r}: {v[-1][1]:.0f} MiB" for r, v in samples.items()), flush=True)
            if now - last_heap >= args.heap_every:
                for addr, h in client.run(_heap).items():
                    heap[role_of[addr]].append((now, h))
                heap["scheduler (+ client)"].append((now, _heap()))
                last_heap = now
            if status.get("done") or (marked and time.time() - t0 >= args.minutes * 60 - 2 * args.every):
                break
            time.sleep(args.every)
        growth = {}
        if marked:  # before wait(): the learner's worker still holds the run's state
            by_addr = client.run(_trace_growth, args.tracemalloc)
            for addr, lines in by_addr.items():
                growth[role_of[addr]] = lines
            growth["scheduler (+ client)"] = _trace_growth(args.tracemalloc)
        results = run.wait()
    client.close()
    cluster.close()

    rows = []
    for role, pts in samples.items():
        a = np.array(pts)
        after = a[a[:, 0] >= args.warmup_minutes * 60]
        slope = float(np.polyfit(after[:, 0] / 60, after[:, 1], 1)[0]) if len(after) >= 3 else float("nan")
        rows.append({"role": role, "rss_start_mib": float(after[0, 1]) if len(after) else None,
                     "rss_end_mib": float(a[-1, 1]), "slope_mib_per_min": slope, "rss_max_mib": float(a[:, 1].max())})
    heap_rows = _heap_slopes(heap, args.warmup_minutes * 60)
    md = [f"Run: {args.pipeline}, {args.minutes:g} min, {results['updates']:,} updates, {results['env_steps']:,} env steps, "
          f"{results['chunks']:,} chunks; slope fitted after {args.warmup_minutes:g} min of warm-up. "
          + ("Dask's own bounded histories at their defaults." if args.dask_defaults else
             "Dask's own bounded histories shortened to fill within 2 minutes (system monitor 240 samples, "
             f"worker profiles and logs 120 entries), and the controller's to {SHORT_HISTORY} entries."), "",
          "| role | RSS after warm-up (MiB) | RSS at end (MiB) | max (MiB) | slope (MiB/min) |", "|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['role']} | {r['rss_start_mib']:.0f} | {r['rss_end_mib']:.0f} | {r['rss_max_mib']:.0f} | "
                  f"{r['slope_mib_per_min']:+.2f} |")
    if heap_rows:
        parts = ["rss", "pymalloc_live", "pymalloc_arenas", "malloc_in_use", "malloc_free_held", "other"]
        md += ["", "Where the growth is: slope after warm-up (MiB/min) of the resident set and of its parts, sampled "
               f"every {args.heap_every:g} s in each process. pymalloc arenas hold Python's small objects (live: the "
               "objects themselves); malloc in use is everything else allocated (tensors, arrays, libraries); "
               "malloc free-held is freed memory glibc keeps; other = RSS - arenas - malloc in use - free-held "
               "(code, stacks, mapped files, untouched pages). '-': not measurable in that run (malloc: the allocator is not glibc's; pymalloc: its statistics are off while tracemalloc traces).", "",
               "| role | " + " | ".join(parts) + " |", "|---|" + "---|" * len(parts)]
        for r in heap_rows:
            md.append(f"| {r['role']} | " + " | ".join("-" if r[p] is None else f"{r[p]:+.3f}" for p in parts) + " |")
        from tianji_dask.dataflow.keycache import LIMIT

        md += ["", f"Dask's key-name cache (entries; cleared past {LIMIT:,}): "
               + "; ".join(f"{role} {max(h.get('key_cache_entries', 0) for _, h in pts):,} at most, "
                           f"{pts[-1][1].get('key_cache_entries', 0):,} at the end" for role, pts in heap.items() if pts) + "."]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = " ".join(["python", "benchmarks/soak.py", *(argv or sys.argv[1:])])
    Path(f"{out}.json").write_text(json.dumps({"command": cmd, "samples": samples, "rows": rows, "heap": heap, "heap_rows": heap_rows,
                                              "tracemalloc_growth": growth}, indent=1))
    Path(f"{out}.md").write_text(f"<!-- generated by: {cmd} -->\n\n" + "\n".join(md) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for role, pts in samples.items():
        a = np.array(pts)
        ax.plot(a[:, 0] / 60, a[:, 1], label=role)
    ax.axvline(args.warmup_minutes, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS (MiB)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{out}.png", dpi=110)
    if growth:
        md += ["", f"Python allocations that grew most from minute {mark_at / 60:.1f} to the end (tracemalloc from the "
               f"end of warm-up, top {args.tracemalloc} call sites):", ""]
        for role, lines in growth.items():
            md += [f"- {role}: traced total {lines[0]}"] + [f"  - {line}" for line in lines[1:]]
        Path(f"{out}.md").write_text(f"<!-- generated by: {cmd} -->\n\n" + "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


def _heap_slopes(heap: dict, after_s: float) -> list[dict]:
    """Per role, the least-squares slope (MiB/min) after warm-up of each part of _heap()."""
    import numpy as np

    rows = []
    for role, pts in heap.items():
        pts = [(t, h) for t, h in pts if t >= after_s]
        if len(pts) < 3:
            continue
        t = np.array([p[0] for p in pts]) / 60
        row = {"role": role}
        for part in ("rss", "pymalloc_live", "pymalloc_arenas", "malloc_in_use", "malloc_free_held"):
            v = [p[1][part] for p in pts]
            row[part] = None if any(x is None for x in v) else float(np.polyfit(t, np.array(v), 1)[0])
        known = [row[p] for p in ("pymalloc_arenas", "malloc_in_use", "malloc_free_held")]
        row["other"] = None if None in known else row["rss"] - sum(known)
        rows.append(row)
    return rows


def _short(filename: str) -> str:
    """A source file named from its package or the standard library down, not from the disk root."""
    import re

    filename = re.sub(r"^.*/(site-packages|python3\.\d+)/", "", filename)
    return re.sub(r"^/.*?/((tianji_dask|benchmarks)/)", r"\1", filename)  # this project's files from its root


def _heap() -> dict:
    """Where this process's memory is, in MiB: pymalloc's arenas and the live small objects in
    them (``sys._debugmallocstats``), glibc malloc's bytes in use and free-but-held in its heap
    (``mallinfo2``; None under another allocator), and the resident set. RSS growing with none of
    the others says the growth is outside both allocators (mapped files, thread stacks, ...)."""
    import ctypes
    import os
    import re
    import sys
    import tempfile

    import psutil
    from dask.utils import key_split

    # Dask's key-name cache: one entry per task key seen, bounded by the run (dataflow/keycache.py)
    out = {"rss": psutil.Process().memory_info().rss / 2**20, "key_cache_entries": key_split.cache_info().currsize}
    with tempfile.TemporaryFile("w+") as tmp:  # the stats go to C stderr: borrow fd 2 for a moment
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read()
    live = re.search(r"# bytes in allocated blocks\s*=\s*([\d,]+)", text)
    arenas = re.search(r"^Total\s*=\s*([\d,]+)", text, re.M)
    out["pymalloc_live"] = int(live.group(1).replace(",", "")) / 2**20 if live else None
    out["pymalloc_arenas"] = int(arenas.group(1).replace(",", "")) / 2**20 if arenas else None

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = Mallinfo2
        info = libc.mallinfo2()
        jemalloc = any("jemalloc" in m.path for m in psutil.Process().memory_maps())
    except (AttributeError, OSError):
        info, jemalloc = None, True
    if info is not None and not jemalloc:
        out["malloc_in_use"] = (info.uordblks + info.hblkhd) / 2**20
        out["malloc_free_held"] = info.fordblks / 2**20
    else:
        out["malloc_in_use"] = out["malloc_free_held"] = None
    return out


def _trace_start() -> None:
    import tracemalloc

    tracemalloc.start(12)


def _trace_mark() -> None:
    import tracemalloc

    tracemalloc.soak_baseline = _snapshot()  # a module attribute survives between client.run calls


def _snapshot():
    import tracemalloc

    return tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])


def _trace_growth(top: int) -> list[str]:
    """[traced size now (+ growth)] + the ``top`` call sites whose allocations grew most."""
    import tracemalloc

    snap = _snapshot()
    base = tracemalloc.soak_baseline
    stats = snap.compare_to(base, "traceback")
    total_now = sum(s.size for s in snap.statistics("filename"))
    total_base = sum(s.size for s in base.statistics("filename"))
    lines = [f"{total_now / 2**20:.1f} MiB ({(total_now - total_base) / 2**20:+.1f} MiB)"]
    for s in stats[:top]:
        # tracemalloc lists frames oldest first: the allocation site is the last one
        frames = " <- ".join(f"{_short(f.filename)}:{f.lineno}" for f in list(s.traceback)[::-1][:8])
        lines.append(f"{s.size_diff / 2**20:+.2f} MiB in {s.count_diff:+d} blocks: {frames}")
    tracemalloc.stop()
    return lines


if __name__ == "__main__":
    sys.exit(main())
