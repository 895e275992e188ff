"""The invariants every chaos run is checked against, whatever its fault. Each check returns
``{"ok": True | False | None, "evidence": "..."}``; None is "does not apply", always with why.

- ``no_hang``: the driver (or, after a killed driver on an external scheduler, ``tianji-dask
  attach``) ended within the class's bound after the fault;
- ``one_line``: what it printed after the fault holds no line that is not tianji-dask's own
  (no log line, no warning, no traceback) and, of tianji-dask's lines, none that reports a fault
  when the run completed, exactly one when it did not, and that one names what to do next
  (``tianji-dask resume`` or ``attach``). The lines of an ordinary end (``not solved: ...``,
  ``finished (no target): ...``, ``results PATH``) are not about the fault; nor is the acknowledgement of a driver's
  SIGTERM (``SIGTERM: stopping the run; ...``), which docs/cli.md prints before the clean stop;
- ``exit_status``: 0 when the run completed (results written, no error, stopped by its budget or
  solved), non-zero otherwise, never 2 (the harness gives no bad input);
- ``no_traceback``: no traceback on the terminal;
- ``results``: results.json exists; its chunk accounting balances (every credit granted came back
  as consumed or returned, none still out; the learner's chunks = the controller's consumed; its
  chunks lost = the credits returned by an erred or forgotten task); chunks.csv has one row per
  consumed chunk and no chunk twice;
- ``checkpoint_loads``: the newest checkpoint loads (``tianji_dask.core.checkpoint.load``);
- ``resume``: ``tianji-dask resume RUN_DIR`` on a fresh embedded cluster, with a short extra
  budget, exits 0 from that checkpoint, its final version past the checkpoint's, its episodes
  past the checkpoint's, its accounting balanced, and prints no traceback or log line;
- ``replay_log``: replay.csv, when there is one, has one row per consumed chunk (chunks.csv's
  rows, results.json's ``replay.rows``) and no chunk twice (stream, env seed, serial); with
  ``--replay``, a run that says it is replayable is replayed (``tianji-dask replay``) and must end
  with the weights it recorded;
- ``clocks``: the run's own times agree with the time that passed: its ``wall_s`` is no longer
  than the time from its start (``t_run_start``, on the driver's clock) to the driver's line saying
  how it ended, nor shorter by more than the fault's hold and SHUTDOWN_S; in chunks.csv no chunk
  ends (the explorer's clock) after it was consumed (the learner's), nor waits longer than the run.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

NAMES = ("no_hang", "one_line", "exit_status", "no_traceback", "results", "checkpoint_loads", "resume", "replay_log",
         "clocks")
COMPLETED = {"solved", "max_seconds", "max_env_steps", "max_updates"}
_NORMAL = ("training ", "dashboard ", "simulated: ", "not solved: ", "finished (no target): ", "solved ", "results ", "resuming ",
           "attaching to run ", "startup: ", "shutdown: ")
_ACK = ("SIGTERM: stopping the run",)
_PROGRESS = re.compile(r"^\[(relaxed|lockstep|single)\] ")
PREFIX = "tianji-dask: "
#: seconds from a learner's stop to the driver's line saying how the run ended (results fetched, written)
SHUTDOWN_S = 20
_ENDED = ("not solved: ", "finished (no target): ", "solved ", "the run failed: ", "error: ")


def verdict(ok, evidence: str) -> dict:
    return {"ok": ok, "evidence": evidence}


def said_how_it_ended(stamped: list[tuple[float, str]]) -> float | None:
    """When the first line saying how the run ended was printed."""
    return next((t for t, line in stamped if line.startswith(PREFIX) and line[len(PREFIX):].startswith(_ENDED)), None)


def is_progress(line: str) -> bool:
    return bool(_PROGRESS.match(line))


def classify(lines: list[str]) -> tuple[list[str], list[str]]:
    """(tianji-dask's lines about a fault, every other line that is not an ordinary one)."""
    faults, noise = [], []
    for line in lines:
        if not line.strip() or _PROGRESS.match(line):
            continue
        if line.startswith(PREFIX):
            said = line[len(PREFIX):]
            if not said.startswith(_NORMAL + _ACK):
                faults.append(line)
        else:
            noise.append(line)
    return faults, noise


def read_results(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / "results.json").read_text())
    except (OSError, ValueError):
        return None


