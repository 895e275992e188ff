"""The learner core: what a learner is without Dask (algorithm, version, books, checkpoints,
numeric guard, stop rules). The single-process mode and the learner actor both run it."""
