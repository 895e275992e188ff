"""What a run shows of itself from Python: a live progress line (``progress=True``) redrawn in a
terminal and updated in place in a Jupyter notebook (there by default), its own notes as one line
each, and none of distributed's warnings unless ``verbose``."""

from __future__ import annotations

import json
import logging
import os
import pty
import subprocess
import sys
import textwrap
import warnings

import pytest

from tianji_dask.run.quiet import dashboard_moved, kept_quiet, say

SHORT = {"mode": "single", "stop.target_return": None, "stop.max_env_steps": 60_000}  # a few seconds of single mode


def _distributed_warning() -> None:
    # what distributed/node.py does when the dashboard's port is taken
    warnings.warn_explicit("Port 8787 is already in use.", UserWarning, "node.py", 195, module="distributed.node")


def test_distributeds_warnings_are_kept_quiet_unless_verbose():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with kept_quiet(verbose=False):
            _distributed_warning()
            warnings.warn("ours", UserWarning)  # only distributed's are kept back
        with kept_quiet(verbose=True):
            _distributed_warning()
    assert [str(w.message) for w in seen] == ["ours", "Port 8787 is already in use."]


def test_a_note_goes_to_the_logging_set_up_else_one_line_on_stderr(caplog, capsys):
    with caplog.at_level(logging.WARNING, logger="tianji_dask"):
        say("dashboard port 8787 is taken; using 40001")
    assert [r.getMessage() for r in caplog.records] == ["dashboard port 8787 is taken; using 40001"]
    root = logging.getLogger()
    handlers = root.handlers[:]
    for handler in handlers:  # as in a plain script: no logging set up at all
        root.removeHandler(handler)
    try:
        say("a note")
    finally:
        for handler in handlers:
            root.addHandler(handler)
    assert capsys.readouterr().err == "tianji_dask: a note\n"
    assert dashboard_moved(":8787", "http://127.0.0.1:40001/status") == (8787, 40001)
    assert dashboard_moved(":8787", "http://127.0.0.1:8787/status") is None and dashboard_moved(None, None) is None


def test_progress_defaults_to_off_outside_a_notebook(tmp_path):
    from tianji_dask import Run

    assert Run("cartpole_ppo", out=tmp_path / "a").progress is False
    assert Run("cartpole_ppo", out=tmp_path / "b", progress=True).progress is True


def _read_all(fd: int) -> str:
    import select

    out = b""
    while select.select([fd], [], [], 120)[0]:
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        out += data
    return out.decode(errors="replace")


@pytest.mark.slow  # a run in a pseudo-terminal
def test_progress_redraws_one_line_in_a_terminal_from_python(tmp_path):
    script = (f"import tianji_dask\nr = tianji_dask.train('cartpole_ppo', out={str(tmp_path / 'run')!r}, overrides={SHORT!r}, "
              "progress=True)\nprint('stopped:', r['stop_reason'])\n")
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=secondary, stdout=secondary, stderr=secondary, close_fds=True,
                            env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "200"})
    os.close(secondary)
    try:
        text = _read_all(primary)
        proc.wait(timeout=60)
    finally:
        os.close(primary)
    assert proc.returncode == 0, text
    assert text.count("[single]") >= 2 and "\x1b[" in text and "env steps" in text, text  # redrawn in place
    assert "stopped: max_env_steps" in text


@pytest.mark.slow  # a Jupyter kernel
def test_progress_is_a_live_display_in_a_notebook_by_default(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    code = (f"import tianji_dask\nresults = tianji_dask.train('cartpole_ppo', out='run', overrides={SHORT!r})\n"
            "print('stopped:', results['stop_reason'])")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = nb.cells[0].outputs
    displays = [o for o in outputs if o.output_type == "display_data"]
    assert len(displays) == 1, outputs  # one display, updated in place
    line = displays[0].data["text/plain"]
    assert line.startswith("[single] ") and "env steps" in line and "mean return" in line, line
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "stopped: max_env_steps" in text and "Warning" not in text, text


SCRIPT = textwrap.dedent("""
    import json, socket, sys
    if __name__ == "__main__":
        import tianji_dask
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        print(json.dumps({"port": port}), flush=True)
        for verbose in (False, True):
            print(f"--- verbose={verbose}", file=sys.stderr, flush=True)
            tianji_dask.train("cartpole_ppo", out=f"{sys.argv[1]}/run-{verbose}", verbose=verbose, overrides={
                "explorers": 1, "stop.target_return": None, "stop.max_env_steps": 4096,
                "cluster.dashboard_address": f"127.0.0.1:{port}"})
""")


@pytest.mark.slow  # two runs, each on a cluster of its own
def test_a_taken_port_is_one_line_unless_verbose(tmp_path):
    (tmp_path / "script.py").write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(tmp_path / "script.py"), str(tmp_path)], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    port = json.loads(proc.stdout.splitlines()[0])["port"]
    quiet, verbose = proc.stderr.split("--- verbose=True\n")
    assert f"tianji_dask: dashboard port {port} is taken; using " in quiet
    assert "Warning" not in quiet and "Traceback" not in quiet, quiet
    assert f"UserWarning: Port {port} is already in use" in verbose, verbose
