"""Fine-tuning models and their HF import/export, checked against transformers' own classes."""

import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from dpbert.models import heads

from dpbert.models import hf, hf_export

from dpbert.models import hf_heads
from dpbert.models import bert as model_lib

TOL = 1e-4
VOCAB = 97
LABELS = ("negative", "positive", "neutral")
TAGS = ("O", "B-problem", "I-problem", "B-test", "I-test", "B-treatment", "I-treatment")


def tiny_hf_config(**kw):
    fields = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=40)
    fields.update(kw)
    return transformers.BertConfig(**fields)


def write_vocab(folder, n=VOCAB):
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    path = folder / "vocab.txt"
    path.write_text("\n".join(special + [f"w{i}" for i in range(n - len(special))]) + "\n")
    return path


def randomize(model):
    """Non-zero biases and LayerNorm parameters, so every tensor matters in the comparison."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def save_hf(model, folder):
    model.save_pretrained(folder)
    write_vocab(folder)
    return folder


def batch(seed=0, b=3, s=16):
    rng = np.random.RandomState(seed)
    ids = rng.randint(5, VOCAB, size=(b, s))
    mask = np.ones_like(ids)
    mask[1, 11:] = 0
    mask[2, 4:] = 0
    ids[:, 0] = 2
    ids[mask == 0] = 0
    seg = np.zeros_like(ids)
    seg[:, 7:] = 1
    seg[mask == 0] = 0
    return ids, seg, mask


def torch_logits(model, ids, seg, mask):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(seg),
                     attention_mask=torch.tensor(mask)).logits.numpy()


def ours(model, ids, seg, mask):
    return np.asarray(model(jnp.asarray(ids), jnp.asarray(seg), jnp.asarray(mask)))


def id2label(labels):
    return {i: name for i, name in enumerate(labels)}


@pytest.mark.parametrize("task,hf_cls,labels", [
    ("sequence_classification", transformers.BertForSequenceClassification, LABELS),
    ("token_classification", transformers.BertForTokenClassification, TAGS)])
def test_import_of_a_fine_tuned_hf_model_matches_transformers(tmp_path, caplog, task, hf_cls,
                                                              labels):
    torch.manual_seed(0)
    ref = randomize(hf_cls(tiny_hf_config(id2label=id2label(labels),
                                          label2id={n: i for i, n in enumerate(labels)}))).eval()
    save_hf(ref, tmp_path)
    with caplog.at_level(logging.INFO, logger="dpbert.models.hf_heads"):
        model, _ = hf_heads.load_task_model(tmp_path, task, labels=None)
    assert model.labels == labels
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    ids, seg, mask = batch()
    got, want = ours(model, ids, seg, mask), torch_logits(ref, ids, seg, mask)
    assert got.shape == want.shape
    if task == "token_classification":  # padded positions are not compared
        got, want = got[mask == 1], want[mask == 1]
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


def test_from_a_bert_model_folder_then_export_to_transformers(tmp_path, caplog):
    """The MiniLM path: a bare BertModel folder; the classifier is new (named in a warning)."""
    torch.manual_seed(0)
    base = randomize(transformers.BertModel(tiny_hf_config())).eval()
    src = save_hf(base, tmp_path / "src")
    with caplog.at_level(logging.WARNING, logger="dpbert.models.hf_heads"):
        model, config = hf_heads.load_task_model(src, "sequence_classification", list(LABELS),
                                                 seed=3)
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "classifier.weight" in warned and "classifier.bias" in warned
    assert "pooler" not in warned          # the BertModel folder has one
    ids, seg, mask = batch(1)
    with torch.no_grad():
        pooled_ref = base(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(seg),
                          attention_mask=torch.tensor(mask)).pooler_output.numpy()
    pooled = model.sequence_representation(jnp.asarray(ids), jnp.asarray(seg), jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(pooled), pooled_ref, atol=TOL, rtol=0)
    # A fresh classifier: BERT's init (std 0.02), zero bias.
    kernel = np.asarray(model.classifier.kernel[...])
    assert kernel.shape == (32, 3) and 0.005 < kernel.std() < 0.03
    assert not np.asarray(model.classifier.bias[...]).any()

    out = hf_heads.save_task_model(model, tmp_path / "out", src / "vocab.txt")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["BertForSequenceClassification"]
    assert cfg["id2label"] == {"0": "negative", "1": "positive", "2": "neutral"}
    assert cfg["label2id"] == {"negative": 0, "positive": 1, "neutral": 2}
    assert cfg["num_labels"] == 3
    assert cfg["problem_type"] == "single_label_classification"
    loaded, info = transformers.BertForSequenceClassification.from_pretrained(
        out, output_loading_info=True)
    assert not info["missing_keys"], info
    assert not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert loaded.config.num_labels == 3 and loaded.config.id2label[1] == "positive"
    np.testing.assert_allclose(ours(model, ids, seg, mask),
                               torch_logits(loaded.eval(), ids, seg, mask), atol=TOL, rtol=0)
    assert "BertForSequenceClassification.from_pretrained" in (out / "README.md").read_text()


def test_token_model_from_a_pretraining_folder_exports_without_a_pooler(tmp_path, caplog):
    torch.manual_seed(0)
    pre = randomize(transformers.BertForPreTraining(tiny_hf_config())).eval()
    src = save_hf(pre, tmp_path / "src")
    with caplog.at_level(logging.INFO, logger="dpbert.models.hf_heads"):
        model, _ = hf_heads.load_task_model(src, "token_classification", list(TAGS), seed=1)
    warnings = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    infos = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    assert "classifier.weight" in warnings and "pooler" not in warnings and "cls." not in warnings
    assert "bert.pooler.dense.weight" in infos and "cls.predictions.bias" in infos
    assert model.bert.pooler is None
    out = hf_heads.save_task_model(model, tmp_path / "out", src / "vocab.txt")
    loaded, info = transformers.BertForTokenClassification.from_pretrained(
        out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    assert loaded.config.id2label == id2label(TAGS) and loaded.config.num_labels == 7
    assert loaded.config.label2id == {t: i for i, t in enumerate(TAGS)}
    ids, seg, mask = batch(2)
    got, want = ours(model, ids, seg, mask), torch_logits(loaded.eval(), ids, seg, mask)
    np.testing.assert_allclose(got[mask == 1], want[mask == 1], atol=TOL, rtol=0)
    # The hidden states are the pretraining model's (same encoder weights).
    with torch.no_grad():
        hidden = pre.bert(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(seg),
                          attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    mine, _ = model.bert(jnp.asarray(ids), jnp.asarray(seg), jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(mine)[mask == 1], hidden[mask == 1], atol=TOL, rtol=0)


def test_import_of_dpbert_pretraining_export(tmp_path):
    config = model_lib.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=40)
    pre = model_lib.create_model(config, seed=5)
    folder = hf_export.save_pretrained(pre, tmp_path / "pre", write_vocab(tmp_path))
    model, _ = hf_heads.load_task_model(folder, "sequence_classification", 2)
    ids, seg, mask = batch(3)
    want = pre.bert(jnp.asarray(ids), jnp.asarray(seg), jnp.asarray(mask))[1]
    got = model.sequence_representation(jnp.asarray(ids), jnp.asarray(seg), jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6, rtol=0)
    assert model.labels == ("LABEL_0", "LABEL_1")


def test_a_classifier_for_other_labels_is_refused(tmp_path):
    ref = transformers.BertForSequenceClassification(tiny_hf_config(
        id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1}))
    save_hf(ref, tmp_path)
    with pytest.raises(hf.CheckpointError, match=r"labels \['neg', 'pos'\].*\['pos', 'neg'\]"):
        hf_heads.load_task_model(tmp_path, "sequence_classification", ["pos", "neg"])
    # The same names but three labels: still refused (the names differ as a list).
    with pytest.raises(hf.CheckpointError, match="use the same labels"):
        hf_heads.load_task_model(tmp_path, "sequence_classification", ["neg", "pos", "x"])
    # Placeholder names LABEL_i: only the count can be checked, a wrong count is a shape error.
    ref2 = transformers.BertForSequenceClassification(tiny_hf_config(num_labels=2))
    save_hf(ref2, tmp_path / "p")
    with pytest.raises(hf.CheckpointError, match=r"classifier\.(weight|bias).* has shape \(2[,)].*3 labels"):
        hf_heads.load_task_model(tmp_path / "p", "sequence_classification", list(LABELS))


def test_missing_encoder_weight_is_an_error(tmp_path):
    from safetensors.numpy import load_file, save_file
    base = transformers.BertModel(tiny_hf_config())
    save_hf(base, tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    del sd["encoder.layer.1.output.dense.weight"]
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(hf.CheckpointError, match="bert.encoder.layer.1.output.dense.weight"):
        hf_heads.load_task_model(tmp_path, "token_classification", list(TAGS))


def make(task, labels, dropout=None):
    config = model_lib.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=40)
    return heads.create_task_model(task, config, labels, classifier_dropout=dropout, seed=0)


@pytest.mark.parametrize("task", ["sequence_classification", "token_classification"])
def test_word_embeddings_input_and_dropout(task):
    model = make(task, 3, dropout=0.5)
    ids, seg, mask = map(jnp.asarray, batch())
    table = model.bert.embeddings.word_embeddings.embedding[...]
    np.testing.assert_allclose(np.asarray(model(ids, seg, mask, word_embeddings=table[ids])),
                               np.asarray(model(ids, seg, mask)), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="no rngs"):
        model(ids, seg, mask, deterministic=False)
    a = model(ids, seg, mask, deterministic=False, rngs=nnx.Rngs(dropout=jax.random.key(0)))
    b = model(ids, seg, mask, deterministic=False, rngs=nnx.Rngs(dropout=jax.random.key(0)))
    c = model(ids, seg, mask, deterministic=False, rngs=nnx.Rngs(dropout=jax.random.key(1)))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.abs(np.asarray(a) - np.asarray(c)).max() > 1e-3


def test_seq_rep_sources_and_head():
    model = make("sequence_classification", 2, dropout=0.0)
    ids, seg, mask = map(jnp.asarray, batch())
    hidden, pooled = model.bert(ids, seg, mask)
    np.testing.assert_allclose(np.asarray(model.sequence_representation(ids, seg, mask)),
                               np.asarray(pooled), atol=1e-6)
    cls = model.sequence_representation(ids, seg, mask, source="cls_hidden")
    np.testing.assert_allclose(np.asarray(cls), np.asarray(hidden[:, 0]), atol=1e-6)
    np.testing.assert_allclose(np.asarray(model.classify(pooled)),
                               np.asarray(model(ids, seg, mask)), atol=1e-6)
    with pytest.raises(ValueError, match="seq_rep source"):
        model.sequence_representation(ids, seg, mask, source="mean")


@pytest.mark.parametrize("task", ["sequence_classification", "token_classification"])
def test_every_param_has_logical_axes_known_to_the_sharding_rules(task):
    from dpbert.runtime import sharding
    known = {name for name, _ in sharding.DEFAULT_RULES}
    state = nnx.state(make(task, 4), nnx.Param)
    for path, var in nnx.to_flat_state(state):
        axes = var.get_metadata().get("out_sharding")
        assert axes is not None and len(axes) == var[...].ndim, path
        assert set(axes) <= known, (path, axes)
        assert var[...].dtype == jnp.float32, path


def test_bad_labels():
    with pytest.raises(ValueError, match="duplicates"):
        make("sequence_classification", ["a", "a"])
    with pytest.raises(ValueError, match="empty"):
        make("sequence_classification", [])
    with pytest.raises(ValueError, match="unknown task"):
        heads.create_task_model("qa", None, 2)


def test_export_states_input_privacy_and_warns_about_cls_hidden(tmp_path, caplog):
    from dpbert.privacy import input_privacy

    model = make("sequence_classification", list(LABELS))
    vocab = write_vocab(tmp_path)
    cfg = input_privacy.InputPrivacyConfig("text_to_text", 75.0)
    out = hf_heads.save_task_model(model, tmp_path / "a", vocab,
                                   input_privacy_report=input_privacy.privacy_report(cfg, epochs=3))
    card = (out / "README.md").read_text()
    assert "## Input privacy during fine-tuning" in card and "| eta | 75.0 |" in card
    assert "η·d_χ-privacy per example" in card
    cfg = input_privacy.InputPrivacyConfig("seq_rep", 5.0, seq_rep_source="cls_hidden")
    with caplog.at_level(logging.WARNING, logger="dpbert.models.hf_heads"):
        out = hf_heads.save_task_model(
            model, tmp_path / "b", vocab,
            input_privacy_report=input_privacy.privacy_report(cfg, epochs=1))
    assert "does not reproduce" in caplog.text and "does not reproduce" in (
        out / "README.md").read_text()
