"""An opt-in disk cache of single-step privacy loss distributions (host side, no JAX).

Building one step's PLD of truncated Poisson sampling costs dp_accounting ~2 s of CPU (a Python
loop over ~600,000 grid points); `dpbert.dp.accountants` caches it in memory, but every new
process (a launcher, a resumed run, a test worker) builds it again. When the environment
variable DPBERT_PLD_CACHE_DIR names a folder, `load_or_build` keeps each PLD there (pickled,
keyed by every argument of its construction and dp_accounting's version) and later processes
load it: the same object, so every epsilon is the same float (tests/dpbert/dp/test_accounting.py
checks). The epsilons the accountant composes from them are kept the same way (a float per
composition: ~1.3 s of a new process's CPU even for a few steps). Unset (the default) it builds
every time. The test suite sets it to a fresh folder per
session (tests/conftest.py), as it does for XLA's compilation cache. Only a folder you alone
write to belongs here: a planted file would be trusted (its key is checked, not its contents).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import pathlib
import pickle
import tempfile
from typing import Any, Callable

CACHE_ENV = "DPBERT_PLD_CACHE_DIR"


def _version() -> str:
    try:
        return importlib.metadata.version("dp-accounting")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def load_or_build(kind: str, args: tuple, build: Callable[[], Any]) -> Any:
    """`build()`, or what an earlier `build()` with the same `kind` and `args` (floats,
    ints, None, tuples and frozen dataclasses of them: found by their repr, compared by
    value) saved in DPBERT_PLD_CACHE_DIR."""
    folder = os.environ.get(CACHE_ENV, "").strip()
    if not folder:
        return build()
    key = (kind, _version(), tuple(args))
    path = pathlib.Path(folder) / (
        f"pld-{hashlib.sha256(repr(key).encode()).hexdigest()[:32]}.pickle")
    try:
        with open(path, "rb") as f:
            saved_key, value = pickle.load(f)
        if saved_key == key:
            return value
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError):
        pass  # absent or unreadable: built again and rewritten
    value = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            pickle.dump((key, value), f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)  # atomic: readers see the old file or the whole new one
    except OSError:
        pass  # a cache that cannot be written costs time, never correctness
    return value
