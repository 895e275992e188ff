"""A script that starts a run without ``if __name__ == "__main__":`` ends with one line naming the
fix, before any process starts; a Ctrl-C while the workers start is said at once and stops the run
once they have."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_script(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300)


def test_a_script_that_trains_from_its_top_level_gets_one_line_naming_the_guard(tmp_path):
    proc = run_script(tmp_path, """\
        import tianji_dask

        results = tianji_dask.train("cartpole_ppo", overrides={"stop.max_env_steps": 4096})
    """)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert 'if __name__ == "__main__":' in line and f"{tmp_path / 'script.py'}:3" in line, line
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["script.py"]  # no runs/ folder, nothing written


def test_a_package_s_main_module_is_not_run_again_so_needs_no_guard(tmp_path):
    package = tmp_path / "mypackage"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text("from tianji_dask.launch.main_guard import unguarded_call\nprint(unguarded_call())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    proc = subprocess.run([sys.executable, "-m", "mypackage"], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "None", proc.stdout + proc.stderr


@pytest.mark.parametrize("body, found", [
    ("from tianji_dask.launch.main_guard import unguarded_call\nprint(unguarded_call())\n", "(SCRIPT, 2)"),
    ("from tianji_dask.launch.main_guard import unguarded_call\n\ndef main():\n    print(unguarded_call())\n\n\n"
     "main()\n", "(SCRIPT, 7)"),
    ("from tianji_dask.launch.main_guard import unguarded_call\n\ndef main():\n    print(unguarded_call())\n\n\n"
     "if __name__ == '__main__':\n    main()\n", "None"),
    ("from tianji_dask.launch.main_guard import unguarded_call\nif '__main__' == __name__:\n    print(unguarded_call())\n",
     "None"),
], ids=["top-level", "function-called-at-top-level", "guarded", "guard-reversed"])
def test_the_guard_is_found_by_the_statement_that_holds_the_call(tmp_path, body, found):
    proc = run_script(tmp_path, body)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == found.replace("SCRIPT", repr(str(tmp_path / "script.py")))


def test_a_ctrl_c_while_the_workers_start_is_said_at_once_and_raised_once_they_have(caplog):
    from tianji_dask.launch.forkserver import interrupts_held

    caplog.set_level("WARNING", logger="tianji_dask")
    before = signal.getsignal(signal.SIGINT)
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_held("forkserver"):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            reached.append("the rest of the start")  # not cut short
    assert reached == ["the rest of the start"]
    lines = [r.getMessage() for r in caplog.records if r.name == "tianji_dask"]
    assert len(lines) == 1 and lines[0].startswith("Ctrl-C: the run stops as soon as"), lines
    assert signal.getsignal(signal.SIGINT) is before  # put back


def test_without_a_ctrl_c_the_start_goes_on():
    from tianji_dask.launch.forkserver import interrupts_held

    before = signal.getsignal(signal.SIGINT)
    with interrupts_held("forkserver"):
        assert signal.getsignal(signal.SIGINT) is not before  # held while the workers start
    assert signal.getsignal(signal.SIGINT) is before
