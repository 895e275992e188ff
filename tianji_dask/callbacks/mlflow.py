"""``MLflowLogger``: a run's pipeline, episodes, updates, evaluations and results in MLflow
(the ``mlflow`` extra: ``pip install 'tianji-dask[mlflow]'``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tianji_dask.callbacks.base import Callback, flatten, require

BATCH = 1000  # MLflow takes at most 1000 metrics and 100 params in one batch
PARAM_BATCH = 100
PARAM_CHARS = 6000


def plain(value):
    """What ``json`` cannot write itself (numpy scalars and arrays), as plain values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


class MLflowLogger(Callback):
    """One MLflow run per learner (``-g<group>`` added to its name in group mode): the flattened
    pipeline as params; ``episode/return`` and ``episode/length`` with the run's env steps as
    step; ``update/<metric>`` with the version as step; ``eval/mean`` and ``eval/std``; the
    learner's results as the artifact ``results.json``.

    ``tracking_uri``: where to log (None: a file store in RUN_DIR/mlruns, read back with
    ``MlflowClient("file:RUN_DIR/mlruns")`` and ``MLFLOW_ALLOW_FILE_STORE=true``, which MLflow 3
    asks of file stores and this logger sets in its own process). MLflow's telemetry is off in
    the learner's process unless ``MLFLOW_DISABLE_TELEMETRY`` says otherwise."""

    def __init__(self, tracking_uri: str | None = None, experiment: str = "tianji-dask", run_name: str | None = None):
        require("mlflow", "mlflow")
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self._client = None
        self.mlflow_run_id: str | None = None

    def on_start(self, info: dict) -> None:
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        uri = self.tracking_uri or f"file:{Path(info['out']).resolve() / 'mlruns'}"
        if uri.startswith("file:") or "://" not in uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        client = MlflowClient(uri)
        experiment = client.get_experiment_by_name(self.experiment)
        if experiment is None:
            try:
                experiment_id = client.create_experiment(self.experiment)
            except MlflowException:  # another group's learner made it first
                experiment_id = client.get_experiment_by_name(self.experiment).experiment_id
        else:
            experiment_id = experiment.experiment_id
        name = self.run_name or f"{info['pipeline'].get('name', 'run')}-{info['run_id']}"
        if info["pipeline"].get("groups", 1) > 1:
            name += f"-g{info['group']}"
        tags = {"tianji.run_id": info["run_id"], "tianji.group": str(info["group"]), "tianji.out": info["out"]}
        run = client.create_run(experiment_id, run_name=name, tags=tags)
        params = [Param(key, (value if isinstance(value, str) else json.dumps(value, default=plain))[:PARAM_CHARS])
                  for key, value in flatten(info["pipeline"]).items()]
        for i in range(0, len(params), PARAM_BATCH):
            client.log_batch(run.info.run_id, params=params[i: i + PARAM_BATCH])
        self._client, self.mlflow_run_id = client, run.info.run_id

    def _log(self, values: list[tuple[str, float, int]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, int(step)) for key, value, step in values]
        for i in range(0, len(metrics), BATCH):
            self._client.log_batch(self.mlflow_run_id, metrics=metrics[i: i + BATCH])

    def on_episodes(self, rows: list[dict]) -> None:
        if self._client is not None:
            self._log([(f"episode/{key}", row[key], row["env_steps"]) for row in rows for key in ("return", "length")])

    def on_update(self, version: int, metrics: dict[str, float]) -> None:
        if self._client is not None:
            self._log([(f"update/{key}", value, version) for key, value in metrics.items()
                       if isinstance(value, (int, float)) and not isinstance(value, bool)])

    def on_evaluation(self, result: dict) -> None:
        if self._client is not None:
            self._log([("eval/mean", result["mean"], result["version"]), ("eval/std", result["std"], result["version"])])

    def on_checkpoint(self, path: str, version: int) -> None:
        if self._client is not None:
            self._client.set_tag(self.mlflow_run_id, "tianji.checkpoint", path)

    def on_end(self, results: dict) -> None:
        if self._client is None:
            return
        self._client.log_text(self.mlflow_run_id, json.dumps(results, indent=1, default=plain), "results.json")
        self._client.set_terminated(self.mlflow_run_id, "FAILED" if results.get("error") else "FINISHED")
        self._client = None
