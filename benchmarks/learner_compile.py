"""Does ``torch.compile`` pay for a learner update here? SAC's updates/s eager, then with its critic
and actor losses compiled (forward and backward through the compiled graphs), in one process.

    python benchmarks/learner_compile.py [--hidden 64] [--batch 128] [--updates 100] [--device cpu|cuda]
                                         [--mode default|reduce-overhead|max-autotune-no-cudagraphs]

Prints the eager rate, the compile time (the first updates after compiling) and the compiled rate.
On ``--device cuda`` the learner side trains there (``Algorithm.to_device``) and each timing ends
at the last kernel; ``--mode reduce-overhead`` replays the compiled graphs as CUDA graphs, which
cuts the kernel launches that bound these small updates on a GPU.
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
    t0 = time.perf_counter()
    algo.critic_loss = torch.compile(algo.critic_loss, mode=args.mode)
    algo.actor_loss = torch.compile(algo.actor_loss, mode=args.mode)
    rate(5)
    compile_s = time.perf_counter() - t0
    print(json.dumps({"hidden": args.hidden, "batch": args.batch, "device": args.device, "mode": args.mode,
                      "torch": torch.__version__, "eager_updates_per_s": eager, "compile_s": compile_s,
                      "compiled_updates_per_s": rate(args.updates)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
