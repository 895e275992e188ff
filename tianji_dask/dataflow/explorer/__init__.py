"""The explorer role: each worker's pool of live envs and policies (``pool.py``) and the tasks
that step them into chunks or evaluations (``tasks.py``)."""
