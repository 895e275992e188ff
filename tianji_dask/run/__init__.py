"""The Run handle and ``train``: what a notebook or the CLI holds while training goes on.

``handle`` is the handle itself; ``checks`` is what a pipeline must pass before any cluster
starts; ``specs`` builds each role's spec; ``backend`` is where the learners live (``SingleBackend``
in this process, over ``single``'s loop; ``dask_backend`` on a cluster, which also rebuilds lost
learners); ``groups`` pools group mode's learners into one run; ``accounting`` reads where the
time and CPU went.
"""
from tianji_dask.run.handle import Run, train
from tianji_dask.run.specs import checkpoint_dirs, group_dirs

__all__ = ["Run", "checkpoint_dirs", "group_dirs", "train"]
