"""Hugging Face import/export: exact parity with transformers, real MiniLM weights, bad input."""

import json
import logging
import os
import re
import pathlib
import shutil
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from dpbert.models import hf, hf_export

REPO = pathlib.Path(__file__).resolve().parents[3]
TOL = 1e-4


def run_cli(*args):
    """Runs a launch/ script with this checkout's packages first on the path."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, env=env)


def tiny_hf_config(**kw):
    fields = dict(vocab_size=211, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=512, max_position_embeddings=64)
    fields.update(kw)
    return transformers.BertConfig(**fields)


def write_vocab(folder: pathlib.Path, n: int) -> pathlib.Path:
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    path = folder / "vocab.txt"
    path.write_text("\n".join(special + [f"w{i}" for i in range(n - len(special))]) + "\n")
    return path


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A random-init transformers.BertForPreTraining saved as a HF folder."""
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(tiny_hf_config()).eval()
    # Random non-zero biases/LayerNorm so the comparison exercises every tensor.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("hf_src")
    model.save_pretrained(folder)
    write_vocab(folder, 211)
    return folder, model


def batch(seed=0, b=3, s=20):
    rng = np.random.RandomState(seed)
    ids = rng.randint(5, 211, size=(b, s))
    mask = np.ones_like(ids)
    mask[1, 12:] = 0
    mask[2, 5:] = 0
    ids[mask == 0] = 0
    seg = np.zeros_like(ids)
    seg[:, 8:] = 1
    seg[mask == 0] = 0
    return ids, seg, mask


def torch_forward(model, ids, seg, mask):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(seg),
                     attention_mask=torch.tensor(mask), output_hidden_states=True)


def test_import_matches_transformers(hf_folder):
    folder, tmodel = hf_folder
    model, config = hf.load_pretrained(folder)
    assert config.hidden_size == 128 and config.vocab_size == 211
    ids, seg, mask = batch()
    ref = torch_forward(tmodel, ids, seg, mask)
    out = model(jnp.asarray(ids), jnp.asarray(seg), jnp.asarray(mask))
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(out.sequence_output)[real],
                               ref.hidden_states[-1].numpy()[real], atol=TOL)
    np.testing.assert_allclose(np.asarray(out.mlm_logits)[real],
                               ref.prediction_logits.numpy()[real], atol=TOL)
    np.testing.assert_allclose(out.nsp_logits, ref.seq_relationship_logits.numpy(), atol=TOL)


