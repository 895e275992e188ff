"""How one invocation of the command ends: exit codes, SIGTERM handled as Ctrl-C, and the file a
fault's traceback is kept in."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
import traceback

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # as a shell reports a process ended by SIGINT
EXIT_TERMINATED = 143  # as a shell reports a process ended by SIGTERM


class SigTerm:
    """SIGTERM (a batch system's time limit or cancel, ``kill``) is Ctrl-C: the first one stops
    the run cleanly, one while the run starts or stops gives up; ``received`` says it came."""

    def __init__(self):
        self.received = False
        #: while the run trains, the stop waits for the next status poll (``checked``): raised inside
        #: a client call, KeyboardInterrupt makes distributed's ``sync`` log a traceback
        self.deferred = False

    def __call__(self, signum, frame):
        self.received = True
        if not self.deferred:
            raise KeyboardInterrupt

    def checked(self, on_status):
        """``on_status``, raising KeyboardInterrupt first once a SIGTERM has come."""
        def call(status):
            if self.received:
                self.deferred = False
                raise KeyboardInterrupt
            on_status(status)

        self.deferred = True
        return call

    @contextlib.contextmanager
    def handled(self):
        if threading.current_thread() is not threading.main_thread():  # only there may handlers be set
            yield self
            return
        previous = signal.signal(signal.SIGTERM, self)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, previous)


class Invocation:
    """What one command's parts share: its SIGTERM handler and the run folder (once there is one)
    a fault's traceback goes to."""

    def __init__(self):
        self.sigterm = SigTerm()
        self.run_out: str | None = None

    def keep_traceback(self) -> str:
        """Write the exception being handled to ``error.txt`` in the run's folder, or a temporary
        file when the run has none; returns where."""
        text = traceback.format_exc()
        if self.run_out is not None and os.path.isdir(self.run_out):
            with contextlib.suppress(OSError):
                path = os.path.join(self.run_out, "error.txt")
                with open(path, "w") as fh:
                    fh.write(text)
                return path
        fd, path = tempfile.mkstemp(prefix="tianji-dask-error-", suffix=".txt")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return path
