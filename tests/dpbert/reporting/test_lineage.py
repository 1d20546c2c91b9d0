"""Privacy lineage (issue 29): a run that starts from a DP export composes what its training
spent (dp_accounting, one event), counts a vocabulary once, lists a declared-disjoint model's
guarantee apart, and is not private when its starting model was trained on the same data without
DP; exports ship no exact corpus statistic."""

import json
import pathlib

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant

from dpbert.reporting import lineage

from dpbert.reporting import card as card_lib
from dpbert.reporting import report as report_lib
from dpbert.dp import accounting, calibration, ledger as ledger_lib
from dpbert.errors import ConfigError


def poisson_events(segments, n=10_000, b=100):
    """dp_accounting events of Poisson segments [(sigma, steps)], written here."""
    return [dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(b / n, dp_accounting.GaussianDpEvent(s)), t)
        for s, t in segments]


def reference_epsilon(segments, delta, n=10_000, b=100):
    return pld_privacy_accountant.PLDAccountant().compose(
        dp_accounting.ComposedDpEvent(poisson_events(segments, n, b))).get_epsilon(delta)


def spec(sigma=1.0, delta=1e-6, n=10_000, b=100, **kw):
    return accounting.AccountingSpec(noise_multiplier=sigma, expected_batch_size=b,
                                     num_examples=n, delta=delta, **kw)


def base_report(tmp_path: pathlib.Path, *, sigma=1.0, steps=30, secret=True, dp=True,
                unit="example", vocab_sha="a" * 64, name="base") -> pathlib.Path:
    """A model folder holding only the public report of a finished run (what lineage reads)."""
    training = None
    if dp:
        training = report_lib.training_part(
            ledger_lib.PrivacyLedger.fresh(spec(sigma)), steps, clip_norm=1.0,
            privacy_unit=unit, secret=secret, target_epsilon=None, stopped_by_budget=False)
    vocab = {"stage": "vocabulary", "read_private_data": True, "dp": True, "epsilon": 2.0,
             "delta": 1e-6, "vocabulary_epsilon": 1.0, "vocabulary_delta": 5e-7,
             "private": True, "vocab_sha256": vocab_sha, "relation": "replace", "records": 2,
             "relation_note": "test"}
    full = report_lib.run_report(training, vocab, privacy_unit=unit, max_seq_length=32,
                                 multiplicity={"document": {"max": 7, "mean": 3.0}},
                                 steps=steps)
    folder = tmp_path / name
    folder.mkdir()
    (folder / lineage.REPORT_FILE).write_text(json.dumps(report_lib.public_report(full)))
    return folder


def run_after(lin, steps=5):
    """(training part, report) of a 5-step run at sigma 1 that starts from `lin`'s model."""
    ledger = ledger_lib.PrivacyLedger.fresh(spec(1.0), lin.segments)
    training = report_lib.training_part(ledger, steps, clip_norm=1.0, privacy_unit="example",
                                        secret=True, target_epsilon=None,
                                        stopped_by_budget=False)
    report = report_lib.run_report(training, {"stage": "vocabulary", "read_private_data": False,
                                              "epsilon": 0.0, "delta": 0.0, "private": True},
                                   privacy_unit="example", max_seq_length=32, multiplicity=None,
                                   steps=steps, lineage=lin)
    return training, report


def load(folder, relation="same", unit="example", delta=1e-6, accountant="pld"):
    return lineage.load(str(folder), relation, privacy_unit=unit, dp_enabled=True, delta=delta,
                        accountant=accountant)


def test_same_data_composes_the_starting_models_segments_with_dp_accounting(tmp_path):
    lin = load(base_report(tmp_path, sigma=1.0, steps=30), delta=1e-6)
    assert lin.relation == "same" and not lin.voids
    assert [(s.spec.noise_multiplier, s.steps) for s in lin.segments] == [(1.0, 30)]
    ledger = ledger_lib.PrivacyLedger.fresh(spec(1.3), lin.segments)
    # One event of both runs (the exact composition), at this run's delta.
    assert ledger.epsilon(20) == pytest.approx(reference_epsilon([(1.0, 30), (1.3, 20)], 1e-6),
                                               rel=1e-9)
    assert ledger.own_epsilon(20) == pytest.approx(reference_epsilon([(1.3, 20)], 1e-6),
                                                   rel=1e-9)
    assert ledger.epsilon(0) == pytest.approx(reference_epsilon([(1.0, 30)], 1e-6), rel=1e-9)
    assert ledger.to_json(20) == [ledger_lib.Segment(spec(1.3), 20).to_json()]  # this run only
    # The progress figure and the budget see the inherited steps too.
    assert ledger.progress_epsilon(20) == pytest.approx(ledger.epsilon(20), rel=1e-3)
    target = reference_epsilon([(1.0, 30), (1.3, 20)], 1e-6)
    assert ledger.max_steps_within_budget(target, upper_limit=1000) == 20


