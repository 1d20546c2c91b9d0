"""data_pipelines.vocab_preflight: the corpus's records against the DP vocabulary's threshold,
counted and judged before anything is built (issue 36)."""

import pytest

from data_pipelines import corpora, synthetic_notes, vocab_preflight as vp

FIELDS = {"epsilon": ("--config.vocab.epsilon", 8.0), "delta": ("--config.vocab.delta", 1e-6),
          "max_words_per_example": ("--config.vocab.max_words_per_example", 64),
          "file": ("--config.vocab.file", "")}


def test_counts_the_records_the_vocabulary_would_see(tmp_path):
    notes = tmp_path / "n.csv.gz"
    written = list(synthetic_notes.generate_synthetic(30, seed=1))
    synthetic_notes.write_noteevents_csv(notes, written)
    assert vp.count_records(notes, "noteevents") == 30
    assert vp.count_records(notes, "noteevents", "patient") == len({n.note.subject_id
                                                                    for n in written})
    text = tmp_path / "t.txt"
    text.write_text("a b.\nc d.\n\ne f.\n\n\ng h.\n")
    assert vp.count_records(text, "text") == 3
    with pytest.raises(ValueError, match="unit='patient' needs a noteevents corpus"):
        vp.count_records(text, "text", "patient")
    with pytest.raises(corpora.CorpusError, match="not found"):
        vp.count_records(tmp_path / "missing.csv", "noteevents")


def test_assess_refuses_below_two_thresholds_and_finds_the_epsilon_that_would_do():
    tau = vp.threshold(8.0, 1e-6, 64)
    assert 85 < tau < 95   # about 91 records must use a word at epsilon 8, K 64
    ok = vp.assess(2000, 8.0, 1e-6, 64)
    assert not ok.refused and not ok.thin and ok.epsilon_needed is None
    thin = vp.assess(282, 8.0, 1e-6, 64)   # the NOTEEVENTS sample's patients
    assert not thin.refused and thin.thin and thin.needed == 182 and thin.good == 907
    low = vp.assess(150, 8.0, 1e-6, 64)
    assert low.refused and low.epsilon_needed is not None
    # the suggested epsilon really brings 150 records to 2 x its threshold, and is not far above
    assert 2 * vp.threshold(low.epsilon_needed, 1e-6, 64) <= 150
    assert 2 * vp.threshold(0.9 * low.epsilon_needed, 1e-6, 64) > 150
    assert vp.assess(5, 8.0, 1e-6, 64).epsilon_needed is None  # no epsilon up to 64 does


def test_explain_names_the_config_fields_and_the_fixes():
    msg = vp.explain(vp.assess(150, 8.0, 1e-6, 64), what="patients (SUBJECT_IDs)",
                     where="notes.csv.gz", fields=FIELDS)
    assert msg.startswith("--config.vocab.epsilon=8.0: too few patients (SUBJECT_IDs) for a "
                          "useful DP vocabulary: notes.csv.gz has 150;")
    assert "at least 182 patients" in msg and "--config.vocab.file=PATH/vocab.txt" in msg
    assert "--config.vocab.epsilon=1" in msg and "or more" in msg
    assert "--epsilon " not in msg   # build_vocab's flag, not this run's field
    warn = vp.explain(vp.assess(282, 8.0, 1e-6, 64), what="patients", where="n", fields=FIELDS)
    assert "3.1 x the DP vocabulary's threshold" in warn and "thin vocabulary" in warn
