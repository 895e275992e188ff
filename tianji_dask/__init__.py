"""tianji_dask: distributed deep-RL training as a Dask dataflow (TianJi's relaxed assignment
dependencies, with an explicit staleness controller)."""

from tianji_dask.config import Pipeline, PipelineError, load_pipeline
from tianji_dask.observe.dashboard import install as _install_dashboard
from tianji_dask.run import Run, train

# the /tianji dashboard pages, for every scheduler this process starts from now on
_install_dashboard()

__all__ = ["Pipeline", "PipelineError", "Run", "load_pipeline", "train"]
__version__ = "0.1.0"
