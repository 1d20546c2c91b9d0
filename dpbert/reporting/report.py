"""What a run may claim: privacy_report.json (the model card's privacy section, written from
it, is `dpbert.reporting.card`).

The headline is the TOTAL cost of everything that read the private corpus, per stated unit:

    total = vocabulary (if it was built from the private corpus)
            + training (this run's DP-SGD, composed with the DP-SGD of the starting model when
              its data may overlap: `dpbert.reporting.lineage`)
            + the other vocabularies of that starting model's total        (basic composition)

Basic composition: epsilons add, deltas add. The vocabulary's guarantee is for adding or
removing one of ITS records (a document/note, or a patient when built with its notes grouped by
SUBJECT_ID). Under the training's neighbouring relation a unit may instead MODIFY records (one
training sequence takes its text from up to 2 documents; removing a note modifies its patient's
record) or span several of them (a patient's notes in a per-note vocabulary, up to the public
cap `vocab.max_records_per_unit`); `vocab_relation` decides which, from public facts only, and
`data_pipelines.vocab_privacy.histogram_guarantee` computes the vocabulary's (epsilon, delta)
under it with dp_accounting from the mechanism (never a data-dependent multiplier).

Two reports: WORKDIR/privacy_report.json is the run's full report, PRIVATE: it adds exact
statistics of the training corpus (`units`, `unit_multiplicity`: examples per unit, documents,
subjects) for the operator. `public_report` drops them; it is what an export ships
(`privacy_report.json` beside the weights and the card's privacy section) and what a later run
reads to compose its lineage.

Anything that voids the claim makes the run "not private" with the reason in the headline:
noise or sampling from a public seed (`dpbert.dp.randomness`), a vocabulary built from the
private corpus without DP or with a public seed, a starting model trained on (possibly) the same
data without DP, or no DP at all.

Every sentence of a report is written here: the DP engine returns numbers and flags
(`dpbert.dp.accounting.privacy_report`, `Accountant.coarse_grid`), the privacy unit its
definition (`dpbert.core.units`), and this module words them (`mechanism_report`, the training
row, the headline, and `cli_answer` for launch/privacy.py); `dpbert.reporting.card` words the
model card from the public report.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

from dpbert.core import units as privacy_units
from dpbert.dp import accounting
from dpbert.dp import randomness
from dpbert.errors import ConfigError

NOT_COVERED = (
    "Not covered by epsilon: training and held-out metrics (metrics.jsonl, TensorBoard, the "
    "console: loss, accuracy, num_nonfinite, held-out MLM numbers) are exact aggregates over "
    "private data, checkpoints hold un-noised gradient sums and the run's secret noise key, and "
    "the workdir's privacy_report.json holds exact corpus statistics. Treat them like the "
    "training data; share the model folder (its privacy_report.json is the public report).")
UNITS_NOTE = "exact statistics of the training corpus (not privatized; never shipped)"
MULTIPLICITY_NOTE = ("exact statistics of the training corpus (not privatized; never shipped), "
                     "stated so that the operator can judge group privacy")
RELEASED_NOTE = ("The public report: what may ship with the model. Exact statistics of the "
                 "private corpus (examples, documents and subjects per unit) are not in it; they "
                 "stay in the training workdir's privacy_report.json. The public parameters of "
                 "the mechanism are: sigma, C, the expected batch size, q, N (the number of "
                 "training units, which the accountant needs), the truncation size, the steps, "
                 "delta and the accountant.")
SHUFFLE_NOTE = (
    "sampling='shuffle' (fixed-size batches from shuffled epochs): epsilon is "
    "computed as if batches were Poisson-sampled with q = batch_size / "
    "num_examples. This is NOT a proven differential-privacy bound for "
    "shuffled batches.")
# Starts the sentence a mechanism's note adds when its PLD grid was coarsened.
COARSE_GRID_NOTE = "Noise multiplier too small for the default PLD grid"
# Fields of a run's report that hold exact corpus statistics (the workdir's report only).
PRIVATE_FIELDS = ("units", "unit_multiplicity")
# Vocabulary report fields that may travel with a model (the rest are exact corpus counts).
VOCAB_PUBLIC_FIELDS = ("dp", "epsilon", "delta", "K", "unit", "neighbouring_relation",
                       "example_definition", "format", "mechanism", "accounting",
                       "secret_randomness", "vocab_size", "num_learned_tokens", "noise_scale",
                       "threshold", "delta_noise", "delta_threshold", "record_identity",
                       "duplicate_ids")
# Fields of a vocabulary part that the run computed (public: parameters and their guarantee).
_VOCAB_PART_FIELDS = ("stage", "read_private_data", "origin", "vocab_sha256",
                      "vocabulary_epsilon", "vocabulary_delta", "relation", "records",
                      "relation_note", "private", "why", "assumption", "warning")


def fmt_eps(x: float | None) -> str:
    """A privacy number in prose: 3 significant digits."""
    if x is None:
        return "inf"
    return f"{x:.3g}"


def mechanism_and_sampling(training: Mapping[str, Any]) -> tuple[str, str]:
    """(the mechanism, its sampling) of a report's training section in words, e.g. ("DP-SGD",
    "poisson") or ("BandMF, 4 band(s)", "cyclic poisson (4 groups of n)"): the card and the
    run's closing line say the same."""
    if training.get("mechanism") == "bandmf":  # dpbert.dp.bandmf
        return (f"BandMF, {training['num_bands']} band(s)",
                f"cyclic {training['sampling']} ({training['num_bands']} groups of "
                f"{training['group_size']})")
    return "DP-SGD", training["sampling"]