def completed(results: dict | None) -> bool:
    return bool(results) and results.get("error") is None and results.get("stop_reason") in COMPLETED


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


# ---- the checks ----------------------------------------------------------------------------------
def no_hang(ended: bool, bound_s: float, took_s: float | None, who: str) -> dict:
    if ended:
        return verdict(True, f"{who} ended {took_s:.0f} s after the fault (bound {bound_s:.0f} s)")
    return verdict(False, f"{who} still running {bound_s:.0f} s after the fault: killed, recorded as a hang")


def one_line(after: list[str], done: bool, killed: bool) -> dict:
    faults, noise = classify(after)
    if killed and noise:
        return verdict(False, f"the driver was SIGKILLed; {len(noise)} line(s) on its terminal after it, from the "
                              "processes it left: " + " | ".join(noise[:3]))
    if killed:
        return verdict(None, "the driver was SIGKILLed: it can print nothing (docs/results.md: resume continues it)")
    if noise:
        return verdict(False, f"{len(noise)} line(s) not tianji-dask's own after the fault, first: " + " | ".join(noise[:3]))
    if done:
        if faults:
            return verdict(False, "the run completed, yet: " + " | ".join(faults))
        return verdict(True, "the run completed; no line about a fault")
    if len(faults) != 1:
        return verdict(False, f"{len(faults)} tianji-dask lines about the fault (one expected): " + " | ".join(faults[:4]))
    if "tianji-dask resume" not in faults[0] and "tianji-dask attach" not in faults[0]:
        return verdict(False, f"one line, but it names no next step (resume, attach): {faults[0]}")
    return verdict(True, faults[0])


def exit_status(rc: int | None, done: bool, results: dict | None) -> dict:
    if rc is None:
        return verdict(None, "no exit status: the harness ended it (see no_hang)")
    what = "completed" if done else f"did not complete (stop_reason {None if results is None else results.get('stop_reason')})"
    if rc == 2:
        return verdict(False, f"exit 2 (bad input) although the input was good; the run {what}")
    ok = (rc == 0) == done
    return verdict(ok, f"exit {rc}; the run {what}")


def no_traceback(lines: list[str]) -> dict:
    at = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if not at:
        return verdict(True, "no traceback on the terminal")
    tail = next((line for line in lines[at[0] + 1:] if line and not line.startswith((" ", "Traceback"))), "?")
    return verdict(False, f"{len(at)} traceback(s) on the terminal, the first ending: {tail}")


def results_balance(run_dir: Path, results: dict | None, exempt: str | None = None) -> dict:
    if results is None:
        if exempt:
            return verdict(None, exempt)
        return verdict(False, "no results.json")
    a = results.get("chunk_accounting")
    if not a:
        return verdict(False, "results.json has no chunk_accounting")
    if "granted" not in a:
        return verdict(False, f"chunk_accounting without figures: {a}")
    returned = a["returned"]
    unconsumed = {k: v for k, v in returned.items() if k != "consumed"}
    lost_credits = sum(v for k, v in unconsumed.items() if k != "unsubmitted")  # tasks that never delivered
    path = run_dir / "chunks.csv"
    rows = _rows(path) if path.exists() else []
    twice = [k for k, n in Counter((r["explorer_id"], r["t_start"], r["t_end"]) for r in rows).items() if n > 1]
    wrong = []
    if a["in_flight"]:
        wrong.append(f"{a['in_flight']} credits still out")
    if a["granted"] != a["consumed"] + sum(unconsumed.values()) + a["in_flight"]:
        wrong.append(f"granted {a['granted']} != consumed {a['consumed']} + returned {sum(unconsumed.values())} "
                     f"+ out {a['in_flight']}")
    if "consumed" in returned and a["consumed"] != returned["consumed"]:
        wrong.append(f"consumed {a['consumed']} != credits returned consumed {returned['consumed']}")
    # a learner lost before its next checkpoint takes the chunks it consumed since, and its own record of
    # the chunks it lost, with it: the results say how many (consumed_lost_with_learners)
    learner_lost = (results.get("stop_reason") == "learner_lost"  # lost, and no learner worker came back
                    or any(r.get("cause") == "lost" for r in results.get("learner_restarts") or []))
    with_learners = a.get("consumed_lost_with_learners") or 0
    if results.get("chunks") != a["consumed"] and not (learner_lost and with_learners > 0
                                                       and results.get("chunks") + with_learners == a["consumed"]):
        wrong.append(f"the learner consumed {results.get('chunks')}, the controller counted {a['consumed']}")
    if results.get("chunks_lost") != lost_credits and not learner_lost:
        wrong.append(f"chunks_lost {results.get('chunks_lost')} != credits of tasks that never delivered {lost_credits}")
    if len(rows) != results.get("chunks"):
        wrong.append(f"chunks.csv has {len(rows)} rows for {results.get('chunks')} chunks")
    if twice:
        wrong.append(f"{len(twice)} chunk(s) consumed twice in chunks.csv")
    if not a.get("balanced"):
        wrong.append(f"balanced: {a.get('balanced')}" + (f" ({a['why']})" if a.get("why") else ""))
    said = (f"granted {a['granted']}, consumed {a['consumed']}, returned unconsumed {unconsumed}, out {a['in_flight']}"
            + (f" (from {a['source']})" if a.get("source") else "")
            + f"; chunks {results.get('chunks')}, lost {results.get('chunks_lost')}, chunks.csv rows {len(rows)}")
    return verdict(not wrong, "; ".join(wrong) + (" — " if wrong else "") + said)