def test_the_starting_models_own_lineage_is_composed_too(tmp_path):
    """A grandparent's segments travel in the parent's report (inherited_segments)."""
    first = load(base_report(tmp_path, sigma=1.0, steps=30, name="a"))
    parent_ledger = ledger_lib.PrivacyLedger.fresh(spec(1.2), first.segments)
    training = report_lib.training_part(parent_ledger, 10, clip_norm=1.0,
                                        privacy_unit="example", secret=True,
                                        target_epsilon=None, stopped_by_budget=False)
    full = report_lib.run_report(training, {"stage": "vocabulary", "read_private_data": False,
                                            "epsilon": 0.0, "delta": 0.0, "private": True},
                                 privacy_unit="example", max_seq_length=32, multiplicity=None,
                                 steps=10, lineage=first)
    folder = tmp_path / "b"
    folder.mkdir()
    (folder / lineage.REPORT_FILE).write_text(json.dumps(report_lib.public_report(full)))
    child = load(folder)
    assert [(s.spec.noise_multiplier, s.steps) for s in child.segments] == [(1.0, 30),
                                                                            (1.2, 10)]
    # The grandparent's vocabulary is in the parent's total: the child counts it once too.
    assert [v["vocab_sha256"] for v in child.vocabularies] == ["a" * 64]


def test_calibration_after_the_starting_model_meets_the_target(tmp_path):
    prior = load(base_report(tmp_path, sigma=1.0, steps=30)).segments
    target = 2.0
    sigma = calibration.calibrate_noise_multiplier(
        target_epsilon=target, expected_batch_size=100, num_examples=10_000, steps=50,
        delta=1e-6, prior=prior)
    assert reference_epsilon([(1.0, 30), (sigma, 50)], 1e-6) <= target
    assert reference_epsilon([(1.0, 30), (sigma * (1 - 2e-3), 50)], 1e-6) > target
    with pytest.raises(ValueError, match="already spent"):
        calibration.calibrate_noise_multiplier(
            target_epsilon=0.1, expected_batch_size=100, num_examples=10_000, steps=50,
            delta=1e-6, prior=prior)


def test_vocabulary_counted_once_and_other_ones_of_the_lineage_added(tmp_path):
    lin = load(base_report(tmp_path, vocab_sha="a" * 64))
    ledger = ledger_lib.PrivacyLedger.fresh(spec(1.0), lin.segments)
    training = report_lib.training_part(ledger, 5, clip_norm=1.0, privacy_unit="example",
                                        secret=True, target_epsilon=None,
                                        stopped_by_budget=False)
    same_vocab = {"stage": "vocabulary", "read_private_data": True, "dp": True,
                  "epsilon": 2.5, "delta": 1e-6, "private": True, "vocab_sha256": "a" * 64}
    report = report_lib.run_report(training, same_vocab, privacy_unit="example",
                                   max_seq_length=32, multiplicity=None, steps=5, lineage=lin)
    assert "inherited_vocabularies" not in report
    assert report["epsilon"] == pytest.approx(2.5 + training["epsilon"])
    # This run found no report beside the same vocabulary: the starting model's report counts.
    unknown = {"stage": "vocabulary", "read_private_data": False, "epsilon": 0.0,
               "delta": 0.0, "private": True, "vocab_sha256": "a" * 64}
    report = report_lib.run_report(training, unknown, privacy_unit="example",
                                   max_seq_length=32, multiplicity=None, steps=5, lineage=lin)
    assert report["vocabulary"]["epsilon"] == 2.0
    assert report["epsilon"] == pytest.approx(2.0 + training["epsilon"])
    # Another vocabulary: both count.
    other = dict(same_vocab, vocab_sha256="b" * 64)
    report = report_lib.run_report(training, other, privacy_unit="example",
                                   max_seq_length=32, multiplicity=None, steps=5, lineage=lin)
    assert [v["vocab_sha256"] for v in report["inherited_vocabularies"]] == ["a" * 64]
    assert report["epsilon"] == pytest.approx(2.5 + 2.0 + training["epsilon"])
    assert "vocabulary of the starting model" in report["composition"]


