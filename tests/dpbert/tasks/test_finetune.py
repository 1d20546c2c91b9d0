"""Fine-tuning on the DP loop end to end, on a tiny BERT (FINETUNE_SPEC §1.6): results.json,
the HF export, the frozen user side, the release (fixed per key, across epochs and on resume),
isolation of token_rep, η → ∞ = mode none, DP-SGD's own report, and refused configurations."""

import hashlib
import json
import math

import jax
import numpy as np
import pytest
import transformers
from safetensors.numpy import load_file

from configs import finetune_classification
from dpbert.runtime import checkpointing
from dpbert.models import hf
from dpbert.privacy import input_privacy
from dpbert.dp import randomness
from dpbert.errors import ConfigError
from data_pipelines import classification as clf_data
from dpbert.tasks import classification, finetuning, release, schedule, starting_model
from dpbert.tasks.input_modes import registry
from dpbert.tasks.input_modes.base import InputMode
from tests.dpbert.tasks import finetune_fixtures as fx

WORD_TABLE = ("bert", "embeddings", "word_embeddings", "embedding")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    train, eval_ = fx.sentiment_tsvs(root / "data")
    return {"ckpt": fx.tiny_checkpoint(root / "ckpt"), "train": train, "eval": eval_}


def config(toy, **overrides):
    c = finetune_classification.get_config()
    values = {"model.init_from_hf": str(toy["ckpt"]), "data.train": str(toy["train"]),
              "data.eval": str(toy["eval"]), "data.max_seq_length": 16,
              "batch.expected_batch_size": 16, "batch.physical_batch_size": 16,
              "optimizer.learning_rate": 1e-2, "train.epochs": 4.0, "train.log_every": 16,
              "privacy.eta": 20.0, "privacy.tokens_per_call": 512,
              "privacy.examples_per_call": 64, "checkpoint.async_save": False, **overrides}
    for key, value in values.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


