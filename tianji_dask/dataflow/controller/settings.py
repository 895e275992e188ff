"""The staleness controller's settings, each declared once: type, bounds, default, what it does,
whether a running run may change it, and the rules between settings.

From ``SETTINGS`` come the pipeline's ``controller`` section (``config.sections.ControllerConfig``,
and from it docs/configuration.md), the live checks of the books (the scheduler's configure
handler), the settings ``Run.configure`` accepts and the window floor. A rule broken live reads
as one line naming the setting; broken in a pipeline, the same line after ``controller.``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, ValidationError


def replay_band(value) -> str | None:
    """What is wrong with a [min, max] replay-ratio band (None: nothing)."""
    if isinstance(value, (tuple, list)):
        lo, hi = value
        if not (0 <= lo <= hi) or hi <= 0:
            return "must be [min, max] with 0 <= min <= max and max > 0"
    return None


@dataclass(frozen=True)
class Setting:
    """One controller setting. ``kind``: its type in a pipeline; ``live_kind``: on a running run,
    when narrower. ``bounds``: pydantic's ``ge``/``gt``/``le``. ``off``: None switches it off, in a
    pipeline and live; otherwise None is the default in a pipeline and leaves it as it is live.
    ``live``: ``configure`` may change it while the run goes on. ``floored``: at least the chunks
    one update needs in relaxed mode. ``rule``: what else is wrong with a value (None: nothing)."""

    name: str
    kind: Any
    default: Any
    description: str
    bounds: dict = field(default_factory=dict)
    off: bool = False
    live: bool = True
    floored: bool = False
    live_kind: Any = None
    rule: Callable[[Any], str | None] | None = None

    def field(self):
        """The pipeline model's field."""
        return Field(self.default, description=self.description, **self.bounds)


#: window_max's default: at least this many chunks in flight, and this many per explorer stream
WINDOW_MAX_FLOOR = 16
WINDOW_MAX_PER_EXPLORER = 4

SETTINGS: tuple[Setting, ...] = (
    Setting("window", int | None, None, "chunks in flight (initial value under a target); default: one per explorer, under a target the "
            "target x the chunks one update needs",
            {"ge": 1}, floored=True),
    Setting("staleness_target", float | None, None, "mean staleness (versions) to hold; null: fixed window",
            {"ge": 0}, off=True),
    Setting("window_min", int | None, None, "default: the chunks one update needs", {"ge": 1}, floored=True),
    Setting("window_max", int | None, None, f"default: max({WINDOW_MAX_FLOOR}, {WINDOW_MAX_PER_EXPLORER} x explorers)",
            {"ge": 1}, floored=True),
    Setting("gain", float, 0.5, "fraction of the staleness error corrected per control period (the window's, and "
            "the replay ratio's in log terms under replay_staleness_target)", {"gt": 0, "le": 2}),
    Setting("replay_ratio", tuple[float, float] | Literal["auto"] | None, "auto",
            "[min, max] samples trained per env step (replaying algorithms); auto: [r/2, 2r] for the algorithm's own "
            "ratio r; null: no pacing (the learner keeps to r)", off=True, live_kind=tuple[float, float] | None,
            rule=replay_band),
    Setting("replay_staleness_target", float | None, None,
            "mean replay staleness (versions from a sample's policy to the update that trains on it) to hold by moving "
            "the replay ratio within replay_ratio's band (replaying algorithms); null: the band as it is",
            {"ge": 0}, off=True),
    Setting("max_staleness", int | None, None, "drop (and count) chunks staler than this; null: keep all",
            {"ge": 0}, off=True),
)
BY_NAME = {s.name: s for s in SETTINGS}
#: what a running run's configure may change
LIVE = tuple(s.name for s in SETTINGS if s.live)


def window_order(values: dict) -> str | None:
    """window_min <= window_max, each when given: the line when not (None: they agree)."""
    w_min, w_max = values.get("window_min"), values.get("window_max")
    if w_min is not None and w_max is not None and w_min > w_max:
        return f"window_min: must be <= window_max (got window_min {w_min}, window_max {w_max})"
    return None


def replay_target_band(values: dict) -> str | None:
    """A replay staleness target moves the replay ratio within its band: none, none to move."""
    if values.get("replay_staleness_target") is not None and "replay_ratio" in values and values["replay_ratio"] is None:
        return ("replay_staleness_target: needs a replay_ratio band to move the replay ratio within "
                "(got replay_ratio null)")
    return None


#: the rules between settings, each giving its one line (None: kept)
RULES: tuple[Callable[[dict], str | None], ...] = (window_order, replay_target_band)


def model_fields() -> dict[str, tuple[Any, Any]]:
    """Every setting as ``pydantic.create_model`` takes a field: (type, Field)."""
    return {s.name: (s.kind, s.field()) for s in SETTINGS}


def check_rules(values: dict) -> None:
    """ValueError, the broken rule's line, when ``values`` break a rule between settings."""
    for rule in RULES:
        line = rule(values)
        if line:
            raise ValueError(line)


@cache
def _adapter(name: str) -> TypeAdapter:
    s = BY_NAME[name]
    return TypeAdapter(Annotated[s.live_kind or s.kind, Field(**s.bounds)])


