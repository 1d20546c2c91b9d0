"""The users' release of a fine-tuning task's train and eval splits, served to the loop.

The release happens ONCE, in `Task.prepare`, keyed by the loop's secret task key: the same
release on resume and in every epoch (unless privacy.fresh_noise_each_epoch), another one in
another run; the eval split is released too. `ReleasedSplit` serves it to the loop as its
random-access dataset.
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from dpbert.runtime.hosts import announce

IGNORE_LABEL = -100


def content_sha256(features: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(features):
        a = np.ascontiguousarray(features[k])
        h.update(f"{k}:{a.dtype}:{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


class ReleasedSplit:
    """A released split as the loop's random-access dataset.

    release: the split as the service received it (`input_privacy.Release`), or a function
      epoch -> Release (fresh noise every epoch: epoch = step // steps_per_epoch).
    groups: int [N, W] rows of the release that form one example (-1 = none): NER's documents
      (all windows of a document are ONE example, the privacy unit); the batch then has a
      window axis [n, W, ...] and `window_mask` [n, W]; `labels` of missing windows are
      IGNORE_LABEL.
    """

    def __init__(self, release, *, num_examples: int, content: str,
                 steps_per_epoch: float | None = None, groups: np.ndarray | None = None):
        self._release = release
        self._steps_per_epoch = steps_per_epoch
        self._cache: dict[int, Any] = {}
        self._lock = threading.Lock()
        self.groups = groups
        self.num_examples = int(num_examples)
        self.metadata = {"content_sha256": content}

    def release(self, step: int = 0):
        if not callable(self._release):
            return self._release
        epoch = int(step // self._steps_per_epoch)
        with self._lock:
            if epoch not in self._cache:
                self._cache = {epoch: self._release(epoch)}  # epochs only move forward
            return self._cache[epoch]

    def get_batch(self, indices: np.ndarray, *, step: int) -> dict[str, np.ndarray]:
        release = self.release(step)
        indices = np.asarray(indices, np.int64)
        if self.groups is None:
            return release.batch(indices)
        rows = self.groups[indices]                                   # [n, W]
        flat = release.batch(np.maximum(rows, 0).reshape(-1))
        out = {k: v.reshape(rows.shape + v.shape[1:]) for k, v in flat.items()}
        present = rows >= 0
        out["window_mask"] = present.astype(np.int32)
        if "labels" in out:
            out["labels"] = np.where(present[..., None], out["labels"], IGNORE_LABEL)
        return out


def group_rows(example_id: np.ndarray) -> np.ndarray:
    """int [U, W_max]: the rows of each unit (example_id 0..U-1 in order), -1 padded."""
    example_id = np.asarray(example_id)
    units, counts = np.unique(example_id, return_counts=True)
    if not np.array_equal(units, np.arange(len(units))):
        raise ValueError("example ids must be 0..U-1")
    groups = np.full((len(units), counts.max()), -1, np.int64)
    for u in range(len(units)):
        rows = np.flatnonzero(example_id == u)
        groups[u, :len(rows)] = rows
    return groups


def release_splits(config, user, train: dict, eval_: dict, task_key, *, num_train: int,
                   groups: np.ndarray | None = None) -> tuple[ReleasedSplit, ReleasedSplit]:
    """The users' release of the train and eval features (module docstring)."""
    key = jnp.asarray(np.asarray(task_key, np.uint32).reshape(2))
    fresh = bool(config.privacy.fresh_noise_each_epoch) and config.privacy.mode != "none"
    steps_per_epoch = num_train / config.batch.expected_batch_size

    def release(features, split, epoch=None):
        t0 = time.time()
        out = user.release(features, key, split=split, epoch=epoch)
        if config.privacy.mode != "none":
            tokens = int(np.sum(features["input_mask"]))
            announce(f"released the {split} split{'' if epoch is None else f' (epoch {epoch})'}"
                     f" as mode {config.privacy.mode} ({tokens:,} tokens) in "
                     f"{time.time() - t0:.0f} s")
        return out

    content = content_sha256(train)
    train_split = ReleasedSplit(
        (lambda e: release(train, "train", e)) if fresh else release(train, "train"),
        num_examples=num_train, content=content, steps_per_epoch=steps_per_epoch,
        groups=groups)
    eval_split = ReleasedSplit(release(eval_, "eval"), num_examples=len(eval_["input_ids"]),
                               content=content_sha256(eval_))
    return train_split, eval_split
