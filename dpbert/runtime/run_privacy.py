"""What a run spends before its first step, checked before any compile: the vocabulary's
part of the total (under the training's relation), the training's share of dp.total_epsilon,
the total δ against 1/N, and unit slots no unit fills. Called by `dpbert.runtime.loop` once
the data is prepared (the vocabulary part and the budget, before the plan) and once the plan
is made (the rest)."""

from __future__ import annotations

import pathlib

import ml_collections
import numpy as np

from data_pipelines import tokenization
from dpbert.dp import plan as plan_lib
from dpbert.errors import ConfigError
from dpbert.reporting import report as report_lib
from dpbert.runtime.hosts import announce


def vocabulary_part(config, data, privacy_unit: str) -> dict:
    """The vocabulary's row of the total, under the training's unit (`report.vocab_relation`);
    a vocabulary without a report is announced, since it is then counted as public."""
    vocab_file = data.extra.get("vocab_file")
    sha = tokenization.vocab_fingerprint(vocab_file) if vocab_file else None
    relation = None
    if data.vocab_report is not None and data.vocab_report.get("dp"):
        units = data.units or {}
        relation = report_lib.vocab_relation(
            data.vocab_report, privacy_unit, per_sequence=data.unit_definition is None,
            unit_key=units.get("unit_key", ""),
            max_records_per_unit=config.get("vocab", {}).get("max_records_per_unit"),
            observed_records_per_unit=units.get("documents_per_unit_max"))
    part = report_lib.vocabulary_part(data.vocab_report, data.vocab_origin, relation, sha)
    if part.get("warning") and config.dp.enabled:
        announce(f"WARNING: {part['warning']} ({part['assumption']})")
    return part


def training_dp(config, vocab_part: dict, lineage):
    """(the dp section the plan reads, the report's `budget` entry or None): with
    dp.total_epsilon, a copy whose target_epsilon is the training's share
    (`report.training_budget`: what the vocabulary leaves), announced; else config.dp."""
    total = config.dp.get("total_epsilon")
    if total is None or not config.dp.enabled:
        return config.dp, None
    target, budget = report_lib.training_budget(total, config.dp.target_epsilon, vocab_part,
                                                lineage)
    announce(f"privacy budget: total epsilon {report_lib.fmt_eps(total)} (dp.total_epsilon) = "
             f"vocabulary {report_lib.fmt_eps(budget['other_parts_epsilon'])} (under "
             f"dp.privacy_unit={config.dp.privacy_unit!r}) + training epsilon <= "
             f"{report_lib.fmt_eps(target)}")
    dp = ml_collections.ConfigDict(config.dp.to_dict())
    dp.target_epsilon = target
    return dp, budget


