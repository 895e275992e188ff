"""What several test files build the same way: small, exact stand-ins for one part under test."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from tianji_dask.chunk import make_chunk, validate_chunk
from tianji_dask.dataflow.controller.settings import LawSettings


def law_wire(window: int, *, window_min: int = 1, window_max: int = 64, **settings) -> dict:
    """A learner's controller settings as ``tianji_begin`` receives them (``LawSettings.to_wire``);
    unnamed settings at their defaults."""
    if settings.get("replay_ratio") is not None:
        settings["replay_ratio"] = tuple(settings["replay_ratio"])
    return LawSettings(window=window, window_min=window_min, window_max=window_max, **settings).to_wire()


def _episode_flags(rng, T: int, N: int, done_p: float, resetting: np.ndarray):
    """(terminated, truncated, valid) of T steps of N envs: after a terminated or truncated step
    the env's next step is an invalid autoreset step (``resetting``: which start as one)."""
    terminated, truncated, valid = np.zeros((T, N), bool), np.zeros((T, N), bool), np.ones((T, N), bool)
    for t in range(T):
        valid[t] = ~resetting
        u = rng.random(N)
        terminated[t] = valid[t] & (u < done_p / 2)
        truncated[t] = valid[t] & (u >= done_p / 2) & (u < done_p)
        resetting = terminated[t] | truncated[t]
    return terminated, truncated, valid


def hand_chunk(T=6, N=2, seed=0, policy_version=0, extras=None, done_p=0.0):
    """A random chunk of 3-float observations and Discrete(2) actions obeying the schema (an
    autoreset step may come first too)."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(T + 1, N, 3)).astype(np.float32)
    actions = rng.integers(0, 2, size=(T, N))
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    terminated, truncated, valid = _episode_flags(rng, T, N, done_p, rng.random(N) < done_p)
    rewards[~valid] = 0.0
    chunk = make_chunk(obs=obs, actions=actions, rewards=rewards, terminated=terminated, truncated=truncated,
                       valid=valid, extras=extras or {}, explorer_id=0, policy_version=policy_version,
                       t_start=0.0, t_end=1.0, episodes=[])
    validate_chunk(chunk)
    return chunk


def box_chunk(T=8, N=3, seed=0, done_p=0.2, explorer_id=0, extras=None, action_dim=2):
    """A random chunk of 3-float observations (each of its own scale) and Box actions in [-1, 1],
    obeying the schema."""
    rng = np.random.default_rng(seed)
    obs = (rng.normal(size=(T + 1, N, 3)) * [1.0, 5.0, 0.1] + [0.0, 3.0, -1.0]).astype(np.float32)
    terminated, truncated, valid = _episode_flags(rng, T, N, done_p, np.zeros(N, bool))
    rewards = np.where(valid, rng.normal(size=(T, N)), 0.0).astype(np.float32)
    chunk = make_chunk(obs=obs, actions=rng.uniform(-1, 1, (T, N, action_dim)).astype(np.float32), rewards=rewards,
                       terminated=terminated, truncated=truncated, valid=valid, extras=extras or {},
                       explorer_id=explorer_id, policy_version=0, t_start=0.0, t_end=1.0, episodes=[])
    validate_chunk(chunk)
    return chunk


def acted_chunk(algo, seed, policy_version=0, T=8, N=3):
    """A ``hand_chunk`` carrying ``algo``'s behaviour log-probabilities of its actions (PPO's, IMPALA's)."""
    chunk = hand_chunk(T=T, N=N, seed=seed, policy_version=policy_version, done_p=0.2)
    _, ex = algo.act(chunk["obs"][:T].reshape(T * N, 3), {})
    chunk["extra_logprob"] = ex["logprob"].reshape(T, N)
    return chunk


def set_linear(linear: torch.nn.Linear, weight, bias):
    """Set a layer's weights and biases to these values."""
    with torch.no_grad():
        linear.weight.copy_(torch.tensor(weight, dtype=torch.float32))
        linear.bias.copy_(torch.tensor(bias, dtype=torch.float32))


def spawn(args: list[str], log) -> subprocess.Popen:
    """``python -m ARGS``, its output into ``log``."""
    return subprocess.Popen([sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT)


def wait_for(what: str, check, timeout: float, log_path: Path):
    """``check()``'s first truthy value; AssertionError naming ``what``, with the log's end, if
    none comes within ``timeout`` (which only guards a hang)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout:.0f}s\n{log_path.read_text()[-4000:]}")


@contextlib.contextmanager
def external_cluster(log_path: Path):
    """A ``dask scheduler`` (with the tianji preload) and two hand-started workers, one LEARNER and
    one EXPLORER, as separate processes on 127.0.0.1, their output into ``log_path``. Yields
    (scheduler address, the list of processes: scheduler first; append more to have them ended too)."""
    log = open(log_path, "a")  # appended by every writer: a second handle on it overwrites nothing
    procs = [spawn(["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                    "--preload", "tianji_dask.preload"], log)]
    try:
        def scheduler_address():
            m = re.search(r"Scheduler at:\s+(tcp://\S+)", log_path.read_text())
            return m and m.group(1)

        address = wait_for("the scheduler's start", scheduler_address, 60, log_path)
        procs.append(spawn(["distributed.cli.dask_worker", address, "--nthreads", "1", "--no-dashboard",
                            "--resources", "LEARNER=1", "--name", "learner"], log))
        procs.append(spawn(["distributed.cli.dask_worker", address, "--nthreads", "2", "--no-dashboard",
                            "--resources", "EXPLORER=2", "--name", "explorer"], log))
        yield address, procs
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def cli(capsys, *args) -> tuple[int, str, str]:
    """The CLI run in this process, as the program runs it: (exit status, stdout, stderr). A
    refusal of argparse's own exits as it would in the program."""
    from tianji_dask.cli import main

    try:
        code = main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def cycles(graph: dict[str, list[str] | set[str]]) -> list[str]:
    """The import cycles of ``graph`` (a module -> the modules it imports), each as "a -> b -> a"."""
    state, found = {}, []

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return found
