"""What keeps a run safe from others and from being stopped: one process per workdir (`Lock`)
and a checkpoint before SIGTERM (preemption) or Ctrl-C ends it (`Stop`)."""

from __future__ import annotations

import fcntl
import pathlib
import signal
from typing import Any

from absl import logging

from dpbert.errors import ConfigError
from dpbert.runtime.hosts import is_primary

LOCK_FILE = ".lock"


class Stop:
    """SIGTERM (preemption) or Ctrl-C sets a flag; the loop saves a checkpoint and exits."""

    def __init__(self):
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. some test runners)
                pass
        return self

    def _handle(self, signum, frame):
        logging.warning("%s received: saving a checkpoint at the end of this step",
                        signal.Signals(signum).name)
        self.signal = signum

    def __exit__(self, *exc):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)


class Lock:
    """One run per workdir: a second process is refused while the first holds the lock (the
    OS releases it when the holder dies, so a killed run leaves nothing stale)."""

    def __init__(self, workdir: pathlib.Path):
        self.path = workdir / LOCK_FILE
        self._file = None

    def __enter__(self):
        if not is_primary():
            return self
        self._file = open(self.path, "a")  # noqa: SIM115
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._file.close()
            raise ConfigError(f"{self.path.parent}: another dpbert process is running in this "
                              "workdir (it holds .lock); wait for it or use another --workdir")
        return self

    def __exit__(self, *exc):
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
