"""Small file helpers shared by every stage: atomic writes, output-folder checks.

A file written with these appears complete or not at all (a temporary file in the same folder,
renamed into place), so a crash, a full disk or a kill never leaves a half-written report,
vocabulary or corpus that a later run would read as valid.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import stat
from collections.abc import Iterable, Iterator


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


def path_problem(path: str | os.PathLike | None, *,
                 sources: Iterable[tuple[str, str | os.PathLike]] = (),
                 inside_sources_ok: bool = False) -> str | None:
    """Why `path` is a degenerate OUTPUT folder, or None: empty (`--out=` would mean the current
    directory), the current directory or a folder that contains it (`.`, `..`, `$HOME`, `/`),
    or a folder that is, lies inside, or contains one of `sources` (an input of the same
    command: writing there would mix the output into it, or replacing the output would delete
    it). `sources` are (what to call it, path) pairs, e.g. ("--from_hf=X", "X"); paths are
    compared after resolving symlinks and relative parts. `inside_sources_ok`: an output inside
    a source is fine (a training workdir's own `WORKDIR/hf` or `WORKDIR/exposure`)."""
    if path is None or (isinstance(path, str) and not path.strip()):
        return ("is empty (an empty path would mean the current directory); give the folder "
                "a name")
    if "://" in os.fspath(path):
        return None  # remote (gs://...): not a local folder
    here = pathlib.Path(os.path.realpath(os.getcwd()))
    out = pathlib.Path(os.path.realpath(path))
    if out == here:
        return ("is the current directory; give a folder of its own (e.g. runs/NAME), so that "
                "its files do not mix with those already here")
    if out in here.parents:
        return ("contains the current directory; give a folder of its own (e.g. runs/NAME), "
                "so that its files do not mix with those already there")
    for name, source in sources:
        if not source or "://" in os.fspath(source):
            continue
        src = pathlib.Path(os.path.realpath(source))
        if out == src:
            return f"is the source {name} itself; write to another folder"
        if src in out.parents and not inside_sources_ok:
            return f"is inside the source {name}; write to a folder outside it"
        if out in src.parents:
            return (f"contains the source {name}; write to a folder that does not hold it (a "
                    "replaced or filled output folder would change the source)")
    return None


def output_folder_problem(path: str | os.PathLike, *,
                          sources: Iterable[tuple[str, str | os.PathLike]] = (),
                          inside_sources_ok: bool = False) -> str | None:
    """Why `path` cannot be (created as) an output folder, or None: a degenerate path
    (`path_problem`: empty, the current directory, a source's folder), a file, its nearest
    existing ancestor is a file, or that ancestor is read-only. Checked before any work, so
    nothing is computed (or written) for an output that cannot or must not be written."""
    problem = path_problem(path, sources=sources, inside_sources_ok=inside_sources_ok)
    if problem or "://" in os.fspath(path):
        return problem
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


_SPECIAL_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
                  (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def special_file_problem(path: str | os.PathLike) -> str | None:
    """Why an existing `path` is neither a regular file nor a folder (a FIFO, a socket, a
    device), or None (also when it does not exist: the reader says so). dpbert's readers open
    their inputs more than once and need their size, which a pipe does not have."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    for test, kind in _SPECIAL_KINDS:
        if test(mode):
            return (f"is {kind}, not a regular file; write its content to a file first (it "
                    "is read more than once)")
    return None


def training_workdir_problem(path: str | os.PathLike | None) -> str | None:
    """`PATH is a dpbert training workdir; its model is PATH/hf` when `path` is a dpbert
    training (or fine-tuning) workdir given where a model folder is expected, else None.

    A workdir is recognised by its `checkpoints/` folder beside its `run.json` or `config.json`
    (the run's config: not a Hugging Face config.json, which is why reading it as a model
    failed with "key 'model_type' is None" or "not a dpbert privacy report"). Local paths
    only."""
    if path is None or not str(path).strip() or "://" in str(path):
        return None
    folder = pathlib.Path(path)
    if not (folder / "checkpoints").is_dir() or not any(
            (folder / name).is_file() for name in ("run.json", "config.json")):
        return None
    model = folder / "hf"
    if (model / "config.json").is_file():
        return f"{path} is a dpbert training workdir; its model is {model}"
    return (f"{path} is a dpbert training workdir; its model is {model}, which is not written "
            f"yet (a run writes it when it ends; or export a checkpoint: python "
            f"launch/export_hf.py --workdir={path} --out=DIR)")