def check_total_delta(config, plan, vocab_part: dict, lineage, workdir: pathlib.Path) -> None:
    """Refuses, before training, a run whose headline delta is no guarantee: the total delta
    (every vocabulary's under the training's relation, this run's and those the starting model's
    total counted, plus dp.delta) must be < 1/N like dp.delta alone (`plan_lib.make_plan`).
    A vocabulary built at a large epsilon may reach it under group privacy (per note at epsilon
    8, trained per sequence: 0.225), while the headline would still say "private"."""
    if plan.ledger is None:  # no DP-SGD: no claim
        return
    vocabulary, inherited, _ = report_lib._lineage_parts(vocab_part, lineage)  # noqa: SLF001
    parts = [p for p in (vocabulary, *inherited) if p.get("read_private_data", True)]
    if any(p.get("delta") is None for p in parts):
        return  # a vocabulary without DP: the headline says there is no guarantee
    total = sum(float(p["delta"]) for p in parts) + float(config.dp.delta)
    n = plan.num_examples
    if total < 1.0 / n:
        return
    worst = max(parts, key=lambda p: float(p["delta"]))
    unit = plan.unit
    v_unit = report_lib.vocab_unit(worst)
    if worst is vocabulary and worst.get("origin") == "built":
        field, value = "vocab.epsilon", config.vocab.epsilon
        where = "built here from the training corpus"
        # A rerun reuses WORKDIR/vocab whatever vocab.* says now.
        smaller = (f"a smaller vocab.epsilon (in a fresh --workdir, or after deleting "
                   f"{workdir / 'vocab'}: a rerun reuses the vocabulary built there)")
    else:
        field, value = (("vocab.file", config.vocab.file) if worst is vocabulary and
                        worst.get("origin") == "file" else
                        ("model.init_from_hf", config.model.get("init_from_hf", "")))
        where = ("of config.vocab.file" if field == "vocab.file" else
                 "of the starting model" + ("'s total" if worst is not vocabulary else ""))
        smaller = "a vocabulary built at a smaller --epsilon (launch/build_vocab.py)"
    if not unit.per_unit:
        match = "note" if v_unit == "document" else "patient"
        unit_fix = (f"a unit the vocabulary counts directly (dp.privacy_unit={match!r}: one "
                    f"{v_unit}, the vocabulary's record)")
    else:
        unit_fix = (f"a vocabulary of the training's unit (launch/build_vocab.py "
                    f"--unit={unit.vocab_record} for dp.privacy_unit={unit.name!r}, or leave "
                    "vocab.file empty and the run builds it so)")
    shares = " + ".join(f"{p['stage']} {float(p['delta']):.3g}" for p in parts)
    bound = plan_lib.delta_bound(n, plan_lib.counted(unit.name, plan.per_unit))
    raise ConfigError(
        f"config.{field}={value!r}: the vocabulary {where} (DP per {v_unit} at (epsilon, delta) "
        f"= ({report_lib.fmt_eps(worst.get('vocabulary_epsilon'))}, "
        f"{float(worst.get('vocabulary_delta', worst['delta'])):.3g})) has delta "
        f"{float(worst['delta']):.3g} under dp.privacy_unit={unit.name!r} "
        f"({worst.get('relation', 'add_remove')} of {worst.get('records', 1)} record(s)), so "
        f"the run's total delta {total:.3g} ({shares} + training dp.delta "
        f"{float(config.dp.delta):.3g}) is not {bound}: that is no meaningful guarantee (it "
        "allows releasing a random record in the clear), though the headline would state it "
        f"as a guarantee. Use {smaller}, {unit_fix}, or a public vocabulary (config.vocab.file "
        "= a vocab.txt not built from this corpus, e.g. a released BERT's)")


def say_unused_unit_slots(plan) -> None:
    """A warning (before the compile) when dp.max_examples_per_unit (K) exceeds the sequence
    count of every unit: K then truncates nothing, and slots no unit fills are padding that
    the [units, K] batches still carry through the model (memory and compute).

    Said, not refused, and the count is not printed. The largest unit's sequence count is an
    exact statistic of the private corpus (docs/threat_model.md: N is the one count released).
    A refusal would make whether a model exists at all depend on the largest unit (removing it
    can turn a refused K into an accepted one: a difference no epsilon covers), and the K of a
    run that went ahead, printed in the public report and card, would tell a lower bound on that
    count. The warning reaches only the operator's console, which already holds exact training
    metrics. The batches and the guarantee are those of any K at or above the largest count,
    so nothing is misstated: only the cost is wasted."""
    if not plan.per_unit:
        return
    sizes = getattr(plan.sampler, "unit_sizes", None)
    if sizes is None or plan.max_examples_per_unit <= int(np.max(sizes)):
        return
    announce(
        f"WARNING: config.dp.max_examples_per_unit={plan.max_examples_per_unit} is larger than "
        f"the number of training sequences of every {plan.privacy_unit} of this corpus: it "
        "truncates no unit, and the slots no unit fills are padding that every batch still "
        "runs through the model (memory and compute). A smaller value samples the same "
        "sequences, with the same guarantee, at less cost. The largest unit's count is an "
        "exact statistic of the private corpus and is not printed (the workdir's "
        "privacy_report.json, which is not for sharing, holds it under "
        "units.examples_per_unit).")
