"""Small file helpers shared by every stage: atomic writes.

A file written with these appears complete or not at all (a temporary file in the same folder,
renamed into place), so a crash, a full disk or a kill never leaves a half-written report,
vocabulary or corpus that a later run would read as valid.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
from collections.abc import Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[pathlib.Path]:
    """Yields a temporary path beside `path`; renames it to `path` if the block succeeds,
    removes it otherwise. The temporary name keeps the suffixes (e.g. `.csv.gz`)."""
    path = pathlib.Path(path)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Writes `text` (UTF-8) to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