def digest(batch: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(batch):
        h.update(k.encode() + np.ascontiguousarray(batch[k]).tobytes())
    return h.hexdigest()


def final_params(workdir):
    ckpt = checkpointing.Checkpointer(workdir / "checkpoints", async_save=False)
    params, meta = ckpt.restore_params(ckpt.latest_step())
    ckpt.close()
    return params, meta


def leaves(params):
    return {tuple(str(getattr(k, "key", k)) for k in p): np.asarray(v)
            for p, v in jax.tree_util.tree_leaves_with_path(params)}


class Recording(classification.ClassificationTask):
    """The classification task, noting a digest of every release it prepares."""

    def __init__(self):
        self.digests = []

    def prepare(self, config, workdir, task_key):
        data = super().prepare(config, workdir, task_key)
        every = np.arange(data.train.num_examples)
        self.digests.append((digest(data.train.get_batch(every, step=0)),
                             digest(data.eval.get_batch(np.arange(data.eval.num_examples),
                                                        step=0))))
        return data


def test_mode_none_end_to_end_writes_results_and_a_loadable_hf_model(toy, tmp_path):
    """The cheap end-to-end run (a few steps): what `launch/finetune.py` writes."""
    results = finetuning.run(config(toy, **{"train.epochs": 0.0, "train.num_steps": 4,
                                            "optimizer.warmup_fraction": None}), tmp_path)
    assert results == json.loads((tmp_path / "results.json").read_text())
    assert results["task"] == "classification" and results["steps"] == 4
    assert 0 <= results["eval_accuracy"] <= 1 and results["eval_loss"] > 0
    assert results["num_train_examples"] == 256 and results["num_eval_examples"] == 64
    p = results["privacy"]
    assert p["mode"] == "none" and p["eta"] is None and p["frozen"] == []
    assert p["dp_sgd"] is None and "No differential-privacy guarantee" in p["dp_sgd_headline"]
    model, info = transformers.BertForSequenceClassification.from_pretrained(
        tmp_path / "hf", output_loading_info=True)
    assert not any(info.values()) and model.config.num_labels == 2


@pytest.mark.slow
def test_token_rep_end_to_end_resume_export_and_frozen_phi(toy, tmp_path):
    workdir = tmp_path / "run"
    task = Recording()
    fixed = {"privacy.mode": "token_rep", "train.epochs": 0.0,
             "optimizer.warmup_fraction": None, "optimizer.warmup_steps": 4}
    finetuning.finetune(task, config(toy, **fixed, **{"train.num_steps": 48}), workdir)
    results = finetuning.finetune(task, config(toy, **fixed, **{"train.num_steps": 128}), workdir)
    # Resumed with the key kept in the checkpoint: the very same release of train and eval.
    assert len(task.digests) == 2 and task.digests[0] == task.digests[1]

    assert results["steps"] == 128 and results["num_train_examples"] == 256
    # 64 eval examples of a secret (entropy-keyed) release: 0.69-0.70 seen; chance is 0.5
    assert 0.6 <= results["eval_accuracy"] <= 1 and results["eval_loss"] > 0
    p = results["privacy"]
    assert p["mode"] == "token_rep" and p["eta"] == 20.0 and p["dp_sgd"] is None
    assert p["frozen"] == ["bert/embeddings/word_embeddings (φ)"]
    assert p["input_privacy"]["composed_eta_train"] == 20.0
    assert "secret run key" in p["input_privacy"]["key"]
    assert "one row of the training file" in p["privacy_unit"]
    assert results["schedule"]["num_steps"] == 128 and results["schedule"]["epochs"] == 8.0

    # φ (the user side) bitwise unchanged; everything else moved.
    params, meta = final_params(workdir)
    source = load_file(str(toy["ckpt"] / "model.safetensors"))
    flat = leaves(params)
    np.testing.assert_array_equal(flat[WORD_TABLE],
                                  source["bert.embeddings.word_embeddings.weight"])
    for k, v in flat.items():
        if k != WORD_TABLE and k[0] == "bert":
            assert not np.array_equal(v, hf.from_hf_tensor(k, source[hf.hf_key(k)])), k

    # The secret task key stays in the checkpoint only.
    secret = [str(x) for x in meta["task_key"]]
    for name in ("config.json", "run.json", "results.json", "privacy_report.json"):
        text = (workdir / name).read_text()
        assert not any(s in text for s in secret), name

    model, info = transformers.BertForSequenceClassification.from_pretrained(
        workdir / "hf", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert model.config.id2label == {0: "0", 1: "1"}
    card = (workdir / "hf" / "README.md").read_text()
    assert "Input privacy during fine-tuning" in card and "token_rep" in card


@pytest.mark.parametrize("mode", ["token_rep", "text_to_text", "seq_rep"])
def test_the_release_is_fixed_per_key_across_epochs_and_hides_raw_ids(toy, tmp_path, mode):
    c = schedule.resolve_schedule(config(toy, **{"privacy.mode": mode, "privacy.eta": 2.0}),
                                    256)
    task = classification.ClassificationTask()
    key, other = np.array([1, 2], np.uint32), np.array([1, 3], np.uint32)
    data = task.prepare(c, tmp_path, key)
    rows = np.arange(256)
    first = data.train.get_batch(rows, step=0)
    assert digest(first) == digest(data.train.get_batch(rows, step=40))   # epoch 2 of 4
    assert digest(first) == digest(task.prepare(c, tmp_path, key).train.get_batch(rows, step=0))
    assert digest(first) != digest(task.prepare(c, tmp_path, other).train.get_batch(rows,
                                                                                      step=0))
    raw = clf_data.load_train_eval(c.data.train, c.data.eval,
                                   starting_model.tokenizer(c), max_seq_len=16)
    ev = data.eval.get_batch(np.arange(64), step=0)
    assert "example_id" not in first and "position_ids" not in first
    if mode == "seq_rep":
        assert set(first) == {"features", "label"} and set(ev) == {"features", "label"}
        return
    special = np.isin(raw.train["input_ids"], [0, 1, 2, 3, 4, 5])
    if mode == "token_rep":
        # The service sees the special-token layout and noisy vectors, never a regular id.
        assert np.all(np.isin(first["input_ids"], [0, 1, 2, 3, 4, 5]))
        np.testing.assert_array_equal(first["input_ids"][special],
                                      raw.train["input_ids"][special])
        assert first["word_embeddings"].shape == (256, 16, 32)
        assert np.all(np.isin(ev["input_ids"], [0, 1, 2, 3, 4, 5]))
    else:
        np.testing.assert_array_equal(first["input_ids"][special],
                                      raw.train["input_ids"][special])   # never perturbed
        assert np.mean(first["input_ids"][~special] != raw.train["input_ids"][~special]) > 0.1
        assert np.mean(ev["input_ids"] != raw.eval["input_ids"]) > 0.05  # eval released too


def test_fresh_noise_each_epoch_releases_again_and_reports_the_composition(toy, tmp_path):
    c = schedule.resolve_schedule(config(toy, **{
        "privacy.mode": "text_to_text", "privacy.eta": 5.0,
        "privacy.fresh_noise_each_epoch": True}), 256)
    data = classification.ClassificationTask().prepare(c, tmp_path, np.array([4, 5], np.uint32))
    rows = np.arange(256)
    e0, e0_again = (data.train.get_batch(rows, step=s) for s in (0, 15))
    e1 = data.train.get_batch(rows, step=16)
    assert digest(e0) == digest(e0_again) != digest(e1)
    report = data.extra["input_privacy"]
    assert report["train_releases_per_example"] == 4 and report["composed_eta_train"] == 20.0
    assert "4 independent releases" in report["statement"]


@pytest.mark.slow
def test_huge_eta_text_to_text_trains_exactly_like_mode_none(toy, tmp_path):
    common = {"train.epochs": 1.0, "dp.insecure_seeded_noise": True}
    none = finetuning.finetune(classification.ClassificationTask(),
                               config(toy, **common), tmp_path / "none")
    t2t = finetuning.finetune(classification.ClassificationTask(), config(
        toy, **common, **{"privacy.mode": "text_to_text", "privacy.eta": 1e9}), tmp_path / "t2t")
    assert t2t["eval_accuracy"] == none["eval_accuracy"]
    a, b = leaves(final_params(tmp_path / "none")[0]), leaves(final_params(tmp_path / "t2t")[0])
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert "NOT private" in t2t["privacy"]["input_privacy"]["statement"]


@pytest.mark.slow
def test_seq_rep_trains_the_head_only(toy, tmp_path):
    finetuning.finetune(classification.ClassificationTask(),
                        config(toy, **{"privacy.mode": "seq_rep", "train.epochs": 1.0}),
                        tmp_path)
    source = load_file(str(toy["ckpt"] / "model.safetensors"))
    flat = leaves(final_params(tmp_path)[0])
    for k, v in flat.items():
        if k[0] == "bert":   # the frozen user side, bitwise
            np.testing.assert_array_equal(v, hf.from_hf_tensor(k, source[hf.hf_key(k)]))
    assert sorted(k for k in flat if k[0] == "classifier") == [("classifier", "bias"),
                                                              ("classifier", "kernel")]


@pytest.mark.slow
def test_dp_sgd_fine_tuning_has_its_own_epsilon_per_example(toy, tmp_path):
    results = finetuning.finetune(classification.ClassificationTask(), config(toy, **{
        "dp.enabled": True, "dp.noise_multiplier": 1.0, "dp.target_epsilon": None,
        "dp.delta": 1e-3, "dp.overflow_probability": 1e-3, "batch.physical_batch_size": 32,
        "batch.microbatch_size": 16, "train.epochs": 1.0, "train.trainable": "all"}), tmp_path)
    report = json.loads((tmp_path / "privacy_report.json").read_text())
    dp = json.loads((tmp_path / "results.json").read_text())["privacy"]["dp_sgd"]
    assert dp == report and report["dp"] and report["private"]
    assert 0 < report["epsilon"] < math.inf and report["delta"] == 1e-3
    assert report["training"]["num_examples"] == 256 and report["training"]["steps"] == 16
    assert report["unit_definition"].startswith("one labelled example: one row of the training")
    assert "one labelled example" in results["privacy"]["dp_sgd_headline"]
    # dp.clipping="auto" resolved to the mixed ghost clipper (the run's config says so).
    assert json.loads((tmp_path / "config.json").read_text())["dp"]["clipping"] == "mixed_ghost"


@pytest.mark.slow
def test_bandmf_fine_tuning_reports_its_mechanism(toy, tmp_path):
    """dp.mechanism="bandmf" runs on the fine-tuning loop too (`dpbert.dp.bandmf`)."""
    finetuning.finetune(classification.ClassificationTask(), config(toy, **{
        "dp.enabled": True, "dp.noise_multiplier": 1.0, "dp.target_epsilon": None,
        "dp.delta": 1e-3, "dp.overflow_probability": 1e-3, "batch.physical_batch_size": 32,
        "batch.microbatch_size": 16, "train.epochs": 1.0, "dp.mechanism": "bandmf",
        "dp.num_bands": 2}), tmp_path)
    training = json.loads((tmp_path / "privacy_report.json").read_text())["training"]
    assert training["mechanism"] == "bandmf" and training["num_bands"] == 2
    assert training["group_size"] == 128 and training["rounds"] == -(-training["steps"] // 2)
    assert 0 < training["epsilon"] < math.inf and "BandMF" in training["note"]


def dp_export(toy, folder, *, sigma=2.0, steps=10):
    """A copy of the toy checkpoint carrying the public report of a DP pretraining run (N=500
    sequences, expected batch 16): what a dpbert export of such a run holds."""
    import shutil

    from dpbert.reporting import lineage
    from dpbert.reporting import report as report_lib
    from dpbert.dp import accounting
    from dpbert.dp import ledger as ledger_lib

    shutil.copytree(toy["ckpt"], folder)
    spec = accounting.AccountingSpec(noise_multiplier=sigma, expected_batch_size=16,
                                     num_examples=500, delta=1e-3)
    training = report_lib.training_part(ledger_lib.PrivacyLedger.fresh(spec), steps,
                                        clip_norm=1.0, privacy_unit="example", secret=True,
                                        target_epsilon=None, stopped_by_budget=False)
    full = report_lib.run_report(training, {"stage": "vocabulary", "read_private_data": False,
                                            "epsilon": 0.0, "delta": 0.0, "private": True},
                                 privacy_unit="example", max_seq_length=32, multiplicity=None,
                                 steps=steps)
    (folder / lineage.REPORT_FILE).write_text(json.dumps(report_lib.public_report(full)))
    return folder, full


def test_fine_tuning_a_dp_export_composes_or_lists_its_lineage(toy, tmp_path):
    """Issue 29: the fine-tuned model's card no longer drops the base model's guarantee. On the
    same data (the default) the base's DP-SGD is composed with the fine-tuning's (one
    dp_accounting event); declared disjoint, it is listed apart."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    base, base_report = dp_export(toy, tmp_path / "base")
    common = {"model.init_from_hf": str(base), "dp.enabled": True, "dp.noise_multiplier": 1.0,
              "dp.target_epsilon": None, "dp.delta": 1e-3, "dp.overflow_probability": 1e-3,
              "batch.physical_batch_size": 32, "batch.microbatch_size": 16,
              "train.epochs": 0.0, "train.num_steps": 4, "optimizer.warmup_fraction": None,
              "train.eval_every": 0}
    same = finetuning.run(config(toy, **common), tmp_path / "same")["privacy"]["dp_sgd"]
    t = same["training"]
    base_t = base_report["training"]
    events = [dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        16 / 500, dp_accounting.GaussianDpEvent(2.0)), 10)]
    own = t["segments"][0]["spec"]
    q, trunc = own["expected_batch_size"] / own["num_examples"], own["max_batch_size"]
    step = (dp_accounting.TruncatedSubsampledGaussianDpEvent(own["num_examples"], q, trunc, 1.0)
            if trunc is not None else dp_accounting.PoissonSampledDpEvent(
                q, dp_accounting.GaussianDpEvent(1.0)))
    events.append(dp_accounting.SelfComposedDpEvent(step, 4))
    want = pld_privacy_accountant.PLDAccountant().compose(
        dp_accounting.ComposedDpEvent(events)).get_epsilon(1e-3)
    assert t["epsilon"] == pytest.approx(want, rel=1e-9)
    assert t["this_run_epsilon"] < t["epsilon"] and base_t["epsilon"] < t["epsilon"]
    assert same["lineage"][0]["relation"] == "same"
    card = (tmp_path / "same" / "hf" / "README.md").read_text()
    assert "Starting model (model.init_from_hf)" in card and base_report["headline"] in card
    shipped = json.loads((tmp_path / "same" / "hf" / "privacy_report.json").read_text())
    assert shipped["training"]["inherited_segments"] == base_t["segments"]
    # Declared disjoint: the fine-tuning's own epsilon; the base's claim is listed.
    apart = finetuning.run(config(toy, **common, **{"model.init_data": "disjoint"}),
                           tmp_path / "apart")["privacy"]["dp_sgd"]
    assert apart["training"]["epsilon"] == pytest.approx(t["this_run_epsilon"], rel=1e-12)
    assert apart["lineage"][0]["relation"] == "disjoint"
    assert base_report["headline"] in (tmp_path / "apart" / "hf" / "README.md").read_text()
    # Without DP-SGD on the same data: no guarantee for the fine-tuning data, lineage listed.
    plain = finetuning.run(config(toy, **{**common, "dp.enabled": False,
                                          "batch.physical_batch_size": 16,
                                          "batch.expected_batch_size": 16}),
                           tmp_path / "plain")
    card = (tmp_path / "plain" / "hf" / "README.md").read_text()
    assert "trained without DP-SGD" in plain["privacy"]["dp_sgd_headline"]
    assert "Starting model (model.init_from_hf)" in card


def test_a_fine_tuning_run_keeps_its_release_key_secret_without_dp_sgd():
    a, b = (randomness.for_run(True, 0, seeded_task_key=False) for _ in range(2))
    assert a.noise_key == b.noise_key and a.task_key != b.task_key and not a.secret
    assert randomness.for_run(True, 0).task_key == randomness.RunSecrets.seeded(0).task_key


def test_refused_configurations(toy, tmp_path):
    cases = [
        ({"privacy.mode": "words"}, "privacy.mode='words': must be one of"),
        ({"privacy.mode": "token_rep", "privacy.eta": -1.0}, "privacy.eta"),
        ({"model.init_from_hf": ""}, "model.init_from_hf"),
        ({"model.init_from_hf": str(tmp_path)}, "no config.json"),
        ({"data.eval": ""}, "config.data.eval is empty"),
        ({"data.max_seq_length": 128}, "exceeds the checkpoint's max_position_embeddings"),
        ({"privacy.mode": "ome", "privacy.epsilon": 0.0}, "privacy.epsilon=0.0"),
        ({"privacy.mode": "ome", "privacy.ome_variant": "paper"}, "privacy.ome_variant"),
        ({"privacy.mode": "ome", "privacy.ome_lambda": 0.5}, "privacy.ome_lambda"),
        ({"privacy.mode": "ome", "privacy.ome_variant": "sue", "privacy.ue_levels": 1},
         "privacy.ue_levels"),
        ({"privacy.mode": "ome", "privacy.fresh_noise_each_epoch": True}, "fresh noise"),
        # The field the user set (dp.enabled), not dp.clipping='vmap' that "auto" became.
        ({"privacy.mode": "texthide", "dp.enabled": True, "dp.noise_multiplier": 1.0},
         r"^config\.dp\.enabled=True: privacy\.mode='texthide': its loss mixes examples, so "
         r"per-example clipping"),
        ({"privacy.mode": "texthide", "dp.enabled": True, "dp.clipping": "ghost_embedding",
          "dp.noise_multiplier": 1.0}, r"^config\.dp\.enabled=True: privacy\.mode='texthide'"),
        ({"privacy.mode": "texthide", "privacy.k": 0}, "k must be a positive integer"),
        ({"privacy.mode": "texthide", "privacy.variant": "inter"}, "privacy.public_file"),
        ({"privacy.mode": "texthide", "privacy.k": 32},
         r"^config\.privacy\.k=32: larger than config\.batch\.physical_batch_size=16, "),
        # The loss (the mixing) sees one microbatch: k above it was accepted.
        ({"privacy.mode": "texthide", "privacy.k": 8, "batch.microbatch_size": 4},
         r"^config\.privacy\.k=8: larger than config\.batch\.microbatch_size=4, the examples "
         r"one call of the loss sees"),
        ({"privacy.mode": "texthide", "privacy.texthide_head_input_norm": "layer"},
         "privacy.texthide_head_input_norm='layer': must be one of"),
        ({"privacy.mode": "texthide", "privacy.texthide_head_init": 0.0},
         "privacy.texthide_head_init"),
        ({"privacy.mode": "seq_rep", "dp.enabled": True, "dp.clipping": "ghost_embedding",
          "dp.noise_multiplier": 1.0}, "only a sentence representation for the head"),
        ({"batch.expected_batch_size": 512, "batch.physical_batch_size": 512},
         "exceeds the 256 training examples"),
    ]
    for overrides, match in cases:
        with pytest.raises(ConfigError, match=match):
            finetuning.finetune(classification.ClassificationTask(), config(toy, **overrides),
                                tmp_path / "w")
    with pytest.raises(ValueError, match="head_learning_rate_scale=-1.0 must be > 0"):
        finetuning.finetune(classification.ClassificationTask(),
                            config(toy, **{"optimizer.head_learning_rate_scale": -1.0}),
                            tmp_path / "w")
    mixing = type("Mixing", (InputMode,), {"name": "test_mixing", "loss_shapes": ("batch",)})()
    registry.MODES[mixing.name] = mixing
    try:
        with pytest.raises(ConfigError, match="mixes examples, so per-example clipping"):
            finetuning.finetune(classification.ClassificationTask(), config(toy, **{
                "privacy.mode": mixing.name, "dp.enabled": True, "dp.noise_multiplier": 1.0}),
                tmp_path / "w")
    finally:
        registry.MODES.pop(mixing.name)
    assert registry.names() == (*input_privacy.MODES, "ome", "texthide")


def test_a_label_problem_is_found_before_any_work(toy, tmp_path):
    """The label map is built by count_train_examples, before the loop makes the workdir: a
    number written two ways, a single label, an eval file with other labels (was: found by
    load, after .lock, checkpoints/ and the vocabulary copy were written)."""
    rows = (tmp_path / "rows.tsv")
    rows.write_text("".join(f"{label}\tsome words here\n" for label in ("0", "1") * 10))
    two_ways = tmp_path / "two_ways.tsv"
    two_ways.write_text(rows.read_text() + "1.0\tother words\n")
    one = tmp_path / "one.tsv"
    one.write_text("".join("1\tsome words\n" for _ in range(20)))
    cases = [({"data.train": str(two_ways)}, "numeric labels written two ways: lines 2 and 21"),
             ({"data.train": str(one)}, "only one label"),
             ({"data.train": str(rows), "data.labels": ("0", "1", "2")},
              "has no row with the given label"),
             ({"data.eval": str(one)}, "the label sets differ")]
    for overrides, match in cases:
        workdir = tmp_path / "w"
        with pytest.raises(clf_data.DataError, match=match):
            finetuning.finetune(classification.ClassificationTask(),
                                config(toy, **overrides), workdir)
        assert not workdir.exists(), overrides


# ----------------------------------------------------------------------------- NER


def ner_config(toy, tmp_path, **overrides):
    from configs import finetune_ner

    train = fx.ner_conll(tmp_path / "train.conll", 40, seed=1)
    test = fx.ner_conll(tmp_path / "test.conll", 10, seed=2)
    c = finetune_ner.get_config()
    values = {"model.init_from_hf": str(toy["ckpt"]), "data.train": str(train),
              "data.eval": str(test), "data.max_seq_length": 16, "data.stride": 8,
              "batch.expected_batch_size": 8, "batch.physical_batch_size": 8,
              "optimizer.learning_rate": 1e-2, "checkpoint.async_save": False, **overrides}
    for key, value in values.items():
        *parents, leaf = key.split(".")
        node = c
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


def test_ner_documents_are_the_examples_and_gold_predictions_score_f1_one(toy, tmp_path):
    from dpbert.tasks import ner

    c = schedule.resolve_schedule(ner_config(toy, tmp_path), 40)
    task = ner.NerTask()
    data = task.prepare(c, tmp_path, np.array([1, 2], np.uint32))
    assert data.train.num_examples == 40 and data.unit_definition.startswith("one document")
    batch = data.train.get_batch(np.array([0, 5, 7]), step=0)
    n, w, s = batch["input_ids"].shape
    assert (n, s) == (3, 16) and batch["window_mask"].shape == (3, w) and w > 1
    # A document's windows are all there; missing windows carry no label.
    assert np.all(batch["labels"][batch["window_mask"] == 0] == release.IGNORE_LABEL)
    assert np.all(batch["window_mask"][:, 0] == 1)
    # Eval: gold tags as the predictions (first piece of each word) give F1 = 1; one wrong
    # entity lowers it.
    ev = data.eval.get_batch(np.arange(data.eval.num_examples), step=0)
    pred = np.where(ev["labels"] >= 0, ev["labels"], 0).astype(np.int32)
    mask = np.ones(len(pred), bool)
    out = {"pred": pred, "mask": mask, "loss_sum": 0.0, "token_count": 1.0}
    perfect = task.eval_metrics([out], data)
    assert perfect["f1"] == 1.0 and perfect["word_accuracy"] == 1.0
    first = np.argwhere(ev["labels"] == data.extra["labels"].index("B-treatment"))[0]
    worse = pred.copy()
    worse[tuple(first)] = data.extra["labels"].index("B-problem")
    assert task.eval_metrics([dict(out, pred=worse)], data)["f1"] < 1.0


def test_a_ner_training_file_of_one_document_is_refused_before_work(toy, tmp_path):
    """A CoNLL file without -DOCSTART- is one document: it cannot be split into folds nor
    batched. The refusal says why (was, without an eval file: "1 documents cannot be split into
    5 folds", and with one: a run on one document), before anything is written."""
    from dpbert.tasks import ner  # noqa: PLC0415

    one = tmp_path / "one.conll"
    one.write_text("The O\npatient O\nsaw O\n\nHe O\nleft O\n")
    for eval_file in ("", str(fx.ner_conll(tmp_path / "test.conll", 10, seed=2))):
        workdir = tmp_path / f"w{len(eval_file)}"
        with pytest.raises(ValueError, match=(
                rf"^{one}: no -DOCSTART- line, so the whole file \(2 sentences\) is ONE "
                r"document: .*; at least 2 documents are needed, 1 found$")):
            finetuning.finetune(ner.NerTask(), ner_config(toy, tmp_path, **{
                "data.train": str(one), "data.eval": eval_file}), workdir)
        assert not workdir.exists()


@pytest.mark.slow
def test_auto_clipping_takes_the_ghost_loss_where_examples_feed_the_encoder(toy, tmp_path):
    from dpbert.tasks import ner  # noqa: PLC0415

    clf = classification.ClassificationTask()
    for mode, want in (("none", "mixed_ghost"), ("token_rep", "mixed_ghost"),
                       ("text_to_text", "mixed_ghost"), ("seq_rep", "vmap"), ("ome", "vmap"),
                       ("texthide", "vmap"), ("no_such_mode", "vmap")):
        assert clf.auto_clipping(config(toy, **{"privacy.mode": mode})) == want, mode
    assert ner.NerTask().auto_clipping(ner_config(toy, tmp_path)) == "vmap"
    with pytest.raises(ConfigError, match="a ner example is a document of several windows"):
        finetuning.run(ner_config(toy, tmp_path, **{
            "dp.enabled": True, "dp.clipping": "mixed_ghost", "dp.noise_multiplier": 1.0}),
            tmp_path / "w")


def test_ner_end_to_end_learns_entities_and_exports_token_classification(toy, tmp_path):
    results = finetuning.run(ner_config(toy, tmp_path, **{"train.epochs": 15.0}),
                             tmp_path / "w")
    assert results["task"] == "ner" and results["num_train_examples"] == 40
    assert results["eval_f1"] >= 0.6, results
    assert "one document" in results["privacy"]["privacy_unit"]
    model, info = transformers.BertForTokenClassification.from_pretrained(
        tmp_path / "w" / "hf", output_loading_info=True)
    assert not any(info.values()) and model.config.num_labels == len(results["labels"])


def test_ner_under_dp_sgd_trains_the_recipes_top_layer_per_document(toy, tmp_path):
    """NER under DP (issue 31): one document = one unit; with train.trainable unset the DP
    recipe trains the top layer and the classifier; the rest is the checkpoint's, bitwise."""
    from safetensors.numpy import load_file

    results = finetuning.run(ner_config(toy, tmp_path, **{
        "dp.enabled": True, "dp.noise_multiplier": 2.0, "dp.target_epsilon": None,
        "train.epochs": 1.0}), tmp_path / "w")
    assert results["trainable"]["spec"] == "top:1" and "one document" in (
        results["privacy"]["privacy_unit"])
    assert results["privacy"]["dp_sgd"]["training"]["epsilon"] > 0
    before = load_file(str(toy["ckpt"] / "model.safetensors"))
    after = load_file(str(tmp_path / "w" / "hf" / "model.safetensors"))
    frozen = [k for k in after if k in before and ".embeddings." in k]   # the toy: 1 layer
    top = [k for k in after if k in before and ".layer.0." in k and k.endswith("weight")]
    assert frozen and top
    for k in frozen:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    assert any(not np.array_equal(after[k], before[k]) for k in top)


# ----------------------------------------------------------------------------- OME (issue 13)


def test_ome_releases_randomized_bits_once_and_reports_claimed_and_true_epsilon(toy, tmp_path):
    from dpbert.privacy import ome

    c = schedule.resolve_schedule(config(toy, **{
        "privacy.mode": "ome", "privacy.epsilon": 1.0, "privacy.ome_lambda": 100.0}), 256)
    task = classification.ClassificationTask()
    key = np.array([7, 8], np.uint32)
    data = task.prepare(c, tmp_path, key)
    rows = np.arange(256)
    first = data.train.get_batch(rows, step=0)
    # The service sees r·l bits and the label, nothing else; the same bits in every epoch and
    # for the same key, others for another key; eval released too.
    assert set(first) == {"features", "label"} and first["features"].shape == (256, 32 * 10)
    assert set(np.unique(first["features"])) <= {0.0, 1.0}
    assert digest(first) == digest(data.train.get_batch(rows, step=40))
    assert digest(first) == digest(task.prepare(c, tmp_path, key).train.get_batch(rows, step=0))
    other = task.prepare(c, tmp_path, np.array([7, 9], np.uint32))
    assert digest(first) != digest(other.train.get_batch(rows, step=0))
    assert data.eval.get_batch(np.arange(64), step=0)["features"].shape == (64, 320)
    # The head reads the bits; the encoder is frozen (only the classifier trains).
    model = data.extra["model"]
    assert model.classifier.kernel.shape == (320, 2)
    trainable = task.trainable(c)
    assert trainable(("classifier", "kernel"), None) and not trainable(("bert", "pooler"), None)
    r = data.extra["input_privacy"]
    want = ome.OME(eps=1.0, lam=100.0, r=32).privacy_report()
    assert r["epsilon_claimed"] == 1.0 and r["epsilon_true"] == want["epsilon_true"] > 100
    assert "claimed ε = 1" in r["statement"] and f"{r['epsilon_true']:.6g}" in r["statement"]
    # The calibrated variant's true ε is the requested one.
    cal = classification.ClassificationTask().prepare(schedule.resolve_schedule(config(toy, **{
        "privacy.mode": "ome", "privacy.ome_variant": "calibrated", "privacy.epsilon": 5.0}),
        256), tmp_path, key).extra["input_privacy"]
    assert cal["epsilon_claimed"] == 5.0 and cal["epsilon_true"] == pytest.approx(5.0)
    # The unary-encoding baselines: r x levels one-hot bits, randomized; both ε reported.
    for kind in ("sue", "oue"):
        c_ue = schedule.resolve_schedule(config(toy, **{
            "privacy.mode": "ome", "privacy.ome_variant": kind, "privacy.epsilon": 5.0,
            "privacy.ue_levels": 8}), 256)
        ue_data = classification.ClassificationTask().prepare(c_ue, tmp_path, key)
        bits = ue_data.train.get_batch(rows, step=0)["features"]
        assert bits.shape == (256, 32 * 8) and set(np.unique(bits)) <= {0.0, 1.0}
        assert ue_data.extra["model"].classifier.kernel.shape == (256, 2)
        ue = ue_data.extra["input_privacy"]
        want = ome.UnaryEncoding(kind, eps=5.0, r=32, levels=8).privacy_report()
        assert ue["variant"] == kind and ue["epsilon_true"] == want["epsilon_true"]
        assert f"{kind.upper()} unary encoding over 8 bins" in ue["statement"]


@pytest.mark.slow
def test_ome_end_to_end_results_and_card_carry_both_epsilons(toy, tmp_path):
    results = finetuning.run(config(toy, **{
        "privacy.mode": "ome", "privacy.epsilon": 1.0, "privacy.ome_lambda": 100.0,
        "train.epochs": 1.0}), tmp_path)
    p = results["privacy"]
    assert p["mode"] == "ome" and p["eta"] is None and p["variant"] == "published"
    assert p["epsilon_claimed"] == 1.0 and p["epsilon_true"] > 100
    assert p["frozen"] == ["bert (embeddings, encoder, pooler)"]
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "epsilon_true" in card and "epsilon_claimed" in card
    settings = json.loads((tmp_path / "hf" / "ome_config.json").read_text())
    head = load_file(str(tmp_path / "hf" / "ome_head.safetensors"))
    assert head["classifier.weight"].shape == (2, 320) and settings["labels"] == ["0", "1"]
    # The frozen encoder is bitwise the starting checkpoint.
    source = load_file(str(toy["ckpt"] / "model.safetensors"))
    for k, v in leaves(final_params(tmp_path)[0]).items():
        if k[0] == "bert":
            np.testing.assert_array_equal(v, hf.from_hf_tensor(k, source[hf.hf_key(k)]))


# ----------------------------------------------------------------------------- TextHide


def _texthide_task(toy, tmp_path, key, **privacy):
    """The prepared texthide task, its config and data (dropout off)."""
    over = {"model.hidden_dropout_prob": 0.0, "model.attention_probs_dropout_prob": 0.0,
            "model.classifier_dropout": 0.0, "privacy.mode": "texthide",
            "privacy.texthide_head": "linear",
            **{f"privacy.{k}": v for k, v in privacy.items()}}
    c = schedule.resolve_schedule(config(toy, **over), 256)
    task = classification.ClassificationTask()
    return task, c, task.prepare(c, tmp_path, key)


def _losses(task, c, data, *, plain: bool):
    """The texthide batch loss (and the plain one) of one batch, jitted."""
    from flax import nnx

    from dpbert.dp import clipping

    graphdef, params = nnx.split(data.extra["model"])
    batch = {k: v for k, v in data.train.get_batch(np.arange(16), step=0).items()
             if k != "example_id"}
    plain_batch = batch
    transform = task.batch_transform(c, data.extra["model"], data)  # the secret key's way in
    batch = transform.train(transform.operand, batch, 0, 0)
    args = (params, batch, np.ones(16, bool), jax.random.split(jax.random.PRNGKey(3), 16))
    out = [jax.jit(task.loss(graphdef, c, "batch", data))(*args)]
    args = (params, plain_batch, *args[2:])
    if plain:
        out.append(jax.jit(clipping.batch_loss(task.example_loss(graphdef,
                                                                 deterministic=False)))(*args))
    return out


def test_texthide_m0_k1_is_plain_fine_tuning_and_the_pool_comes_from_the_secret_key(toy,
                                                                                  tmp_path):
    key = np.array([5, 6], np.uint32)
    (h_loss, h_m), (p_loss, p_m) = _losses(*_texthide_task(toy, tmp_path, key, m=0, k=1),
                                           plain=True)
    np.testing.assert_allclose(h_loss, p_loss, rtol=1e-5)
    assert float(h_m["correct"]) == float(p_m["correct"]) and float(h_m["count"]) == 16
    task, c, data = _texthide_task(toy, tmp_path, key, m=8, k=4)
    (mixed, _), = _losses(task, c, data, plain=False)
    assert abs(float(mixed) - float(p_loss)) > 1e-3            # mixing and masks do act
    user = data.extra["user_side"]
    pool = user.pool(user.key)
    assert pool.masks.shape == (8, 32) and set(np.unique(pool.masks)) == {-1.0, 1.0}
    np.testing.assert_array_equal(pool.masks, user.pool(user.key).masks)
    other, _, other_data = _texthide_task(toy, tmp_path, np.array([5, 7], np.uint32), m=8,
                                          k=4, texthide_head="mlp")
    other_user = other_data.extra["user_side"]
    assert not np.array_equal(pool.masks, other_user.pool(other_user.key).masks)
    assert hasattr(other_data.extra["model"].classifier, "head")   # the MLP head (mlp)
    # the MLP head's input is RMS-normalised by default; the exported settings say how to run
    # the head (texthide_config.json carries the report)
    assert other_data.extra["model"].classifier.head.input_norm == "rms"
    other_report = other_data.extra["user_side"].report(epochs=1)
    assert other_report["head_input_norm"] == "rms" and "RMS" in other_report["head"]
    r = data.extra["user_side"].report(epochs=1)
    assert r["head_input_norm"] == "none"
    assert r["m"] == 8 and r["k"] == 4 and r["epsilon"] is None and "NOT differential" in \
        r["statement"]


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["intra", "inter"])
def test_texthide_end_to_end_learns_and_reports_no_epsilon(toy, tmp_path, variant):
    public, _ = fx.sentiment_tsvs(tmp_path / "public", n_train=128, n_eval=8)
    results = finetuning.run(config(toy, **{
        "privacy.mode": "texthide", "privacy.m": 4, "privacy.k": 2, "privacy.variant": variant,
        "privacy.public_file": str(public), "train.epochs": 12.0,
        "optimizer.learning_rate": 2e-3, "dp.insecure_seeded_noise": True}), tmp_path / "w")
    p = results["privacy"]
    assert p["mode"] == "texthide" and p["eta"] is None and p["dp_sgd"] is None
    assert p["input_privacy"]["variant"] == variant and p["input_privacy"]["epsilon"] is None
    if variant == "intra":
        # (inter did not beat chance on this toy in 12 epochs: its even slots are public
        # sentences whose weight the head must learn to ignore; not asserted here)
        assert results["eval_accuracy"] >= 0.65, results["eval_accuracy"]
    else:
        assert p["input_privacy"]["public_file"].endswith("train.tsv")
    card = (tmp_path / "w" / "hf" / "README.md").read_text()
    assert "TextHide" in card and "NOT differential privacy" in card
    tensors = load_file(str(tmp_path / "w" / "hf" / "texthide_model.safetensors"))
    assert any(k.startswith("classifier/head/") for k in tensors)
    assert any(k.startswith("bert/") for k in tensors)
