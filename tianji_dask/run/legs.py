"""A run's legs: ``train`` trains a run's first leg, and each ``resume`` that trains one more, in
the same folder. Before a leg trains, the records the one before wrote (``RECORDS``) move to
``legs/N/`` whole, so nothing a leg wrote is ever overwritten: each leg's folder is a run folder
of its own (``tianji-dask replay RUN/legs/0`` replays the first exactly). A resume that a stop
rule still in force would end at once trains nothing and changes nothing (``check``).

Imports nothing heavy: the CLI checks a resume before it starts the process its workers fork from.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import yaml

from tianji_dask.config.renamed import renamed, renamed_overrides
from tianji_dask.errors import PipelineError

LEGS_DIR = "legs"
#: what a leg writes into the run's folder (checkpoints stay: the next leg starts from them)
RECORDS = ("results.json", "episodes.csv", "chunks.csv", "eval.csv", "replay.csv", "env_errors.txt", "error.txt",
           "learning_curve.png")
#: read by the next leg as well, so copied rather than moved
KEPT = ("pipeline.yaml",)
class NothingToResume(PipelineError):
    """A resume the run's stop rules, with the overrides applied, would end before it trained:
    nothing was started or changed. ``solved``: the rule is the run's target, reached (the CLI
    exits 0); else a budget used up (exit 2)."""

    def __init__(self, line: str, solved: bool = False):
        super().__init__(line)
        self.solved = solved


def leg_dirs(run_dir: str | os.PathLike) -> list[Path]:
    """The folders of the run's earlier legs, first to last."""
    d = Path(run_dir) / LEGS_DIR
    found = [p for p in d.iterdir() if p.is_dir() and p.name.isdigit()] if d.is_dir() else []
    return sorted(found, key=lambda p: int(p.name))


def previous_results(run_dir: str | os.PathLike) -> dict | None:
    """The results of the run's newest leg that wrote them (None: none did, e.g. a killed driver
    before any results)."""
    for d in [Path(run_dir), *reversed(leg_dirs(run_dir))]:
        try:
            return json.loads((d / "results.json").read_text())
        except (OSError, ValueError):
            continue
    return None


def _stop_section(run_dir: Path, overrides: dict) -> tuple[dict, dict]:
    """(the stop section the last leg ran with, the one a resume with ``overrides`` would run
    with), read from ``pipeline.yaml`` without building the pipeline."""
    written = renamed(yaml.safe_load((run_dir / "pipeline.yaml").read_text()) or {})  # a folder from before a rename
    before = dict(written.get("stop") or {})
    after = dict(before)
    for key, value in renamed_overrides(overrides).items():
        if key == "stop" and isinstance(value, dict):
            after.update(value)
        elif key.startswith("stop."):
            after[key.split(".", 1)[1]] = value
    return before, after


def check(run_dir: str | os.PathLike, overrides: dict | None = None) -> None:
    """NothingToResume, one line naming the rule and the flag that lets the run go on, when the
    run's last leg stopped by a rule that, with ``overrides``, still holds; else nothing."""
    from tianji_dask.core.stop import StopRules

    d = Path(run_dir)
    prev = previous_results(d)
    if prev is None or not (d / "pipeline.yaml").is_file():
        return
    try:
        before, after = _stop_section(d, overrides or {})
        rules = StopRules(target_return=after.get("target_return"), mean_episodes=int(after.get("mean_episodes", 100)),
                          on_solve=bool(after.get("on_solve", True)), max_env_steps=after.get("max_env_steps"),
                          max_updates=after.get("max_updates"), max_seconds=after.get("max_seconds"),
                          on_eval=after.get("on", "train") == "eval")
        env_steps, updates, trained_s = int(prev["env_steps"]), _total(prev["updates"]), float(prev["wall_s"])
    except (OSError, ValueError, TypeError, KeyError, yaml.YAMLError):
        return  # the pipeline's own checks say what is wrong with it, in one line, as the resume loads it
    # the target still reached: the same judge, a target no higher than the one met
    target, old_target = rules.target_return, before.get("target_return")
    solved = bool(prev.get("solved")) and target is not None and old_target is not None and target <= old_target \
        and rules.mean_episodes == int(before.get("mean_episodes", 100)) and rules.on_eval == (before.get("on", "train") == "eval")
    reason = rules.reason(solved=solved, env_steps=env_steps, updates=updates, elapsed_s=trained_s)
    run = f"run {prev.get('run_id', '?')}"
    if reason == "solved":
        when = prev.get("time_to_solve_s")
        at = f" at {when:.2f} s of training" if isinstance(when, (int, float)) else ""
        raise NothingToResume(
            f"resume: {run} has solved {prev.get('env_id', 'its env')} already ({rules.mean_episodes}-episode mean >= "
            f"{target:g}{at}); nothing was started or changed. To train on, raise the target: "
            f"--set stop.target_return=R, or --set stop.on_solve=false with a budget", solved=True)
    if reason == "max_env_steps":
        raise NothingToResume(
            f"stop.max_env_steps: {run} has made {env_steps:,} env steps of its {rules.max_env_steps:,}; nothing was "
            f"started or changed; allowed: a larger budget in all, e.g. --total-timesteps {2 * rules.max_env_steps}")
    if reason == "max_updates":
        raise NothingToResume(
            f"stop.max_updates: {run} has made {updates:,} updates of its {rules.max_updates:,}; nothing was started "
            f"or changed; allowed: a larger budget in all, e.g. --set stop.max_updates={2 * rules.max_updates}")
    if reason == "max_seconds":
        raise NothingToResume(
            f"stop.max_seconds: {run} has trained {trained_s:.1f} s of its {rules.max_seconds:g} s; nothing was "
            f"started or changed; allowed: a larger budget in all (training seconds), e.g. "
            f"--max-seconds {2 * rules.max_seconds:g}")


