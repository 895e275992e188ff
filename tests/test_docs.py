"""The documentation stays true: the generated reference matches the code, every page's relative
links and anchors resolve, and the README's commands are the ones CI runs. Fast, no cluster."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: every markdown page: the README and all of docs/ (a page added later is checked without being listed)
PAGES = [ROOT / "README.md"] + sorted(DOCS.rglob("*.md"))

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.S | re.M)


def _prose(text: str) -> str:
    """Markdown without its fenced code blocks."""
    return FENCE.sub("", text)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file (a repeated heading's get -1, -2, ...)."""
    anchors: set[str] = set()
    for line in _prose(path.read_text()).splitlines():
        heading = re.match(r"#+\s+(.*)", line)
        if heading:
            anchor = re.sub(r"[^a-z0-9 _-]", "", heading.group(1).strip().lower()).replace(" ", "-")
            n, unique = 0, anchor
            while unique in anchors:
                n += 1
                unique = f"{anchor}-{n}"
            anchors.add(unique)
    return anchors


def test_every_markdown_page_is_link_checked():
    # the pages the guide links to and the ones beside it: none is left out by a list kept by hand
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/design.md", "docs/benchmarks.md", "docs/sweeps.md", "docs/evaluation.md"} <= names


def test_configuration_reference_is_current():
    from tianji_dask.config.doc import REGENERATE, render

    written = (DOCS / "configuration.md").read_text()
    assert written == render(), f"docs/configuration.md is out of date with the config models; regenerate it: {REGENERATE}"


def _broken(page: Path) -> list[str]:
    """The relative links of ``page`` (outside code blocks) to no file, or to no heading of a page."""
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target} (no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    broken = _broken(page)
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {', '.join(broken)}"


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n[ok](other.md#other-page) [again](other.md#twice-1) [here](#a-page)\n"
                    "[gone](nowhere.md) [no heading](other.md#nowhere) [nor here](#nothing)\n\n"
                    "```\n[in code](not-checked.md)\n```\n")
    assert [b.split(" ")[0] for b in _broken(page)] == ["nowhere.md", "other.md#nowhere", "#nothing"]


def _readme_commands() -> dict[str, str]:
    commands = [line.strip() for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("python3 -m venv")]
    return {"train": next(c for c in commands if "tianji-dask train" in c), "test": next(c for c in commands if c.endswith("pytest"))}


def test_readme_commands_are_the_ones_ci_runs():
    commands = _readme_commands()
    assert commands["train"] == ("python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e . "
                                 "&& .venv/bin/tianji-dask train cartpole_ppo")
    last = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()][-1]
    assert commands["test"] in last, f".ci/run's last line runs {last!r}, not the README's test command {commands['test']!r}"