def test_export_reloads_in_transformers(hf_folder, tmp_path):
    folder, tmodel = hf_folder
    model, _ = hf.load_pretrained(folder)
    out_dir = hf_export.save_pretrained(model, tmp_path / "export", folder / "vocab.txt")
    reloaded, info = transformers.BertForPreTraining.from_pretrained(
        out_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    ids, seg, mask = batch(1)
    a = torch_forward(reloaded.eval(), ids, seg, mask)
    b = torch_forward(tmodel, ids, seg, mask)
    np.testing.assert_allclose(a.prediction_logits.numpy(), b.prediction_logits.numpy(), atol=TOL)
    np.testing.assert_allclose(a.seq_relationship_logits.numpy(),
                               b.seq_relationship_logits.numpy(), atol=TOL)
    # The tied decoder is not written twice; Dense kernels are in PyTorch layout.
    tensors = load_file(out_dir / "model.safetensors")
    assert "cls.predictions.decoder.weight" not in tensors
    assert tensors["bert.encoder.layer.0.intermediate.dense.weight"].shape == (512, 128)
    cfg = json.loads((out_dir / "config.json").read_text())
    assert cfg["model_type"] == "bert" and cfg["architectures"] == ["BertForPreTraining"]
    assert cfg["hidden_act"] == "gelu" and cfg["layer_norm_eps"] == 1e-12
    assert cfg["pad_token_id"] == 0
    tok = json.loads((out_dir / "tokenizer_config.json").read_text())
    assert tok["do_lower_case"] is True and tok["model_max_length"] == 64
    assert (out_dir / "vocab.txt").read_text() == (folder / "vocab.txt").read_text()
    card = (out_dir / "README.md").read_text()
    assert "## Privacy" in card and "No differential-privacy guarantee is claimed" in card


def _report(secret: bool, vocab_report=None):
    from dpbert.reporting import report as report_lib
    from dpbert.dp import accounting
    from dpbert.dp import ledger

    spec = accounting.AccountingSpec(noise_multiplier=1.0, expected_batch_size=100,
                                     num_examples=10_000, delta=1e-6)
    training = report_lib.training_part(
        ledger.PrivacyLedger.fresh(spec), 50, clip_norm=1.0, privacy_unit="example",
        secret=secret, target_epsilon=None, stopped_by_budget=False)
    relation = (report_lib.vocab_relation(vocab_report, "example")
                if vocab_report is not None else None)
    vocab = report_lib.vocabulary_part(vocab_report, "file", relation)
    return report_lib.run_report(training, vocab, privacy_unit="example", max_seq_length=128,
                                 multiplicity=None, steps=50)


def test_model_card_carries_privacy_report(hf_folder, tmp_path):
    folder, _ = hf_folder
    model, _ = hf.load_pretrained(folder)
    report = _report(secret=True)
    out_dir = hf_export.save_pretrained(model, tmp_path / "e", folder / "vocab.txt",
                                 privacy_report=report)
    card = (out_dir / "README.md").read_text()
    assert report["headline"] in card and "- differential-privacy" in card
    assert report["headline"].startswith(f"({report['epsilon']:.3g}, 1e-06)-differential privacy")
    assert "one training sequence of at most 128 tokens" in card
    assert "assumed public" in card  # a vocab file without a report beside it
    assert "No differential-privacy guarantee" not in card


def test_model_card_of_a_seeded_run_says_not_private(hf_folder, tmp_path):
    folder, _ = hf_folder
    model, _ = hf.load_pretrained(folder)
    vocab_report = {"dp": True, "epsilon": 1.0, "delta": 1e-7, "K": 16,
                    "secret_randomness": False, "num_examples": 1234}
    for secret, reason in ((False, "dp.insecure_seeded_noise=True"),
                           (True, "vocab.seed set")):
        report = _report(secret=secret, vocab_report=vocab_report)
        out_dir = hf_export.save_pretrained(model, tmp_path / str(secret), folder / "vocab.txt",
                                     privacy_report=report)
        card = (out_dir / "README.md").read_text()
        assert report["private"] is False
        assert report["headline"].startswith("NOT PRIVATE: ") and reason in report["headline"]
        assert report["headline"] in card and "- differential-privacy" not in card
        assert "1234" not in card  # the vocabulary's exact corpus counts are not shipped
        assert "1234" not in (out_dir / "privacy_report.json").read_text()


@pytest.mark.parametrize("arch", ["BertModel", "BertForMaskedLM"])
def test_partial_layouts_initialise_missing_heads_with_warning(arch, tmp_path, caplog):
    torch.manual_seed(1)
    tmodel = getattr(transformers, arch)(tiny_hf_config()).eval()
    tmodel.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="dpbert.models.hf"):
        model, _ = hf.load_pretrained(tmp_path)
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "cls.seq_relationship.weight" in warned
    if arch == "BertModel":
        assert "cls.predictions.transform.dense.weight" in warned
    else:
        assert "bert.pooler.dense.weight" in warned
    ids, seg, mask = batch(2)
    ref = torch_forward(tmodel, ids, seg, mask)
    out = model(jnp.asarray(ids), jnp.asarray(seg), jnp.asarray(mask))
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(out.sequence_output)[real],
                               ref.hidden_states[-1].numpy()[real], atol=TOL)
    if arch == "BertForMaskedLM":
        np.testing.assert_allclose(np.asarray(out.mlm_logits)[real], ref.logits.numpy()[real],
                                   atol=TOL)


def test_pytorch_model_bin(hf_folder, tmp_path):
    folder, tmodel = hf_folder
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    torch.save(tmodel.state_dict(), tmp_path / "pytorch_model.bin")
    model, _ = hf.load_pretrained(tmp_path)
    ids, seg, mask = batch(3)
    out = model(jnp.asarray(ids), jnp.asarray(seg), jnp.asarray(mask))
    np.testing.assert_allclose(out.nsp_logits,
                               torch_forward(tmodel, ids, seg, mask).seq_relationship_logits,
                               atol=TOL)


