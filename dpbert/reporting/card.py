"""The privacy section of a model card (README.md), written from a run's PUBLIC report.

`card_section` states only what the report (`dpbert.reporting.report.public_report`) says: the
headline, the training's mechanism and its unit, the vocabulary, the starting model's lineage
(`lineage_lines`, also the "Starting model" section of an input mode's folder), the total,
what one unit is and what epsilon does not cover, then every field of the report as a table.
`dpbert.models.hf_export.model_card` puts it in the card of every Hugging Face export.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from dpbert.core import units as privacy_units
from dpbert.reporting.report import fmt_eps, mechanism_and_sampling

def _flat(report: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    rows = []
    for key, value in report.items():
        if isinstance(value, Mapping):
            rows += _flat(value, f"{prefix}{key}.")
        elif key not in ("segments", "inherited_segments", "lineage",
                         "inherited_vocabularies", "released"):
            rows.append((f"{prefix}{key}", value))
    return rows


def _vocab_line(v: Mapping[str, Any], what: str = "Vocabulary") -> str:
    if v.get("epsilon") is None:
        return f"- {what}: {v.get('why')}"
    return (f"- {what} (DP WordPiece, per {v.get('example_definition', v.get('unit', 'document'))}"
            f"): ({fmt_eps(v['vocabulary_epsilon'])}, {v['vocabulary_delta']:.3g}) for adding or "
            f"removing one of its records; under this run's unit ({v.get('relation_note')}): "
            f"({fmt_eps(v['epsilon'])}, {v['delta']:.3g})"
            + ("" if v.get("private") else f". {v.get('why')}"))


def lineage_lines(report: Mapping[str, Any]) -> list[str]:
    lines = []
    for entry in report.get("lineage") or []:
        base = (f"({fmt_eps(entry['epsilon'])}, {entry['delta']:.3g})"
                if entry.get("epsilon") is not None else "no DP guarantee")
        lines.append(f"- Starting model (model.init_from_hf): {base}; {entry['how']}. Its "
                     f"headline: \"{entry.get('headline')}\"")
    for v in report.get("inherited_vocabularies") or []:
        lines.append(_vocab_line(v, "Vocabulary of the starting model's total"))
    return lines


def _groups_sequences(privacy_unit: object) -> bool:
    """Whether a report's unit is one of several sequences (`PrivacyUnit.per_unit`)."""
    unit = privacy_units.find(privacy_unit)
    return unit is not None and unit.per_unit


def card_section(report: Mapping[str, Any] | None) -> list[str]:
    """The card's "## Privacy" section (markdown lines) for a run's PUBLIC report (None: no
    run)."""
    lines = ["## Privacy", ""]
    if not report or not report.get("read_private_data", True):
        return lines + [
            "No differential-privacy guarantee is claimed for this model. It was exported by "
            "dpbert without a DP training run attached, so it carries whatever the source "
            "weights learned from their training data.", ""]
    if not report.get("dp") and not report.get("vocabulary") and not report.get("lineage"):
        return lines + [
            "No differential-privacy guarantee is claimed for this model: it was trained "
            "without DP-SGD (dp.enabled=False).", ""]
    lines += [f"**{report['headline']}**", ""]
    if report.get("dp"):
        t = report["training"]
        per_unit = (f" of {t['num_units']} {report['privacy_unit']}s (at most "
                    f"{t['max_examples_per_unit']} sequences each per batch, the "
                    f"{t['unit_loss']} of their losses clipped once per {report['privacy_unit']})"
                    if t.get("num_units") else "")
        inherited = (f" (composed with the starting model's DP-SGD on data that may overlap; "
                     f"this run alone: {fmt_eps(t['this_run_epsilon'])})"
                     if t.get("inherited_segments") else "")
        mechanism, sampling = mechanism_and_sampling(t)
        if t.get("mechanism") == "bandmf":  # dpbert.dp.bandmf
            mechanism += (f", jax-privacy's banded strategy "
                          f"{[round(c, 4) for c in t['strategy']]} with {t['num_bands'] - 1} "
                          "noise buffer(s) kept only in the private checkpoints")
        lines += [
            f"- Training ({mechanism}): ({fmt_eps(t['epsilon'])}, {t['delta']:.3g}){inherited}, "
            f"`{t['accountant']}` accountant of `dp_accounting`"
            + (" on jax-privacy's amplified BandMF event" if t.get("mechanism") == "bandmf"
               else "")
            + f", {sampling} sampling{per_unit}, noise multiplier {t['noise_multiplier']:.4g}, "
            f"clip norm {t['clip_norm']}, {t['steps']} steps; {t['randomness']}"]
    v = report.get("vocabulary") or {}
    if v.get("read_private_data"):
        lines.append(_vocab_line(v))
    elif v.get("assumption"):
        lines.append(f"- Vocabulary: assumed public: {v['assumption']}. WARNING: "
                     f"{v.get('warning', '')}.")
    lines += lineage_lines(report)
    if report.get("dp"):
        lines.append(f"- Total: {report['composition']}.")
    if report.get("budget"):
        b = report["budget"]
        lines.append(f"- Budget (dp.total_epsilon): total epsilon <= {b['total_epsilon']:g}; "
                     f"the vocabulary's {fmt_eps(b['other_parts_epsilon'])} left the training "
                     f"a target of {fmt_eps(b['training_target_epsilon'])}.")
    lines.append(f"- What one unit is: {report['unit_definition']}."
                 + (f" The guarantee covers a whole {report['privacy_unit']} directly (no group "
                    "privacy)." if _groups_sequences(report.get("privacy_unit")) else
                    " One note or one patient lands in many training sequences, so a guarantee "
                    "for a whole sentence, note or patient follows only by group privacy and is "
                    "much weaker (how many sequences each touches is an exact corpus statistic, "
                    "kept in the training workdir's report)."
                    if str(report.get("unit_definition", "")).startswith("one training "
                                                                         "sequence")
                    and report.get("dp") else ""))
    if report.get("not_covered"):
        lines.append(f"- {report['not_covered']}")
    lines += ["", "| field | value |", "|---|---|"]
    lines += [f"| {k} | {v if isinstance(v, str) else json.dumps(v)} |"
              for k, v in _flat(report)]
    lines.append("")
    return lines


def privacy_adaptive_section(report: Mapping[str, Any] | None) -> list[str]:
    """The card's section on privacy-adaptive pretraining (dχ inputs) when the report records
    it (`privacy_adaptive`: mechanism, η, MLM target), else []. η is dχ's metric-DP level for
    the users' inputs, not part of the (epsilon, delta) above."""
    pa = (report or {}).get("privacy_adaptive")
    if not pa:
        return []
    samples = f" ({pa['prob_samples']} privatized draws)" if pa.get("prob_samples") else ""
    return ["## Privacy-adaptive pretraining (dχ)", "",
            f"This model was pretrained on dχ-privatized input: mechanism `{pa['mechanism']}` "
            f"at η = {pa['eta']:g}, MLM target `{pa['mlm_target']}`{samples}; frozen: "
            f"{pa['frozen']}. Serve or fine-tune it on text privatized with the same mechanism "
            "and η. η protects the users' inputs (dχ-privacy, a metric guarantee per token); "
            "it is not part of the (epsilon, delta) of the Privacy section.", ""]

