"""What a run may claim: privacy_report.json and the privacy section of the model card.

The headline is the TOTAL cost of everything that read the private corpus, per stated unit:

    total = vocabulary (if it was built from the private corpus) + training   (basic composition)

Basic composition: epsilons add, deltas add. The vocabulary's guarantee is per document (one
note, or one text document), or per patient when it was built with its notes grouped by
SUBJECT_ID. Per training unit it counts k times by group privacy, (k·ε_v, δ_v·Σ_{i<k} e^{i·ε_v}),
with k = `vocab_documents_per_unit`: per example, the documents one example takes its text from
(2 when segment B is a 'random next' from another document); per note, 1; per patient, 1 when
the vocabulary is per patient too (or the corpus has no SUBJECT_IDs, a patient being a
document), else the most notes one patient has. The report also states, from the data pipeline, how many
examples one sentence / document / subject touches (exact corpus statistics, flagged as not
privatized), so a reader can see what a sentence-, note- or patient-level statement would
cost by group privacy.

Anything that voids the claim makes the run "not private" with the reason in the headline:
noise or sampling from a public seed (`dpbert.dp.randomness`), a vocabulary built from the
private corpus without DP or with a public seed, or no DP at all.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

from dpbert.dp import accounting
from dpbert.dp import randomness

NOT_COVERED = (
    "Not covered by epsilon: training and held-out metrics (metrics.jsonl, TensorBoard, the "
    "console: loss, accuracy, num_nonfinite, held-out MLM numbers) are exact aggregates over "
    "private data, and checkpoints hold un-noised gradient sums and the run's secret noise key. "
    "Treat logs and checkpoints like the training data; share the model and this report.")
UNITS_NOTE = "exact statistics of the training corpus (not privatized)"
MULTIPLICITY_NOTE = ("exact statistics of the training corpus (not privatized), stated so that "
                     "group privacy can be judged")
# Vocabulary report fields that may travel with a model (the rest are exact corpus counts).
VOCAB_PUBLIC_FIELDS = ("dp", "epsilon", "delta", "K", "unit", "neighbouring_relation",
                       "example_definition", "format", "mechanism", "accounting",
                       "secret_randomness", "vocab_size", "num_learned_tokens")


def fmt_eps(x: float | None) -> str:
    """A privacy number in prose: 3 significant digits."""
    if x is None:
        return "inf"
    return f"{x:.3g}"


def unit_definition(privacy_unit: str, max_seq_length: int | None,
                    max_examples_per_unit: int | None = None, unit_key: str = "") -> str:
    """One sentence: what the guarantee protects (`unit_key`: "SUBJECT_ID" or "document", the
    key a patient was grouped by)."""
    if privacy_unit == "example":
        length = f" of at most {max_seq_length} tokens" if max_seq_length else ""
        return f"one training sequence{length} ([CLS] A [SEP] B [SEP])"
    per_batch = (f", at most {max_examples_per_unit} per batch"
                 if max_examples_per_unit else "")
    if privacy_unit == "patient" and unit_key == "document":
        return ("one patient, here one document (the corpus has no SUBJECT_IDs), with all the "
                f"training sequences made from it{per_batch}")
    return {"note": f"one note (document) with all the training sequences made from "
                    f"it{per_batch}",
            "patient": f"one patient (SUBJECT_ID) with all the training sequences made from "
                       f"their notes{per_batch}"}.get(privacy_unit, privacy_unit)


def vocab_unit(vocab_report: Mapping[str, Any] | None) -> str:
    """What the vocabulary's neighbouring records are: "patient" or "document" (a note, or a
    document of a text corpus; reports written before the field existed are per document)."""
    return str((vocab_report or {}).get("unit", "document"))


def vocab_documents_per_unit(vocab_report: Mapping[str, Any] | None, privacy_unit: str,
                             multiplicity: Mapping[str, Any] | None,
                             units: Mapping[str, Any] | None) -> int:
    """k: how many of the vocabulary's neighbouring records one training unit spans (the
    vocabulary then counts k times by group privacy; see the module docstring)."""
    multiplicity = multiplicity or {}
    if privacy_unit == "example":
        documents = int(multiplicity.get("documents_per_example_max", 2))
        if vocab_unit(vocab_report) == "patient":
            return int(multiplicity.get("subjects_per_example_max", documents))
        return documents
    if privacy_unit == "note" or vocab_unit(vocab_report) == "patient":
        return 1  # a note lies in one document and in one patient
    if (units or {}).get("unit_key") == "document":
        return 1  # no SUBJECT_IDs: a patient is a document
    return int(multiplicity.get("documents_per_subject_max", 1))


def units_part(plan, units: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The training report's unit fields (None per example): the accountant's N is the number
    of units, each contributing at most K sequences per logical batch."""
    if not getattr(plan, "per_unit", False):
        return None
    return {"num_units": int(plan.num_examples),
            "max_examples_per_unit": int(plan.max_examples_per_unit),
            "unit_loss": plan.unit_loss,
            "unit_key": (units or {}).get("unit_key")}


