"""``dask scheduler --preload tianji_dask.preload`` (which imports this module): a scheduler ready for tianji runs.

Imported before the scheduler wires its dashboard, so the ``/tianji`` pages (and the JupyterLab
plots) are served; ``dask_setup`` adds the staleness controller, so runs find it in place.
"""

from tianji_dask.observe.dashboard import install

install()


def dask_setup(scheduler):
    from tianji_dask.dataflow.controller.plugin import StalenessController

    if "tianji" not in scheduler.plugins:
        scheduler.add_plugin(StalenessController(), name="tianji")
