"""The documentation stays true: the generated reference matches the code, every page's relative
links and anchors resolve, the README's commands are the ones CI runs, and every table that lists
something the code has (bundled pipelines, CLI commands and flags, extras, notebooks, the public
API, callback hooks) lists what the code has today. Fast, no cluster."""

import contextlib
import importlib
import io
import re
import tomllib
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


#: how CI builds the docs site (Sphinx, MyST, autodoc), warnings as errors
DOCS_BUILD = ".venv/bin/sphinx-build -W --keep-going -b html docs docs/_build/html"


def _ci_steps() -> list[str]:
    """.ci/run's commands in order: each ``&&`` step of each line, comments left out."""
    steps = []
    for line in (ROOT / ".ci" / "run").read_text().splitlines():
        line = line.split(" #")[0].strip()
        if line and not line.startswith("#"):
            steps += [step.strip() for step in line.split(" && ")]
    return steps


def test_readme_commands_are_the_ones_ci_runs():
    commands = _readme_commands()
    assert commands["train"] == ("python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e . "
                                 "&& .venv/bin/tianji-dask train cartpole_ppo")
    readme = commands["test"].split(" && ")
    steps = _ci_steps()
    # CI ends with the README's steps in their order, the docs build between the install and the tests
    assert steps[-len(readme) - 1:] == [*readme[:-1], DOCS_BUILD, readme[-1]], \
        f".ci/run ends with {steps[-len(readme) - 1:]}, not the README's test command {commands['test']!r} around {DOCS_BUILD!r}"
    assert f"```bash\n{DOCS_BUILD}\n```" in (DOCS / "install.md").read_text(), "install.md shows another docs build than CI's"


# ---- tables that list what the code has ---------------------------------------------------------

def _section(path: Path, heading: str) -> str:
    """The text of the ``## `` section of ``path`` whose heading starts with ``heading`` (without
    its ``## ``), up to the next ``## `` heading."""
    text = path.read_text()
    start = re.search(rf"^## {re.escape(heading)}.*$", text, re.M)
    assert start, f"{path.relative_to(ROOT)} has no section '## {heading}'"
    end = re.search(r"^## ", text[start.end():], re.M)
    return text[start.start():start.end() + end.start() if end else len(text)]


def _rows(text: str) -> list[list[str]]:
    """The cells of each body row of the markdown tables in ``text`` (an escaped ``\\|`` stays in its cell)."""
    rows = []
    for line in text.splitlines():
        if re.fullmatch(r"\|[-:| ]+\|", line.strip()):
            rows.pop()  # the row above a table's separator is its header
        elif line.startswith("|"):
            rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def _code(text: str) -> list[str]:
    """The inline code spans of ``text``."""
    return re.findall(r"`([^`]+)`", text)


def test_table_helpers_read_cells_and_sections(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n## One `x`\n\n| a | b |\n|---|---|\n| `p\\|q` | `r`, `s` |\n\n"
                    "| c |\n|---|\n| d |\n\n## Two\n\ntext\n")
    one = _section(page, "One")
    assert "## Two" not in one and _rows(one) == [["`p\\|q`", "`r`, `s`"], ["d"]]
    assert _code(_rows(one)[0][1]) == ["r", "s"]


BUNDLED = sorted(p.stem for p in (ROOT / "pipelines").glob("*.yaml"))


def test_every_bundled_pipeline_is_in_the_pipelines_table():
    listed = [_code(row[0])[0] for row in _rows(_section(DOCS / "pipelines.md", "Bundled pipelines"))]
    assert sorted(listed) == BUNDLED, (f"docs/pipelines.md's table of bundled pipelines: missing {sorted(set(BUNDLED) - set(listed))}, "
                                       f"not in pipelines/ {sorted(set(listed) - set(BUNDLED))}")


def test_every_bundled_pipeline_is_named_in_the_cli_page():
    train = _section(DOCS / "cli.md", "`tianji-dask train")
    paragraph = next(p for p in train.split("\n\n") if "bundled one" in p)
    listed = [name for name in _code(paragraph) if re.fullmatch(r"[a-z0-9_]+", name)]
    assert sorted(listed) == BUNDLED, (f"docs/cli.md's list of bundled pipelines: missing {sorted(set(BUNDLED) - set(listed))}, "
                                       f"not in pipelines/ {sorted(set(listed) - set(BUNDLED))}")


def _cli_help(*args: str) -> str:
    """What ``tianji-dask ARGS --help`` prints, through the entry point pyproject.toml installs."""
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["tianji-dask"]
    module, _, name = entry.partition(":")
    main = getattr(importlib.import_module(module), name)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        main([*args, "--help"])
    assert exited.value.code == 0, f"tianji-dask {' '.join(args)} --help exited {exited.value.code}"
    return re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())  # without colours, where argparse adds them


def _cli_commands() -> list[str]:
    return re.search(r"\{([a-z,-]+)\}", _cli_help()).group(1).split(",")


def _cli_flags(command: str) -> set[str]:
    """The long flags of ``tianji-dask COMMAND`` (without --help), read from its --help."""
    flags = set()
    for line in _cli_help(command).splitlines():
        if re.match(r"  -", line):  # an option's line; its help text, if on the line, follows two spaces
            flags |= set(re.findall(r"(?:^|, )(--[a-z][a-z0-9-]*)", line.strip().split("  ")[0]))
    return flags - {"--help"}


