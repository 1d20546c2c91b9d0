"""Entity-level F1: hand-built cases, and seqeval (the reference implementation) on random tags."""

import random

import pytest
import seqeval.metrics
from seqeval.metrics.sequence_labeling import get_entities as seqeval_entities

from data_pipelines import ner_metrics as nm


def test_hand_built_cases():
    gold = ["B-problem", "I-problem", "I-problem", "O", "B-test", "O"]
    # Exact match.
    assert nm.entity_f1([gold], [gold])["f1"] == 1.0
    # Partial overlap: one false positive AND one false negative (the test entity is right).
    partial = ["B-problem", "I-problem", "O", "O", "B-test", "O"]
    r = nm.entity_f1([gold], [partial])
    assert (r["true_positives"], r["num_predicted"], r["num_gold"]) == (1, 2, 2)
    assert r["per_type"]["problem"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert r["per_type"]["test"]["f1"] == 1.0
    # Right span, wrong type: FP (treatment) + FN (problem).
    wrong = ["B-treatment", "I-treatment", "I-treatment", "O", "B-test", "O"]
    r = nm.entity_f1([gold], [wrong])
    assert (r["true_positives"], r["num_predicted"], r["num_gold"]) == (1, 2, 2)
    assert r["per_type"]["treatment"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0,
                                          "support": 0}
    assert r["precision"] == r["recall"] == r["f1"] == 0.5
    # I- after O starts an entity; a type switch inside a run splits it.
    assert nm.get_entities(["O", "I-test", "I-test", "O"]) == [("test", 1, 2)]
    assert nm.get_entities(["B-test", "I-problem", "I-problem"]) == [("test", 0, 0),
                                                                     ("problem", 1, 2)]
    assert nm.get_entities(["B-test", "B-test", "I-test"]) == [("test", 0, 0), ("test", 1, 2)]
    assert nm.get_entities(["S-x", "E-x", "B-x", "E-x", "I-x"]) == [
        ("x", 0, 0), ("x", 1, 1), ("x", 2, 3), ("x", 4, 4)]
    # An entity ending at the end of a sentence; nothing predicted -> P = 0 (seqeval's default).
    r = nm.entity_f1([["O", "B-test"]], [["O", "O"]])
    assert r["precision"] == 0.0 and r["recall"] == 0.0 and r["f1"] == 0.0


def test_bad_tags_and_shapes():
    for tag in ("B", "X-test", "Btest", "B-", "o"):
        with pytest.raises(ValueError, match="is not 'O' or"):
            nm.get_entities(["O", tag])
    with pytest.raises(ValueError, match="sentence 1: 2 gold tags but 1 predicted"):
        nm.count_entities([["O"], ["O", "O"]], [["O"], ["O"]])
    with pytest.raises(ValueError, match="2 gold sentences but 1 predicted"):
        nm.count_entities([["O"], ["O"]], [["O"]])


def random_tags(rng, n, scheme):
    types = ("problem", "test", "treatment")
    prefixes = ("B", "I") if scheme == "BIO" else ("B", "I", "E", "S")
    return ["O" if rng.random() < 0.4 else f"{rng.choice(prefixes)}-{rng.choice(types)}"
            for _ in range(n)]


@pytest.mark.parametrize("scheme", ["BIO", "BIOES"])
def test_agrees_with_seqeval_on_random_sequences(scheme):
    rng = random.Random(0)
    gold = [random_tags(rng, rng.randint(1, 25), scheme) for _ in range(400)]
    # Predictions: gold with some tags changed, so there are hits, misses and partial overlaps.
    pred = [[t if rng.random() < 0.8 else random_tags(rng, 1, scheme)[0] for t in s]
            for s in gold]
    for s in gold[:100]:
        assert nm.get_entities(s) == seqeval_entities(s)
    r = nm.entity_f1(gold, pred)
    assert 0.2 < r["f1"] < 0.9     # a non-trivial case
    assert r["precision"] == pytest.approx(seqeval.metrics.precision_score(gold, pred), abs=1e-12)
    assert r["recall"] == pytest.approx(seqeval.metrics.recall_score(gold, pred), abs=1e-12)
    assert r["f1"] == pytest.approx(seqeval.metrics.f1_score(gold, pred), abs=1e-12)
    per_type = seqeval.metrics.classification_report(gold, pred, output_dict=True)
    for kind in ("problem", "test", "treatment"):
        for field in ("precision", "recall", "f1"):
            want = per_type[kind]["f1-score" if field == "f1" else field]
            assert r["per_type"][kind][field] == pytest.approx(want, abs=1e-12)
        assert r["per_type"][kind]["support"] == per_type[kind]["support"]
    # Counting in two halves and adding gives the same counts.
    halves = nm.count_entities(gold[:200], pred[:200]) + nm.count_entities(gold[200:], pred[200:])
    assert nm.f1_report(halves) == r
