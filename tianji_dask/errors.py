"""The error a user causes, importable without the rest of the package: the CLI catches it
before it imports anything heavy."""


def first_line(err: BaseException, chars: int = 300) -> str:
    """An exception as one line: its type and the first line of its message (``chars`` at most)."""
    text = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {text[:chars]}" if text else type(err).__name__


class PipelineError(ValueError):
    """A user-caused configuration error; ``str()`` is the one line to show."""


class RunFault(RuntimeError):
    """A fault outside the user's input that stopped a run (a full disk, a cluster gone); ``str()``
    is the one line to show (exit 1 in the CLI)."""


class RunFailed(RuntimeError):
    """A run that ended on an error (an exception in the learner or an algorithm, non-finite
    weights, an explorer stream failing again and again, a checkpoint that could not be written):
    what ``tianji_dask.train`` raises. ``str()`` is the run's one line (``results["error"]``);
    ``results`` is the results dict, written to the run's folder as for any other end."""

    def __init__(self, line: str, results: dict | None = None):
        super().__init__(line)
        self.results = results if results is not None else {}

    def __reduce__(self):
        return type(self), (str(self), self.results)


class ClusterLost(RuntimeError):
    """The cluster can no longer run the run's learners; ``str()`` says what happened. The run
    writes what it has and says how to resume."""


class SchedulerLost(ClusterLost):
    """The run's scheduler stopped answering (``address``): Dask's workers close with it, so the
    run's learners have ended."""

    def __init__(self, address: str):
        super().__init__(f"scheduler: the scheduler at {address} was lost, and the run's workers closed with it")
        self.address = address


class LearnerWorkersGone(ClusterLost):
    """A learner's worker was lost and no worker offering the LEARNER resource came back."""


class ExplorerError(RuntimeError):
    """What an explorer's chunk raised (its env, or the algorithm's acting); ``str()`` is one line
    naming the stream, the env and, when the algorithm raised it, the class and method; ``detail``
    the traceback; ``env``: the env raised it (making, resetting or stepping it). Pickles with all
    three, as Dask sends a task's exception to the learner."""

    def __init__(self, line: str, detail: str = "", env: bool = False):
        super().__init__(line)
        self.detail = detail
        self.env = env

    def __reduce__(self):
        return type(self), (str(self), self.detail, self.env)


class EnvError(RuntimeError):
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
