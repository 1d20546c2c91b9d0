"""Entity-level exact-match precision / recall / F1 for BIO(ES) tag sequences (conlleval rules).

An entity is a maximal run of tags of one type that the conlleval chunking rules group together,
and a predicted entity counts as correct only when its type AND both boundaries equal a gold
entity's. The rules are conlleval's (and `seqeval`'s default, non-strict mode, which the tests
use as the reference):

* an entity starts at B- or S-, at an I-/E- that follows O / an E- / an S- or a tag of
  another type (so "O I-test" starts a test entity: I- after O is not dropped);
* it ends before O, B-, S-, a tag of another type, and after E- / S-.

Consequences the tests pin down: a predicted span that overlaps a gold span without matching it
is one false positive AND one false negative; the right span with the wrong type likewise.

Counts (`EntityCounts`) are per type and add up (`+`), so batches, documents or folds can be
counted separately and summed; `f1_report` turns them into micro-averaged precision / recall / F1
plus the same per type (precision 0 when nothing was predicted, F1 0 when P + R = 0, as
seqeval's defaults).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Iterable, Sequence

Entity = tuple[str, int, int]          # (type, first index, last index), inclusive
_PREFIXES = ("B", "I", "E", "S")


def split_tag(tag: str) -> tuple[str, str]:
    """'B-problem' -> ('B', 'problem'); 'O' -> ('O', ''). Raises ValueError on other forms."""
    if tag == "O":
        return "O", ""
    prefix, sep, kind = tag.partition("-")
    if sep != "-" or prefix not in _PREFIXES or not kind:
        raise ValueError(f"tag {tag!r} is not 'O' or '<B|I|E|S>-<type>'")
    return prefix, kind


def get_entities(tags: Sequence[str]) -> list[Entity]:
    """The entities of one tag sequence, in order, by the conlleval rules (module docstring)."""
    entities: list[Entity] = []
    start = None
    prev_prefix, prev_kind = "O", ""
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, kind = split_tag(tag)
        type_changed = kind != prev_kind
        ends = start is not None and (
            prev_prefix in ("E", "S") or prefix in ("O", "B", "S") or type_changed)
        if ends:
            entities.append((prev_kind, start, i - 1))
            start = None
        begins = prefix != "O" and (
            prefix in ("B", "S") or prev_prefix in ("O", "E", "S") or type_changed)
        if begins:
            start = i
        prev_prefix, prev_kind = prefix, kind
    return entities


@dataclasses.dataclass
class EntityCounts:
    """Per type: true positives, predicted entities, gold entities."""

    true_positives: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    predicted: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    gold: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def __add__(self, other: "EntityCounts") -> "EntityCounts":
        return EntityCounts(self.true_positives + other.true_positives,
                            self.predicted + other.predicted, self.gold + other.gold)

    def add_sentence(self, gold_tags: Sequence[str], pred_tags: Sequence[str]) -> None:
        gold = set(get_entities(gold_tags))
        pred = set(get_entities(pred_tags))
        for kind, _, _ in gold:
            self.gold[kind] += 1
        for kind, _, _ in pred:
            self.predicted[kind] += 1
        for kind, _, _ in gold & pred:
            self.true_positives[kind] += 1

    @property
    def types(self) -> list[str]:
        return sorted(set(self.gold) | set(self.predicted))


def count_entities(gold: Iterable[Sequence[str]], pred: Iterable[Sequence[str]]
                   ) -> EntityCounts:
    """Counts over sentences (lists of tags); gold and predicted sentences pair up in order and
    must have equal lengths (entities never cross a sentence boundary)."""
    counts = EntityCounts()
    gold, pred = list(gold), list(pred)
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sentences but {len(pred)} predicted ones")
    for i, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted tags")
        counts.add_sentence(g, p)
    return counts


def _prf(tp: int, predicted: int, gold: int) -> dict[str, float]:
    precision = tp / predicted if predicted else 0.0
    recall = tp / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def f1_report(counts: EntityCounts) -> dict:
    """Micro-averaged precision / recall / F1 and the same per type (with `support` = gold)."""
    tp, pred, gold = (sum(c.values()) for c in (counts.true_positives, counts.predicted,
                                                 counts.gold))
    out = _prf(tp, pred, gold)
    out.update({"true_positives": tp, "num_predicted": pred, "num_gold": gold, "per_type": {
        t: dict(_prf(counts.true_positives[t], counts.predicted[t], counts.gold[t]),
                support=counts.gold[t]) for t in counts.types}})
    return out


def entity_f1(gold: Iterable[Sequence[str]], pred: Iterable[Sequence[str]]) -> dict:
    """`f1_report(count_entities(gold, pred))`."""
    return f1_report(count_entities(gold, pred))
