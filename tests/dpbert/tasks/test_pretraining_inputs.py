"""Pretraining's inputs end to end: privacy-adaptive (dχ) runs from a pretrained start, the real
corpora (../shared/data) through the training loop, and the configs that need files. Split
from test_pretraining.py so that the two pytest-xdist workers (whole files each) share the
end-to-end runs."""

import json

import jax
import numpy as np
import pytest

from data_pipelines import tokenization
from dpbert import dp as dp_lib
from dpbert.runtime import sharding
from dpbert.dp import trees
from dpbert.errors import ConfigError
from dpbert.tasks import pretraining as train
from tests.dpbert.tasks.test_pretraining import (  # noqa: F401  (cache_dir: the fixture)
    cache_dir, override, small_config)


@pytest.fixture(scope="module")
def hf_start(tmp_path_factory):
    """A small 'pretrained' BERT folder + a public text corpus, for privacy-adaptive runs."""
    from data_pipelines import dp_vocab, synthetic_notes
    from dpbert.models import hf_export
    from dpbert.models import bert as model_lib

    root = tmp_path_factory.mktemp("pa")
    corpus = root / "corpus.txt.gz"
    synthetic_notes.write_text_corpus(corpus, synthetic_notes.generate_synthetic(48, seed=3))
    dp_vocab.build_vocab(corpus, "text", 1000, None, None, 64, root / "vocab", dp=False,
                         seed=0, progress=False)
    vocab = tokenization.load_vocab(root / "vocab" / "vocab.txt")
    model = model_lib.create_model(model_lib.BertConfig.preset(
        "tiny", len(vocab), max_position_embeddings=64), seed=5)
    hf_export.save_pretrained(model, root / "bert", root / "vocab" / "vocab.txt")
    return root / "bert", corpus


def small_privacy_adaptive_config(hf_start, cache_dir, mechanism: str = "text_to_text"):
    """configs/privacy_adaptive.py at the tests' size, from `hf_start` (2 steps, batch 16)."""
    from configs import privacy_adaptive

    start, corpus = hf_start
    c = privacy_adaptive.get_config(mechanism)
    c.model.init_from_hf = str(start)
    c.dchi.prob_samples = 3
    c.dchi.eta = 50.0
    c.data.paths = (str(corpus),)
    c.data.max_seq_length = 32
    c.data.max_predictions_per_seq = 5
    c.data.eval_fraction = 0.1
    c.data.cache_dir = str(cache_dir / "instances")
    c.batch.expected_batch_size = c.batch.physical_batch_size = 16
    c.optimizer.warmup_steps = 1
    c.train.num_steps = 2
    c.train.log_every = 1
    c.train.eval_every = 0
    c.train.eval_batches = 1
    c.train.eval_batch_size = 16
    c.checkpoint.async_save = False
    return c


@pytest.mark.slow
@pytest.mark.parametrize("mechanism,target", [("text_to_text", "vanilla"),
                                              ("text_to_text", "prob"),
                                              ("token_rep", "denoising")])
def test_privacy_adaptive_config_trains_each_target(hf_start, cache_dir, tmp_path, mechanism,
                                                    target):
    from safetensors.numpy import load_file

    start, _ = hf_start
    c = small_privacy_adaptive_config(hf_start, cache_dir, mechanism)
    c.mlm_target = target
    c.optimizer.learning_rate = 1e-2
    report = train.train_and_evaluate(c, tmp_path / "run")
    assert report["dp"] is False and report["steps"] == 2
    # The export keeps its history (issue 36): mechanism, eta, target on the report and card.
    settings = report["privacy_adaptive"]
    assert (settings["mechanism"], settings["eta"], settings["mlm_target"]) == (
        mechanism, 50.0, target)
    assert settings.get("prob_samples") == (3 if target == "prob" else None)
    shipped = json.loads((tmp_path / "run" / "hf" / "privacy_report.json").read_text())
    assert shipped["privacy_adaptive"] == settings
    card = (tmp_path / "run" / "hf" / "README.md").read_text()
    assert "## Privacy-adaptive pretraining (dχ)" in card
    assert f"mechanism `{mechanism}` at η = 50, MLM target `{target}`" in card
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(l["train/loss"]) for l in lines if "train/loss" in l)
    before = load_file(start / "model.safetensors")
    after = load_file(tmp_path / "run" / "hf" / "model.safetensors")
    key = "bert.embeddings.word_embeddings.weight"
    np.testing.assert_array_equal(before[key], after[key])  # φ (and the tied decoder) frozen
    moved = "bert.encoder.layer.0.intermediate.dense.weight"
    assert not np.array_equal(before[moved], after[moved])  # the rest trains


def test_dchi_keys_are_secret_in_a_dp_run(hf_start):
    """dχ noise is keyed by batch position (like dropout): in a DP run it comes from the run's
    secret task key, so another run (another key) privatizes the same batch differently; with
    insecure seeded noise it comes from config.seed."""
    import jax.numpy as jnp

    from configs import privacy_adaptive
    from dpbert.runtime import loop

    start, _ = hf_start
    c = privacy_adaptive.get_config("text_to_text")
    c.model.init_from_hf = str(start)
    c.dp.enabled = True
    c.data.max_seq_length = 32
    vocab_file = start / "vocab.txt"
    model = train.build_model(c, len(tokenization.load_vocab(vocab_file)))
    rng = np.random.default_rng(0)
    batch = {"input_ids": jnp.asarray(rng.integers(5, 900, (4, 16)), jnp.int32),
             "input_mask": jnp.ones((4, 16), jnp.int32),
             "segment_ids": jnp.zeros((4, 16), jnp.int32),
             "masked_lm_positions": jnp.asarray(np.tile(np.arange(1, 4), (4, 1)), jnp.int32),
             "masked_lm_ids": jnp.asarray(rng.integers(5, 900, (4, 3)), jnp.int32),
             "masked_lm_weights": jnp.ones((4, 3), jnp.float32),
             "next_sentence_labels": jnp.zeros((4,), jnp.int32)}

    def privatized(task_key, insecure):
        c.dp.insecure_seeded_noise = insecure
        data = loop.TaskData(None, None, extra={"vocab_file": str(vocab_file),
                                                "task_key": np.asarray(task_key, np.uint32)})
        t = train.TASK.batch_transform(c, model, data)
        return np.asarray(t.train(t.operand, batch, jnp.int32(3), jnp.int32(0))["input_ids"])

    a, b = privatized([1, 2], False), privatized([3, 4], False)
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(privatized([1, 2], True), privatized([3, 4], True))