@pytest.mark.parametrize("relation", ["disjoint", "public"])
def test_declared_other_data_composes_nothing_and_is_listed(tmp_path, relation):
    lin = load(base_report(tmp_path), relation)
    assert lin.segments == () and lin.vocabularies == () and not lin.voids
    entry = lin.entry()
    assert entry["relation"] == relation and entry["headline"].startswith("(")
    training, report = run_after(lin)
    assert report["epsilon"] == pytest.approx(training["epsilon"])
    card = "\n".join(card_lib.card_section(report_lib.public_report(report)))
    assert "Starting model (model.init_from_hf)" in card and f"'{relation}'" in card


@pytest.mark.parametrize("secret,dp", [(False, True), (True, False)])
def test_a_starting_model_without_a_guarantee_on_the_same_data_voids_the_claim(tmp_path,
                                                                              secret, dp):
    lin = load(base_report(tmp_path, secret=secret, dp=dp))
    assert lin.voids and "model.init_data" in lin.voids
    training, report = run_after(lin)
    assert report["private"] is False
    assert report["headline"].startswith(("NOT PRIVATE", "No differential-privacy"))


def test_refusals(tmp_path):
    folder = base_report(tmp_path, unit="example")
    with pytest.raises(ConfigError, match="epsilons of different units do not compose"):
        load(folder, unit="patient")
    assert load(folder, "disjoint", unit="patient").relation == "disjoint"
    with pytest.raises(ConfigError, match="init_data='bogus'"):
        load(folder, "bogus")
    # This run's delta must be < 1/N of the starting model's training too.
    with pytest.raises(ConfigError, match="cannot be composed"):
        load(folder, delta=1e-3)
    # A dpbert export from before the report existed cannot be composed.
    old = tmp_path / "old"
    old.mkdir()
    (old / "README.md").write_text("# BERT exported by dpbert\n")
    with pytest.raises(ConfigError, match="Re-export it from its workdir"):
        load(old)
    assert load(old, "public") is None
    # A model from elsewhere (no dpbert card, no report) counts as public.
    elsewhere = tmp_path / "hub"
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text("{}")
    assert load(elsewhere) is None
    # A training workdir holds the run's PRIVATE report: its model is W/hf.
    workdir = tmp_path / "w"
    (workdir / "checkpoints").mkdir(parents=True)
    (workdir / "run.json").write_text("{}")
    with pytest.raises(ConfigError, match="training workdir; its model is"):
        load(workdir)
    (folder / lineage.REPORT_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="not a readable privacy report"):
        load(folder)


def test_public_report_drops_exact_corpus_statistics():
    training = report_lib.training_part(
        ledger_lib.PrivacyLedger.fresh(spec(1.0)), 5, clip_norm=1.0, privacy_unit="note",
        secret=True, target_epsilon=None, stopped_by_budget=False,
        units={"num_units": 10_000, "max_examples_per_unit": 4, "unit_loss": "mean",
               "unit_key": "document"})
    vocab = {"stage": "vocabulary", "read_private_data": True, "dp": True, "epsilon": 2.0,
             "delta": 1e-6, "private": True, "num_examples": 4242, "num_words": 31337,
             "vocabulary_epsilon": 1.0, "vocabulary_delta": 1e-6, "relation": "add_remove",
             "records": 1, "relation_note": "x"}
    units = {"unit_key": "document", "num_units": 10_000, "num_examples": 55_555,
             "examples_per_unit": {"max": 777, "mean": 5.5, "median": 5.0},
             "train_subjects": 123, "train_documents": 10_001, "documents_per_unit_max": 2}
    full = report_lib.run_report(training, vocab, privacy_unit="note", max_seq_length=32,
                                 multiplicity={"document": {"max": 999, "mean": 3.3}}, steps=5,
                                 units=units, max_examples_per_unit=4)
    public = report_lib.public_report(full)
    text = json.dumps(public) + "\n".join(card_lib.card_section(public))
    for secret in ("55555", "777", "10001", "4242", "31337", "999", "unit_multiplicity",
                   '"examples_per_unit"', ".examples_per_unit", "train_subjects",
                   "train_documents"):
        assert secret not in text, secret
    # Every one of them is in the workdir's (private) report.
    private = json.dumps(full)
    assert all(s in private for s in ("55555", "777", "10001", "4242", "999"))
    assert public["training"]["num_units"] == 10_000  # N: the accountant's public input
    assert public["format"] == lineage.REPORT_FORMAT
