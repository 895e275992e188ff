"""A run's folder before it trains: made, with the resolved ``pipeline.yaml`` that ``tianji-dask
resume`` reads back and, for a run that outlives its driver, the run file ``attach`` reads."""

from __future__ import annotations

import shutil
from pathlib import Path

from tianji_dask.config import Pipeline, PipelineError, pipeline_yaml
from tianji_dask.run import attach


def prepare(out: Path, pipeline: Pipeline, *, run_file: dict | None) -> bool:
    """Make ``out`` and write the pipeline into it, and ``run_file`` (None: the run does not
    outlive its driver, and a run file left by an earlier start goes). Returns whether the
    folder is new; PipelineError, one line, when it cannot be written (a folder this made goes)."""
    fresh = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        # not a plain dump: with balance, chunk_steps given as well would not load back
        (out / "pipeline.yaml").write_text(pipeline_yaml(pipeline))
        if run_file is not None:
            attach.write_run_file(out, run_file)
        else:
            (out / attach.RUN_FILE).unlink(missing_ok=True)
    except OSError as err:
        if fresh:
            shutil.rmtree(out, ignore_errors=True)
        raise PipelineError(f"out: cannot write {str(out)!r} ({err.strerror or err}); "
                            "allowed: a directory this user can create and write, on a disk with room") from None
    return fresh