def test_missing_config(tmp_path):
    with pytest.raises(hf.CheckpointError, match=r"config\.json: missing"):
        hf.load_pretrained(tmp_path)


def test_non_bert_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 10}))
    with pytest.raises(hf.CheckpointError, match=r"config\.json: key 'model_type' is 'gpt2'"):
        hf.load_pretrained(tmp_path)


def test_wrong_shape_names_file_and_key(hf_folder, tmp_path):
    folder, _ = hf_folder
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    tensors = load_file(folder / "model.safetensors")
    tensors["bert.encoder.layer.1.attention.self.key.weight"] = np.zeros((128, 64), np.float32)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(hf.CheckpointError) as e:
        hf.load_pretrained(tmp_path)
    msg = str(e.value)
    assert "model.safetensors" in msg and "bert.encoder.layer.1.attention.self.key.weight" in msg
    assert "(128, 64)" in msg and "(128, 128)" in msg


def test_missing_encoder_tensor(hf_folder, tmp_path):
    folder, _ = hf_folder
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    tensors = load_file(folder / "model.safetensors")
    del tensors["bert.encoder.layer.0.output.dense.bias"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(hf.CheckpointError, match=r"'bert.encoder.layer.0.output.dense.bias' is missing"):
        hf.load_pretrained(tmp_path)


def test_vocab_size_mismatch_is_refused_and_existing_export_kept(hf_folder, tmp_path):
    folder, _ = hf_folder
    model, _ = hf.load_pretrained(folder)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "config.json").write_text("keep me")
    bad_vocab = write_vocab(tmp_path, 50)
    with pytest.raises(ValueError, match="has 50 tokens but the model's vocab_size is 211"):
        hf_export.save_pretrained(model, out_dir, bad_vocab)
    assert (out_dir / "config.json").read_text() == "keep me"


EXPORT_FILES = ["README.md", "config.json", "model.safetensors", "privacy_report.json",
                "tokenizer_config.json", "vocab.txt"]


