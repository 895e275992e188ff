"""One chaos run: train, inject the planned fault at its moment, let the run end (or attach to it,
after a driver killed on an external scheduler), check every invariant, resume from the newest
checkpoint on a fresh cluster, and return the record benchmarks/chaos.py writes."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import chaos_checks as checks
from chaos_faults import CLASSES, DISK_SIZE, Plan, build_clock, clock_env, inject
from chaos_procs import Undo, tmpfs
from chaos_setup import Embedded, External
from chaos_slurm import Slurm

CKPT = re.compile(r"^ckpt-(\d{9})\.pt$")
#: seconds a run may take to start (imports, cluster, learner) and reach its moment, past its budget
START_S = 300
#: seconds a driver may need past its budget and the fault's hold to end (a rebuild, a clean stop)
SLACK_S = 180
RESUME_S = 300


@dataclass
class Settings:
    pipeline: str = "cartpole_ppo"
    budget_s: float = 120  # stop.max_seconds
    env_steps: int = 1_500_000  # stop.max_env_steps: the run's length in events, the time cap above it
    every_versions: int = 10  # checkpoint.every_versions
    at_versions: tuple[int, int] = (10, 300)  # the fault's moment: a checkpoint at or past a version drawn here
    explorers: int = 2
    resume_steps: int = 100_000
    resume_s: float = 40
    keep: bool = False  # keep the scratch folder (run folder, logs)
    replay: bool = False  # replay (tianji-dask replay) a run that says it can be


def _say(log, p: Plan, text: str) -> None:
    log(f"chaos: {p.fault} seed {p.seed} ({p.setup}): {text}")


def _newest_version(run_dir: Path) -> int:
    d = run_dir / "checkpoints"
    versions = [int(m.group(1)) for m in map(CKPT.match, (x.name for x in d.iterdir())) if m] if d.is_dir() else []
    return max(versions, default=-1)


def _arm(driver, run_dir: Path, version: int, deadline_s: float) -> str | None:
    """Wait for a checkpoint at or past ``version``; None when there is one, else why not."""
    end = time.time() + deadline_s
    while time.time() < end:
        if _newest_version(run_dir) >= version:
            return None
        if driver.poll() is not None:
            return f"the driver ended (exit {driver.poll()}) before a checkpoint at version {version}"
        time.sleep(0.2)
    return f"no checkpoint at version {version} within {deadline_s:.0f} s"


def run_one(p: Plan, s: Settings, log=print) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix="tianji-chaos-"))
    rec = {"fault": p.fault, "setup": p.setup, "seed": p.seed, "plan": p.as_dict(), "settings": vars(s).copy(),
           "scratch": str(scratch) if s.keep else None, "t_start": time.time()}
    rec["settings"]["at_versions"] = list(s.at_versions)
    with Undo() as undo:
        if not s.keep:
            undo.add("remove the scratch folder", lambda: shutil.rmtree(scratch, ignore_errors=True))
        try:
            _run(p, s, scratch, undo, rec, log)
        finally:
            failed = undo.close()
            if failed:
                rec["undo_failed"] = failed
    return rec


def make_setup(name: str, scratch: Path, undo: Undo, explorers: int, worker_env: dict | None = None):
    """The cluster a run of setup ``name`` trains on (chaos_setup.py, chaos_slurm.py)."""
    if name == "embedded":
        return Embedded(scratch, undo)
    if name == "slurm":
        return Slurm(scratch, undo, explorers)
    return External(scratch, undo, explorers, worker_env)


def _run(p: Plan, s: Settings, scratch: Path, undo: Undo, rec: dict, log) -> None:
    cls = CLASSES[p.fault]
    clock = build_clock(scratch) if cls.action == "clock" else None
    if p.fault == "disk-full":
        tmpfs(scratch / "disk", DISK_SIZE, undo)
        run_dir = scratch / "disk" / "run"
    else:
        run_dir = scratch / "run"
    setup = make_setup(p.setup, scratch, undo, s.explorers, clock_env(p, clock))
    setup.start()
    args = [s.pipeline, "--out", str(run_dir), "--set", f"seed={p.seed}", "--set", "stop.target_return=null",
            "--set", f"stop.max_env_steps={s.env_steps}", "--set", f"stop.max_seconds={s.budget_s:g}",
            "--set", f"checkpoint.every_versions={s.every_versions}", "--set", "cluster.dashboard_address=127.0.0.1:0",
            "--set", f"explorers={s.explorers}"]
    driver = setup.train(args)
    _say(log, p, f"training; the fault once a checkpoint at version >= {p.at_version} is written")
    why_not = _arm(driver, run_dir, p.at_version, START_S + s.budget_s)
    if why_not:
        rec["not_injected"] = why_not
        _say(log, p, f"not injected: {why_not}")
        fault = {"t_fault": time.time(), "t_undone": None, "target": None, "did": None, "error": why_not}
    else:
        rec["version_at_fault"] = _newest_version(run_dir)
        fault = inject(p, setup, run_dir, clock, undo)
        _say(log, p, fault["error"] or fault["did"])
    rec["injected"] = fault
    t_fault = fault["t_fault"]
    judged, who = driver, "the driver"
    killed_driver = cls.name == "driver-kill" and not why_not
    if killed_driver and p.setup == "external":  # elsewhere the scheduler lived in the driver
        driver.wait(30)
        judged, who = setup.command(["attach", str(run_dir)], "attach"), "tianji-dask attach"
        _say(log, p, "the driver killed: `tianji-dask attach` started")
    bound = s.budget_s + (p.hold_s or 0) + SLACK_S
    rc = judged.wait(bound - (time.time() - t_fault))
    hang = rc is None
    if hang:
        judged.kill()
        _say(log, p, f"HANG: {who} still running {bound:.0f} s after the fault; killed")
    else:
        _say(log, p, f"{who} ended: exit {rc}, {time.time() - t_fault:.0f} s after the fault")
    if judged is not driver and driver.poll() is None:
        driver.kill()
    ended_at = judged.t_end or time.time()
    if isinstance(setup, Embedded):
        end = time.time() + 15
        while driver.left_behind() and time.time() < end:
            time.sleep(0.5)
        rec["left_behind"] = driver.left_behind()
        if hasattr(setup, "jobs_left"):  # the batch jobs the run leaves queued or running once its driver ended
            rec["jobs_left"] = setup.jobs_left()
    else:
        rec["log_tails"] = setup.log_tails()
    driver.kill()
    setup.stop_cluster()

    results = checks.read_results(run_dir)
    done = checks.completed(results)
    judged_lines = judged.text()
    after = judged.text(since=t_fault) if judged is driver else judged_lines
    all_lines = driver.text() + ([] if judged is driver else judged_lines)
    exempt = None
    if killed_driver and p.setup != "external":
        exempt = "a driver killed outright writes no results (docs/results.md); its cluster ended with it"
    elif p.fault == "disk-full" and any("cannot write the results" in line for line in after):
        exempt = "the disk was full when the results were due: one line, exit 1 (docs/design.md, the failure model)"
    inv = {
        "no_hang": checks.no_hang(not hang, bound, None if hang else ended_at - t_fault, who),
        "one_line": checks.one_line(after, done, killed_driver and p.setup != "external"),
        "exit_status": checks.exit_status(None if hang else rc, done, results),
        "no_traceback": checks.no_traceback(all_lines),
        "results": checks.results_balance(run_dir, results, exempt),
    }
    inv["clocks"] = checks.clocks(run_dir, results, checks.said_how_it_ended(judged.lines), p.hold_s or 0)
    inv["checkpoint_loads"], held = checks.newest_checkpoint(run_dir)
    replayed = _replay(p, scratch, undo, run_dir, results, rec, log) if s.replay else None
    inv["replay_log"] = checks.replay_log(run_dir, results, exempt, replayed)
    nxt, rec["stall_s"] = checks.next_update_s(run_dir, t_fault) if not why_not else (None, None)
    rec["next_update_s"] = nxt
    rec["to_exit_s"] = None if hang else round(ended_at - t_fault, 3)
    rec["recovery_s"] = nxt if nxt is not None else rec["to_exit_s"]
    rec["chunks_lost"] = None if results is None else results.get("chunks_lost")
    rec["results"] = None if results is None else {k: results.get(k) for k in (
        "stop_reason", "error", "final_version", "updates", "episodes", "chunks", "chunks_lost", "wall_s",
        "chunk_accounting", "learner_restarts", "replay", "t_run_start", "age_s")}
    rec["driver"] = {"rc": driver.poll(), "last_lines": driver.text()[-12:]}
    rec["judged"] = {"who": who, "rc": rc, "last_lines": judged_lines[-12:],
                     "after_fault": [line for line in after if not checks.is_progress(line)][:200]}
    inv["resume"] = _resume(p, s, scratch, undo, run_dir, held, rec, log)
    rec["invariants"] = inv
    rec["held"] = None if why_not else all(v["ok"] is not False for v in inv.values())
    rec["failed"] = [k for k, v in inv.items() if v["ok"] is False]


def _replay(p: Plan, scratch: Path, undo: Undo, run_dir: Path, results: dict | None, rec: dict, log):
    if not results or not (results.get("replay") or {}).get("replayable"):
        return None
    proc = Embedded(scratch, undo).command(["replay", str(run_dir)], "replay")
    rc = proc.wait(RESUME_S)
    proc.kill()
    lines = proc.text()
    rec["replay"] = {"rc": rc, "last_lines": lines[-4:]}
    _say(log, p, f"replay: exit {rc}")
    return rc, (lines[-1] if lines else "no output")


def _resume(p: Plan, s: Settings, scratch: Path, undo: Undo, run_dir: Path, held: dict | None, rec: dict, log) -> dict:
    if held is None:
        return checks.resume(None, [], None, None)
    # a checkpoint's training time can be below 0 (a clock stepped back): the new budget is still past it
    args = ["resume", str(run_dir), "--max-seconds", f"{max(held['elapsed_s'], 0) + s.resume_s:.1f}",
            "--set", f"stop.max_env_steps={held['env_steps'] + s.resume_steps}",
            "--set", "cluster.kind=local", "--set", "cluster.dashboard_address=127.0.0.1:0"]
    proc = Embedded(scratch, undo).command(args, "resume")
    rc = proc.wait(RESUME_S)
    if rc is None:
        proc.kill()
    proc.kill()  # nothing of its cluster is left behind
    lines = proc.text()
    results = checks.read_results(run_dir)
    rec["resume"] = {"rc": rc, "last_lines": lines[-8:], "final_version": results and results.get("final_version")}
    _say(log, p, f"resume: exit {rc}")
    return checks.resume(rc, lines, results, held)