def unit_definition(privacy_unit: str, max_seq_length: int | None,
                    max_examples_per_unit: int | None = None, unit_key: str = "") -> str:
    """One sentence: what the guarantee protects (`dpbert.core.units.PrivacyUnit.definition`;
    `unit_key`: "SUBJECT_ID" or "document", the key a patient was grouped by). A name that is
    no unit is returned as it is."""
    unit = privacy_units.find(privacy_unit)
    if unit is None:
        return privacy_unit
    return unit.definition(max_seq_length, max_examples_per_unit, unit_key)


def vocab_unit(vocab_report: Mapping[str, Any] | None) -> str:
    """What the vocabulary's neighbouring records are: "patient" or "document" (a note, or a
    document of a text corpus; reports written before the field existed are per document)."""
    return str((vocab_report or {}).get("unit", privacy_units.DOCUMENT_RECORD))


@dataclasses.dataclass(frozen=True)
class VocabRelation:
    """How one training unit's neighbour changes the vocabulary's records: "add_remove" of
    `records` whole records or "replace" (modification) of `records` records; `records` is a
    public bound. `why` says it in words."""

    relation: str
    records: int
    why: str


def vocab_relation(vocab_report: Mapping[str, Any] | None,
                   privacy_unit: str | privacy_units.PrivacyUnit, *,
                   per_sequence: bool = True, unit_key: str = "",
                   max_records_per_unit: int | None = None,
                   observed_records_per_unit: int | None = None) -> VocabRelation:
    """The vocabulary's neighbouring relation under the training's (module docstring), from
    public facts: the two units, how sequences are made, and the public cap
    `max_records_per_unit` (`vocab.max_records_per_unit`) where one training unit may span
    several vocabulary records. `observed_records_per_unit` (private: the most vocabulary records
    one training unit of this corpus spans, when known) is only CHECKED against the cap: a
    corpus that exceeds it is refused (ConfigError), so the released claim depends on the cap
    alone.

    `per_sequence`: the training unit "example" is a pretraining sequence (True; its text comes
    from up to 2 documents) or a fine-tuning example (False; assumed to lie within one record).
    """
    v = vocab_unit(vocab_report)
    unit = privacy_units.get(privacy_unit)
    if not unit.per_unit:
        if per_sequence:
            return VocabRelation("replace", 2, (
                f"one training sequence takes its text from up to 2 {v}s (segment A, and a "
                f"'random next' segment B from another one); removing it modifies those {v}s' "
                "vocabulary records"))
        return VocabRelation("replace", 1, (
            f"one fine-tuning example is assumed to lie within one {v} of the vocabulary's "
            "corpus; removing it modifies that record"))
    # A unit of one document (a note) inside a per-patient vocabulary's record.
    if unit.vocab_record == privacy_units.DOCUMENT_RECORD and v == privacy_units.PATIENT_RECORD:
        return VocabRelation("replace", 1, "removing one note modifies its patient's vocabulary "
                                           "record (a patient's notes are one record)")
    if unit.vocab_record == privacy_units.PATIENT_RECORD and (
            v == privacy_units.PATIENT_RECORD or unit_key == privacy_units.DOCUMENT_KEY):
        return VocabRelation("add_remove", 1, (
            "one training patient is one vocabulary record"
            if v == privacy_units.PATIENT_RECORD else
            "the corpus has no SUBJECT_IDs: one training patient is one document, one "
            "vocabulary record"))
    # A per-document vocabulary and a training unit that may span several documents (a patient's
    # notes; a note unit spans one document, since duplicated ROW_IDs are refused or merged
    # before anything reads them, `data_pipelines.identity`): the public cap, checked.
    cap = int(max_records_per_unit) if max_records_per_unit else 1
    if observed_records_per_unit is not None and observed_records_per_unit > cap:
        raise ConfigError(
            f"config.vocab.max_records_per_unit={max_records_per_unit!r}: the vocabulary is DP "
            f"per document and one training {unit.noun} of this corpus spans more documents than "
            f"that, so the vocabulary's guarantee per {unit.name} would not hold. Build the "
            "vocabulary per patient (launch/build_vocab.py --unit=patient, or let the run build "
            "it), or set vocab.max_records_per_unit to a public bound on documents per "
            f"{unit.name} that the corpus respects (the vocabulary then counts that many "
            "times, by group privacy)")
    if cap == 1:
        return VocabRelation("add_remove", 1, f"one training {unit.name} is one document, one "
                                              "vocabulary record")
    return VocabRelation("add_remove", cap, (
        f"one training {unit.name} spans up to {cap} documents (the public bound "
        "vocab.max_records_per_unit, checked on the corpus), each one vocabulary record"))


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