def test_export_replaces_a_previous_export_as_a_whole(hf_folder, tmp_path, monkeypatch):
    """A stale tokenizer.json (30522 tokens) beside a new 211-token model was a silent wrong
    result: a non-empty --out is refused, and --overwrite replaces the folder as a whole."""
    folder, _ = hf_folder
    model, _ = hf.load_pretrained(folder)
    out = tmp_path / "export"
    hf_export.save_pretrained(model, out, folder / "vocab.txt", overwrite=False)
    assert sorted(p.name for p in out.iterdir()) == EXPORT_FILES
    (out / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"w": 30521}}}))
    with pytest.raises(hf_export.ExportError, match="is not empty.*--overwrite"):
        hf_export.save_pretrained(model, out, folder / "vocab.txt", overwrite=False)
    assert (out / "tokenizer.json").exists()
    hf_export.save_pretrained(model, out, folder / "vocab.txt", overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == EXPORT_FILES  # the stale file is gone
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask  # a normal folder, not mkdtemp's 0700
    assert transformers.BertConfig.from_pretrained(out).vocab_size == 211
    # A failure while writing (disk full) keeps the previous export and leaves no debris.
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    import safetensors.numpy
    monkeypatch.setattr(safetensors.numpy, "save_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        hf_export.save_pretrained(model, out, folder / "vocab.txt", overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_export_destination_errors(tmp_path):
    check = hf_export.check_export_destination
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(hf_export.ExportError, match="is a file; the export needs a folder"):
        check(a_file, overwrite=True)
    with pytest.raises(hf_export.ExportError, match=r"cannot be created \(.*file is a file\)"):
        check(a_file / "sub", overwrite=False)
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("not a model")
    # --overwrite never deletes a folder that is not a model export (e.g. --out=. by mistake).
    with pytest.raises(hf_export.ExportError, match="not a Hugging Face model folder"):
        check(home, overwrite=True)
    check(tmp_path / "new" / "deeper", overwrite=False)   # absent: fine
    (tmp_path / "empty").mkdir()
    check(tmp_path / "empty", overwrite=False)             # empty: fine
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    # root ignores permission bits: then a read-only mount stands in.
    target = ro / "out" if os.getuid() != 0 else pathlib.Path("/sys/dpbert_export")
    try:
        with pytest.raises(hf_export.ExportError, match="read-only"):
            check(target, overwrite=False)
    finally:
        ro.chmod(0o700)


# --------------------------------------------------------------------------- real weights (MiniLM)

SENTENCES = [
    "The patient was admitted with shortness of breath and a productive cough.",
    "No acute cardiopulmonary process; the heart size is within normal limits.",
    "A quick brown fox jumps over the lazy dog near the riverbank.",
    "Differential privacy bounds what any single record can reveal.",
]


def minilm_inputs(folder):
    tok = transformers.BertTokenizerFast(vocab=str(folder / "vocab.txt"), do_lower_case=True)
    enc = tok(SENTENCES, padding=True, return_tensors="np")
    assert (enc["input_ids"] == tok.unk_token_id).mean() < 0.02  # vocab really loaded
    return enc["input_ids"], enc["token_type_ids"], enc["attention_mask"]


@pytest.mark.minilm
def test_minilm_real_weights_match_transformers(minilm_dir):
    ids, seg, mask = minilm_inputs(minilm_dir)
    model, config = hf.load_pretrained(minilm_dir)
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (6, 384, 30522)
    ref = transformers.BertModel.from_pretrained(minilm_dir).eval()
    with torch.no_grad():
        expected = ref(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(seg),
                       attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    out = model(jnp.asarray(ids), jnp.asarray(seg), jnp.asarray(mask))
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(out.sequence_output)[real], expected[real], atol=TOL)


@pytest.mark.minilm
@pytest.mark.slow
def test_export_cli_on_minilm(minilm_dir, tmp_path):
    dst = tmp_path / "minilm_export"
    proc = run_cli(REPO / "launch" / "export_hf.py", f"--from_hf={minilm_dir}", f"--out={dst}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    ids, seg, mask = minilm_inputs(dst)  # tokenizer from the exported vocab
    src = transformers.BertModel.from_pretrained(minilm_dir).eval()
    exp = transformers.BertModel.from_pretrained(dst).eval()
    with torch.no_grad():
        kw = dict(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(seg),
                  attention_mask=torch.tensor(mask))
        a, b = src(**kw).last_hidden_state.numpy(), exp(**kw).last_hidden_state.numpy()
    np.testing.assert_allclose(a, b, atol=TOL)
    _, info = transformers.BertForPreTraining.from_pretrained(dst, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_export_cli_reports_bad_source(tmp_path):
    (tmp_path / "src").mkdir()
    proc = run_cli(REPO / "launch" / "export_hf.py", f"--from_hf={tmp_path / 'src'}",
                   f"--out={tmp_path / 'o'}")
    assert proc.returncode != 0
    assert "config.json: missing" in proc.stderr


def test_export_cli_refuses_a_non_empty_out_in_one_line(hf_folder, tmp_path):
    folder, _ = hf_folder
    out = tmp_path / "out"
    out.mkdir()
    (out / "tokenizer.json").write_text("{}")
    proc = run_cli(REPO / "launch" / "export_hf.py", f"--from_hf={folder}", f"--out={out}")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"export_hf: {out}: is not empty; an export into it would mix the files of two models "
        "(e.g. a stale tokenizer.json); choose an empty or new folder, or pass --overwrite to "
        "replace a previous export"]
    assert [p.name for p in out.iterdir()] == ["tokenizer.json"]


# --------------------------------------------------------------------------- issue 35: sources


def test_export_never_replaces_holds_or_lands_in_its_source(hf_folder, tmp_path, monkeypatch):
    """--from_hf=X --out=X --overwrite replaced X (and lost a tokenizer file); now X, a
    symlink or relative spelling of X, a folder inside X and a folder holding X are refused
    before anything is loaded or written, and X is byte-identical afterwards."""
    folder, _ = hf_folder
    src = tmp_path / "models" / "src"
    shutil.copytree(folder, src)
    (src / "tokenizer.json").write_text("{}")   # a file the export does not write
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    (tmp_path / "link").symlink_to(src)
    monkeypatch.chdir(tmp_path)
    cases = {src: "is the source folder", tmp_path / "link": "is the source folder",
             "models/src": "is the source folder", "./models/../models/src/":
             "is the source folder",
             src / "sub": "is inside the source folder",
             tmp_path / "models": "contains the source folder",
             "": "is empty", ".": "is the current directory"}
    for dst, message in cases.items():
        with pytest.raises(hf_export.ExportError, match=message):
            hf_export.export_from_hf(src, dst, overwrite=True)
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["src"]


def test_headless_export_card_names_the_fresh_heads(tmp_path):
    """A BertModel (no MLM/NSP head) exported as BertForPreTraining: the card says which heads
    were initialised at random (transformers cannot warn: the weights are present)."""
    torch.manual_seed(2)
    transformers.BertModel(tiny_hf_config()).eval().save_pretrained(tmp_path / "headless")
    write_vocab(tmp_path / "headless", 211)
    out = hf_export.export_from_hf(tmp_path / "headless", tmp_path / "out")
    card = (out / "README.md").read_text()
    assert "## Freshly initialised heads" in card
    assert "the MLM head (cls.predictions.*) and the NSP head (cls.seq_relationship.*)" in card
    assert "`cls.seq_relationship.weight`" in card and "bert.pooler" not in card
    # A complete BertForPreTraining folder has no such section; its round trip is exact.
    again = hf_export.export_from_hf(out, tmp_path / "again")
    assert "Freshly initialised" not in (again / "README.md").read_text()
    assert hf.fresh_heads(["bert.pooler.dense.weight"]) == ["the pooler (bert.pooler.*)"]


def test_a_fine_tuned_classifier_or_a_workdir_is_not_exported_as_pretraining(hf_folder,
                                                                             tmp_path):
    """Issue 35: `--from_hf=A_FINE_TUNED_CLASSIFIER` wrote a BertForPreTraining without the
    trained classifier.* and id2label (only a log line said so); `--from_hf=WORKDIR` said
    `WORKDIR/privacy_report.json: not a dpbert privacy report`. Both are refused by name,
    before anything is written."""
    # A BertForSequenceClassification folder: the encoder and pooler, a classifier, 3 labels.
    shutil.copytree(hf_folder[0], tmp_path / "clf")
    weights = tmp_path / "clf" / "model.safetensors"
    tensors = {k: v for k, v in load_file(weights).items() if not k.startswith("cls.")}
    tensors["classifier.weight"] = np.zeros((3, 128), np.float32)
    tensors["classifier.bias"] = np.zeros(3, np.float32)
    save_file(tensors, weights, metadata={"format": "pt"})
    cfg = json.loads((tmp_path / "clf" / "config.json").read_text())
    cfg.update(architectures=["BertForSequenceClassification"],
               id2label={"0": "a", "1": "b", "2": "c"}, label2id={"a": 0, "b": 1, "c": 2})
    (tmp_path / "clf" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(hf.CheckpointError, match=(
            r"clf/config\.json names a BertForSequenceClassification \(a task model\); this "
            r"export writes a BertForPreTraining, which would drop its trained task head "
            r"\(classifier\.bias, classifier\.weight\) and its 3 labels \(id2label\)")):
        hf_export.export_from_hf(tmp_path / "clf", tmp_path / "out")
    # The same weights under a config.json that does not say so: the weights tell.
    cfg["architectures"] = ["BertForPreTraining"]
    (tmp_path / "clf" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(hf.CheckpointError, match=r"clf: its weights hold a trained head that "
                                                 r"BertForPreTraining does not have "
                                                 r"\(classifier\.bias, classifier\.weight\); "
                                                 r"this export would drop it and its 3 labels"):
        hf_export.export_from_hf(tmp_path / "clf", tmp_path / "out")
    work = tmp_path / "work"
    (work / "checkpoints").mkdir(parents=True)
    (work / "run.json").write_text("{}")
    (work / "config.json").write_text('{"dp": {}}')
    message = f"{work} is a dpbert training workdir; its model is {work}/hf"
    with pytest.raises(hf.CheckpointError, match=re.escape(message)):
        hf_export.export_from_hf(work, tmp_path / "out")
    with pytest.raises(hf.CheckpointError, match=re.escape(message)):
        hf.read_bert_config_json(work)   # finetune, analyze_dchi, load_pretrained
    assert not (tmp_path / "out").exists()
