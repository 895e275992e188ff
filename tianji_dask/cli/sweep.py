"""``tianji-dask sweep``: a study (or population-based training) from the command line."""

from __future__ import annotations

import sys
import time
from pathlib import Path


def cmd_sweep(args, overrides: dict) -> int:
    from tianji_dask.sweeps import report

    t0 = time.time()
    objective = args.objective or ("final_return" if args.pbt else "time_to_solve")

    lines = {  # what each event of the sweep prints
        "cluster": "{slots} trials at once; dashboard {dashboard}",
        "start": "trial {number} started on slot {slot}: {params} ({run_dir})",
        "prune": "trial {number} pruned at {elapsed_s:.1f} s",
        "done": "trial {number} finished: " + objective + " {value:.4g} ({params})",
        "fail": "trial {number} failed: {error}",
        "exploit": "member {member} took member {from_member}'s checkpoint: {params}",
    }

    def say(kind: str, info: dict) -> None:
        if not args.quiet and kind in lines:
            text = lines[kind].format(**{**info, "params": report.fmt_params(info.get("params") or {})})
            print(f"[sweep {time.time() - t0:6.1f} s] {text}", flush=True)

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
    print(f"tianji-dask: best {data['objective']} {best['value']:.4g} (trial {best['number']}: "
          f"{report.fmt_params(best['params'])}); "
          f"{out / 'best.yaml'} trains it: tianji-dask train {out / 'best.yaml'}")
    return 0
