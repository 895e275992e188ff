"""Tools for people who bring their own algorithm: ``check_algorithm`` runs one against the
contract the dataflow relies on, in one process, and names each violation in one line."""

from tianji_dask.testing.contract import AlgorithmCheckError, check_algorithm

__all__ = ["AlgorithmCheckError", "check_algorithm"]
