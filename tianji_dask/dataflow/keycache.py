"""Keep Dask's key-name cache from holding every explorer task's key.

``dask.utils.key_split`` is an ``lru_cache`` of 100,000 entries, and every process that handles a
task calls it on the task's key: the scheduler when the task arrives, workers for their metrics.
Every explorer task and every weights version has a key of its own, so each such process keeps
about 160 bytes per key (the cache entry and the key string it keeps alive) until 100,000 keys
have passed: at CartPole's chunk rate, hours of slow growth (about 0.2 MiB a minute in the
scheduler) before the cache is full at 20-30 MiB per process. A pure function's cache costs
nothing to drop but recomputation, so the run drops it whenever it passes ``LIMIT`` entries.
"""

from __future__ import annotations

from dask.utils import key_split

#: entries allowed before the cache is cleared (a module attribute, so a test can lower it)
LIMIT = 4096


def bound_key_cache() -> bool:
    """Clear ``key_split``'s cache if it holds more than LIMIT entries; True when it did."""
    if key_split.cache_info().currsize > LIMIT:
        key_split.cache_clear()
        return True
    return False
