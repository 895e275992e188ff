"""Starting the processes a run lives in: the embedded or jobqueue cluster (``cluster``), the
forkserver its workers fork from (``forkserver``, ``worker_imports``), and the worker and
scheduler preloads (``worker_preload``, ``scheduler_preload``). Imports nothing heavy."""
