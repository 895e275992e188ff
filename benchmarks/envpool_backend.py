"""Explorer env steps per second with each env backend (env.backend: gymnasium, envpool).

    python benchmarks/envpool_backend.py [--envs CartPole-v1 Hopper-v5] [--num-envs 16] [--chunk-steps 128]
        [--chunks 10] [--repeats 5] [--out benchmarks/results/envpool_backend]

Each repeat steps a fresh ``Rollout`` (an explorer's own loop: act, step, fill the chunk) of each
backend, alternated within the repeat so that neighbours share the machine's noise, with a fixed
random policy (a bank of random action batches drawn once, so acting costs both the same), for
``--chunks`` chunks after one untimed warm-up chunk. Per (env, backend): the median env steps
(the chunks' ``env_steps``: transitions, reset steps left out) per wall second and their range,
per CPU second of this process (per core: EnvPool's own thread counts with the caller's), and the
median over repeats of envpool's wall rate over gymnasium's. EnvPool runs with one thread
(``num_threads: 1``), as an explorer stream does by default.

An env with a vector entry point of its own (CartPole-v1: numpy over all its envs at once) is what
the gymnasium backend steps; ``gymnasium-sync`` adds gymnasium's SyncVectorEnv of single envs for
it (what an env without one, Hopper, always gets, and what any env gets with ``env.wrappers``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import publish  # noqa: E402 - a sibling script

from tianji_dask.acting import Acting  # noqa: E402
from tianji_dask.envs.rollout import Rollout  # noqa: E402
from tianji_dask.envs.vector import EnvId  # noqa: E402

BACKENDS = ("gymnasium", "envpool", "gymnasium-sync")
BANK = 64  # random action batches the policy cycles through


class RandomBank(Acting):
    """Acts batches of random actions drawn once from the env's action space, in turn."""

    def __init__(self, space, num_envs: int, seed: int):
        space.seed(seed)
        self.bank = [np.stack([space.sample() for _ in range(num_envs)]) for _ in range(BANK)]
        self.t = 0

    def act(self, obs, explore):
        self.t += 1
        return self.bank[self.t % BANK], {}


def unwrapped(env):
    """A wrapper that wraps nothing: with it gymnasium vectorises single envs (SyncVectorEnv)."""
    return env


def backends(env: str) -> list[str]:
    """The backends measured on ``env``: gymnasium's SyncVectorEnv too where it is not the default."""
    return list(BACKENDS if gym.spec(env).vector_entry_point is not None else BACKENDS[:2])


def env_id(env: str, backend: str):
    if backend == "envpool":
        return EnvId(env, backend="envpool")
    return EnvId(env, spec=gym.spec(env), wrappers=[unwrapped]) if backend == "gymnasium-sync" else env


def measure(env: str, backend: str, args, seed: int) -> dict:
    """One repeat of one backend: a fresh rollout, a warm-up chunk, then ``args.chunks`` timed."""
    rollout = Rollout(env_id(env, backend), args.num_envs, seed)
    try:
        policy = RandomBank(rollout.env.single_action_space, args.num_envs, seed)
        rollout.run(policy, args.chunk_steps, {}, policy_version=0, explorer_id=0)
        steps, wall, cpu = 0, time.perf_counter(), time.process_time()
        for _ in range(args.chunks):
            steps += rollout.run(policy, args.chunk_steps, {}, policy_version=0, explorer_id=0)["env_steps"]
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        rollout.close()
    return {"env": env, "backend": backend, "seed": seed, "env_steps": steps, "wall_s": wall, "cpu_s": cpu,
            "steps_per_s": steps / wall, "steps_per_cpu_s": steps / cpu if cpu > 0 else None}


def table(runs: list[dict], envs: list[str]) -> str:
    lines = ["| env | backend | env steps/s, median | range | env steps per CPU s, median | envpool ÷ gymnasium (median of repeats) |",
             "|---|---|---|---|---|---|"]
    for env in envs:
        mine = {b: [r for r in runs if r["env"] == env and r["backend"] == b] for b in backends(env)}
        ratios = [p["steps_per_s"] / g["steps_per_s"] for g, p in zip(mine["gymnasium"], mine["envpool"])]
        for b in mine:
            rates = [r["steps_per_s"] for r in mine[b]]
            per_cpu = [r["steps_per_cpu_s"] for r in mine[b] if r["steps_per_cpu_s"]]
            ratio = f"{statistics.median(ratios):.2f}" if b == "envpool" else ""
            lines.append(f"| {env} | {b} | {statistics.median(rates):,.0f} | {min(rates):,.0f}–{max(rates):,.0f} | "
                         f"{statistics.median(per_cpu):,.0f} | {ratio} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "Hopper-v5"],
                        help="ids both backends have (EnvPool 1.2.5 has Hopper-v4 and Hopper-v5)")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--chunk-steps", type=int, default=128)
    parser.add_argument("--chunks", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="write OUT.json (every repeat) and OUT.md (the table)")
    args = parser.parse_args(argv)
    runs = []
    for r in range(args.repeats):
        for env in args.envs:
            order = backends(env)
            order = order[r % len(order):] + order[:r % len(order)]  # none always first
            for backend in order:
                run = measure(env, backend, args, seed=r)
                runs.append(run)
                print(f"repeat {r} {env} {backend}: {run['steps_per_s']:,.0f} env steps/s", flush=True)
    publish(table(runs, args.envs), args.out, "envpool_backend.py", argv, args, runs, "Explorer env steps/s by env backend",
            f"medians over {args.repeats} alternated repeats of {args.chunks} chunks of {args.chunk_steps} steps "
            f"x {args.num_envs} envs, a fixed random policy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
