"""Orbax checkpoints of the whole training state, with a config-compatibility check.

A checkpoint holds two items:

* `state`: the jitted train state pytree (parameters, optimizer state, DP accumulator, step,
  RNG key), saved asynchronously and restored straight into its shardings;
* `meta`: JSON — the host-side state that makes a resumed run bitwise identical to an
  uninterrupted one (sampler / data-iterator state, privacy accountant state), plus the config
  fields that define the run, so a checkpoint from an incompatible config is refused with a
  message naming the fields that differ.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import pathlib
from typing import Any, Iterable, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp
# The store orbax's default jax.Array handler writes array metadata with (not re-exported).
from orbax.checkpoint._src.metadata import array_metadata_store

from dpbert.dp import trees

logger = logging.getLogger(__name__)

# Config sections that may change between a run and its resumption (bookkeeping, not the
# computation): how often to log/evaluate/checkpoint, how long to train, where data lives.
RESUMABLE_FIELDS = (
    "train.num_steps", "train.log_every", "train.eval_every", "train.eval_batches",
    "checkpoint.every_steps", "checkpoint.max_to_keep", "checkpoint.async_save",
    "train.export_hf", "dp.target_epsilon", "dp.total_epsilon", "train.prefix_cache_dir",
    "runtime.compilation_cache_dir", "data.preflight", "fill_mask",
)


def first_line(error: BaseException, limit: int = 200) -> str:
    """The first line of an error's message, at most `limit` characters (orbax's and
    TensorStore's messages run to pages)."""
    text = str(error).strip()
    return (text.splitlines() or [""])[0][:limit]


@contextlib.contextmanager
def quiet_failed_reads():
    """Drops orbax's echoes of a failed restore while the context is open.

    orbax reads array shards in coroutines; when a file is damaged, the shards that failed
    besides the one raised surface later through `sys.unraisablehook` as TensorStore dumps of
    thousands of lines. The failure itself is raised (and reported once, as a fallback to the
    previous checkpoint); its echoes are dropped, everything else goes to the previous hook.
    """
    previous = sys.unraisablehook

    def hook(unraisable):
        if "error while reading array" not in str(unraisable.exc_value)[:200]:
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


class IncompatibleCheckpointError(ValueError):
    """The workdir holds a checkpoint written under a different config."""


def flatten_config(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten_config(v, key + "."))
        else:
            out[key] = v
    return out


# Fields that act only under one privacy.mode (the prefix's fields, mode): left out of the
# signature, on both sides of a resume (`inert_fields`), under any other mode, so that a run of
# another mode does not stop resuming when one of them changes (TextHide's head defaults did).
MODE_ONLY_FIELDS = (("privacy.texthide_", "texthide"),)


def inert_fields(flat: Mapping[str, Any]) -> set[str]:
    """The keys of a flat config (or signature) that do nothing under its privacy.mode."""
    mode = flat.get("privacy.mode")
    return {k for k in flat for prefix, only in MODE_ONLY_FIELDS
            if k.startswith(prefix) and mode != only}


def run_signature(config_dict: Mapping[str, Any],
                  ignore: Iterable[str] = RESUMABLE_FIELDS) -> dict[str, Any]:
    """The flattened config minus the fields a resumed run may change (JSON-normalised).
    With dp.mechanism="dpsgd" (the default) BandMF's fields are left out as well, and
    train.nsp when True (the default), so that a checkpoint written before they existed still
    resumes; and the fields its privacy.mode does not use (`inert_fields`)."""
    ignored = set(ignore)
    flat = flatten_config(config_dict)
    ignored |= inert_fields(flat)
    if flat.get("dp.mechanism", "dpsgd") == "dpsgd":
        ignored |= {"dp.mechanism", "dp.num_bands"}
    if flat.get("train.nsp", True) is True:  # the default, also of checkpoints without it
        ignored.add("train.nsp")
    return json.loads(json.dumps({k: v for k, v in flat.items() if k not in ignored},
                                 default=str))


# The task of a config without a `task` field (the pretraining configs).
DEFAULT_TASK = "pretraining"


def task_mismatch(saved_task: str, current_task: str, where: str) -> str | None:
    """`W holds a <saved> run, not <current>; use another --workdir`, or None if they agree."""
    if saved_task == current_task:
        return None
    return f"{where} holds a {saved_task} run, not {current_task}; use another --workdir"


