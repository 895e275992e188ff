"""``tianji-dask sweep``: a study (or population-based training) from the command line."""

from __future__ import annotations

import sys
import time


def cmd_sweep(args, overrides: dict) -> int:
    from tianji_dask.sweeps import report

    t0 = time.time()
    objective = args.objective or ("final_return" if args.pbt else "time_to_solve")

    def say(kind: str, info: dict) -> None:
        if args.quiet:
            return
        t = f"[sweep {time.time() - t0:6.1f} s]"
        params = ", ".join(f"{k}={report._fmt(v)}" for k, v in (info.get("params") or {}).items())
        if kind == "cluster":
            print(f"{t} {info['slots']} trials at once; dashboard {info['dashboard']}", flush=True)
        elif kind == "start":
            print(f"{t} trial {info['number']} started on slot {info['slot']}: {params} ({info['run_dir']})", flush=True)
        elif kind == "prune":
            print(f"{t} trial {info['number']} pruned at {info['elapsed_s']:.1f} s", flush=True)
        elif kind == "done":
            print(f"{t} trial {info['number']} finished: {objective} {info['value']:.4g} ({params})", flush=True)
        elif kind == "fail":
            print(f"{t} trial {info['number']} failed: {info['error']}", flush=True)
        elif kind == "exploit":
            print(f"{t} member {info['member']} took member {info['from_member']}'s checkpoint: {params}", flush=True)

    from pathlib import Path


    out = Path(args.out or f"sweeps/{Path(args.pipeline).stem}")
    if args.pbt:
        from tianji_dask.sweeps.pbt import pbt

        data = pbt(args.pipeline, args.params, population=args.concurrent, objective=objective,
                   max_seconds=args.max_seconds, interval_s=args.pbt_interval, out=out, overrides=overrides,
                   seed=args.seed, on_event=say)
    else:
        from tianji_dask.sweeps import sweep

        data = sweep(args.pipeline, args.params, trials=args.trials, concurrent=args.concurrent,
                     objective=objective, max_seconds=args.max_seconds, out=out, overrides=overrides,
                     pruner=args.pruner, sampler=args.sampler, seed=args.seed, on_event=say)
    print(report.table(data), end="")
    best = data.get("best")
    if best is None:
        print(f"tianji-dask: no trial completed; see {out / 'sweep.json'}", file=sys.stderr)
        return 1
    params = ", ".join(f"{k}={report._fmt(v)}" for k, v in best["params"].items())
    print(f"tianji-dask: best {data['objective']} {best['value']:.4g} (trial {best['number']}: {params}); "
          f"{out / 'best.yaml'} trains it: tianji-dask train {out / 'best.yaml'}")
    return 0