def public_vocab_report(vocab_report: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a vocabulary report that may be shipped (drops exact corpus counts)."""
    out = {k: vocab_report[k] for k in VOCAB_PUBLIC_FIELDS if k in vocab_report}
    if "secret_randomness" not in out and vocab_report.get("dp"):
        # Reports written before the field existed say it in the noise_rng text.
        out["secret_randomness"] = "NOT for a release" not in str(vocab_report.get("noise_rng"))
    return out


def vocabulary_part(vocab_report: Mapping[str, Any] | None, origin: str,
                    documents_per_unit: int) -> dict[str, Any]:
    """The vocabulary's row of the total (`origin`: "built" from the training corpus here,
    "file" (config.vocab.file) or "checkpoint" (the starting checkpoint's vocab.txt))."""
    if vocab_report is None:
        where = {"file": "config.vocab.file", "checkpoint": "the starting checkpoint"}
        return {"stage": "vocabulary", "read_private_data": False, "epsilon": 0.0,
                "delta": 0.0, "private": True,
                "assumption": f"the vocabulary ({where.get(origin, origin)}, no "
                              "vocab_privacy.json beside it) was not built from the private "
                              "corpus"}
    part: dict[str, Any] = {"stage": "vocabulary", "read_private_data": True,
                            **public_vocab_report(vocab_report)}
    if not vocab_report.get("dp"):
        part.update(private=False, epsilon=None, delta=None,
                    why="the vocabulary was built WITHOUT differential privacy (raw word "
                        "counts); if it read the private corpus there is no guarantee")
        return part
    eps_v, delta_v = float(vocab_report["epsilon"]), float(vocab_report["delta"])
    k = max(int(documents_per_unit), 1)
    part.update(
        vocabulary_epsilon=eps_v, vocabulary_delta=delta_v, documents_per_unit=k,
        epsilon=k * eps_v, delta=delta_v * sum(math.exp(i * eps_v) for i in range(k)),
        private=bool(part.get("secret_randomness", True)))
    if k > 1:
        part["lifted"] = (f"the vocabulary is DP per document; one unit takes its text from up "
                          f"to {k} documents, so it counts {k} times (group privacy)")
    elif vocab_unit(vocab_report) == "patient":
        part["unit_relation"] = ("the vocabulary is DP per patient (a patient's notes grouped by "
                                 "SUBJECT_ID before bounding) and one training unit lies within "
                                 "one patient, so it counts once (documents_per_unit = 1, no "
                                 "group-privacy lifting)")
    if not part["private"]:
        part["why"] = ("the vocabulary's noise was derived from a public seed (vocab.seed set; "
                       "build it with vocab.seed=None for a release)")
    return part


def training_part(ledger, steps_in_segment: int, *, clip_norm: float, privacy_unit: str,
                  secret: bool, target_epsilon: float | None,
                  stopped_by_budget: bool, units: Mapping[str, Any] | None = None
                  ) -> dict[str, Any]:
    """The DP-SGD row: `accounting.privacy_report` of the composed ledger (`units`:
    `units_part`, for privacy units of several sequences)."""
    total_steps = ledger.closed_steps + steps_in_segment
    part = accounting.privacy_report(ledger.current, total_steps, clip_norm=clip_norm,
                                     privacy_unit=privacy_unit,
                                     epsilon=ledger.epsilon(steps_in_segment))
    if units:
        part.update(units)
        part["note"] = part["note"].split(" The privacy unit")[0] + (
            f" The sampler draws whole {privacy_unit}s (Poisson over the {units['num_units']} "
            f"units, num_examples counts units), each contributing at most "
            f"{units['max_examples_per_unit']} sequences to a logical batch, and the clipper "
            f"clips each unit's gradient (the {units['unit_loss']} of its sequences' losses) "
            "once to clip_norm: one unit changes the clipped sum by at most clip_norm.")
    if ledger.closed:
        part["segments"] = ledger.to_json(steps_in_segment)
        part["note"] += (f" The run was resumed under {len(ledger.closed) + 1} different "
                         "mechanisms (segments); epsilon is dp_accounting's composition of "
                         "all of them.")
    part.update(stage="training", secret_randomness=secret, target_epsilon=target_epsilon,
                stopped_by_budget=stopped_by_budget,
                private=secret and part["proven_bound"],
                randomness=randomness.SECRET_NOTE if secret else randomness.SEEDED_NOTE)
    if not secret:
        part["why"] = ("the training noise and batch sampling were derived from a public seed "
                       "(dp.insecure_seeded_noise=True)")
    elif not part["proven_bound"]:
        part["why"] = accounting.SHUFFLE_NOTE
    return part


def run_report(training: dict[str, Any] | None, vocabulary: dict[str, Any],
               *, privacy_unit: str, max_seq_length: int | None,
               multiplicity: Mapping[str, Any] | None, steps: int,
               unit: str | None = None,
               units: Mapping[str, Any] | None = None,
               max_examples_per_unit: int | None = None) -> dict[str, Any]:
    """privacy_report.json: the total first, then its parts. `unit`: what one example is, in
    words (a task's own definition; default `unit_definition`); `units`: the data's unit
    summary for privacy units of several sequences."""
    unit = unit or unit_definition(privacy_unit, max_seq_length, max_examples_per_unit,
                                   (units or {}).get("unit_key", ""))
    report: dict[str, Any] = {"dp": training is not None, "steps": steps,
                              "privacy_unit": privacy_unit, "unit_definition": unit}
    if units:
        report["units"] = {**units, "max_examples_per_unit": max_examples_per_unit,
                           "note": UNITS_NOTE}
    if multiplicity:
        report["unit_multiplicity"] = {**multiplicity, "note": MULTIPLICITY_NOTE}
    if training is None:
        report.update(private=False, epsilon=None, delta=None,
                      headline="No differential-privacy guarantee: trained without DP-SGD "
                               "(dp.enabled=False).",
                      note="trained without differential privacy (dp.enabled=False)")
        if vocabulary.get("read_private_data"):
            report["vocabulary"] = vocabulary
        return report
    parts = [p for p in (vocabulary, training) if p.get("read_private_data", True)]
    private = all(p.get("private") for p in parts)
    finite = all(p.get("epsilon") is not None for p in parts)
    eps = sum(p["epsilon"] for p in parts) if finite else None
    delta = sum(p["delta"] for p in parts) if finite else None
    report.update(epsilon=eps, delta=delta, private=private and finite,
                  proven_bound=training["proven_bound"],
                  composition="basic composition (epsilons add, deltas add) of: " +
                              ", ".join(p["stage"] for p in parts),
                  training=training, vocabulary=vocabulary, not_covered=NOT_COVERED)
    report["headline"] = _headline(report, parts, unit)
    return report


def _headline(report: Mapping[str, Any], parts: list[dict], unit: str) -> str:
    why = [p["why"] for p in parts if p.get("why")]
    if report["epsilon"] is None:
        return "No differential-privacy guarantee: " + " ".join(why)
    claim = (f"({fmt_eps(report['epsilon'])}, {report['delta']:.3g})-differential privacy with "
             f"respect to {unit}, for everything that read the private data (" +
             " + ".join(f"{p['stage']} {fmt_eps(p['epsilon'])}" for p in parts) + ").")
    if not report["private"]:
        return "NOT PRIVATE: " + "; ".join(why) + ". Nominal figure, not a guarantee: " + claim
    return claim


# ------------------------------------------------------------------------------- model card

def _flat(report: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    rows = []
    for key, value in report.items():
        if isinstance(value, Mapping):
            rows += _flat(value, f"{prefix}{key}.")
        elif key != "segments":
            rows.append((f"{prefix}{key}", value))
    return rows


def card_section(report: Mapping[str, Any] | None) -> list[str]:
    """The card's "## Privacy" section (markdown lines) for a run's report (None: no run)."""
    lines = ["## Privacy", ""]
    if not report or (not report.get("dp") and not report.get("vocabulary")):
        return lines + [
            "No differential-privacy guarantee is claimed for this model. It was exported by "
            "dpbert without a DP training run attached, so it carries whatever the source "
            "weights learned from their training data.", ""]
    lines += [f"**{report['headline']}**", ""]
    if report.get("dp"):
        t = report["training"]
        per_unit = (f" of {t['num_units']} {report['privacy_unit']}s (at most "
                    f"{t['max_examples_per_unit']} sequences each per batch, the "
                    f"{t['unit_loss']} of their losses clipped once per {report['privacy_unit']})"
                    if t.get("num_units") else "")
        lines += [
            f"- Training (DP-SGD): ({fmt_eps(t['epsilon'])}, {t['delta']:.3g}), "
            f"`{t['accountant']}` accountant of `dp_accounting`, "
            f"{t['sampling']} sampling{per_unit}, noise multiplier {t['noise_multiplier']:.4g}, "
            f"clip norm {t['clip_norm']}, {t['steps']} steps; {t['randomness']}"]
    v = report.get("vocabulary") or {}
    if v.get("read_private_data"):
        if v.get("epsilon") is None:
            lines.append(f"- Vocabulary: {v.get('why')}")
        else:
            lines.append(
                f"- Vocabulary (DP WordPiece, per {v.get('example_definition', 'document')}): "
                f"({fmt_eps(v['vocabulary_epsilon'])}, {v['vocabulary_delta']:.3g})"
                + (f"; {v['lifted']}: ({fmt_eps(v['epsilon'])}, {v['delta']:.3g})"
                   if v.get("lifted") else "")
                + (f"; {v['unit_relation']}" if v.get("unit_relation") else "")
                + ("" if v.get("private") else f". {v.get('why')}"))
    elif v.get("assumption"):
        lines.append(f"- Vocabulary: assumed public: {v['assumption']}.")
    if report.get("dp"):
        lines.append(f"- Total: {report['composition']}.")
    mult = report.get("unit_multiplicity")
    units = report.get("units")
    if units:
        e = units["examples_per_unit"]
        lines.append(f"- What one unit is: {report['unit_definition']}. The guarantee covers "
                     f"a whole {report['privacy_unit']} directly (no group privacy): the "
                     f"training data has {units['num_units']} of them, with up to {e['max']} "
                     f"training sequences each (mean {e['mean']:.3g}; {units['note']}).")
    elif mult:
        def row(name: str) -> str:
            m = mult.get(name)
            return f"one {name} in up to {m['max']} (mean {m['mean']:.3g})" if m else ""
        touched = "; ".join(filter(None, (row(n) for n in ("sentence", "document", "subject"))))
        lines.append(f"- What one unit is: {report['unit_definition']}. In the training data "
                     f"{touched} training sequences ({mult['note']}); a guarantee for a whole "
                     "sentence, note or patient follows only by group privacy and is much "
                     "weaker.")
    if report.get("not_covered"):
        lines.append(f"- {report['not_covered']}")
    lines += ["", "| field | value |", "|---|---|"]
    lines += [f"| {k} | {v if isinstance(v, str) else json.dumps(v)} |"
              for k, v in _flat(report)]
    lines.append("")
    return lines
