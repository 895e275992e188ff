"""The controller's settings come from one declaration (``dataflow.settings``): the pipeline's
model and its reference page, the live configure of the books and of ``Run.configure``, and the
window floor. A rule broken live and in a pipeline reads the same line."""

import annotated_types as at
import pytest

from tianji_dask.config import PipelineError, load_pipeline
from tianji_dask.config.doc import render
from tianji_dask.config.sections import ControllerConfig
from tianji_dask.dataflow.controller.plugin import StalenessController
from tianji_dask.dataflow.controller.settings import BY_NAME, LIVE, SETTINGS
from tianji_dask.run import Run
from helpers import law_wire

#: a value each live setting may take on cartpole_ppo's books (one chunk per update)
GOOD = {"window": 3, "staleness_target": 2.0, "window_min": 2, "window_max": 8, "gain": 0.3, "replay_ratio": [1, 2],
        "replay_staleness_target": 50.0, "max_staleness": 4}
BOUNDS = {at.Ge: "ge", at.Gt: "gt", at.Le: "le", at.Lt: "lt"}


def _books():
    """Books with a replay-ratio band (a replay staleness target needs one to move the ratio within)."""
    ctl = StalenessController()
    ctl.begin("r", law_wire(window=2, window_min=1, window_max=16, replay_ratio=[4, 8]))
    return ctl


def test_every_setting_is_a_field_of_the_model_with_its_type_default_and_bounds():
    fields = ControllerConfig.model_fields
    assert list(fields) == [s.name for s in SETTINGS]
    for s in SETTINGS:
        f = fields[s.name]
        bounds = {BOUNDS[type(m)]: getattr(m, BOUNDS[type(m)]) for m in f.metadata if type(m) in BOUNDS}
        assert (f.annotation, f.default, f.description, bounds) == (s.kind, s.default, s.description, s.bounds), s.name
    assert ControllerConfig().model_dump() == {s.name: s.default for s in SETTINGS}


def test_the_reference_page_shows_every_setting_and_names_the_live_ones():
    page = render()
    section = page[page.index("## controller\n"):page.index("## learner\n")]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [s.name for s in SETTINGS]
    for s, row in zip(SETTINGS, rows):
        assert row.endswith(f" {s.description} |")
    assert "changes " + ", ".join(f"`{n}`" for n in LIVE[:-1]) + f" and `{LIVE[-1]}` with `run.configure(...)`" in section


def test_the_live_settings_are_exactly_what_run_configure_and_the_books_accept():
    assert set(GOOD) == set(LIVE) == set(BY_NAME)  # every setting may change live today
    run = Run("cartpole_ppo")
    for name in LIVE:  # past the checks of its name and value, to the cluster it has not got
        with pytest.raises(RuntimeError, match="^configure: this run has no cluster"):
            run.configure(**{name: GOOD[name]})
        ctl = _books()
        assert ctl.configure("r", **{name: GOOD[name]})[name] == GOOD[name]
        assert ctl.books("r").params().params_version == 1
    refused = f"^chunk_steps: unknown setting; allowed: {', '.join(LIVE)}$"
    with pytest.raises(ValueError, match=refused):
        run.configure(chunk_steps=8)
    ctl = _books()
    with pytest.raises(ValueError, match=refused):
        ctl.configure("r", chunk_steps=8)
    assert set(ctl.books("r").settings()) == set(LIVE) and ctl.books("r").params().params_version == 0


@pytest.mark.parametrize("settings", [
    {"window": 0}, {"window_min": 0}, {"window_max": 0}, {"staleness_target": -1}, {"gain": 3}, {"gain": 0},
    {"max_staleness": -2}, {"replay_ratio": [4, 2]}, {"replay_ratio": [0, 0]}, {"window": 2.5},
    {"window_min": 5, "window_max": 2}, {"replay_staleness_target": 5, "replay_ratio": None},
    {"replay_staleness_target": -1},
])
def test_a_rule_broken_live_and_in_a_pipeline_reads_the_same_line(settings):
    with pytest.raises(ValueError) as live:
        _books().configure("r", **settings)
    with pytest.raises(PipelineError) as pipeline:
        load_pipeline("cartpole_ppo", overrides={f"controller.{k}": v for k, v in settings.items()})
    assert str(pipeline.value) == f"controller.{live.value}"
    assert next(iter(settings)) == str(live.value).partition(":")[0] and "\n" not in str(live.value)


@pytest.mark.parametrize("name", [s.name for s in SETTINGS if s.floored])
def test_the_window_floor_reads_the_same_line_live_and_in_a_pipeline(name):
    floor = {"algo.config.segments_per_batch": 3}
    with pytest.raises(ValueError) as live:
        Run("cartpole_ppo", overrides=floor).configure(**{name: 2})
    with pytest.raises(PipelineError) as pipeline:
        Run("cartpole_ppo", overrides={**floor, f"controller.{name}": 2})
    assert str(live.value) == f"{name}: must be >= 3, the chunks one ppo update needs (a smaller window deadlocks; got 2)"
    assert str(pipeline.value) == f"controller.{live.value}"


def test_law_settings_resolve_every_default_the_replay_band_included():
    from tianji_dask.dataflow.controller.settings import LawSettings

    given = ControllerConfig().model_dump()  # every setting at its default: replay_ratio auto
    resolve = dict(relaxed=True, explorers=2, chunks_per_update=1)
    assert LawSettings.resolve(given, **resolve, own_replay_ratio=16.0).replay_ratio == (8.0, 32.0)  # [r/2, 2r]
    assert LawSettings.resolve(given, **resolve).replay_ratio is None  # an algorithm that does not replay
    band = {**given, "replay_ratio": (1, 4)}
    assert LawSettings.resolve(band, **resolve, own_replay_ratio=16.0).replay_ratio == (1.0, 4.0)
    assert LawSettings.resolve({**given, "replay_ratio": None}, **resolve, own_replay_ratio=16.0).replay_ratio is None
    law = LawSettings.resolve(given, **resolve, own_replay_ratio=16.0)
    assert (law.window, law.window_min, law.window_max, law.gain) == (2, 1, 16, BY_NAME["gain"].default)
    lockstep = LawSettings.resolve(given, relaxed=False, explorers=3, chunks_per_update=1, own_replay_ratio=16.0)
    assert (lockstep.window, lockstep.window_min, lockstep.window_max, lockstep.replay_ratio) == (3, 3, 3, None)
    assert LawSettings.from_wire(law.to_wire()) == law
    assert list(law.values()) == [s.name for s in SETTINGS] and law.values()["replay_ratio"] == [8.0, 32.0]
