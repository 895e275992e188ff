"""The Dask roles: the explorer task and its env pool, the learner actor and its parts, the
staleness controller (plugin, books, law), the reducer, and the direct chunk path. No algorithm
internals: algorithms are used through their interface only."""
