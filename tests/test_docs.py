"""The user guide stays true: the generated reference matches the code, relative links resolve,
and the README's commands are the ones CI runs. Fast, no cluster."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: the README and the user guide; their links (to design.md and benchmarks.md too) must resolve
GUIDE = [ROOT / "README.md"] + [DOCS / f"{name}.md" for name in
                                ("install", "quickstart", "cli", "pipelines", "configuration", "clusters", "watching", "results")]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.S | re.M)


def _prose(text: str) -> str:
    """Markdown without its fenced code blocks."""
    return FENCE.sub("", text)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file."""
    anchors = set()
    for line in _prose(path.read_text()).splitlines():
        heading = re.match(r"#+\s+(.*)", line)
        if heading:
            anchors.add(re.sub(r"[^a-z0-9 _-]", "", heading.group(1).lower()).replace(" ", "-"))
    return anchors


def test_configuration_reference_is_current():
    from tianji_dask.config.doc import REGENERATE, render

    written = (DOCS / "configuration.md").read_text()
    assert written == render(), f"docs/configuration.md is out of date with the config models; regenerate it: {REGENERATE}"


@pytest.mark.parametrize("page", GUIDE, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target} (no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest in GUIDE and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {', '.join(broken)}"


def _readme_commands() -> dict[str, str]:
    commands = [line.strip() for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("python3 -m venv")]
    return {"train": next(c for c in commands if "tianji-dask train" in c), "test": next(c for c in commands if c.endswith("pytest"))}


def test_readme_commands_are_the_ones_ci_runs():
    commands = _readme_commands()
    assert commands["train"] == ("python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e . "
                                 "&& .venv/bin/tianji-dask train cartpole_ppo")
    last = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()][-1]
    assert commands["test"] in last, f".ci/run's last line runs {last!r}, not the README's test command {commands['test']!r}"
