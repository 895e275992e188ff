"""A run's results played back in one process, no Dask: a checkpoint's policy evaluated (and
filmed), and a whole asynchronous run re-executed exactly from its log."""
