"""Host-side random-access pretraining datasets and the prefetching reader.

``PretrainingDataset.get_batch(indices, step=...)`` reads examples by index with fresh masking
from an RNG derived from ``(seed, step, example key)``, the key being the example's stable
identity (``Instances.example_key``), not its index: the result depends on nothing else (not on
the host, the batch composition, the order, or which other examples the data set holds). The
trainer's sampler (``dpbert.dp.sampling``) decides which indices make up each batch, every host
loads only its own rows, and ``prefetch`` (grain) prepares them ahead of the training step.

Feature layout (one example; a batch adds a leading axis B):
  input_ids int32 [S], input_mask int32 [S], segment_ids int32 [S],
  masked_lm_positions int32 [P], masked_lm_ids int32 [P], masked_lm_weights float32 [P],
  next_sentence_labels int32 [] (1 = B is random).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grain
import numpy as np

from data_pipelines import tokenization
from data_pipelines.instances import Instances
from data_pipelines.masking import MaskingParams, mask_sequence

FEATURE_KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                "masked_lm_ids", "masked_lm_weights", "next_sentence_labels")


# Domain tags keep the masking RNG streams of different uses apart.
_MASK_DOMAIN_STEP = 1


class PretrainingDataset:
    """Random-access BERT pretraining examples with fresh masking at every load.

    The masking of example ``index`` at ``step`` uses
    ``np.random.default_rng([seed, domain, step, instances.example_key[index]])``: it is a pure
    function of those numbers, so results do not depend on which host loads the example, on the
    other examples in the batch or their order, nor on the other examples of the data set
    (removing one unit of the corpus changes no other unit's masks).

    Attributes:
      num_examples: N, the number of examples (what a DP accountant counts).
      instances: the underlying ``Instances``.
      metadata: free-form facts about how the examples were made (corpus, counts, fingerprint,
        canary file, ...).
      unit_ids: int64 [N], the privacy unit (0..U-1) of every example when the examples were
        made for a unit larger than one example (note, patient), else None.
    """

    def __init__(self, instances: Instances, masking: MaskingParams, *,
                 special: tokenization.SpecialTokenIds, vocab_size: int,
                 is_continuation: np.ndarray | None = None, seed: int = 0,
                 metadata: dict[str, Any] | None = None):
        masking.validate()
        if len(instances) == 0:
            raise ValueError("PretrainingDataset needs at least one instance")
        max_len = int(instances.lengths.max()) + 3
        if max_len > masking.max_seq_length:
            raise ValueError(f"instances are up to {max_len} tokens long but max_seq_length is "
                             f"{masking.max_seq_length}")
        if masking.whole_word_masking and is_continuation is None:
            raise ValueError("whole_word_masking=True needs is_continuation")
        self.instances = instances
        self.masking = masking
        self.special = special
        self.vocab_size = int(vocab_size)
        self.is_continuation = is_continuation
        self.seed = int(seed)
        self.metadata = dict(metadata or {})
        self.num_examples = len(instances)
        self.unit_ids: np.ndarray | None = None
        # Copies of small per-instance arrays: fast element access even when memory-mapped.
        self._offsets = np.asarray(instances.offsets, dtype=np.int64)
        self._a_lengths = np.asarray(instances.a_lengths, dtype=np.int64)
        self._is_random = np.asarray(instances.is_random_next, dtype=bool)
        self._keys = np.asarray(instances.example_key, dtype=np.int64)
        if self._keys.shape != self._a_lengths.shape or (self._keys < 0).any():
            raise ValueError("instances.example_key must hold one non-negative key per example")

    def __len__(self) -> int:
        return self.num_examples

    @property
    def subject_ids(self) -> np.ndarray:
        """int64 [N]: SUBJECT_ID of each example's segment A (``NO_SUBJECT`` when unknown)."""
        return np.asarray(self.instances.subject_id)

    def _rng(self, domain: int, step: int, key: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, domain, step, key])

    def _fill(self, out: dict[str, np.ndarray], row: int, index: int,
              rng: np.random.Generator) -> None:
        start, end = self._offsets[index], self._offsets[index + 1]
        len_a = int(self._a_lengths[index])
        len_b = int(end - start) - len_a
        n = len_a + len_b + 3
        seq = np.empty([n], np.int32)
        seq[0] = self.special.cls
        seq[1:1 + len_a] = self.instances.tokens[start:start + len_a]
        seq[1 + len_a] = self.special.sep
        seq[2 + len_a:2 + len_a + len_b] = self.instances.tokens[start + len_a:end]
        seq[n - 1] = self.special.sep
        positions, labels = mask_sequence(seq, len_a, len_b, self.masking, self.special,
                                          self.vocab_size, self.is_continuation, rng)
        out["input_ids"][row, :n] = seq
        out["input_mask"][row, :n] = 1
        out["segment_ids"][row, 2 + len_a:n] = 1
        k = len(positions)
        out["masked_lm_positions"][row, :k] = positions
        out["masked_lm_ids"][row, :k] = labels
        out["masked_lm_weights"][row, :k] = 1.0
        out["next_sentence_labels"][row] = int(self._is_random[index])

    def _empty_batch(self, batch_size: int) -> dict[str, np.ndarray]:
        s, p = self.masking.max_seq_length, self.masking.max_predictions_per_seq
        return {
            "input_ids": np.zeros([batch_size, s], np.int32),
            "input_mask": np.zeros([batch_size, s], np.int32),
            "segment_ids": np.zeros([batch_size, s], np.int32),
            "masked_lm_positions": np.zeros([batch_size, p], np.int32),
            "masked_lm_ids": np.zeros([batch_size, p], np.int32),
            "masked_lm_weights": np.zeros([batch_size, p], np.float32),
            "next_sentence_labels": np.zeros([batch_size], np.int32),
        }

    def _batch(self, indices: np.ndarray, steps: np.ndarray, domain: int
               ) -> dict[str, np.ndarray]:
        indices = np.asarray(indices)
        if indices.ndim != 1:
            raise ValueError(f"indices must be 1-D, got shape {indices.shape}")
        if not np.issubdtype(indices.dtype, np.integer) and indices.size:
            raise ValueError(f"indices must be integers, got dtype {indices.dtype}")
        if indices.size and (indices.min() < 0 or indices.max() >= self.num_examples):
            raise IndexError(f"example index out of range [0, {self.num_examples}): "
                             f"min {indices.min()}, max {indices.max()}")
        out = self._empty_batch(len(indices))
        keys = self._keys
        for row, (index, step) in enumerate(zip(indices.tolist(), steps.tolist())):
            if step < 0:
                raise ValueError(f"step/epoch must be >= 0, got {step}")
            self._fill(out, row, index, self._rng(domain, step, int(keys[index])))
        return out

    def get_batch(self, indices: np.ndarray, *, step: int) -> dict[str, np.ndarray]:
        """Features of the examples ``indices``, masked for training step ``step``.

        Args:
          indices: int [B], example indices in [0, num_examples) (repeats allowed).
          step: the training step (>= 0); the same (step, example) always gives the same
            masking.

        Returns:
          The feature dict (see module docstring) with leading axis B.
        """
        indices = np.asarray(indices)
        return self._batch(indices, np.full(indices.shape, int(step), np.int64),
                           _MASK_DOMAIN_STEP)


