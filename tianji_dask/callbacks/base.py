"""What a callback is: an object whose hooks the learner's process calls as the run goes, on a
thread of their own (``runner.py``), never on the learner's. No Dask."""

from __future__ import annotations

import importlib.util

from tianji_dask.errors import TianjiError


class Callback:
    """Subclass and override the hooks you need; each is a no-op here.

    The hooks of one learner run one at a time, in the order of the events, on one thread of the
    learner's process (the run's own process in single mode; the learner's worker otherwise,
    where the object arrives pickled). ``__init__`` should only keep its settings: a pipeline's
    check builds each named callback once to see that it can be built; ``on_start`` is where a
    logger opens what it writes to."""

    def on_start(self, info: dict) -> None:
        """The learner is built: ``run_id``, ``out`` (the run's folder), ``pipeline`` (the
        resolved pipeline as a dict), ``group``, ``version`` (above 0 when resumed), ``resumed``."""

    def on_episodes(self, rows: list[dict]) -> None:
        """Episodes that ended in one consumed chunk, each a dict: ``t`` (seconds since the run's
        start), ``return``, ``length``, ``explorer_id``, ``policy_version`` (the policy that played
        it), ``version`` (the learner's when consumed), ``env_steps`` (the run's, counting that chunk)."""

    def on_update(self, version: int, metrics: dict[str, float]) -> None:
        """Update ``version`` is done (versions count from 1); ``metrics``: the algorithm's figures."""

    def on_evaluation(self, result: dict) -> None:
        """An evaluation ended: ``t`` (seconds since the run's start), ``version``, ``mean``, ``std``,
        ``episodes``, ``returns``."""

    def on_checkpoint(self, path: str, version: int) -> None:
        """A checkpoint of ``version`` was written to ``path``."""

    def on_end(self, results: dict) -> None:
        """The learner finished: its results (results.json's learner fields; the run adds its own
        once every learner is done). Called once, also for a callback that stopped getting events."""


class MissingDependency(TianjiError, ImportError):
    """A callback needs a package that is not installed; ``str()`` is the one line to show."""


def require(module: str, extra: str) -> None:
    """MissingDependency unless ``module`` can be imported, naming the extra that installs it."""
    if importlib.util.find_spec(module) is None:
        raise MissingDependency(f"needs {module} (pip install 'tianji-dask[{extra}]')")


def flatten(data: dict, prefix: str = "") -> dict[str, object]:
    """A nested dict as one level of dotted keys (``{"a": {"b": 1}}`` → ``{"a.b": 1}``)."""
    flat: dict[str, object] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat
