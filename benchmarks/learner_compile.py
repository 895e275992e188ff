"""Does ``torch.compile`` pay for a learner update here? SAC's updates/s eager, then with its critic
and actor losses compiled (forward and backward through the compiled graphs), in one process.

    python benchmarks/learner_compile.py [--hidden 64] [--batch 128] [--updates 100] [--device cpu|cuda]
                                         [--mode default|reduce-overhead|max-autotune-no-cudagraphs] [--background]

Prints the eager rate, the compile time (the first updates after compiling) and the compiled rate.
On ``--device cuda`` the learner side trains there (``Algorithm.to_device``) and each timing ends
at the last kernel; ``--mode reduce-overhead`` replays the compiled graphs as CUDA graphs, which
cuts the kernel launches that bound these small updates on a GPU.

``--background`` measures ``learner.compile`` itself (core/compile.py): the learner trains eager
while the losses compile on their own thread, then swaps them in. It prints the eager rate before,
the eager rate while compiling, the compile time, and the first three compiled updates' times
beside the median of the compiled ones after: a recompilation on the learner's thread would show
as a first update of seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--updates", type=int, default=100)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--mode", default="default", choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"])
    parser.add_argument("--background", action="store_true", help="learner.compile: compile while training eager")
    args = parser.parse_args(argv)
    import torch

    from tianji_dask.algos import make_algorithm
    from tianji_dask.envs.rollout import Rollout
    from tianji_dask.envs.vector import env_spaces

    torch.set_num_threads(1)
    algo = make_algorithm("sac", *env_spaces("Pendulum-v1"), {"hidden": [args.hidden] * 2, "batch_size": args.batch,
                                                               "learning_starts": 512}, 0)
    algo.to_device(args.device)
    rollout = Rollout("Pendulum-v1", 4, 0)
    while not algo.ready():
        algo.ingest(rollout.run(algo, 64, algo.exploration(0, 0), policy_version=0, explorer_id=0), 0)

    def rate(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            if args.mode == "reduce-overhead":  # a new step: the graphs' outputs of the last one may be overwritten
                torch.compiler.cudagraph_mark_step_begin()
            algo.learn()
            algo.update_credit += 1.0  # keep it allowed to train: the timing wants updates, not pacing
        if args.device != "cpu":
            torch.cuda.synchronize()
        return n / (time.perf_counter() - t0)

    rate(10)
    eager = rate(args.updates)
    if args.background:
        print(json.dumps({"hidden": args.hidden, "batch": args.batch, "device": args.device, "mode": args.mode,
                          "torch": torch.__version__, "eager_updates_per_s": eager, **background(algo, args.mode)}))
        return 0
    t0 = time.perf_counter()
    algo.critic_loss = torch.compile(algo.critic_loss, mode=args.mode)
    algo.actor_loss = torch.compile(algo.actor_loss, mode=args.mode)
    rate(5)
    compile_s = time.perf_counter() - t0
    print(json.dumps({"hidden": args.hidden, "batch": args.batch, "device": args.device, "mode": args.mode,
                      "torch": torch.__version__, "eager_updates_per_s": eager, "compile_s": compile_s,
                      "compiled_updates_per_s": rate(args.updates)}))
    return 0


def background(algo, mode: str) -> dict:
    """``learner.compile``'s path: eager updates while compiling, then the compiled ones timed one by one."""
    import statistics

    import torch

    from tianji_dask.core.compile import BackgroundCompile

    def one() -> float:
        t0 = time.perf_counter()
        compiler.before_update()
        algo.learn()
        algo.update_credit += 1.0
        updates[0] += 1
        compiler.after_update(updates[0])
        if algo.device.type != "cpu":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    compiler, updates = BackgroundCompile(algo, mode), [0]
    t0, n = time.perf_counter(), 0
    while compiler.state in ("waiting", "compiling"):
        one()
        n += 1
    while_compiling = n / (time.perf_counter() - t0)
    after = [one() for _ in range(200)]
    return {"state": compiler.state, "reason": compiler.reason, "compile_s": compiler.compile_s,
            "eager_updates_per_s_while_compiling": while_compiling, "eager_updates_while_compiling": n,
            "first_compiled_update_ms": [round(1e3 * t, 2) for t in after[:3]],
            "median_compiled_update_ms": round(1e3 * statistics.median(after[3:]), 2),
            "compiled_updates_per_s": 1 / statistics.mean(after[3:])}


if __name__ == "__main__":
    sys.exit(main())
