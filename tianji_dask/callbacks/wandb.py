"""``WandbLogger``: a run's pipeline, episodes, updates, evaluations and results in Weights &
Biases (the ``wandb`` extra: ``pip install 'tianji-dask[wandb]'``); offline by default, with no
network and no login."""

from __future__ import annotations

import os
import threading

from tianji_dask.callbacks.base import Callback, require

SUMMARY = ("solved", "time_to_solve_s", "stop_reason", "wall_s", "env_steps", "updates", "final_version", "episodes",
           "final_mean_return", "error")
_open = {"runs": 0}  # this process's open runs: the last to finish ends wandb's service
_lock = threading.Lock()


class WandbLogger(Callback):
    """One W&B run per learner: the pipeline as its config; ``episode/return`` and
    ``episode/length`` against ``env_steps``; ``update/<metric>`` and ``eval/mean``,
    ``eval/std`` against ``version``; the learner's headline results in its summary.

    ``mode``: "offline" (the default: the run is written under ``dir``/wandb, to upload later
    with ``wandb sync``), "online" (needs a login) or "disabled". ``dir``: None is the run's
    folder. The service wandb starts in the learner's process is ended at ``on_end`` once no
    other W&B run of that process is open, so the process exits promptly."""

    def __init__(self, project: str = "tianji-dask", mode: str = "offline", dir: str | None = None,
                 name: str | None = None, entity: str | None = None, tags: list[str] | None = None):
        require("wandb", "wandb")
        if mode not in ("offline", "online", "disabled"):
            raise ValueError(f"mode: must be offline, online or disabled (got {mode!r})")
        self.project, self.mode, self.dir, self.name, self.entity, self.tags = project, mode, dir, name, entity, tags
        self._run = None

    def on_start(self, info: dict) -> None:
        os.environ.setdefault("WANDB_SILENT", "true")
        if self.mode == "offline":
            os.environ.setdefault("WANDB_MODE", "offline")
        import wandb

        name = self.name or f"{info['pipeline'].get('name', 'run')}-{info['run_id']}"
        if info["pipeline"].get("groups", 1) > 1:
            name += f"-g{info['group']}"
        run = wandb.init(project=self.project, entity=self.entity, mode=self.mode, dir=self.dir or info["out"], name=name,
                         tags=self.tags, config=info["pipeline"], group=info["run_id"], reinit="create_new",
                         settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
        with _lock:
            _open["runs"] += 1
        self._run = run
        run.define_metric("env_steps")
        run.define_metric("version")
        run.define_metric("episode/*", step_metric="env_steps")
        run.define_metric("update/*", step_metric="version")
        run.define_metric("eval/*", step_metric="version")

    def on_episodes(self, rows: list[dict]) -> None:
        if self._run is not None:
            for row in rows:
                self._run.log({"episode/return": row["return"], "episode/length": row["length"], "env_steps": row["env_steps"]})

    def on_update(self, version: int, metrics: dict[str, float]) -> None:
        if self._run is not None:
            self._run.log({**{f"update/{k}": v for k, v in metrics.items()}, "version": version})

    def on_evaluation(self, result: dict) -> None:
        if self._run is not None:
            self._run.log({"eval/mean": result["mean"], "eval/std": result["std"], "version": result["version"]})

    def on_checkpoint(self, path: str, version: int) -> None:
        if self._run is not None:
            self._run.summary["checkpoint"] = path

    def on_end(self, results: dict) -> None:
        run, self._run = self._run, None
        if run is None:
            return
        import wandb

        try:
            run.summary.update({key: results[key] for key in SUMMARY if key in results})
            run.finish(exit_code=1 if results.get("error") else 0)
        finally:
            with _lock:
                _open["runs"] -= 1
                last = _open["runs"] == 0
            if last:
                wandb.teardown()  # ends the service process wandb started here