_ORIGINS = {"file": "config.vocab.file", "checkpoint": "the starting model's folder",
            "built": "built from the training corpus by this run"}


def vocabulary_part(vocab_report: Mapping[str, Any] | None, origin: str,
                    relation: VocabRelation | None, vocab_sha256: str | None = None
                    ) -> dict[str, Any]:
    """The vocabulary's row of the total (`origin`: "built" from the training corpus here,
    "file" (config.vocab.file) or "checkpoint" (the starting model's vocab.txt)); `relation`:
    `vocab_relation` for the run (None only without a report)."""
    if vocab_report is None:
        where = _ORIGINS.get(origin, origin)
        return {"stage": "vocabulary", "read_private_data": False, "epsilon": 0.0,
                "delta": 0.0, "private": True, "origin": origin, "vocab_sha256": vocab_sha256,
                "assumption": f"the vocabulary ({where}, no vocab_privacy.json beside it) was "
                              "not built from the private corpus",
                "warning": "a vocabulary without vocab_privacy.json is counted as public; if "
                           "it was built from this corpus, this total is wrong"}
    part: dict[str, Any] = {"stage": "vocabulary", "read_private_data": True, "origin": origin,
                            "vocab_sha256": vocab_sha256, **public_vocab_report(vocab_report)}
    if not vocab_report.get("dp"):
        part.update(private=False, epsilon=None, delta=None,
                    why="the vocabulary was built WITHOUT differential privacy (raw word "
                        "counts); if it read the private corpus there is no guarantee")
        return part
    from data_pipelines import vocab_privacy  # noqa: PLC0415

    eps_v, delta_v = float(vocab_report["epsilon"]), float(vocab_report["delta"])
    guarantee = vocab_privacy.histogram_guarantee(
        vocab_privacy.privacy_from_report(vocab_report), relation.relation, relation.records)
    part.update(vocabulary_epsilon=eps_v, vocabulary_delta=delta_v,
                relation=relation.relation, records=relation.records,
                relation_note=f"{relation.why}: {guarantee.explanation}",
                epsilon=float(guarantee.epsilon), delta=float(guarantee.delta),
                private=bool(part.get("secret_randomness", True)))
    if not part["private"]:
        part["why"] = ("the vocabulary's noise was derived from a public seed (vocab.seed set, "
                       "or --seed of launch/build_vocab.py); rebuild it from OS entropy for a "
                       "release (vocab.seed=None in a pretraining run, no --seed)")
    return part


