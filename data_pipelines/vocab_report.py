"""The content of a DP vocabulary's ``vocab_privacy.json`` (``data_pipelines.dp_vocab``).

What the vocabulary claims (its mechanism, parameters and guarantee, per example) and the exact
corpus counts that come with it for the operator (``non_private_fields``: to be dropped before
publishing; ``dpbert.reporting.report.public_vocab_report`` keeps only the public fields when a
model ships it).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from data_pipelines import corpora, identity
from data_pipelines.vocab_privacy import HistogramPrivacy
from data_pipelines.wordpiece import special_tokens
from dpbert.core import units as privacy_units

# What one example (record) of the vocabulary is, by corpus format, or per patient.
EXAMPLE_DEFINITIONS = {
    "text": "one document of the text corpus (a blank-line-separated block of sentences)",
    "noteevents": "one MIMIC-III note (one NOTEEVENTS row, i.e. one ROW_ID)",
    "patient": "one patient (SUBJECT_ID): all their MIMIC-III notes (NOTEEVENTS rows) together",
}


def _finite_or_none(value: float | None) -> float | None:
    """``value`` as a float, or None when unset or not finite (JSON has no NaN)."""
    return float(value) if value is not None and math.isfinite(value) else None


def make_report(privacy: HistogramPrivacy | None, fmt: str, epsilon: float, delta: float,
                k: int, vocab_size: int, num_learned: int, num_unused: int,
                do_lower_case: bool, seed: int | None, num_examples: int,
                num_distinct: int, num_surviving: int,
                stats: corpora.ReadStats, unit: str = privacy_units.DOCUMENT_RECORD,
                duplicates: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The content of ``vocab_privacy.json``. ``duplicates``: ``identity``'s summary (the rule
    is public, the counts are not)."""
    duplicates = dict(duplicates or {})
    per_patient = unit == privacy_units.PATIENT_RECORD
    report: dict[str, Any] = {
        "dp": privacy is not None,
        "epsilon": float(epsilon) if privacy else None,
        "delta": float(delta) if privacy else None,
        "K": k if privacy else None,
        "unit": unit,
        "neighbouring_relation": ("add or remove one patient (all their notes)"
                                  if per_patient else "add or remove one example"),
        "example_definition": EXAMPLE_DEFINITIONS["patient" if per_patient else fmt],
        "format": fmt,
        # One record per identity (data_pipelines/identity.py): the rule, not its outcome.
        "record_identity": (identity.NOTE_IDENTITY if fmt == "noteevents"
                            else identity.TEXT_IDENTITY),
        "duplicate_ids": duplicates.get("duplicate_ids", identity.DEFAULT_RULE),
    }
    if privacy is not None:
        report.update(
            mechanism=privacy.mechanism(),
            accounting=privacy.accounting,
            epsilon_per_word=privacy.epsilon_per_word,
            delta_per_word=privacy.delta_per_word,
            noise_scale=privacy.noise_scale,
            threshold=privacy.threshold,
            delta_noise=privacy.delta_noise,
            delta_threshold=privacy.delta_threshold,
            secret_randomness=seed is None,
            noise_rng=("numpy Generator(PCG64), " + (
                "seeded by --seed: reproducible, NOT for a release" if seed is not None
                else "seeded from 128 bits of OS entropy")),
        )
    else:
        report.update(
            mechanism="NON-PRIVATE: raw word counts (no contribution bounding, no noise, "
                      "no threshold); this vocabulary can contain any rare word of the "
                      "corpus",
            requested_epsilon=_finite_or_none(epsilon),
            requested_delta=_finite_or_none(delta), requested_K=k)
    report.update(
        num_examples=num_examples,
        num_distinct_words=num_distinct,
        num_surviving_words=num_surviving,
        vocab_size=vocab_size,
        num_learned_tokens=num_learned,
        num_unused=num_unused,
        do_lower_case=do_lower_case,
        special_token_ids={t: i for i, t in enumerate(special_tokens(num_unused))
                           if not t.startswith("[unused")},
        reader={"records_read": stats.records_read, "records_kept": stats.records_kept,
                "skipped_iserror": stats.skipped_iserror,
                "skipped_malformed": stats.skipped_malformed,
                "skipped_empty": stats.skipped_empty,
                "skipped_bad_utf8": stats.skipped_bad_utf8},
        duplicates={k: duplicates.get(k, 0) for k in ("duplicated_ids", "copies_dropped")}
        | {"text": duplicates.get("text", "")},
        non_private_fields=["num_examples", "num_distinct_words", "reader", "duplicates"],
        non_private_note=("these fields are exact counts from the corpus, not covered by "
                          "epsilon/delta (num_distinct_words counts the bounded histogram's "
                          "nonzero words); drop them before publishing this file"),
    )
    return report


def console_summary(report: Mapping[str, Any], vocab_path, privacy_path
                    ) -> tuple[list[str], str, str]:
    """What launch/build_vocab.py says once a vocabulary is built: (lines for stderr, the log
    line, the closing line). Stderr gets the copies of duplicate records dropped (an exact count
    of the corpus: said on the console only, never in a shipped report) and the build's
    warnings."""
    notes = []
    if report.get("duplicates", {}).get("copies_dropped"):
        notes.append(f"NOTE: {report['duplicates']['text']}")
    notes += [f"WARNING: {warning}" for warning in report.get("warnings", ())]
    what = (f"DP (epsilon={report['epsilon']}, delta={report['delta']}, K={report['K']}, "
            f"threshold={report['threshold']:.1f})" if report["dp"] else "NON-PRIVATE")
    counts = (f"{report['num_surviving_words']} surviving words, "
              f"{report['num_learned_tokens']} learned tokens")
    return (notes, f"{what} vocabulary: {counts}",
            f"wrote {vocab_path} ({what}; {counts}) and {privacy_path}")
