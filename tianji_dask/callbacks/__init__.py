"""Callbacks: hooks the learner's process calls as a run goes (episodes, updates, evaluations,
checkpoints, the end), on a thread of their own. ``base`` is the ``Callback`` class; ``entries``
reads a pipeline's ``callbacks``; ``runner`` calls them off the learner's path; ``mlflow`` and
``wandb`` are loggers built on them (each an optional extra)."""

from tianji_dask.callbacks.base import Callback

__all__ = ["Callback"]