def public_vocabulary_part(part: Mapping[str, Any]) -> dict[str, Any]:
    """A vocabulary part with only shippable fields."""
    return {k: v for k, v in part.items()
            if k in VOCAB_PUBLIC_FIELDS or k in _VOCAB_PART_FIELDS}


# ------------------------------------------------------------------- one mechanism, in words

def _sampling_sentence(spec: accounting.AccountingSpec, unit: privacy_units.PrivacyUnit) -> str:
    if spec.sampling == "shuffle":
        return SHUFFLE_NOTE
    if spec.mechanism == "bandmf":  # dpbert.dp.bandmf
        b, left = spec.num_bands, spec.num_examples % spec.num_bands
        return (f"BandMF (jax-privacy's banded matrix factorization, {b} band(s), strategy "
                f"{[round(c, 4) for c in spec.strategy]}): each step's noise is correlated with "
                f"the previous {b - 1} steps' (the buffers, kept only in the private "
                f"checkpoints); cyclic Poisson sampling: the {unit.name}s are split into {b} "
                f"groups of {spec.group_size}" + (f" ({left} never sampled)" if left else "")
                + f" and step t samples group t mod {b}, so a {unit.name} takes part at most "
                f"once in any {b} consecutive steps. Epsilon is an upper bound from "
                f"dp_accounting ({spec.accountant.upper()} accountant) for jax-privacy's "
                f"amplified BandMF event (ceil(steps / {b}) rounds of the subsampled Gaussian "
                f"of one group); neighbouring: one {unit.name} replaced by a null one "
                "(zero-out, jax-privacy's relation for BandMF; dp_accounting gives these events "
                "the same epsilon under add-or-remove).")
    return ("Poisson sampling; epsilon is an upper bound from dp_accounting "
            f"({spec.accountant.upper()} accountant, add-or-remove-one neighbouring "
            f"{unit.name}s).")


def _unit_sentence(unit: privacy_units.PrivacyUnit, units: Mapping[str, Any] | None) -> str:
    """What the sampler and the clipper do with one unit (`units`: `units_part`, for units of
    several sequences)."""
    if not units:
        return (f"The privacy unit ({unit.name!r}) must be what the sampler draws and the "
                "clipper treats as ONE example (one dataset row); a unit spanning several rows "
                "is not covered.")
    return (f"The sampler draws whole {unit.name}s (Poisson over the {units['num_units']} "
            f"units, num_examples counts units), each contributing at most "
            f"{units['max_examples_per_unit']} sequences to a logical batch, and the clipper "
            f"clips each unit's gradient (the {units['unit_loss']} of its sequences' losses) "
            "once to clip_norm: one unit changes the clipped sum by at most clip_norm.")


def grid_sentence(spec: accounting.AccountingSpec, steps: int) -> str:
    """The sentence saying that `steps` steps of `spec` were accounted on a coarsened PLD grid
    (`Accountant.coarse_grid`); "" on the default grid."""
    grid = spec.accounted_by.coarse_grid(spec, steps)
    if grid is None:
        return ""
    return (f"{COARSE_GRID_NOTE} ({accounting.DEFAULT_PLD_DISCRETIZATION:g}: minutes and "
            f"gigabytes); a coarser pessimistic grid ({grid:g}) was used: epsilon is still an "
            "upper bound, only a looser one.")


