"""The Run handle and ``train``: what a notebook or the CLI holds while training goes on.

``handle`` is the handle itself and ``one_call`` its ``train``; ``checks`` is what a pipeline must
pass before any cluster starts; ``progress``, ``quiet`` and ``provenance`` what a run shows and
records of itself; ``specs`` builds each role's spec; ``backend`` is where the learners live (``SingleBackend``
in this process, over ``single``'s loop; ``dask_backend`` on a cluster, which also rebuilds lost
learners); ``groups`` pools group mode's learners into one run; ``accounting`` reads where the
time and CPU went.
"""
from __future__ import annotations

from tianji_dask.lazy import lazy_attributes

__all__ = ["Run", "checkpoint_dirs", "group_dirs", "train"]

# loaded on first use: ``legs`` and ``quiet`` serve the CLI before it imports torch
_LAZY = {"Run": "tianji_dask.run.handle", "checkpoint_dirs": "tianji_dask.run.specs",
         "group_dirs": "tianji_dask.run.specs", "train": "tianji_dask.run.one_call"}


__getattr__ = lazy_attributes(globals(), _LAZY)
