"""How close one learner update comes to what the machine can do: FLOPs per update, its time, and
the machine's single-thread matrix-multiply rate measured in the same run.

    python benchmarks/learner_roofline.py [--cases dqn_cartpole sac_256] [--updates 30] [--threads 1]
                                          [--device cpu|cuda] [--peers-python .peers-venv/bin/python]
                                          [--seeds 0 1] [--out benchmarks/results/learner_roofline]

For each case the algorithm is filled with real chunks from its env (as benchmarks/learner_updates.py
does), one ``learn()`` is counted with ``torch.utils.flop_counter.FlopCounterMode`` (matmuls and
convolutions, forward and backward: what dominates these updates), and ``--updates`` calls are
timed. ``gemm`` is the best of five 1024x1024 float32 matmuls on ``--threads`` threads; ``of_gemm``
is the update's FLOP/s over it (1.0: every cycle in the update does matmul work at the GEMM rate).
``--device cuda`` trains the learner side there (``Algorithm.to_device``, as ``learner.device``
does) and times each update to its last kernel (``torch.cuda.synchronize``); its GEMM is then the
device's float32 8192x8192 rate, and SB3 runs on the same device.
With ``--peers-python`` (the peers' venv, benchmarks/peers/setup), Stable-Baselines3's updates/s on
the same network and batch (benchmarks/peers/sb3_updates.py) are measured right after ours, case by
case, and the table gains their ratio. ``--seeds`` measures each case at each seed (the networks'
initialisation and the data; default the pipeline's own seed), one row each.
Writes OUT.json (every figure) and OUT.md (the table).
"""

from __future__ import annotations

import argparse
import sys
import time

CASES = {  # name: (pipeline, config overrides): the bundled networks and batches
    "dqn_cartpole": ("cartpole_dqn", {}),
    "dqn_minatar": ("minatar_breakout_dqn", {}),
    "ppo_minatar": ("minatar_breakout_ppo", {}),
    "impala_cartpole": ("cartpole_impala", {}),
    "sac_64": ("pendulum_sac", {}),
    "sac_256": ("pendulum_sac", {"hidden": [256, 256], "batch_size": 256}),  # RL Zoo's network and batch
}


def gemm_rate(n: int = 1024, repeats: int = 5, device: str = "cpu") -> float:
    """FLOP/s of the best of ``repeats`` n x n float32 matmuls on ``device``."""
    import torch

    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    torch.mm(a, b)
    best = min(_timed(lambda: torch.mm(a, b), device) for _ in range(repeats))
    return 2 * n**3 / best


def _timed(fn, device: str = "cpu") -> float:
    import torch

    t0 = time.perf_counter()
    fn()
    if device != "cpu":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def measure(case: str, updates: int, device: str = "cpu", seed: int | None = None) -> dict:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from tianji_dask.algos import make_algorithm
    from tianji_dask.config import load_pipeline
    from tianji_dask.envs.rollout import Rollout
    from tianji_dask.envs.vector import env_spaces

    pipeline, extra = CASES[case]
    p = load_pipeline(pipeline, None if seed is None else {"seed": seed})
    obs_space, act_space = env_spaces(p.env.id, **p.env.kwargs)
    config = {**p.algo_config.model_dump(), **extra}
    if "learning_starts" in config:
        config["learning_starts"] = min(config["learning_starts"], 2 * p.chunk_steps * p.env.num_envs)
    algo = make_algorithm(p.algo.name, obs_space, act_space, config, p.seed)
    algo.to_device(device)
    actor = make_algorithm(p.algo.name, obs_space, act_space, config, p.seed)
    rollout = Rollout(p.env.id, p.env.num_envs, p.seed, p.env.kwargs)
    explore = {"epsilon": 1.0} if p.algo.name == "dqn" else {}
    version = [0]

    def feed():
        while not algo.ready():
            actor.set_weights(algo.get_weights())
            algo.ingest(rollout.run(actor, p.chunk_steps, explore, policy_version=version[0], explorer_id=0), 0)

    def learn():
        metrics = algo.learn()
        version[0] += 1
        return metrics

    feed()
    learn()  # the first: optimizer state, caches
    feed()
    counter = FlopCounterMode(display=False)
    with counter:
        samples = learn()["samples"]
    flops = counter.get_total_flops()
    elapsed = 0.0
    for _ in range(updates):
        feed()
        elapsed += _timed(learn, device)
    rollout.close()
    per_update = elapsed / updates
    return {"case": case, "pipeline": pipeline, "algo": p.algo.name, "config": extra, "samples": samples,
            "flops_per_update": flops, "s_per_update": per_update, "updates_per_s": 1 / per_update,
            "flop_per_s": flops / per_update, "torch_threads": torch.get_num_threads(), "device": device, "seed": p.seed}