def read_live(settings: dict) -> dict:
    """``settings`` for a running run's configure, read as their types: the ones that change
    something (None is dropped where it does not switch the setting off). ValueError, one line
    naming the first setting not allowed or out of its bounds."""
    unknown = [name for name in settings if name not in LIVE]
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown setting; allowed: {', '.join(LIVE)}")
    out = {}
    for name, given in settings.items():
        s = BY_NAME[name]
        if given is None and not s.off:
            continue
        try:
            value = _adapter(name).validate_python(given)
        except ValidationError as err:  # as the pipeline's line reads it (config.validation.one_line)
            raise ValueError(f"{name}: {err.errors()[0]['msg']} (got {given!r})") from None
        problem = s.rule(value) if s.rule is not None else None
        if problem:
            raise ValueError(f"{name}: {problem} (got {given!r})")
        out[name] = value
    return out


def check_live(settings: dict, current: dict) -> dict:
    """``read_live``, then the rules between settings over ``current`` (the settings now) with
    these applied: the values to apply, or ValueError naming the first wrong one."""
    values = read_live(settings)
    check_rules({**current, **values})
    return values


def window_floor(values: dict, floor: int, label: str) -> None:
    """ValueError, one line, when a floored setting in ``values`` is below ``floor``, the chunks
    one ``label`` update needs: on-policy chunks hold their credit until trained on, so a smaller
    window deadlocks."""
    for s in SETTINGS:
        value = values.get(s.name)
        if s.floored and value is not None and value < floor:
            raise ValueError(f"{s.name}: must be >= {floor}, the chunks one {label} update needs "
                             f"(a smaller window deadlocks; got {value})")


def replay_band_of(given, own_ratio: float | None) -> tuple[float, float] | None:
    """The [min, max] band a pipeline's ``replay_ratio`` (``given``) resolves to for an algorithm
    whose own ratio is ``own_ratio`` (samples trained per env step; None: it does not replay, so
    nothing to pace): ``auto`` is [r/2, 2r] around it, null no pacing."""
    if own_ratio is None or given is None:
        return None
    return (own_ratio / 2, 2 * own_ratio) if given == "auto" else (given[0], given[1])


@dataclass(frozen=True)
class LawSettings:
    """One learner's controller settings with every default filled in (``resolve``): built once
    from the pipeline, carried in the learner's spec, held by its books (``configured`` on a live
    change). On the scheduler's RPC it travels as a plain dict (``to_wire``)."""

    window: int
    window_min: int
    window_max: int
    staleness_target: float | None = None
    gain: float = BY_NAME["gain"].default
    #: [min, max] samples trained per env step (the algorithm's own band resolved); None: no pacing
    replay_ratio: tuple[float, float] | None = None
    replay_staleness_target: float | None = None
    max_staleness: int | None = None
    #: the explorers' env steps carry a simulated cost (the dashboard and metrics say so)
    simulated: bool = False

    def __post_init__(self):
        # as the laws hold them: a band from the wire (a list) or from configure reads as floats
        band = self.replay_ratio
        object.__setattr__(self, "replay_ratio", None if band is None else (float(band[0]), float(band[1])))
        object.__setattr__(self, "gain", float(self.gain))
        if self.replay_staleness_target is not None:
            object.__setattr__(self, "replay_staleness_target", float(self.replay_staleness_target))

    @classmethod
    def resolve(cls, given: dict, *, relaxed: bool, explorers: int, chunks_per_update: int,
                own_replay_ratio: float | None = None, simulated: bool = False) -> "LawSettings":
        """From a pipeline's ``controller`` values (``given``, its settings as declared above) and
        what the run's checks found of the algorithm: the chunks one update needs and its own
        replay ratio (None: it does not replay). ``relaxed``: False for lockstep, whose round asks
        one chunk per explorer, so its window is the explorer count and nothing moves it."""
        if not relaxed:
            return cls(window=explorers, window_min=explorers, window_max=explorers, simulated=simulated)
        values = {s.name: given.get(s.name, s.default) for s in SETTINGS}
        w_min = values["window_min"] or chunks_per_update
        w_max = values["window_max"] or max(WINDOW_MAX_FLOOR, WINDOW_MAX_PER_EXPLORER * explorers, w_min)
        target, window = values["staleness_target"], values["window"]
        if window is None:
            window = explorers
            if target is not None:
                # mean staleness ~ (window - 1) x updates per chunk (1 / chunks per update): a chunk waits on the
                # others in flight, and a window of one trains each chunk before the next is admitted (staleness
                # 0). Start there, so the law's first periods do not spend the run far from the target
                window = min(round(target * chunks_per_update) + 1, w_max)
        return cls(**{**values, "window": max(window, w_min), "window_min": w_min, "window_max": w_max,
                      "replay_ratio": replay_band_of(values["replay_ratio"], own_replay_ratio)}, simulated=simulated)

    def configured(self, values: dict) -> "LawSettings":
        """These settings with ``values`` (``check_live``'s, by the names declared above) applied."""
        return replace(self, **values)

    def values(self, window: int | None = None) -> dict:
        """Every setting declared above, as the books answer it (the band as a list); ``window``:
        the window now, where a law has moved it from the one set."""
        out = {s.name: getattr(self, s.name) for s in SETTINGS}
        out["replay_ratio"] = None if self.replay_ratio is None else list(self.replay_ratio)
        if window is not None:
            out["window"] = window
        return out

    def to_wire(self) -> dict:
        out = asdict(self)
        out["replay_ratio"] = None if self.replay_ratio is None else list(self.replay_ratio)
        return out

    @classmethod
    def from_wire(cls, wire: dict) -> "LawSettings":
        return cls(**wire)
