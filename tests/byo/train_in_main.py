"""Trains a class that exists only in this script's ``__main__`` (as a notebook cell's class
does): the workers cannot import it, so it reaches them by value. Prints the results as JSON.
Usage: python train_in_main.py OUT_DIR"""

import json
import pathlib
import sys

if __name__ == "__main__":  # worker processes re-running this file as __mp_main__ do not define the class
    from tianji_dask import Run

    # the class's source, executed here: its __module__ is __main__, not an importable module
    exec(compile(pathlib.Path(__file__).with_name("labalgos").joinpath("clipped_pg.py").read_text(), "clipped_pg", "exec"))

    assert ClippedPG.__module__ == "__main__"  # noqa: F821 - defined by the exec above
    run = Run("cartpole_ppo", out=sys.argv[1], algorithm=ClippedPG,  # noqa: F821
              overrides={"algo.config": {}, "mode": "relaxed", "stop.max_seconds": 120})
    results = run.start().wait()
    print(json.dumps({k: results.get(k) for k in ("solved", "env_steps", "final_mean_return", "mode", "algo", "error")}))
