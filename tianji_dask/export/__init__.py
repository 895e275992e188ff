"""Policies that leave the project: ``load_policy`` (a run's checkpoint as an acting ``Policy``)
and ``export_policy`` (its deterministic policy as a TorchScript or ONNX file)."""

from __future__ import annotations

from tianji_dask.export.load import Policy, load_policy
from tianji_dask.export.write import FORMATS, check_format, export_policy

__all__ = ["FORMATS", "Policy", "check_format", "export_policy", "load_policy"]
