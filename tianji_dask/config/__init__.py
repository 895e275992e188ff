"""Pipelines: YAML files validated into typed models (``sections``, ``pipeline``), the bundled
pipelines (``bundled``), scheduler addresses (``addresses``), one-line validation errors
(``validation``) and the generated reference (``doc``)."""

from tianji_dask.lazy import lazy_attributes

__all__ = ["Pipeline", "PipelineError", "StopConfig", "apply_overrides", "bundled_pipelines", "bundled_pipelines_dir",
           "load_pipeline", "parse_pipeline", "pipeline_yaml", "resolve_pipeline_path"]

# loaded on first use: the pipeline's models import every algorithm (torch), and a light module of
# this package (``renamed``: a run folder's old field names) serves before the CLI imports torch
_LAZY = {"bundled_pipelines": "tianji_dask.config.bundled", "bundled_pipelines_dir": "tianji_dask.config.bundled",
         "resolve_pipeline_path": "tianji_dask.config.bundled", "Pipeline": "tianji_dask.config.pipeline",
         "apply_overrides": "tianji_dask.config.pipeline", "load_pipeline": "tianji_dask.config.pipeline",
         "parse_pipeline": "tianji_dask.config.pipeline", "pipeline_yaml": "tianji_dask.config.pipeline",
         "StopConfig": "tianji_dask.config.sections", "PipelineError": "tianji_dask.errors"}

__getattr__ = lazy_attributes(globals(), _LAZY)
