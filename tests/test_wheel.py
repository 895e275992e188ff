"""The built wheel is a whole install: built from this checkout, installed into a fresh virtual
environment (its dependencies borrowed from this one, nothing fetched), it lists and trains a
bundled pipeline from a folder far from the source tree."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(cmd, **kwargs):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=240, **kwargs)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_the_wheel_installed_elsewhere_trains_a_bundled_pipeline(tmp_path):
    source = tmp_path / "source"  # setuptools builds inside the source tree: a copy keeps the checkout clean
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", ".peers-venv", "build", "dist", "runs",
                                                               "artifacts", "*.egg-info", "__pycache__", "benchmarks"))
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, source])
    wheel, = dist.glob("tianji_dask-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    assert "tianji_dask/py.typed" in shipped, "the wheel lacks the py.typed marker: type checkers would ignore its hints"
    assert any(name.split("/")[0].endswith(".dist-info") and name.endswith("/LICENSE") for name in shipped), \
        "the wheel lacks the LICENSE"
    fresh = tmp_path / "fresh"
    _run([sys.executable, "-m", "venv", "--without-pip", fresh])
    python = fresh / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel])
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # the dependencies: this environment's packages, after the fresh one's (so its tianji_dask wins)
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    where = _run([python, "-c", "import tianji_dask; print(tianji_dask.__file__)"], cwd=elsewhere, env=env).stdout.strip()
    assert Path(where).is_relative_to(site), f"tianji_dask came from {where}, not the wheel"

    listed = _run([fresh / "bin" / "tianji-dask", "pipelines"], cwd=elsewhere, env=env).stdout
    bundled = sorted(p.stem for p in (ROOT / "pipelines").glob("*.yaml"))
    assert [line.split()[0] for line in listed.splitlines()[1:]] == bundled

    # RL Zoo's hyperparameters are package data: --env/--algo reads them from the installed wheel
    shown = _run([fresh / "bin" / "tianji-dask", "show", "--env", "Acrobot-v1", "--algo", "ppo"], cwd=elsewhere, env=env)
    assert "using RL Zoo's hyperparameters for Acrobot-v1" in shown.stderr, shown.stderr

    _run([fresh / "bin" / "tianji-dask", "train", "cartpole_ppo", "--max-seconds", "60", "--out", "run", "--quiet"],
         cwd=elsewhere, env=env)
    results = json.loads((elsewhere / "run" / "results.json").read_text())
    assert results["pipeline"] == "cartpole_ppo" and results["mode"] == "relaxed" and results["error"] is None
    assert results["env_steps"] > 0
