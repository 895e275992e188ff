"""What distributed's Nanny environment costs a learner's updates: the same PPO updates on MinAtar
Breakout (the MinAtar paper's network, 2,048-step batches, 4 epochs of 8 minibatches), timed in a
process started with the Nanny's ``MALLOC_TRIM_THRESHOLD_=65536`` and in one without it (what a
run's own workers now get, forkserver.LEFT_OUT), alternated round by round, and in the learner
worker of a run's own LocalCluster.

    python benchmarks/worker_environ.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

NANNY_VALUE = "65536"  # distributed.yaml: distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_


def update_seconds(updates: int = 8) -> float:
    """Median seconds of one PPO update (one 2,048-step segment) in this process, one torch thread."""
    import torch

    from tianji_dask.config import load_pipeline
    from tianji_dask.envs.rollout import Rollout
    from tianji_dask.run.checks import check_pipeline

    torch.set_num_threads(1)
    p = load_pipeline("minatar_breakout_ppo")
    algo = check_pipeline(p, has_client=False).make_algo()
    chunk = Rollout(p.env.id, p.env.num_envs, 0, {}).run(algo, p.chunk_steps, {}, policy_version=0, explorer_id=0)
    times = []
    for _ in range(updates + 1):
        algo.ingest(chunk, staleness=0)
        t = time.perf_counter()
        while algo.ready():
            algo.learn()
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])  # the first pays for allocations made once


def in_process(malloc: str | None) -> float:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_TRIM_THRESHOLD_"}
    env.update(OMP_NUM_THREADS="1", **({"MALLOC_TRIM_THRESHOLD_": malloc} if malloc else {}))
    code = f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import worker_environ as w; print(w.update_seconds())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def in_run_worker() -> float:
    from distributed import Client

    from tianji_dask.launch.cluster import local_cluster

    cluster = local_cluster(1, None)
    client = Client(cluster)
    try:
        learner = [a for a, w in client.scheduler_info(n_workers=-1)["workers"].items() if w["resources"].get("LEARNER")]
        return client.submit(update_seconds, workers=learner, pure=False).result()
    finally:
        client.close()
        cluster.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rows = {"nanny_environ": [], "without": [], "run_worker": []}
    for i in range(args.rounds):
        rows["nanny_environ"].append(in_process(NANNY_VALUE))
        rows["without"].append(in_process(None))
        rows["run_worker"].append(in_run_worker())
        print(f"round {i}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in rows.items()), flush=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(json.dumps({"median_update_s": med, "range": {k: [min(v), max(v)] for k, v in rows.items()},
                      "nanny_environ_over_without": med["nanny_environ"] / med["without"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
