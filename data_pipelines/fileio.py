"""Small file helpers shared by every stage: atomic writes, output-folder checks.

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


def writable(folder: str | os.PathLike) -> bool:
    """Whether a file can be created in `folder` (tried: permission bits do not tell for root
    or for read-only mounts)."""
    import tempfile  # noqa: PLC0415

    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".dpbert-write-test-"):
            return True
    except OSError:
        return False


def output_folder_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be (created as) an output folder, or None: it is a file, its nearest
    existing ancestor is a file, or that ancestor is read-only. Checked before any work, so
    nothing is computed for an output that cannot be written."""
    path = pathlib.Path(path)
    if path.exists() and not path.is_dir():
        return "is a file, not a folder"
    existing = path.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"cannot be created ({existing} is a file)"
    if not writable(existing):
        return f"not writable ({existing} is read-only for this user)"
    return None
