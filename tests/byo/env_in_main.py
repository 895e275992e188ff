"""Trains on an env class that exists only in this script's ``__main__`` (as a notebook cell's
class does): the workers cannot import it, so it reaches them by value. Prints the results as JSON.
Usage: python env_in_main.py OUT_DIR {class,registered}: the class itself as env.id, or an id this
script registers with gymnasium.register."""

import json
import pathlib
import sys

if __name__ == "__main__":  # worker processes re-running this file as __mp_main__ do not define the class
    import gymnasium as gym

    import tianji_dask

    # the class's source, executed here: its __module__ is __main__, not an importable module
    exec(compile(pathlib.Path(__file__).with_name("labenvs").joinpath("corridor.py").read_text(), "corridor", "exec"))
    assert Corridor.__module__ == "__main__"  # noqa: F821 - defined by the exec above

    env_id = Corridor  # noqa: F821
    if sys.argv[2] == "registered":
        gym.register("lab/Corridor-v0", entry_point=Corridor)  # noqa: F821
        env_id = "lab/Corridor-v0"
    results = tianji_dask.train({
        "env": {"id": env_id, "num_envs": 8, "kwargs": {"length": 8}},
        "algo": {"name": "ppo", "config": {"segments_per_batch": 1, "max_policy_lag": 1}},
        "explorers": 2, "chunk_steps": 32,
        "stop": {"target_return": 0.6, "mean_episodes": 50, "max_seconds": 120},
    }, out=sys.argv[1])
    print(json.dumps({k: results.get(k) for k in ("solved", "env_steps", "final_mean_return", "env_id", "error",
                                                  "stop_reason")}))
