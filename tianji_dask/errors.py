"""The package's exceptions, importable without the rest of the package: the CLI catches them
before it imports anything heavy.

Every error the package raises to a caller is a ``TianjiError``; each keeps the builtin base it
had (``PipelineError`` is a ``ValueError``, ``RunFailed`` a ``RuntimeError``, ...), so an
``except ValueError`` written before still catches what it caught. A run that did not succeed is
a ``RunFailed``: the run ended on an error (``train`` raises it with the results), or a
``RunFault`` stopped it (a cluster that could not start, a full disk, a cluster gone).
"""


def first_line(err: BaseException, chars: int = 300) -> str:
    """An exception as one line: its type and the first line of its message (``chars`` at most)."""
    text = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {text[:chars]}" if text else type(err).__name__


class TianjiError(Exception):
    """The base of every error tianji_dask raises to a caller: ``except tianji_dask.TianjiError``
    catches any of them (a bad pipeline, a run that failed, a run fault, a missing package a
    callback needs, ...). ``str()`` is the one line to show."""


class PipelineError(TianjiError, ValueError):
    """A user-caused configuration error; ``str()`` is the one line to show (exit 2 in the CLI)."""


class RunFailed(TianjiError, RuntimeError):
    """A run that did not succeed: it ended on an error (an exception in the learner or an
    algorithm, non-finite weights, an explorer stream failing again and again, a checkpoint that
    could not be written), which is what ``tianji_dask.train`` raises, or a ``RunFault`` stopped it.
    ``str()`` is the run's one line (``results["error"]``); ``results`` is the results dict,
    written to the run's folder as for any other end (empty when there are none)."""

    def __init__(self, line: str, results: dict | None = None):
        super().__init__(line)
        self.results = results if results is not None else {}

    def __reduce__(self):  # with any attribute a subclass adds: it crosses Dask pickled
        return type(self), (str(self), self.results), dict(self.__dict__)


class RunFault(RunFailed):
    """A fault outside the user's input that stopped a run, or kept it from starting (its cluster
    could not start, a full disk, a cluster gone); ``str()`` is the one line to show (exit 1 in
    the CLI). A ``RunFailed``, so one ``except tianji_dask.RunFailed`` catches any run that did
    not succeed; ``results`` is empty unless the run had results to give."""


class ClusterLost(RunFault):
    """The cluster can no longer run the run's learners; ``str()`` says what happened. The run
    writes what it has and says how to resume."""


class SchedulerLost(ClusterLost):
    """The run's scheduler stopped answering (``address``): Dask's workers close with it, so the
    run's learners have ended."""

    def __init__(self, address: str):
        super().__init__(f"scheduler: the scheduler at {address} was lost, and the run's workers closed with it")
        self.address = address

    def __reduce__(self):
        return type(self), (self.address,), dict(self.__dict__)


class LearnerWorkersGone(ClusterLost):
    """A learner's worker was lost and no worker offering the LEARNER resource came back."""


class ExplorerError(TianjiError, RuntimeError):
    """What an explorer's chunk raised (its env, or the algorithm's acting); ``str()`` is one line
    naming the stream, the env and, when the algorithm raised it, the class and method; ``detail``
    the traceback; ``env``: the env raised it (making, resetting or stepping it). Pickles with all
    three, as Dask sends a task's exception to the learner."""

    def __init__(self, line: str, detail: str = "", env: bool = False):
        super().__init__(line)
        self.detail = detail
        self.env = env

    def __reduce__(self):
        return type(self), (str(self), self.detail, self.env), dict(self.__dict__)


class EnvError(TianjiError, RuntimeError):
    """An env raised while it was made, reset or stepped (``__cause__``: what it raised); ``str()``
    is ``"Type: message"`` of that exception."""

    def traceback_text(self) -> str:
        """The env's own traceback (the cause's), without the re-raise."""
        import traceback

        return "".join(traceback.format_exception(self.__cause__ or self))


def raised_in(err: BaseException, cls: type) -> str:
    """One line for ``err``: ``"Class.method raised Type: message"``, naming the outermost frame
    of the traceback that ran a method of an instance of ``cls`` (the user's class, when they
    brought it), or ``"Type: message"`` when none did."""
    tb, where = err.__traceback__, None
    while tb is not None and where is None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, cls):
            where = f"{type(owner).__qualname__}.{tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    text = f"{type(err).__name__}: {err}"
    return f"{where} raised {text}" if where else text
