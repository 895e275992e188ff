"""``dask scheduler --preload tianji_dask.preload``: a scheduler ready for tianji runs (the
``/tianji`` pages and the staleness controller); see ``launch/scheduler_preload.py``."""

from tianji_dask.launch.scheduler_preload import dask_setup

__all__ = ["dask_setup"]
