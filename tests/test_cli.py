"""The command line as a user meets it in a terminal: the live progress display, in a real
pseudo-terminal, and the lines around it."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys

import yaml

from tianji_dask.config import resolve_pipeline_path


def _read_all(fd: int, timeout: float) -> str:
    out = b""
    while True:
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            break
        try:
            data = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        out += data
    return out.decode(errors="replace")


def test_live_progress_redraws_one_line_in_a_terminal(tmp_path):
    # a run that goes on past the solve, so the display has a few seconds to update
    data = yaml.safe_load(resolve_pipeline_path("cartpole_ppo").read_text())
    data["stop"].update(on_solve=False, max_seconds=3)
    pipeline = tmp_path / "cartpole_ppo.yaml"
    pipeline.write_text(yaml.safe_dump(data))
    primary, secondary = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "tianji_dask", "train", str(pipeline), "--mode", "single",
                             "--out", str(tmp_path / "run")], stdin=secondary, stdout=secondary, stderr=secondary,
                            env=env, close_fds=True)
    os.close(secondary)
    try:
        text = _read_all(primary, timeout=120)
        proc.wait(timeout=60)
    finally:
        os.close(primary)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, text
    assert text.startswith("tianji-dask: training cartpole_ppo (CartPole-v1, ppo, single, 2 explorers)"), text[:200]
    # the progress line, redrawn in place several times (cursor movement, not new lines)
    assert text.count("[single]") >= 3 and "\x1b[" in text, text
    line = text[text.rindex("[single]"):].splitlines()[0]
    assert "version" in line and "env steps" in line and "mean return" in line
    assert "tianji-dask: solved CartPole-v1" in text and "tianji-dask: results" in text
    assert (tmp_path / "run" / "results.json").exists()
