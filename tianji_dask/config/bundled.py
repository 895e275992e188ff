"""The bundled pipelines (``pipelines/*.yaml``): listing them and resolving a name or a path."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from tianji_dask.config.validation import did_you_mean_name
from tianji_dask.errors import PipelineError


def bundled_pipelines_dir() -> Path:
    """Inside the package when installed from a wheel (``setup.py`` copies them there); the
    top-level ``pipelines/`` of a source checkout or an editable install."""
    package = Path(__file__).resolve().parent.parent
    installed = package / "pipelines"
    return installed if installed.is_dir() else package.parent / "pipelines"


def resolve_pipeline_path(path: str | os.PathLike) -> Path:
    p = Path(path)
    if p.exists() or p.suffix in (".yaml", ".yml") or os.sep in str(path):
        if not p.exists():
            raise PipelineError(f"pipeline: file {str(path)!r} does not exist")
        return p
    bundled = bundled_pipelines_dir() / f"{path}.yaml"
    if bundled.exists():
        return bundled
    names = sorted(q.stem for q in bundled_pipelines_dir().glob("*.yaml"))
    hint = did_you_mean_name(str(path), names)
    raise PipelineError(f"pipeline: {str(path)!r} is neither a file nor a bundled pipeline{hint} "
                        f"(allowed: a YAML file or a bundled name: {', '.join(names)})")


def bundled_pipelines() -> list[dict]:
    """Each bundled pipeline's name, env id, algorithm and target return, read without validating
    (a pipeline whose env needs an extra that is not installed is still listed)."""
    rows = []
    for path in sorted(bundled_pipelines_dir().glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        rows.append({"name": path.stem, "env_id": (data.get("env") or {}).get("id"),
                     "algo": (data.get("algo") or {}).get("name"),
                     "target_return": (data.get("stop") or {}).get("target_return")})
    return rows