EXAMPLE_MASK = "example_mask"  # the feature of a unit batch saying which slots hold examples


def get_unit_batch(dataset: Any, indices: np.ndarray, example_mask: np.ndarray, *,
                   step: int) -> dict[str, np.ndarray]:
    """A batch of units: [n, K] example slots of any dataset with ``get_batch``.

    Args:
      dataset: has ``get_batch(indices int [m], *, step) -> dict of [m, ...]``.
      indices: int [n, K], example indices (padding slots: any valid index, e.g. 0).
      example_mask: bool [n, K], False for padding slots.
      step: passed on (masking randomness per (step, example)).

    Returns:
      The dataset's features reshaped to [n, K, ...], plus ``EXAMPLE_MASK`` bool [n, K].
    """
    indices = np.asarray(indices)
    if indices.ndim != 2 or np.shape(example_mask) != indices.shape:
        raise ValueError(f"unit batch: indices {indices.shape} and example_mask "
                         f"{np.shape(example_mask)} must both be [units, K]")
    flat = dataset.get_batch(indices.reshape(-1), step=step)
    out = {k: v.reshape(indices.shape + v.shape[1:]) for k, v in flat.items()}
    out[EXAMPLE_MASK] = np.asarray(example_mask, bool)
    return out


U = TypeVar("U")


def prefetch(fn: Callable[[int], U], start: int, stop: int, *, buffer_size: int = 2
             ) -> Iterator[U]:
    """``fn(start), fn(start + 1), ..., fn(stop - 1)``, computed up to ``buffer_size`` items
    ahead of the consumer by a grain reader thread.

    The trainer uses it with ``fn = call -> this host's rows of that call's batch``. Order is
    kept; an exception in ``fn`` is raised in the consumer; dropping the iterator stops the
    reader. One thread: ``fn`` need not be thread-safe.
    """
    if buffer_size < 1:
        raise ValueError(f"buffer_size must be >= 1, got {buffer_size}")
    if stop <= start:
        return iter(())
    items = grain.MapDataset.range(start, stop).map(fn)
    return iter(items.to_iter_dataset(
        grain.ReadOptions(num_threads=1, prefetch_buffer_size=buffer_size)))
