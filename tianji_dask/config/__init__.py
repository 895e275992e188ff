"""Pipelines: YAML files validated into typed models (``sections``, ``pipeline``), the bundled
pipelines (``bundled``), scheduler addresses (``addresses``), one-line validation errors
(``validation``) and the generated reference (``doc``)."""

from tianji_dask.config.bundled import bundled_pipelines, bundled_pipelines_dir, resolve_pipeline_path
from tianji_dask.config.pipeline import Pipeline, apply_overrides, load_pipeline, parse_pipeline, pipeline_yaml
from tianji_dask.config.sections import StopConfig
from tianji_dask.errors import PipelineError

__all__ = ["Pipeline", "PipelineError", "StopConfig", "apply_overrides", "bundled_pipelines", "bundled_pipelines_dir",
           "load_pipeline", "parse_pipeline", "pipeline_yaml", "resolve_pipeline_path"]