def mechanism_note(spec: accounting.AccountingSpec, steps: int,
                   privacy_unit: str | privacy_units.PrivacyUnit,
                   units: Mapping[str, Any] | None = None) -> str:
    """The `note` of one mechanism's report: how it is accounted, what one unit is to the
    sampler and the clipper, and (one row per unit) whether the PLD grid was coarsened. (The
    note of units of several sequences has never carried the grid sentence.)"""
    unit = privacy_units.get(privacy_unit)
    note = f"{_sampling_sentence(spec, unit)} {_unit_sentence(unit, units)}"
    grid = "" if units else grid_sentence(spec, steps)
    return f"{note} {grid}" if grid else note


def mechanism_report(spec: accounting.AccountingSpec, steps: int, *, clip_norm: float | None,
                     privacy_unit: str | privacy_units.PrivacyUnit = "example",
                     epsilon: float | None = None) -> dict[str, Any]:
    """The privacy statement of one mechanism, JSON-serialisable: `accounting.privacy_report`'s
    numbers and flags (epsilon, delta, noise_multiplier, effective_noise_multiplier, clip_norm,
    sampling, sampling_probability, expected_batch_size, max_batch_size, num_examples, steps,
    accountant, privacy_unit, noise_mode, num_shards, proven_bound) and its `note`."""
    part = accounting.privacy_report(spec, steps, clip_norm=clip_norm,
                                     privacy_unit=privacy_unit, epsilon=epsilon)
    part["note"] = mechanism_note(spec, part["steps"], privacy_unit)
    return part


# launch/privacy.py's two questions.
CLI_COMMANDS = ("epsilon", "calibrate")


