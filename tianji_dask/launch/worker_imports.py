"""What an embedded cluster's worker process imports to run its roles, imported once by the
forkserver the workers fork from (``forkserver.PRELOAD``), so no worker imports it again.

Imports only: a thread started here (a torch op's thread pool) would not survive the fork.
"""

import atexit
import os

from tianji_dask.launch.forkserver import MARK

if os.environ.pop(MARK, None):  # the forkserver itself (its children never see it)
    # it exits when the process that started it does; its teardown (a garbage collection over
    # torch's objects, torch's C++ destructors) takes seconds, holding that process's stdout
    # open. First registered, this runs after every other exit handler.
    atexit.register(os._exit, 0)

import distributed.nanny  # noqa: E402, F401 - the worker process's own code
import dask  # noqa: E402
import importlib  # noqa: E402

# the HTTP routes every worker imports as it starts (prometheus_client's among them: most of a
# forked worker's own start, about 0.2 s of CPU each, measured with cProfile in the worker)
for _route in dask.config.get("distributed.worker.http.routes"):
    importlib.import_module(_route)
import distributed.protocol.numpy  # noqa: E402, F401 - how chunks and weights travel
import gymnasium.envs.classic_control  # noqa: E402, F401 - the bundled small envs
import torch  # noqa: E402, F401

from tianji_dask.algos import algorithm_registry  # noqa: E402
from tianji_dask.dataflow.explorer import pool, tasks  # noqa: E402, F401 - the env pool, explore_chunk
from tianji_dask.dataflow.learner import reducer  # noqa: E402, F401 - the reducer actor
from tianji_dask.dataflow.learner import actor  # noqa: E402, F401 - the learner actor
from tianji_dask.launch import worker_preload  # noqa: E402, F401 - dask's worker preload

algorithm_registry()  # imports every algorithm's module