def workdir_task_problem(workdir: str | os.PathLike, task: str) -> str | None:
    """The `task_mismatch` line when `workdir`'s run.json names another task than `task`
    (e.g. a fine-tuning workdir given to train.py), else None (no run.json yet, or one that
    does not name a task: the checkpoint's own check decides)."""
    run_file = pathlib.Path(workdir) / "run.json"
    if "://" in str(workdir) or not run_file.is_file():
        return None
    try:
        saved = json.loads(run_file.read_text(encoding="utf-8")).get("task")
    except (OSError, ValueError, AttributeError):
        return None
    return task_mismatch(saved, task, str(workdir)) if isinstance(saved, str) else None


def check_compatible(saved: Mapping[str, Any], current: Mapping[str, Any], where: str) -> None:
    """Raises IncompatibleCheckpointError naming every field that differs; a checkpoint of
    another task (a fine-tuning workdir resumed by pretraining, ...) in one line naming both
    tasks instead of a diff of every field."""
    mismatch = task_mismatch(saved.get("task") or DEFAULT_TASK,
                             current.get("task") or DEFAULT_TASK, where)
    if mismatch:
        raise IncompatibleCheckpointError(mismatch)
    # A checkpoint written before `inert_fields` existed still holds them.
    saved = {k: v for k, v in saved.items() if k not in inert_fields(saved)}
    keys = sorted(set(saved) | set(current))
    diffs = [f"{k}: checkpoint={saved.get(k, '<absent>')!r} config={current.get(k, '<absent>')!r}"
             for k in keys if saved.get(k, "<absent>") != current.get(k, "<absent>")]
    if diffs:
        raise IncompatibleCheckpointError(
            f"{where} holds a checkpoint from a different config; refusing to resume it. "
            "Use a fresh --workdir, or restore the original config. Differences:\n  "
            + "\n  ".join(diffs))


# orbax saves a replicated array "replica-parallel": each of the R devices holding a copy
# writes 1/R of it, taken with an eager `jax.lax.slice` per device (one small program per
# slice shape and device, compiled at the process's first save). Worth it for large arrays
# (an embedding table: R transfers and writes in parallel), pure overhead for small ones: the
# tiny test model on 8 CPU devices cut ~180 arrays into 1,440 slices at every save (about 1 s
# of a 4-step run's 2 saves, with the slices' programs in the compilation cache). Slices
# below this size are not made: such an array is written whole by its first replica, as on
# one device. The checkpoint's format is orbax's either way (only the write chunking differs;
# every checkpoint reads back).
MIN_REPLICA_SLICE_BYTES = 1 << 20
_registered_min_slice_bytes: list[int | None] = []  # what this process registered, if any


def register_array_handler(min_slice_bytes: int | None = MIN_REPLICA_SLICE_BYTES) -> None:
    """orbax's jax.Array handler (its defaults) with `min_slice_bytes` per replica slice
    (None: orbax's own behaviour, every replicated array sliced), through orbax's registry
    (its documented way to set the option); done by every `Checkpointer`, a no-op when already
    registered (benchmarks/checkpoint_save.py compares the two)."""
    if _registered_min_slice_bytes == [min_slice_bytes]:
        return
    handler = ocp.type_handlers.ArrayHandler(
        array_metadata_store=array_metadata_store.Store(),
        min_slice_bytes_for_replica_parallel=min_slice_bytes)
    absl_logger = logging.getLogger("absl")  # orbax warns that it replaces its own handler
    quiet = lambda record: "overriding" not in record.getMessage()  # noqa: E731
    absl_logger.addFilter(quiet)
    try:
        ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
    finally:
        absl_logger.removeFilter(quiet)
    _registered_min_slice_bytes[:] = [min_slice_bytes]


