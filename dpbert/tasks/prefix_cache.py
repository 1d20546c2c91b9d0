"""The frozen prefix, computed once: with `train.trainable` = head or top:K, every trainable
parameter lies above the embeddings and the first L-K encoder layers. When nothing in that
prefix is re-drawn per epoch (the release is fixed: mode none, or a dχ release made once;
dropout is off in the prefix), its output is a function of the released example alone, so it
is computed once per split and each step runs only the top (`BertModel.from_prefix`).

    applies(config, task)         whether the run caches its prefix (config only: decided
                                  before any data is read, so dp.clipping="auto" can pick vmap)
    cached_splits(...)            the released train / eval splits served as prefix outputs
                                  (`prefix_hidden` float32 [n, S, H] instead of the tokens)

The cache is a file per split under train.prefix_cache_dir ("" = WORKDIR/prefix_cache), named
by a key over everything the prefix's output depends on: the released arrays it reads, the
prefix's parameters, the number of prefix layers, the sequence length and this format. A change
of data, checkpoint or prefix makes a new key (the old files of the run's own cache folder are
removed). Stored as float16 (half the disk; relative error ~1e-3, far below DP's noise). It
holds a function of the private training text: it is private like a checkpoint
(docs/threat_model.md) and is never exported.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dpbert.models import trainable as trainable_lib
from dpbert.runtime.hosts import announce
from dpbert.tasks import recipe

FORMAT = "dpbert-prefix-cache/1"
# Input modes whose release the prefix may read once (re-drawn per epoch only with
# privacy.fresh_noise_each_epoch); the others have their own representation (seq_rep, ome,
# texthide).
FIXED_RELEASE_MODES = ("none", "token_rep", "text_to_text")
# Prefix inputs the released batch may carry.
INPUTS = ("input_ids", "segment_ids", "input_mask", "word_embeddings")
EXAMPLES_PER_CALL = 256
PROGRESS_SECONDS = 30.0  # a progress line at most this often while the prefix is computed


def applies(config, task) -> bool:
    """Whether this run computes its frozen prefix once (module docstring)."""
    spec = trainable_lib.parse(recipe.trainable(config))
    fixed = config.privacy.mode == "none" or (config.privacy.mode in FIXED_RELEASE_MODES and
                                              not config.privacy.fresh_noise_each_epoch)
    return (bool(config.train.prefix_cache) and spec.kind in ("head", "top") and fixed
            and getattr(task, "prefix_cacheable", False))


def _fingerprint(release, prefix_params, num_layers: int) -> str:
    h = hashlib.sha256(f"{FORMAT};layers={num_layers};".encode())
    arrays = dict(release.arrays)
    if release.vectors is not None:
        arrays["__vectors"] = release.vectors
        arrays["__vector_index"] = release.vector_index
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(f"{k}:{a.dtype}:{a.shape};".encode())
        h.update(a.tobytes())
    for leaf in jax.tree.leaves(prefix_params):
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{a.dtype}:{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _prefix_params(model, num_layers: int):
    """The parameters the prefix reads: the embeddings and the first `num_layers` layers."""
    bert = model.bert
    return (nnx.state(bert.embeddings, nnx.Param),
            [nnx.state(layer, nnx.Param) for layer in list(bert.encoder.layer)[:num_layers]])


def _compute(release, model, num_layers: int, n: int, name: str = "") -> np.ndarray:
    graphdef, state = nnx.split(model.bert)

    @jax.jit
    def run(state, batch):
        bert = nnx.merge(graphdef, state)
        return bert.prefix(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                           num_layers, word_embeddings=batch.get("word_embeddings")
                           ).astype(jnp.float16)

    out = []
    t0 = last = time.time()
    for start in range(0, n, EXAMPLES_PER_CALL):
        idx = np.arange(start, min(n, start + EXAMPLES_PER_CALL))
        pad = EXAMPLES_PER_CALL - len(idx)  # one compiled shape for every call
        batch = release.batch(np.concatenate([idx, np.full(pad, idx[-1])]))
        batch = {k: v for k, v in batch.items() if k in INPUTS}
        out.append(np.asarray(run(state, batch))[:len(idx)])
        if time.time() - last >= PROGRESS_SECONDS and idx[-1] + 1 < n:  # minutes on a CPU
            last = time.time()
            announce(f"frozen prefix of the {name} split: {idx[-1] + 1:,} of {n:,} examples "
                     f"({last - t0:.0f} s)")
    return np.concatenate(out)


class PrefixSplit:
    """A released split served as its prefix outputs: `get_batch` returns the release's
    batch with `prefix_hidden` (float32 [n, S, H]) instead of the prefix's inputs."""

    def __init__(self, split, hidden: np.ndarray):
        self._split = split
        self._hidden = hidden
        self.num_examples = split.num_examples
        self.metadata = split.metadata
        self.groups = None

    def get_batch(self, indices: np.ndarray, *, step: int) -> dict[str, np.ndarray]:
        batch = self._split.get_batch(indices, step=step)
        batch = {k: v for k, v in batch.items()
                 if k not in INPUTS or k == "input_mask"}
        batch["prefix_hidden"] = np.asarray(self._hidden[np.asarray(indices, np.int64)],
                                            np.float32)
        return batch


def cached_split(split, model, num_layers: int, folder: pathlib.Path, name: str,
                 *, own_folder: bool) -> PrefixSplit:
    """`split` (a fixed `release.ReleasedSplit`) as its prefix outputs, computed once and
    kept in `folder` (module docstring)."""
    release = split.release(0)
    n = int(len(next(iter(release.arrays.values()))))
    key = _fingerprint(release, _prefix_params(model, num_layers), num_layers)[:24]
    path = folder / f"{name}-{key}.npy"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        if own_folder:  # data, checkpoint or prefix changed: the old outputs are stale
            for old in folder.glob(f"{name}-*.npy"):
                old.unlink()
        t0 = time.time()
        hidden = _compute(release, model, num_layers, n, name)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")  # one per process
        np.save(tmp, hidden)
        tmp.replace(path)
        announce(f"frozen prefix (embeddings + {num_layers} layers) of the {name} split: "
                 f"{n:,} examples computed once in {time.time() - t0:.0f} s, cached")
    hidden = np.load(path, mmap_mode="r")
    if hidden.shape[0] != n:
        raise ValueError(f"{path}: holds {hidden.shape[0]} examples, the split has {n}")
    return PrefixSplit(split, hidden)


def cached_splits(config, model, train, eval_, workdir: pathlib.Path):
    """(train, eval, prefix layers) with the prefix cached; see `applies`."""
    spec = trainable_lib.parse(recipe.trainable(config), model.config.num_hidden_layers)
    layers = spec.prefix_layers(model.config.num_hidden_layers)
    folder = pathlib.Path(config.train.prefix_cache_dir or workdir / "prefix_cache")
    own = not config.train.prefix_cache_dir
    return (cached_split(train, model, layers, folder, "train", own_folder=own),
            cached_split(eval_, model, layers, folder, "eval", own_folder=own), layers)
