"""A run that outlives its driver. On a scheduler of its own making (``cluster.kind: address``) the
learners and the controller do not need the process that started them: the driver publishes
what it keeps of the run (its learners' futures, the figures read at the start, the learner
restarts so far) on the scheduler under the run's name, which also keeps the learner actors
alive (Dask frees an actor once no client holds its future), and writes the run file (the
scheduler's address, the run's id, its start) into the run directory. ``tianji-dask attach``
reads both, becomes the run's one driver (the controller keeps who drives each run) and drives
it to the end, when the published state goes."""

from __future__ import annotations

import json
from pathlib import Path

from tianji_dask.core.metrics import atomic_write
from tianji_dask.dataflow.keys import run_dataset_name
from tianji_dask.errors import PipelineError

RUN_FILE = "run.json"


def write_run_file(out: Path, record: dict) -> None:
    """Write the run file (atomically: a reader never sees half of one)."""
    atomic_write(Path(out) / RUN_FILE, lambda fh: json.dump(record, fh, indent=2, sort_keys=True))


def _resume_hint(run_dir: Path) -> str:
    return f"`tianji-dask resume {run_dir}` continues it from its newest checkpoint"


def read_run_file(run_dir: Path) -> dict:
    """The run file of the run in ``run_dir``, checked to name a run that has not finished;
    PipelineError in one line (not a run directory, a run that trained in its driver's own
    cluster, one that has finished) otherwise."""
    d = Path(run_dir)
    if not (d / "pipeline.yaml").is_file():
        raise PipelineError(f"run_dir: {str(d)!r} is not a run directory (no pipeline.yaml)")
    try:
        record = json.loads((d / RUN_FILE).read_text())
    except FileNotFoundError:
        raise PipelineError(f"attach: the run in {d} did not train on a scheduler of its own (no {RUN_FILE}): its cluster "
                            f"ended with its driver, so nothing is left to attach to; {_resume_hint(d)}") from None
    except (OSError, ValueError) as err:
        raise PipelineError(f"attach: cannot read {d / RUN_FILE} ({err})") from None
    try:
        finished = json.loads((d / "results.json").read_text()).get("run_id") == record["run_id"]
    except (OSError, ValueError):
        finished = False
    if finished:
        raise PipelineError(f"attach: run {record['run_id']} in {d} has finished (results.json written); "
                            f"{_resume_hint(d)} with a new budget (e.g. --max-seconds)")
    return record


def publish(client, run_id: str, state: dict) -> None:
    """Publish (or replace) the run's state; the futures in it keep their tasks, the learner
    actors, alive without any driver."""
    client.publish_dataset(state, name=run_dataset_name(run_id), override=True)


def unpublish(client, run_id: str) -> None:
    client.unpublish_dataset(run_dataset_name(run_id))


def drive(client, run_id: str) -> str | None:
    """Make this client the run's one driver: None, or the id of the connected client that drives it."""
    return client.sync(client.scheduler.tianji_drive, run_id=run_id, client_id=client.id)


def claim(client, run_id: str, address: str, run_dir: Path) -> dict:
    """Become the run's one driver; the state its last driver published. PipelineError in one
    line when the scheduler holds no such run (it finished, or the scheduler started afresh) or
    another driver still drives it."""
    name = run_dataset_name(run_id)
    gone = (f"attach: no live run {run_id} on the scheduler at {address} (it ended without its results, or the "
            f"scheduler has restarted since); {_resume_hint(run_dir)}")
    if name not in client.list_datasets():
        raise PipelineError(gone)
    held = drive(client, run_id)
    if held is not None:
        raise PipelineError(f"attach: run {run_id} has a driver attached already (client {held}); one driver at a time: "
                            "end that one first (Ctrl-C there stops the run and writes its results)")
    state = client.get_dataset(name, default=None)
    if state is None:
        raise PipelineError(gone)
    return state
