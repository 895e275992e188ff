"""Keep Dask's key-name cache from holding every explorer task's key.

``dask.utils.key_split`` keeps an ``lru_cache`` of 100,000 entries, and every process that
handles a task calls it on the task's key. Every explorer task and weights version has a key of
its own, so without a bound each such process would keep every key it saw until 100,000 have
passed. A pure function's cache costs nothing to drop but recomputation, so the run drops it
whenever it passes ``LIMIT`` entries.
"""

from __future__ import annotations

from tianji_dask import dask_internals

#: entries allowed before the cache is cleared (a module attribute, so a test can lower it)
LIMIT = 4096


def bound_key_cache() -> bool:
    """Clear ``key_split``'s cache if it holds more than LIMIT entries; True when it did."""
    if dask_internals.key_cache_size() > LIMIT:
        dask_internals.clear_key_cache()
        return True
    return False
