"""What several test files build the same way: small, exact stand-ins for one part under test."""

from __future__ import annotations

from tianji_dask.dataflow.controller.settings import LawSettings


def law_wire(window: int, *, window_min: int = 1, window_max: int = 64, **settings) -> dict:
    """A learner's controller settings as ``tianji_begin`` receives them (``LawSettings.to_wire``);
    unnamed settings at their defaults."""
    if settings.get("replay_ratio") is not None:
        settings["replay_ratio"] = tuple(settings["replay_ratio"])
    return LawSettings(window=window, window_min=window_min, window_max=window_max, **settings).to_wire()


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
