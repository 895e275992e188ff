"""The error a user causes, importable without the rest of the package: the CLI catches it
before it imports anything heavy."""


class PipelineError(ValueError):
    """A user-caused configuration error; ``str()`` is the one line to show."""


class RunFault(RuntimeError):
    """A fault outside the user's input that stopped a run (a full disk, a cluster gone); ``str()``
    is the one line to show (exit 1 in the CLI)."""