def _cli_sections() -> dict[str, str]:
    """docs/cli.md's section of each command, by the command's name."""
    text = _prose((DOCS / "cli.md").read_text())
    return {m.group(1): _section(DOCS / "cli.md", f"`tianji-dask {m.group(1)}")
            for m in re.finditer(r"^## `tianji-dask ([a-z-]+)", text, re.M)}


def test_cli_help_is_read():
    assert {"train", "resume", "eval"} <= set(_cli_commands())
    assert {"--explorers", "--max-seconds", "--set", "--quiet"} <= _cli_flags("train")


def test_cli_overview_lists_every_command():
    overview = FENCE.search((DOCS / "cli.md").read_text()).group(0)
    listed = re.findall(r"^tianji-dask ([a-z-]+)", overview, re.M)
    commands = _cli_commands()
    assert sorted(listed) == sorted(commands), (f"docs/cli.md's overview: missing {sorted(set(commands) - set(listed))}, "
                                                f"no such command {sorted(set(listed) - set(commands))}")


def test_every_cli_command_has_its_section():
    sections, commands = _cli_sections(), _cli_commands()
    assert sorted(sections) == sorted(commands), (f"docs/cli.md: no section for {sorted(set(commands) - set(sections))}, "
                                                  f"a section for no command {sorted(set(sections) - set(commands))}")


def test_every_cli_flag_is_in_its_commands_table():
    problems = []
    for command, section in _cli_sections().items():
        flags = _cli_flags(command)
        heading, rows = section.splitlines()[0], _rows(section)
        documented = set(re.findall(r"--[a-z][a-z0-9-]*", heading + " ".join(" ".join(row) for row in rows)))
        tabled = set(re.findall(r"--[a-z][a-z0-9-]*", " ".join(row[0] for row in rows)))
        if flags - documented:
            problems.append(f"{command}: {sorted(flags - documented)} not in its heading or table")
        if tabled - flags:
            problems.append(f"{command}: its table lists {sorted(tabled - flags)}, which it does not take")
    assert not problems, "docs/cli.md: " + "; ".join(problems)


def _requirement_name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0).lower().replace("_", "-")


def test_extras_table_matches_pyproject():
    declared = {name: {_requirement_name(r) for r in reqs}
                for name, reqs in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"].items()}
    listed = {}
    for row in _rows(_section(DOCS / "install.md", "Optional extras")):
        name = re.fullmatch(r"`\[([a-z0-9-]+)\]`", row[0]).group(1)
        listed[name] = {code.lower() for code in _code(row[1])}
    assert sorted(listed) == sorted(declared), (f"docs/install.md's extras: missing {sorted(set(declared) - set(listed))}, "
                                                f"not in pyproject.toml {sorted(set(listed) - set(declared))}")
    wrong = {name: (sorted(listed[name]), sorted(declared[name])) for name in declared if listed[name] != declared[name]}
    assert not wrong, f"docs/install.md's extras add other packages than pyproject.toml's (listed, declared): {wrong}"


NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
           "ten": 10, "eleven": 11, "twelve": 12}


def test_quickstart_counts_and_lists_the_notebooks():
    notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    section = _section(DOCS / "quickstart.md", "Notebooks")
    counts = re.findall(r"`notebooks/` has (\w+)|all (\w+)\)", section)
    assert counts and all(NUMBERS.get(word) == len(notebooks) for pair in counts for word in pair if word), \
        f"docs/quickstart.md counts {counts}; notebooks/ has {len(notebooks)}"
    listed = sorted(code for code in _code(section) if code.endswith(".ipynb"))
    assert listed == notebooks, f"docs/quickstart.md lists {listed}; notebooks/ has {notebooks}"


def test_api_reference_documents_every_public_name():
    import tianji_dask

    documented = set(re.findall(r"^\.\. auto\w+:: tianji_dask\.(\w+)$", (DOCS / "api.md").read_text(), re.M))
    missing = set(tianji_dask.__all__) - documented
    assert not missing, f"docs/api.md documents no {sorted(missing)} (tianji_dask.__all__)"


def test_docs_site_lists_every_page():
    toctrees = re.findall(r"^```\{toctree\}\n(.*?)^```", (DOCS / "index.md").read_text(), re.S | re.M)
    listed = {line.strip() for tree in toctrees for line in tree.splitlines() if line.strip() and not line.startswith(":")}
    pages = {p.stem for p in DOCS.glob("*.md")} - {"index"}
    assert listed == pages, f"docs/index.md's toctrees: missing {sorted(pages - listed)}, no such page {sorted(listed - pages)}"


def test_callback_hooks_table_lists_every_hook():
    from tianji_dask import Callback

    hooks = {name for name in vars(Callback) if not name.startswith("_")}
    listed = {re.match(r"(\w+)", code).group(1) for row in _rows(_section(DOCS / "extending.md", "Callbacks and loggers"))
              for code in _code(row[0])}
    assert listed == hooks, f"docs/extending.md's hooks: missing {sorted(hooks - listed)}, no such hook {sorted(listed - hooks)}"


def test_algorithm_contract_table_names_real_methods():
    from tianji_dask import Algorithm

    listed = {re.match(r"(\w+)", code).group(1) for row in _rows(_section(DOCS / "extending.md", "Write an algorithm"))
              for code in _code(row[1])}
    assert Algorithm.__abstractmethods__ <= listed, \
        f"docs/extending.md's contract table leaves out {sorted(Algorithm.__abstractmethods__ - listed)}"
    unknown = {name for name in listed if not hasattr(Algorithm, name)}
    assert not unknown, f"docs/extending.md's contract table names {sorted(unknown)}, which Algorithm has not"
