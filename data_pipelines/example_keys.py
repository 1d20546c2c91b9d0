"""Stable keys of pretraining examples, derived from identities, never from positions.

Public randomness and keys derived from an identity (a unit's, a document's, a canary's)
rather than from a position in a global list: nothing else in the corpus changes them, so
adding or removing one unit leaves every other unit's examples, and the masks keyed by
``example_key`` (``datasets.PretrainingDataset``), bitwise unchanged
(``docs/threat_model.md``; ``tests/data_pipelines/test_corpus_neighbours.py``).

    identity_hash(*parts)        a 63-bit integer from SHA-256 (seeds of unit-local streams,
                                 the order of units)
    example_keys(kind, identity, pass, ordinals)   the keys of one identity's examples
    KeyRecorder                  the keys of examples in creation order, in one vectorized go
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np


def identity_hash(*parts: Any) -> int:
    """A 63-bit non-negative integer from the SHA-256 of ``parts`` (their ``str`` forms).

    Public randomness and keys derived from an identity (a unit's, a document's) rather than
    from a position: nothing else in the corpus changes them.
    """
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: a bijection of uint64 [n] (wrapping arithmetic)."""
    x = np.asarray(x, np.uint64)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def example_keys(kind: str, identity: Any, dupe_pass: int, ordinals: np.ndarray | list[int]
                 ) -> np.ndarray:
    """int64 [n] (non-negative, 63 bits): the stable keys of the examples ``ordinals`` (0, 1,
    ...) that the ``identity`` of kind ``kind`` ("doc", "subject", "canary") yields in pass
    ``dupe_pass``.

    ``mix64(identity_hash(kind, identity, pass) + ordinal)``: a pure function of the example's
    own identity, so masking keyed by it (``datasets.PretrainingDataset``) does not change when
    other examples or units are added or removed.
    """
    base = np.uint64(identity_hash("example", kind, identity, dupe_pass))
    return _keys_from(np.full(np.shape(ordinals), base, np.uint64), ordinals)


def _keys_from(bases: np.ndarray, ordinals: np.ndarray) -> np.ndarray:
    """int64 [n]: ``mix64(base + ordinal)`` shifted to 63 bits (``example_keys``)."""
    total = np.asarray(bases, np.uint64) + np.asarray(ordinals, np.uint64)
    return (_mix64(total) >> np.uint64(1)).astype(np.int64)


class KeyRecorder:
    """Stable keys of examples in creation order: per (kind, identity, pass), the ordinals
    0, 1, ... of the examples that identity yields in that pass (``example_keys``, computed
    at the end in one vectorized go)."""

    def __init__(self):
        self._next: dict[tuple[str, int, int], int] = {}
        self._bases: list[int] = []
        self._firsts: list[int] = []
        self._counts: list[int] = []

    def add(self, kind: str, identity: int, dupe_pass: int, count: int) -> None:
        if count:
            first = self._next.get((kind, identity, dupe_pass), 0)
            self._next[(kind, identity, dupe_pass)] = first + count
            self._bases.append(identity_hash("example", kind, identity, dupe_pass))
            self._firsts.append(first)
            self._counts.append(count)

    def keys(self) -> np.ndarray:
        counts = np.asarray(self._counts, np.int64)
        total = int(counts.sum())
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        ordinals = (np.arange(total, dtype=np.int64) - np.repeat(starts, counts)
                    + np.repeat(np.asarray(self._firsts, np.int64), counts))
        bases = np.repeat(np.asarray(self._bases, np.uint64), counts)
        return _keys_from(bases, ordinals)