LOAD = ("import json, sys\nfrom tianji_dask.core import checkpoint\n"
        "s = checkpoint.load(sys.argv[1]); l = s['ledger']\n"
        "print(json.dumps({'version': int(s['version']), 'elapsed_s': float(l['elapsed_s']), "
        "'episodes': len(l['episodes']), 'env_steps': int(l['env_steps']), 'updates': int(l['updates'])}))")


def newest_checkpoint(run_dir: Path) -> tuple[dict, dict | None]:
    """(the check, what the newest checkpoint holds: version, elapsed_s, episodes, env_steps)."""
    found = sorted((run_dir / "checkpoints").glob("ckpt-*.pt"))
    if not found:
        return verdict(False, "no checkpoint in the run folder"), None
    proc = subprocess.run([sys.executable, "-c", LOAD, str(found[-1])], capture_output=True, text=True, timeout=120,
                          check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return verdict(False, f"{found[-1].name} does not load: {last}"), None
    held = json.loads(proc.stdout)
    held["path"] = str(found[-1])
    return verdict(True, f"{found[-1].name} loads: version {held['version']}, {held['episodes']} episodes, "
                         f"{held['elapsed_s']:.1f} s trained"), held


def resume(rc: int | None, lines: list[str], results: dict | None, held: dict | None) -> dict:
    if held is None:
        return verdict(False if rc is None else rc == 0, "no checkpoint that loads: nothing to resume from"
                       + ("" if rc is None else f" (resume exit {rc})"))
    if rc is None:
        return verdict(False, "resume did not end within its bound")
    wrong = []
    start = next((line for line in lines if line.startswith(PREFIX + "resuming ")), None)
    if rc != 0:
        faults, _ = classify(lines)
        wrong.append(f"exit {rc}: {' | '.join(faults[-2:]) or (lines[-1:] or ['no output'])[0]}")
    if start is None:
        wrong.append("no 'resuming ... from' line")
    faults, noise = classify(lines)
    if noise:
        wrong.append(f"{len(noise)} line(s) not tianji-dask's own, first: {noise[0]}")
    if any(line.startswith("Traceback") for line in lines):
        wrong.append("a traceback on the terminal")
    if results is None:
        wrong.append("no results.json after the resume")
    else:
        if results["final_version"] <= held["version"]:
            wrong.append(f"final version {results['final_version']} not past the checkpoint's {held['version']}")
        if results["episodes"] <= held["episodes"]:
            wrong.append(f"{results['episodes']} episodes, not past the checkpoint's {held['episodes']}")
        if not (results.get("chunk_accounting") or {}).get("balanced"):
            wrong.append(f"accounting not balanced: {results.get('chunk_accounting')}")
    said = (f"from version {held['version']} ({start[len(PREFIX):] if start else '?'}) to "
            f"{results and results['final_version']}, episodes {held['episodes']} -> {results and results['episodes']}")
    return verdict(not wrong, "; ".join(wrong) + (" — " if wrong else "") + said)


def replay_log(run_dir: Path, results: dict | None, exempt: str | None = None,
               replayed: tuple[int | None, str] | None = None) -> dict:
    """``replayed``: ``tianji-dask replay``'s exit status and last line, when it was run."""
    path = run_dir / "replay.csv"
    if results is None:
        return verdict(None if exempt else False, exempt or "no results.json to hold the log against")
    if not path.exists():
        return verdict(None, "no replay.csv (the mode keeps none)")
    rows = _rows(path)
    chunks = run_dir / "chunks.csv"
    consumed = len(_rows(chunks)) if chunks.exists() else None
    twice = [k for k, n in Counter((r["stream"], r["env_seed"], r["stream_serial"]) for r in rows).items() if n > 1]
    said_rows = (results.get("replay") or {}).get("rows")
    wrong = []
    replayable = (results.get("replay") or {}).get("replayable")
    # a log said not replayable (a learner rebuilt or resumed from a checkpoint) records only its last learner's chunks
    if (len(rows) != results.get("chunks") or len(rows) != consumed) and not (replayable is False and len(rows) <= consumed):
        wrong.append(f"{len(rows)} rows for {results.get('chunks')} consumed chunks ({consumed} in chunks.csv)")
    if said_rows is not None and said_rows != len(rows):
        wrong.append(f"results.json says {said_rows} rows, the file has {len(rows)}")
    if twice:
        wrong.append(f"{len(twice)} (stream, env seed, serial) twice, e.g. {twice[0]}")
    if replayed is not None and replayed[0] != 0:
        wrong.append(f"results.json says replayable, but `tianji-dask replay` exits {replayed[0]}: {replayed[1]}")
    why_not = (results.get("replay") or {}).get("why_not")
    return verdict(not wrong, "; ".join(wrong) + (" — " if wrong else "")
                   + f"{len(rows)} rows; replayable {(results.get('replay') or {}).get('replayable')}"
                   + (f" ({why_not})" if why_not else ""))


def clocks(run_dir: Path, results: dict | None, t_said: float | None, hold_s: float) -> dict:
    """``t_said``: when the driver printed how the run ended (it had the results by then)."""
    if results is None or t_said is None or results.get("t_run_start") is None:
        return verdict(None, "no results.json or no line saying how the run ended to hold its times against")
    real, wall = t_said - results["t_run_start"], results.get("wall_s") or 0.0
    wrong = []
    if wall > real + 2:
        wrong.append(f"wall_s {wall:.1f} s, but only {real:.1f} s passed from run start to the line saying how it ended")
    if wall < real - hold_s - SHUTDOWN_S:
        wrong.append(f"wall_s {wall:.1f} s, but {real:.1f} s passed from run start to the line saying how it ended")
    path = run_dir / "chunks.csv"
    rows = [(float(r["t_consumed"]), float(r["t_end"])) for r in _rows(path)] if path.exists() else []
    ahead = [t_end - t for t, t_end in rows if t_end > t + 1]
    behind = [t - t_end for t, t_end in rows if t - t_end > max(real, 0) + 1]
    if ahead:
        wrong.append(f"{len(ahead)} chunk(s) ended up to {max(ahead):.1f} s after they were consumed (chunks.csv)")
    if behind:
        wrong.append(f"{len(behind)} chunk(s) consumed up to {max(behind):.1f} s after they ended, longer than the run")
    said = f"wall_s {wall:.1f} s, {real:.1f} s from run start to the line saying how it ended; {len(rows)} chunks' times"
    return verdict(not wrong, "; ".join(wrong) + (" — " if wrong else "") + said)


def next_update_s(run_dir: Path, t_fault: float) -> tuple[float | None, float | None]:
    """(seconds from the fault to the first chunk consumed at a newer version than any consumed
    before it: the learner's next update, as chunks.csv sees it; the longest time without such an
    advance from the fault on: how long training stalled). None where there is none."""
    path = run_dir / "chunks.csv"
    if not path.exists():
        return None, None
    rows = sorted((float(r["t_consumed"]), float(r["consumed_version"])) for r in _rows(path))
    before = [v for t, v in rows if t <= t_fault]
    top = max(before) if before else -1
    advances = []
    for t, v in rows:
        if t > t_fault and v > top:
            advances.append(t)
            top = v
    if not advances:
        return None, None
    gaps = [b - a for a, b in zip([t_fault, *advances], advances)]
    return round(advances[0] - t_fault, 3), round(max(gaps), 3)
