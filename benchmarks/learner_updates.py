"""Learner updates per second of a pipeline's algorithm on a torch device (no Dask, no explorers).

    python benchmarks/learner_updates.py [--pipeline pong_dqn] [--device cpu|cuda] [--updates 50]

Fills the algorithm with real chunks from the pipeline's env (random actions for DQN's replay,
the policy's own for on-policy algorithms), then times ``learn()`` calls on the device. This is
the figure that tells whether a GPU learner pays off for a pipeline: compare its updates/s with
the env steps/s the explorers produce.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="pong_dqn")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--updates", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the pipeline's learner.threads)")
    args = parser.parse_args(argv)

    import torch

    from tianji_dask.algos import make_algorithm
    from tianji_dask.config import load_pipeline
    from tianji_dask.core.torch_setup import learner_device, prepare_torch
    from tianji_dask.envs.rollout import Rollout
    from tianji_dask.envs.vector import env_spaces

    p = load_pipeline(args.pipeline)
    prepare_torch(args.threads or p.learner.threads)
    obs_space, act_space = env_spaces(p.env.id, **p.env.kwargs)
    config = p.algo_config.model_dump()
    if "learning_starts" in config:
        config["learning_starts"] = min(config["learning_starts"], 2 * p.chunk_steps * p.env.num_envs)
    algo = make_algorithm(p.algo.name, obs_space, act_space, config, p.seed)
    algo.to_device(learner_device(args.device))
    actor = make_algorithm(p.algo.name, obs_space, act_space, config, p.seed)  # explorer side, on CPU
    rollout = Rollout(p.env.id, p.env.num_envs, p.seed, p.env.kwargs)
    explore = {"epsilon": 1.0} if p.algo.name == "dqn" else {}

    def feed():
        while not algo.ready():
            actor.set_weights(algo.get_weights())
            algo.ingest(rollout.run(actor, p.chunk_steps, explore, policy_version=algo_version[0], explorer_id=0), 0)

    algo_version = [0]
    sync = torch.cuda.synchronize if algo.device.type == "cuda" else (lambda: None)
    feed()
    algo.learn()  # first call: optimizer state, kernels, caches
    algo_version[0] += 1
    elapsed, samples = 0.0, 0.0
    for _ in range(args.updates):
        feed()
        sync()
        t0 = time.perf_counter()
        metrics = algo.learn()
        sync()
        elapsed += time.perf_counter() - t0
        samples += metrics["samples"]
        algo_version[0] += 1
    rollout.close()
    result = {"pipeline": args.pipeline, "device": str(algo.device), "torch_threads": torch.get_num_threads(),
              "updates": args.updates, "updates_per_s": args.updates / elapsed, "samples_per_s": samples / elapsed}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