def _total(value) -> int:
    """A count that group mode records per group."""
    return int(sum(value)) if isinstance(value, list) else int(value)


def archive(run_dir: str | os.PathLike) -> Path | None:
    """Move the records the last leg wrote into ``legs/N/`` (N: the legs kept so far), whole:
    gathered in a folder of their own first, which is renamed into place, so a fault midway
    leaves every record in one place or the other. None when the last leg left no results
    (nothing to keep apart: it is continued, not repeated)."""
    d = Path(run_dir)
    if not (d / "results.json").is_file():
        return None
    legs = d / LEGS_DIR
    legs.mkdir(exist_ok=True)
    done = leg_dirs(d)
    target = legs / str(int(done[-1].name) + 1 if done else 0)
    staging = legs / f".{target.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for name in KEPT:
        if (d / name).is_file():
            shutil.copy2(d / name, staging / name)
    for name in RECORDS:
        if (d / name).is_file():
            os.replace(d / name, staging / name)
    os.replace(staging, target)
    return target


def history(run_dir: str | os.PathLike, before: dict | None) -> dict:
    """What a leg's results say of the legs before it: ``resumes`` (how many), ``legs`` (their
    folders, relative to the run's), and ``process_s_before`` / ``trained_s_before``: their
    process and training seconds (from their results; a leg that wrote none counts nothing)."""
    d = Path(run_dir)
    legs = [str(p.relative_to(d)) for p in leg_dirs(d)]
    process_s, trained_s = 0.0, 0.0
    if before:
        trained_s = float(before.get("wall_s") or 0.0)
        process_s = before.get("process_s")
        if process_s is None:  # written before legs were counted: a first leg's, process start to its end
            process_s = before["t_run_start"] + trained_s - before["t_process_start"]
    return {"resumes": len(legs), "legs": legs, "process_s_before": float(process_s), "trained_s_before": trained_s}


def stamp(results: dict, earlier: dict | None) -> dict:
    """The figures that carry across legs, on a leg's ``results``: ``process_s`` (process seconds
    in all, each leg's start-up included), and for a resumed run its ``resumes`` and ``legs``,
    with ``time_to_solve_from_process_start_s`` counted on the same clock: every leg's process
    seconds before the solve, so that it is never below ``time_to_solve_s`` (training seconds in
    all)."""
    t_end = results["t_run_start"] + results["wall_s"]
    if not earlier:
        results.update(process_s=t_end - results["t_process_start"], resumes=0, legs=[])
        return results
    overhead = earlier["process_s_before"] - earlier["trained_s_before"]  # the earlier legs' start-ups and ends
    results.update(process_s=earlier["process_s_before"] + t_end - results["t_process_start"],
                   resumes=earlier["resumes"], legs=earlier["legs"])
    if results.get("time_to_solve_s") is not None:
        built = (results.get("startup") or {}).get("learner_built_s") or 0.0
        results["time_to_solve_from_process_start_s"] = results["time_to_solve_s"] + overhead + built
    return results