def test_dchi_needs_a_pretrained_start(cache_dir, tmp_path):
    c = small_config(cache_dir, **{"dchi.mechanism": "text_to_text"})
    with pytest.raises(ConfigError, match="model.init_from_hf"):
        train.train_and_evaluate(c, tmp_path / "x")


def test_optimizer_state_is_sharded_like_the_parameters():
    from flax import nnx
    from jax.sharding import PartitionSpec as P

    from dpbert.models import bert as model_lib
    from dpbert.runtime import optimizers

    mesh = sharding.make_mesh(4, 2)
    model = model_lib.create_model(model_lib.BertConfig.preset("tiny", 100))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    shardings = sharding.pure_param_shardings(model, mesh)
    opt_cfg = dict(name="adamw", learning_rate=1e-3, warmup_steps=1, total_steps=10,
                   weight_decay=0.01)
    tx = optimizers.make_optimizer(opt_cfg, params,
                                   trainable=dp_lib.freeze_paths_containing("word_embeddings"))
    opt = sharding.opt_state_shardings(jax.eval_shape(tx.init, params), params, shardings, mesh)
    specs = {trees.path_names(p): s.spec for p, s in jax.tree_util.tree_leaves_with_path(opt)}
    kernel = ("bert", "encoder", "layer", "0", "intermediate", "dense", "kernel")
    moments = [k for k in specs if k[-len(kernel):] == kernel]
    assert len(moments) == 2  # mu and nu
    assert all(specs[k] == P(None, "fsdp") for k in moments)
    # The frozen word embedding has no optimizer state at all.
    assert not any("word_embeddings" in k for k in specs)


def _shrink(c, cache_dir, steps=2):
    """A real experiment config shrunk to a few seconds of tiny BERT."""
    return override(c, {
        "model.size": "tiny", "model.max_position_embeddings": 64, "data.max_seq_length": 64,
        "data.max_predictions_per_seq": 8, "data.cache_dir": str(cache_dir / "instances"),
        "vocab.size": 2000, "vocab.seed": 0, "batch.expected_batch_size": 16,
        "batch.physical_batch_size": 32, "batch.microbatch_size": 16,
        "dp.overflow_probability": 1e-3, "dp.max_examples_per_unit": 2,
        "optimizer.warmup_steps": 1, "train.num_steps": steps,
        "train.log_every": 1, "train.eval_every": 0, "train.eval_batches": 1,
        "train.eval_batch_size": 16, "train.export_hf": False, "checkpoint.async_save": False})


@pytest.mark.slow
@pytest.mark.shared_data
@pytest.mark.parametrize("corpus", ["noteevents", "text"])
def test_real_corpora_feed_the_training_loop(shared_data, cache_dir, tmp_path, corpus):
    """The NOTEEVENTS sample (mimic_dp config) and a plain-text corpus train end to end, with a
    DP vocabulary built from them first."""
    from configs import mimic_dp

    c = _shrink(mimic_dp.get_config("size=tiny"), cache_dir)
    c.dp.delta = 1e-6
    if corpus == "noteevents":
        c.data.paths = (str(shared_data / "clinical" / "NOTEEVENTS_sample.csv.gz"),)
    else:
        c.data.corpus = "text"
        c.data.paths = (str(shared_data / "corpus" / "web_bible.txt.gz"),)
        c.data.eval_split_unit = "document"
    report = train.train_and_evaluate(c, tmp_path / corpus)
    assert report["steps"] == 2 and report["training"]["delta"] == 1e-6
    assert report["vocabulary"]["dp"] is True
    assert report["training"]["num_examples"] > 100
    assert (tmp_path / corpus / "vocab" / "vocab.txt").is_file()


def test_mimic_config_without_corpus_says_what_is_missing(tmp_path):
    from configs import mimic_dp

    with pytest.raises(ConfigError, match=r"data.paths.*is empty: give a MIMIC-III "
                                                r"NOTEEVENTS"):
        train.train_and_evaluate(mimic_dp.get_config(), tmp_path)
    c = mimic_dp.get_config()
    c.data.paths = ("/nowhere/NOTEEVENTS.csv.gz",)
    with pytest.raises(ConfigError, match="/nowhere/NOTEEVENTS.csv.gz' does not exist"):
        train.train_and_evaluate(c, tmp_path)
    with pytest.raises(ValueError, match="unknown config arg"):
        mimic_dp.get_config("sise=tiny")


def test_wiki_books_needs_prepared_tfds_and_a_vocab(tmp_path):
    from configs import wiki_books

    c = wiki_books.get_config("tiny")
    with pytest.raises(ConfigError, match="vocab.file is empty"):
        train.train_and_evaluate(c, tmp_path / "a")