class Checkpointer:
    """Thin wrapper over `orbax.checkpoint.CheckpointManager` for dpbert train states."""

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3,
                 async_save: bool = True):
        register_array_handler()
        self.directory = pathlib.Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True)
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "meta"),
            item_handlers={"state": ocp.StandardCheckpointHandler(),
                           "meta": ocp.JsonCheckpointHandler()})

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def latest_intact(self, skip: Iterable[int] = ()) -> tuple[int | None, dict[str, Any] | None]:
        """(step, meta) of the newest checkpoint whose meta reads back, or (None, None).

        A checkpoint cut short (a truncated file) is skipped with a warning naming it, so the
        run resumes from the one before; `skip` names steps already found damaged.
        """
        for step in sorted(set(self.all_steps()) - set(skip), reverse=True):
            try:
                return step, self.read_meta(step)
            except Exception as e:  # orbax raises several types for a damaged step
                logger.warning("checkpoint step %d is unreadable (%s: %s: %s); falling back "
                               "to the previous one", step, self.directory / str(step) / "meta",
                               type(e).__name__, first_line(e))
        return None, None

    def save(self, step: int, state: Any, meta: Mapping[str, Any]) -> None:
        """Saves asynchronously (returns once the arrays are copied off the devices)."""
        self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(dict(meta))), force=True)

    def delete(self, step: int) -> None:
        self._manager.delete(step)

    def read_meta(self, step: int) -> dict[str, Any]:
        out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out["meta"])

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """Restores `state` into the shapes/dtypes/shardings of `abstract_state`."""
        out = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
        return out["state"], dict(out["meta"])

    def layout_problem(self, step: int, abstract_state: Any) -> str | None:
        """How the training state saved at `step` differs from `abstract_state` in its leaves'
        paths, shapes and dtypes (a checkpoint written by another version of dpbert, e.g.
        before BandMF kept buffers for the trainable leaves only), or None; None too when the
        state's metadata does not read back (`restore` then finds the step damaged)."""
        try:
            tree = self._manager.item_metadata(step)["state"]
        except Exception:  # orbax raises several types for a damaged step
            return None
        tree = getattr(tree, "tree", tree)
        if tree is None:
            return None
        saved, now = _layout(tree), _layout(abstract_state)
        if saved == now:
            return None
        diffs = [f"{k}: checkpoint={saved.get(k, '<absent>')} now={now.get(k, '<absent>')}"
                 for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
        return (f"the training state saved at step {step} is laid out differently from the one "
                f"this version of dpbert builds for the config ({len(diffs)} leaves differ: "
                + "; ".join(diffs[:3]) + ("; ..." if len(diffs) > 3 else "")
                + "); it was written by another version. Resume it with that version, or use "
                "a fresh --workdir (nothing was deleted)")

    def restore_params(self, step: int) -> tuple[Any, dict[str, Any]]:
        """The parameters as host arrays and the meta, whatever mesh or how many processes
        wrote the checkpoint (for export and comparisons)."""
        tree = self._manager.item_metadata(step)["state"]
        tree = getattr(tree, "tree", tree)
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        abstract = jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), tree)
        out = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        return jax.device_get(out["state"]["params"]), dict(out["meta"])

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def sync(self, step: int) -> None:
        """fsyncs every file and folder of a committed step, and the checkpoints folder (whose
        entry orbax's final rename created), so the step survives a crash or power loss right
        after (orbax commits by a rename, without flushing). Local folders only."""
        folder = self.directory / str(step)
        if "://" in str(self.directory) or not folder.is_dir():
            return
        for root, dirs, files in os.walk(folder, topdown=False):
            for name in files:
                _fsync(os.path.join(root, name), folder=False)
            _fsync(root, folder=True)
        _fsync(str(self.directory), folder=True)

    def unfinished_saves(self) -> list[str]:
        """Names of temporary step folders in the checkpoints folder: saves that never
        committed (the run was killed while saving); orbax ignores them."""
        if not self.directory.is_dir():
            return []
        return sorted(p.name for p in self.directory.iterdir()
                      if p.is_dir() and "tmp" in p.name)

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def _fsync(path: str, folder: bool) -> None:
    """fsync a file (an error is raised: the data may not be on disk) or a folder (errors are
    ignored: some filesystems cannot fsync folders)."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if folder else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        if folder:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not folder:
            raise
    finally:
        os.close(fd)


def _layout(tree: Any) -> dict[str, str]:
    """{leaf path: "dtype[shape]"} of a state or of its saved metadata."""
    return {trees.path_string(path): f"{np.dtype(leaf.dtype).name}{list(leaf.shape)}"
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def abstract_like(state: Any) -> Any:
    """ShapeDtypeStructs (with shardings) of a live state, the target for a restore."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
