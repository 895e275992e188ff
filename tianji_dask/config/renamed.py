"""Fields renamed so that each word has one meaning (docs/design.md, "Words"): the old dotted name,
the new one. A pipeline (its YAML, and ``overrides`` / ``--set``) may still give an old name: it is
read as the new one and says so once, in one line; giving both names is an error. An old run
folder's ``pipeline.yaml`` loads and resumes as before."""

from __future__ import annotations

from typing import Any

from tianji_dask.errors import PipelineError

#: old dotted name -> new dotted name (the same section: only the last part changes)
RENAMED: dict[str, str] = {
    "stop.window": "stop.mean_episodes",  # "window" is the controller's bound on tasks in flight
    "checkpoint.replay": "checkpoint.replay_buffer",  # "replay" alone also names exact replay and the replay ratio
}

_said: set[str] = set()  # the old names already said in this process


def _say_once(old: str) -> None:
    if old in _said:
        return
    _said.add(old)
    from tianji_dask.run.quiet import say

    say(f"{old} is now {RENAMED[old]}; the old name still works and will be removed")


def _both(old: str) -> PipelineError:
    return PipelineError(f"{RENAMED[old]}: given both by this name and by its old name {old}; "
                         f"allowed: one of them, {RENAMED[old]}")


def _renamed_in(tree: dict, prefix: str) -> dict:
    """``tree`` (the mapping at dotted ``prefix``; "" for the pipeline) with every old name in it
    or below it read as the new one."""
    out: dict = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        new = RENAMED.get(dotted)
        if new is not None:
            new_key = new.rpartition(".")[2]
            if new_key in tree:
                raise _both(dotted)
            _say_once(dotted)
            key, dotted = new_key, new
        if isinstance(value, dict) and any(old.startswith(f"{dotted}.") for old in RENAMED):
            value = _renamed_in(value, f"{dotted}.")
        out[key] = value
    return out


def renamed(data: Any) -> Any:
    """A pipeline's mapping (as loaded from YAML) with the old names read as the new ones; said
    once per old name; PipelineError in one line when a mapping gives both names."""
    return _renamed_in(data, "") if isinstance(data, dict) else data


def renamed_overrides(overrides: dict) -> dict:
    """Dotted ``overrides`` (``{"stop.window": 5}``, ``{"stop": {"window": 5}}``) with the old
    names read as the new ones, in the order given; PipelineError when both names are given."""
    out: dict = {}
    for key, value in overrides.items():
        new = RENAMED.get(key)
        if new is not None:
            if new in overrides:
                raise _both(key)
            _say_once(key)
            key = new
        if isinstance(value, dict):
            value = _renamed_in(value, f"{key}.")
        out[key] = value
    return out


def old_names(paths) -> dict[str, str]:
    """{old dotted name: new} for the renamed fields whose new name is among ``paths``: where a
    misspelling may have aimed (the did-you-mean of an unknown key names the new one)."""
    paths = set(paths)
    return {old: new for old, new in RENAMED.items() if new in paths}
