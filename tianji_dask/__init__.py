"""tianji_dask: distributed deep-RL training as a Dask dataflow (TianJi's relaxed assignment
dependencies, with an explicit staleness controller).

Importing the package is cheap: ``Run``, ``train``, ``sweep`` and the pipeline helpers load on first use,
and the dashboard pages are installed when a run starts its own cluster (or by
``install_dashboard()``, before you build a cluster of your own).
"""

from __future__ import annotations

# the exception family: errors.py imports nothing, so these cost nothing to import
from tianji_dask.errors import PipelineError, RunFailed, RunFault, TianjiError
from tianji_dask.lazy import lazy_attributes

__version__ = "0.1.0"
__all__ = ["AlgoConfig", "Algorithm", "Callback", "Evaluation", "Pipeline", "PipelineError", "Run", "RunFailed", "RunFault",
           "TianjiError", "evaluate", "install_dashboard", "load_pipeline", "load_policy", "sweep", "train"]

_LAZY = {"AlgoConfig": "tianji_dask.algos", "Algorithm": "tianji_dask.algos", "Callback": "tianji_dask.callbacks",
         "Pipeline": "tianji_dask.config", "load_pipeline": "tianji_dask.config",
         "Run": "tianji_dask.run", "train": "tianji_dask.run", "sweep": "tianji_dask.sweeps",
         "load_policy": "tianji_dask.export", "evaluate": "tianji_dask.playback.evaluate",
         "Evaluation": "tianji_dask.playback.evaluate"}


def install_dashboard() -> None:
    """Add the ``/tianji`` dashboard pages to every scheduler this process builds from now on
    (they are then listed in JupyterLab's Dask pane too)."""
    from tianji_dask.observe.dashboard import install

    install()


__getattr__ = lazy_attributes(globals(), _LAZY)


def __dir__():
    return sorted(set(globals()) | set(__all__))