def cli_answer(command: str, flags: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """launch/privacy.py's answer: (the privacy report, JSON-serialisable; the same in text).

    `command`: "epsilon" (of `flags["noise_multiplier"]`) or "calibrate" (the smallest noise
    multiplier within 0.1 % whose epsilon is <= `flags["target_epsilon"]`); `flags`: the
    launcher's flag values by name (num_examples, batch_size, steps, delta, accountant,
    sampling, noise_mode, num_shards, max_batch_size, and optionally mechanism "dpsgd" |
    "bandmf" with num_bands: BandMF's epsilon for the strategy a run of these steps would
    optimize, as `dpbert.dp.plan` accounts it). ValueError naming a missing flag
    (``--name``) or a bad value.
    """
    from dpbert.dp import calibration  # noqa: PLC0415

    def require(*names: str) -> None:
        missing = [f"--{name}" for name in names if flags.get(name) is None]
        if missing:
            raise ValueError(f"missing required flag(s): {', '.join(missing)}")

    own, other = (("noise_multiplier", "target_epsilon") if command == "epsilon"
                  else ("target_epsilon", "noise_multiplier"))
    # Every missing flag in one message; a flag of the other command is refused, not ignored.
    require("num_examples", "batch_size", "steps", "delta", own)
    if flags.get(other) is not None:
        raise ValueError(f"--{other} does not apply to the {command} command (it uses --{own})")
    common = dict(expected_batch_size=flags["batch_size"], num_examples=flags["num_examples"],
                  delta=flags["delta"], sampling=flags["sampling"],
                  noise_mode=flags["noise_mode"], num_shards=flags["num_shards"],
                  max_batch_size=flags["max_batch_size"], accountant=flags["accountant"])
    mechanism, bands = flags.get("mechanism") or "dpsgd", flags.get("num_bands") or 1
    if mechanism == "dpsgd" and bands != 1:
        raise ValueError(f"--num_bands={bands} applies to --mechanism=bandmf only")
    if mechanism == "bandmf":  # the strategy a run of these steps would optimize (bandmf.py)
        from dpbert.dp import bandmf  # noqa: PLC0415
        common.update(mechanism=mechanism, num_bands=bands,
                      strategy=bandmf.strategy(flags["steps"], bands))
    if command == "epsilon":
        sigma = flags["noise_multiplier"]
    else:
        sigma = calibration.calibrate(
            accounting.AccountingSpec(noise_multiplier=1.0, **common), flags["steps"],
            flags["target_epsilon"])
    # The report states the epsilon of the calibrated sigma, recomputed.
    spec = accounting.AccountingSpec(noise_multiplier=sigma, **common)
    report = mechanism_report(spec, flags["steps"], clip_norm=None)
    if command == "calibrate":
        report["target_epsilon"] = flags["target_epsilon"]
    if command == "epsilon":
        lines = [f"epsilon = {report['epsilon']:.6g}  (delta = {report['delta']:.3g})"]
    else:
        lines = [f"noise_multiplier = {report['noise_multiplier']:.6g}  "
                 f"(epsilon = {report['epsilon']:.6g} <= target "
                 f"{report['target_epsilon']:.6g}, delta = {report['delta']:.3g})"]
    if mechanism == "bandmf":
        lines.append(f"  mechanism=bandmf num_bands={bands}: cyclic Poisson sampling of "
                     f"{bands} groups of {spec.group_size} units, {spec.rounds(flags['steps'])} "
                     f"rounds accounted (jax-privacy's BandMF accounting)")
    lines.append(f"  accountant={report['accountant']} sampling={report['sampling']} "
                 f"q={report['sampling_probability']:.6g} steps={report['steps']} "
                 f"noise_mode={report['noise_mode']} num_shards={report['num_shards']} "
                 f"effective_noise_multiplier={report['effective_noise_multiplier']:.6g}")
    if not report["proven_bound"]:
        lines.append(f"  WARNING: {report['note']}")
    elif grid_sentence(spec, report["steps"]):
        lines.append(f"  NOTE: {grid_sentence(spec, report['steps'])}")
    return report, "\n".join(lines)


def training_part(ledger, steps_in_segment: int, *, clip_norm: float,
                  privacy_unit: str | privacy_units.PrivacyUnit,
                  secret: bool, target_epsilon: float | None,
                  stopped_by_budget: bool, units: Mapping[str, Any] | None = None
                  ) -> dict[str, Any]:
    """The DP-SGD row: the composed ledger's numbers (`accounting.privacy_report`) and their
    note (`units`: `units_part`, for privacy units of several sequences). With inherited
    segments (a starting model trained on data that may overlap, `dpbert.reporting.lineage`)
    epsilon is their composition with this run's; `this_run_epsilon` is this run's alone."""
    total_steps = ledger.closed_steps + steps_in_segment
    part = accounting.privacy_report(ledger.current, total_steps, clip_norm=clip_norm,
                                     privacy_unit=privacy_unit,
                                     epsilon=ledger.epsilon(steps_in_segment))
    part["note"] = mechanism_note(ledger.current, total_steps, privacy_unit, units)
    if units:
        part.update(units)
    part["segments"] = ledger.to_json(steps_in_segment)
    if ledger.closed:
        part["note"] += (f" The run was resumed under {len(ledger.closed) + 1} different "
                         "mechanisms (segments); epsilon is dp_accounting's composition of "
                         "all of them.")
    if ledger.inherited:
        part["inherited_segments"] = ledger.inherited_json()
        part["this_run_epsilon"] = ledger.own_epsilon(steps_in_segment)
        part["note"] += (f" Epsilon composes this run's DP-SGD with the "
                         f"{len(ledger.inherited)} segments ("
                         f"{sum(s.steps for s in ledger.inherited)} steps) of the starting "
                         "model's training on data that may overlap (model.init_data='same'), "
                         "in one dp_accounting event; this_run_epsilon is this run's alone.")
    part.update(stage="training", secret_randomness=secret, target_epsilon=target_epsilon,
                stopped_by_budget=stopped_by_budget,
                private=secret and part["proven_bound"],
                randomness=randomness.SECRET_NOTE if secret else randomness.SEEDED_NOTE)
    if not secret:
        part["why"] = ("the training noise and batch sampling were derived from a public seed "
                       "(dp.insecure_seeded_noise=True)")
    elif not part["proven_bound"]:
        part["why"] = SHUFFLE_NOTE
    return part


def _lineage_parts(vocabulary: dict[str, Any], lineage) -> tuple[dict, list[dict], list[dict]]:
    """(this run's vocabulary part, the starting model's other vocabularies, a part voiding the
    claim) for `lineage` (`dpbert.reporting.lineage.Lineage` or None). A vocabulary of the starting
    model's total that this run uses again (same sha256) is counted once, as this run's: from
    the starting model's report when this run found no report beside it."""
    if lineage is None:
        return vocabulary, [], []
    inherited = []
    for v in lineage.vocabularies:
        if vocabulary.get("vocab_sha256") and v.get("vocab_sha256") == vocabulary[
                "vocab_sha256"]:
            if not vocabulary.get("read_private_data"):
                vocabulary = {**v, "origin": "the starting model (its report)"}
            continue
        inherited.append({**v, "stage": "vocabulary of the starting model"})
    void = ([{"stage": "starting model", "read_private_data": True, "private": False,
              "epsilon": None, "delta": None, "why": lineage.voids}] if lineage.voids else [])
    return vocabulary, inherited, void


BUDGET_RULE = (
    "dp.total_epsilon bounds everything that read the private corpus. The vocabulary spends "
    "what vocab.epsilon costs under the training's neighbouring relation (computed from its "
    "mechanism, as in the total), a starting model's other vocabularies what its report says; "
    "the training gets the rest as its target epsilon (its sigma calibrated to it, or its "
    "steps capped by it). Basic composition: the total is at most the budget.")


def training_budget(total_epsilon: float, target_epsilon: float | None,
                    vocabulary: dict[str, Any], lineage=None) -> tuple[float, dict[str, Any]]:
    """(the training's target epsilon, the report's `budget` entry) for dp.total_epsilon
    (`BUDGET_RULE`): the total minus every other part of `run_report`'s total (this run's
    vocabulary part, the starting model's other vocabularies), or `target_epsilon` when it is
    also set and fits. ConfigError when the other parts alone reach the total, when one has no
    epsilon (no DP), or when the training's own target does not fit beside them."""
    vocabulary, inherited, void = _lineage_parts(vocabulary, lineage)
    others = [p for p in (vocabulary, *inherited, *void) if p.get("read_private_data", True)]
    field = f"config.dp.total_epsilon={total_epsilon!r}"
    unbounded = [p for p in others if p.get("epsilon") is None]
    if unbounded:
        raise ConfigError(f"{field}: no total can be guaranteed: the {unbounded[0]['stage']} "
                          f"has no epsilon ({unbounded[0].get('why')})")
    spent = sum(float(p["epsilon"]) for p in others)
    shares = " + ".join(f"{p['stage']} {fmt_eps(p['epsilon'])}" for p in others) or "nothing"
    if spent >= total_epsilon:
        raise ConfigError(
            f"{field}: the vocabulary alone spends it ({shares} = {fmt_eps(spent)} under "
            f"this run's unit, before any training). Raise dp.total_epsilon, build the "
            f"vocabulary at a smaller vocab.epsilon (now "
            f"{vocabulary.get('vocabulary_epsilon', vocabulary.get('epsilon'))}), or use a "
            "public vocabulary (config.vocab.file)")
    if target_epsilon is not None:
        if spent + target_epsilon > total_epsilon:
            raise ConfigError(
                f"{field} and config.dp.target_epsilon={target_epsilon!r} disagree: the "
                f"vocabulary spends {fmt_eps(spent)} ({shares}), so training at "
                f"{target_epsilon} totals {fmt_eps(spent + target_epsilon)}. Set only one "
                f"(dp.total_epsilon leaves the training {fmt_eps(total_epsilon - spent)})")
        target = float(target_epsilon)
    else:
        target = float(total_epsilon) - spent
        while spent + target > total_epsilon:  # float rounding: the sum stays within
            target = math.nextafter(target, 0.0)
    return target, {"total_epsilon": float(total_epsilon), "target_epsilon": target_epsilon,
                    "rule": BUDGET_RULE,
                    "other_parts_epsilon": spent, "training_target_epsilon": target}


def run_report(training: dict[str, Any] | None, vocabulary: dict[str, Any],
               *, privacy_unit: str, max_seq_length: int | None,
               multiplicity: Mapping[str, Any] | None, steps: int,
               unit: str | None = None,
               units: Mapping[str, Any] | None = None,
               max_examples_per_unit: int | None = None,
               lineage=None, budget: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """privacy_report.json (the workdir's, private; `public_report` gives the shippable one):
    the total first, then its parts. `unit`: what one example is, in words (a task's own
    definition; default `unit_definition`); `units`: the data's unit summary for privacy units
    of several sequences; `lineage`: `dpbert.reporting.lineage.Lineage` of the starting model;
    `budget`: `training_budget`'s entry when the run had a dp.total_epsilon."""
    unit = unit or unit_definition(privacy_unit, max_seq_length, max_examples_per_unit,
                                   (units or {}).get("unit_key", ""))
    report: dict[str, Any] = {"dp": training is not None, "steps": steps,
                              "privacy_unit": privacy_unit, "unit_definition": unit}
    if units:
        report["units"] = {**units, "max_examples_per_unit": max_examples_per_unit,
                           "note": UNITS_NOTE}
    if multiplicity:
        report["unit_multiplicity"] = {**multiplicity, "note": MULTIPLICITY_NOTE}
    vocabulary, inherited, void = _lineage_parts(vocabulary, lineage)
    if lineage is not None:
        report["lineage"] = [lineage.entry()]
    if inherited:
        report["inherited_vocabularies"] = inherited
    if training is None:
        report.update(private=False, epsilon=None, delta=None,
                      headline="No differential-privacy guarantee: trained without DP-SGD "
                               "(dp.enabled=False).",
                      note="trained without differential privacy (dp.enabled=False)")
        if vocabulary.get("read_private_data"):
            report["vocabulary"] = vocabulary
        return report
    parts = [p for p in (vocabulary, *inherited, training, *void)
             if p.get("read_private_data", True)]
    private = all(p.get("private") for p in parts)
    finite = all(p.get("epsilon") is not None for p in parts)
    eps = sum(p["epsilon"] for p in parts) if finite else None
    delta = sum(p["delta"] for p in parts) if finite else None
    report.update(epsilon=eps, delta=delta, private=private and finite,
                  proven_bound=training["proven_bound"],
                  composition="basic composition (epsilons add, deltas add) of: " +
                              ", ".join(p["stage"] for p in parts),
                  training=training, vocabulary=vocabulary, not_covered=NOT_COVERED)
    if budget:
        report["budget"] = dict(budget)
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


def public_report(report: Mapping[str, Any] | None) -> dict[str, Any]:
    """What may ship with a model: the run's report without exact corpus statistics
    (`PRIVATE_FIELDS`; a vocabulary part keeps only its public fields), tagged with its format
    so that a later run can read its lineage (`dpbert.reporting.lineage`). None: a model without a
    dpbert run (a conversion)."""
    from dpbert.reporting import lineage as lineage_lib  # noqa: PLC0415

    if report is None:
        return {"format": lineage_lib.REPORT_FORMAT, "dp": False, "private": False,
                "read_private_data": False, "epsilon": None, "delta": None,
                "headline": "No differential-privacy guarantee is claimed: converted by dpbert "
                            "from a folder without a dpbert privacy report."}
    out = {k: v for k, v in report.items() if k not in PRIVATE_FIELDS}
    if isinstance(out.get("vocabulary"), Mapping):
        out["vocabulary"] = public_vocabulary_part(out["vocabulary"])
    if out.get("inherited_vocabularies"):
        out["inherited_vocabularies"] = [public_vocabulary_part(v)
                                         for v in out["inherited_vocabularies"]]
    out["format"] = lineage_lib.REPORT_FORMAT
    out["released"] = RELEASED_NOTE
    return json.loads(json.dumps(out, default=str))
