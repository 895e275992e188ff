"""environment.yml (conda-forge) and pyproject.toml must ask for the same things."""

import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parent.parent
# PyPI name -> conda-forge name, where they differ
CONDA_NAME = {"torch": "pytorch", "box2d": "box2d-py"}


def _split(req: str) -> tuple[str, str]:
    m = re.match(r"^([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*)$", req.strip())
    return m.group(1).lower().replace("_", "-"), m.group(3).replace(" ", "")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = {}
    for dep in env["dependencies"]:
        if isinstance(dep, str):
            name, spec = _split(dep)
            conda[name] = spec
    for req in project["dependencies"]:
        name, spec = _split(req)
        conda_name = CONDA_NAME.get(name, name)
        assert conda_name in conda, f"environment.yml lacks {conda_name} (pyproject: {req})"
        if name == "box2d":  # conda-forge packages the bindings under another version scheme
            continue
        assert conda[conda_name] == spec, f"{name}: pyproject says {spec!r}, environment.yml {conda[conda_name]!r}"
    pypi_names = {CONDA_NAME.get(_split(r)[0], _split(r)[0]) for r in project["dependencies"]}
    extra = set(conda) - pypi_names - {"python", "pip"}
    assert not extra, f"environment.yml has dependencies pyproject.toml lacks: {sorted(extra)}"


def test_peer_systems_are_not_runtime_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {_split(r)[0] for r in project["dependencies"]}
    assert not names & {"ray", "stable-baselines3"}
