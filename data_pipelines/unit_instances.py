"""Instances of privacy units of several sequences, made unit by unit (``privacy_unit`` "note"
or "patient", issue 15; the units are `dpbert.core.units`).

Neighbours are corpora that differ in one unit, so (``data_pipelines.instances``'s docstring has
the whole argument):

* every example belongs to exactly ONE unit: a 'random next' segment B comes from the same unit
  (``_unit_source``);
* what a unit yields is a function of its own documents and of public randomness keyed by its
  IDENTITY alone (``create_unit_local``): a ``random.Random`` seeded from a hash of (seed, unit
  kind, identity), units ordered by a hash of their identity.

``unit_ids`` gives each example's unit and checks that A and B share it.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import numpy as np

from data_pipelines import fast_random
from data_pipelines.documents import NO_SUBJECT
from data_pipelines.example_keys import KeyRecorder, identity_hash
from data_pipelines.tokenized_corpus import TokenizedCorpus
from dpbert.core import units as privacy_units

if TYPE_CHECKING:
    from data_pipelines.instances import InstanceParams, Instances, _Maker


def _unit_identities(corpus: TokenizedCorpus, unit: privacy_units.PrivacyUnit
                     ) -> tuple[str, list[int]]:
    """(kind, identity of every document's unit): "doc" and the document key for "note" (and
    for "patient" in corpora without SUBJECT_IDs), "subject" and the SUBJECT_ID for "patient"
    (`PrivacyUnit.by_subject`).
    """
    if unit.by_subject:
        subjects = np.asarray(corpus.subject_ids)
        known = subjects != NO_SUBJECT
        if known.any() and not known.all():
            missing = int(np.flatnonzero(~known)[0])
            raise ValueError(
                f"privacy_unit={unit.name!r} needs a SUBJECT_ID on every note, but document "
                f"{int(corpus.doc_keys[missing])} (and {int((~known).sum()) - 1} more) has none")
        if known.any():
            return "subject", subjects.tolist()
    return "doc", np.asarray(corpus.doc_keys).tolist()


def create_unit_local(corpus: TokenizedCorpus, params: InstanceParams, maker: _Maker,
                      keys: KeyRecorder, bar: Any) -> list[int]:
    """Instances unit by unit (privacy unit "note" / "patient"); returns their final order.

    A unit is the set of documents with one identity (``_unit_identities``), in corpus order.
    Its examples come from BERT's steps run over its documents only, for ``dupe_factor``
    passes, with ``random.Random(identity_hash("instances", seed, kind, identity))``; 'random
    next' segments come from the unit (``_unit_source``); then its examples are shuffled with
    the same generator. Units follow each other in the order of
    ``identity_hash("order", seed, kind, identity)``. So adding or removing a unit changes no
    other unit's examples, their order among themselves, or their keys.
    """
    kind, identity = _unit_identities(corpus, privacy_units.get(params.privacy_unit))
    members: dict[int, list[int]] = {}
    for d, ident in enumerate(identity):
        members.setdefault(ident, []).append(d)
    order = sorted(members, key=lambda ident: (identity_hash("order", params.seed, kind, ident),
                                               ident))
    perm: list[int] = []
    for ident in order:
        docs = members[ident]
        rng = fast_random.Random(identity_hash("instances", params.seed, kind, ident))
        source = _unit_source(docs, rng, maker.doc_first, maker.doc_count)
        first = len(maker)
        for dupe_pass in range(params.dupe_factor):
            made = 0
            for doc in docs:
                made += maker.document(doc, rng, source)
            keys.add(kind, ident, dupe_pass, made)
            bar.update(len(docs))
        local = list(range(first, len(maker)))
        rng.shuffle(local)
        perm.extend(local)
    return perm


def _unit_source(docs: list[int], rng: random.Random, doc_first: list[int],
                 doc_count: list[int]):
    """`source(doc, c0, a_end) -> (document, first sentence, sentence limit) | None`: where a
    'random next' segment B comes from when it must stay in the example's unit (module doc).

    A unit of several documents (a patient's notes; rows sharing a ROW_ID): a random sentence
    of another of its documents, to that document's end. A unit of one document: a random start
    in the document outside A, not touching it: before A (B then ends one sentence before A) or
    after A's true next sentence; None when the document has no such sentence.
    """
    position = {d: k for k, d in enumerate(docs)}

    def source(doc: int, c0: int, a_end: int) -> tuple[int, int, int] | None:
        if len(docs) > 1:
            k = rng.randrange(len(docs) - 1)
            if k >= position[doc]:
                k += 1  # a uniform choice among the other documents
            other = docs[k]
            o_first, o_count = doc_first[other], doc_count[other]
            return other, o_first + rng.randint(0, o_count - 1), o_first + o_count
        first, end = doc_first[doc], doc_first[doc] + doc_count[doc]
        n_before = max(c0 - 1 - first, 0)  # starts in [first, c0 - 1), B stops before c0 - 1
        after = c0 + a_end + 1  # after A's true next sentence (c0 + a_end)
        n_after = max(end - after, 0)
        if n_before + n_after == 0:
            return None
        j = rng.randrange(n_before + n_after)
        if j < n_before:
            return doc, first + j, c0 - 1
        return doc, after + j - n_before, end

    return source


def unit_ids(instances: Instances, privacy_unit: str | privacy_units.PrivacyUnit) -> np.ndarray:
    """int64 [N]: the privacy unit of every example, numbered 0..U-1.

    "example": every example its own unit. "note": its document key (ROW_ID, or the content
    key of a text document: rows sharing a key are one unit). "patient": its SUBJECT_ID, or its
    document key where the corpus has no SUBJECT_IDs (plain text). Examples outside the corpus
    (example-placed canaries, document -1) are each a unit of their own. Units are numbered in
    the order of their identities.

    Raises:
      ValueError: an example whose segment B lies in another unit than A (instances made for
        privacy_unit="example" cannot serve a larger unit).
    """
    unit = privacy_units.get(privacy_unit)
    n = len(instances)
    if not unit.per_unit:
        return np.arange(n, dtype=np.int64)
    # A unit is (kind, value): 0 = a document key, 1 = a SUBJECT_ID, 2 = an outside example.
    kind_a = np.zeros(n, np.int64)
    kind_b = np.zeros(n, np.int64)
    val_a = np.asarray(instances.doc_key, np.int64)
    val_b = np.asarray(instances.b_doc_key, np.int64)
    if unit.by_subject:
        subj_a = np.asarray(instances.subject_id, np.int64)
        subj_b = np.asarray(instances.b_subject_id, np.int64)
        kind_a, kind_b = (subj_a != NO_SUBJECT).astype(np.int64), (subj_b != NO_SUBJECT).astype(
            np.int64)
        val_a = np.where(kind_a == 1, subj_a, val_a)
        val_b = np.where(kind_b == 1, subj_b, val_b)
    outside = np.asarray(instances.doc_index) < 0
    crossing = ~outside & ((kind_a != kind_b) | (val_a != val_b))
    if crossing.any():
        i = int(np.flatnonzero(crossing)[0])
        raise ValueError(
            f"{int(crossing.sum())} examples take segment B from another {unit.name} than A "
            f"(e.g. example {i}: documents {int(instances.doc_key[i])} and "
            f"{int(instances.b_doc_key[i])}); such instances were made for "
            f"privacy_unit='example' and cannot be used per {unit.name}")
    kind_a = np.where(outside, 2, kind_a)
    val_a = np.where(outside, np.arange(n, dtype=np.int64), val_a)
    ids = np.unique(np.stack([kind_a, val_a], axis=1), axis=0, return_inverse=True)[1]
    return np.asarray(ids, np.int64).reshape(-1)
