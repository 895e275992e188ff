"""The command line as a user meets it: the live progress display in a real pseudo-terminal, plain
lines into a pipe, ``--set``, ``pipelines`` and ``show``, and SIGTERM as a batch system sends it."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys

import pytest
import yaml
from helpers import cli

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


@pytest.mark.slow  # a whole run in a pseudo-terminal: the full suite (CI) runs it
def test_live_progress_redraws_one_line_in_a_terminal(tmp_path):
    # a run that goes on past the solve, so the display has a few seconds to update
    data = yaml.safe_load(resolve_pipeline_path("cartpole_ppo").read_text())
    data["stop"].update(on_solve=False, max_seconds=8)  # solved in about 3 s alone; CI runs it beside other tests
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


def _cli(*args, timeout=300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tianji_dask", *args], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def _plain(text: str) -> None:
    """What a log file should hold: whole lines, no terminal codes, no padding, no Python warnings."""
    for line in text.splitlines():
        assert "\x1b" not in line and "\r" not in line and line == line.rstrip() and len(line) < 300, repr(line)
    assert "Warning" not in text and "warnings.warn" not in text and "Traceback" not in text, text


_main = cli  # the CLI in this process (helpers.cli)


@pytest.mark.parametrize("setting,named", [
    ("no.such.key=1", "no.such.key"),
    ("stop.windw=3", "stop.windw"),
    ("explorers=0", "explorers"),
    ("explorers", "KEY=VALUE"),  # no "="
    ("algo.config.lr=[1,", "algo.config.lr"),  # not YAML
])
def test_a_bad_set_is_one_line_and_exit_2(tmp_path, capsys, setting, named):
    out = tmp_path / "run"
    code, stdout, stderr = _main(capsys, "train", "cartpole_ppo", "--set", setting, "--out", str(out))
    assert code == 2, stderr
    assert stderr.count("\n") == 1 and named in stderr and "Traceback" not in stderr, stderr
    assert stdout == "" and not out.exists()


def test_the_program_refuses_a_bad_set_in_one_line_and_exits_2(tmp_path):
    # the real process, for what only it shows: its exit status and nothing on its streams but the
    # one line (test_config's test_cli_process_exits_2_without_traceback: a pipeline the checks refuse)
    out = tmp_path / "run"
    proc = _cli("train", "cartpole_ppo", "--set", "explorers", "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "KEY=VALUE" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == "" and not out.exists()


def test_a_bad_set_names_what_is_allowed(capsys):
    code, _, stderr = _main(capsys, "show", "cartpole_ppo", "--set", "no.such.key=1")
    assert code == 2
    assert stderr.startswith("tianji-dask: error: no.such.key: unknown key 'no'; allowed: algo, balance,"), stderr
    code, _, stderr = _main(capsys, "show", "cartpole_ppo", "--set", "stop.windw=3")
    assert code == 2
    assert "stop.windw: unknown key; allowed: " in stderr and " mean_episodes" in stderr, stderr


def test_set_reaches_the_run_and_a_later_setting_wins(cli_training_run):
    # `train cartpole_ppo --explorers 3 --set explorers=1 --set stop.max_env_steps=6144 --set
    # cluster.dashboard_address=:PORT --verbose` (conftest), PORT taken: one line says which port
    # the dashboard moved to; --verbose lets distributed's own warning of it through as well
    proc, out, port = cli_training_run.proc, cli_training_run.out, cli_training_run.port
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert "tianji-dask: training cartpole_ppo (CartPole-v1, ppo, relaxed, 1 explorer)" in proc.stdout, text
    assert f"tianji-dask: dashboard port {port} is taken; using " in proc.stdout, text
    assert f"UserWarning: Port {port} is already in use" in proc.stderr, proc.stderr
    # stdout and stderr are pipes here: the progress comes as plain whole lines
    progress = [line for line in proc.stderr.splitlines() if line.startswith("[relaxed] ")]
    assert progress and all("in flight" in line for line in progress), proc.stderr
    _plain(proc.stdout + "\n".join(progress))
    assert "Traceback" not in text, text
    results = json.loads((out / "results.json").read_text())
    assert results["explorers"] == 1 and results["pipeline_config"]["stop"]["max_env_steps"] == 6144
    assert set(results["controller"]["per_explorer_env_steps"]) == {"0"}


def test_pipelines_lists_every_bundled_pipeline(capsys):
    from tianji_dask.config import bundled_pipelines_dir

    code, stdout, stderr = _main(capsys, "pipelines")
    assert code == 0 and stderr == ""
    lines = stdout.splitlines()
    assert lines[0].split() == ["name", "env", "id", "algorithm", "target", "return"]
    files = sorted(bundled_pipelines_dir().glob("*.yaml"))
    assert len(lines) == 1 + len(files)
    for path, line in zip(files, lines[1:]):
        data = yaml.safe_load(path.read_text())
        target = data["stop"].get("target_return")
        assert line.split() == [path.stem, data["env"]["id"], data["algo"]["name"], "-" if target is None else f"{target:g}"]


@pytest.mark.slow  # it trains in a subprocess; the fast tier checks show's refusals
def test_show_prints_a_pipeline_that_loads_back_equal_and_trains(tmp_path):
    from tianji_dask.config import load_pipeline, parse_pipeline

    settings = ["explorers=3", "algo.config.lr=3e-4", "controller.replay_ratio=null", "env.kwargs={max_episode_steps: 200}"]
    proc = _cli("show", "cartpole_ppo", *[a for s in settings for a in ("--set", s)])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    shown = yaml.safe_load(proc.stdout)
    expected = load_pipeline("cartpole_ppo", overrides={"explorers": 3, "algo.config.lr": 3e-4, "controller.replay_ratio": None,
                                                        "env.kwargs": {"max_episode_steps": 200}})
    assert parse_pipeline(shown) == expected and parse_pipeline(shown).model_dump() == expected.model_dump()
    assert shown["explorers"] == 3 and shown["algo"]["config"]["lr"] == 3e-4 and shown["controller"]["replay_ratio"] is None
    assert set(shown) >= {"stop", "controller", "learner", "cluster", "checkpoint"}  # every field, defaults filled in
    path = tmp_path / "shown.yaml"
    path.write_text(proc.stdout)
    assert _cli("show", str(path)).stdout == proc.stdout  # showing the shown pipeline changes nothing
    out = tmp_path / "run"
    proc = _cli("train", str(path), "--mode", "single", "--max-seconds", "2", "--quiet", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((out / "results.json").read_text())["pipeline_config"]["explorers"] == 3


def _train_in_its_own_session(out, *args) -> subprocess.Popen:
    # a session of its own, as a batch job's processes are: the SIGTERM goes to every process in it
    return subprocess.Popen([sys.executable, "-m", "tianji_dask", "train", "cartpole_ppo", *args, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_sigterm_while_the_cluster_starts_is_one_line(tmp_path):
    import signal

    proc = _train_in_its_own_session(tmp_path / "run", "--set", "stop.max_seconds=60")
    try:
        first = proc.stdout.readline()
        assert first.startswith("tianji-dask: training cartpole_ppo"), first
        os.killpg(proc.pid, signal.SIGTERM)  # the cluster is starting now
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, rest
    assert "Traceback" not in rest and "Warning" not in rest, rest
    # given up while starting, or (on a fast machine) stopped once started: either way one line says so
    assert rest.endswith("tianji-dask: interrupted (SIGTERM)\n") or "stopped by SIGTERM" in rest, rest


@pytest.mark.slow
def test_sigterm_stops_the_run_cleanly_and_resume_continues_it(tmp_path):
    import re
    import signal

    out = tmp_path / "run"
    proc = _train_in_its_own_session(out, "--set", "stop.target_return=null", "--set", "stop.max_seconds=60")
    seen = []
    try:
        for line in proc.stdout:  # progress lines come every few seconds; wait for one after an update
            seen.append(line)
            m = re.match(r"\[relaxed\] .* version (\d+) ", line)
            if m and int(m.group(1)) > 0:
                break
        os.killpg(proc.pid, signal.SIGTERM)  # as a batch system does at its time limit: every process of the job
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = "".join(seen) + rest
    assert proc.returncode == 143, text
    assert "Traceback" not in text and "finished (no target): stopped by SIGTERM after " in text and f"tianji-dask resume {out}" in text, text
    first = json.loads((out / "results.json").read_text())
    assert first["stop_reason"] == "stopped" and first["error"] is None and first["learner_restarts"] == []
    assert first["updates"] > 0 and list((out / "checkpoints").glob("ckpt-*.pt"))

    # resume goes on from the checkpoint: a budget of some more env steps than the stopped run made
    proc = _cli("resume", str(out), "--quiet", "--set", f"stop.max_env_steps={first['env_steps'] + 20_000}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("tianji-dask: resuming cartpole_ppo from "), proc.stdout
    second = json.loads((out / "results.json").read_text())
    assert second["stop_reason"] == "max_env_steps" and second["error"] is None
    assert second["env_steps"] > first["env_steps"] and second["updates"] > first["updates"]