def sb3(peers_python: str, case: str, updates: int, threads: int, device: str = "cpu") -> dict | None:
    """SB3's figures for ``case`` (None when it has no such case), from the peers' venv."""
    import json
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parent / "peers" / "sb3_updates.py"
    out = subprocess.run([peers_python, str(script), "--cases", case, "--updates", str(updates), "--threads", str(threads),
                          "--device", device],
                         capture_output=True, text=True, check=True).stdout
    found = json.loads(out.strip().splitlines()[-1])
    return found[0] if found else None


def table(rows: list[dict], gemm: float, label: str = "Single-thread GEMM (1024x1024 float32)") -> str:
    peers = any(r.get("sb3") for r in rows)
    head = "| update | samples | MFLOP / update | ms / update | updates/s | GFLOP/s | of GEMM |"
    lines = [f"{label}: **{gemm / 1e9:.0f} GFLOP/s**.", "",
             head + (" SB3 updates/s | ours ÷ SB3 |" if peers else ""), "|---" * (7 + 2 * peers) + "|"]
    for r in rows:
        line = (f"| {r['case']} | {r['samples']:.0f} | {r['flops_per_update'] / 1e6:.1f} | {1e3 * r['s_per_update']:.2f} | "
                f"{r['updates_per_s']:.0f} | {r['flop_per_s'] / 1e9:.1f} | {r['flop_per_s'] / gemm:.0%} |")
        if peers:
            theirs = r.get("sb3")
            line += (f" {theirs['updates_per_s']:.0f} | {r['updates_per_s'] / theirs['updates_per_s']:.2f}× |" if theirs
                     else " – | – |")
        lines.append(line)
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--peers-python", default=None, help="the peers' venv python: SB3 side by side")
    parser.add_argument("--seeds", nargs="+", type=int, default=[None], help="each case at each of these seeds")
    parser.add_argument("--out", default="benchmarks/results/learner_roofline")
    args = parser.parse_args(argv)

    from _report import write_report

    from tianji_dask.core.torch_setup import prepare_torch

    prepare_torch(args.threads)
    on_cpu = args.device == "cpu"
    gemm = gemm_rate() if on_cpu else gemm_rate(8192, device=args.device)
    rows = []
    for seed in args.seeds:
        for case in args.cases:  # ours, then SB3's, case by case: neighbours share the machine's noise
            rows.append(measure(case, args.updates, args.device, seed))
            if args.peers_python:
                rows[-1]["sb3"] = sb3(args.peers_python, case, args.updates, args.threads, args.device)
    for r in rows:
        r["of_gemm"] = r["flop_per_s"] / gemm
    text = table(rows, gemm, f"{args.threads}-thread GEMM (1024x1024 float32)" if on_cpu else
                 f"{args.device} GEMM (8192x8192 float32)")
    print(text)
    write_report(args.out, "learner_roofline.py", argv, args, [{"gemm_flop_per_s": gemm}, *rows], "Learner roofline",
                 f"{args.updates} timed updates per case, {args.threads} torch thread(s), learner on {args.device}", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
