r"""What an eavesdropper recovers from TextHide representations (RSS, abs-RSS, RepRecon).

    PYTHONPATH=. python benchmarks/texthide_rss.py [--dataset=rt] [--queries=1000]
        [--recon_queries=500] [--recon_epochs=20] [--cache_dir=...] [--update_md]

TextHide paper §4.2 / App. C (FINETUNE_SPEC §2.5) on a FROZEN encoder: representations are
MiniLM-L6 pooled outputs of the train ∪ dev sentences (no fine-tuning yet; the paper indexes a
fine-tuned baseline model and queries the TextHide model's representations — that comparison
needs the fine-tuning loop). Each scheme hides the whole corpus batch by batch (batch 32, a
fresh secret key per batch, as in training; the representation of sentence x is the row whose
slot 1 is x). Schemes: baseline (m, k) = (0, 1); mask only (256, 1) — TextHide's INFERENCE
path; mix-only (0, 4); TextHide intra (256, 4); m = ∞ (∞, 4). Attacks:
* RSS: nearest baseline representation by cosine, `--queries` random corpus sentences;
* abs-RSS: the same on coordinate-wise absolute values, which sign masks do not change
  (|σ ∘ e| = |e|) — an attacker needs no mask to use it;
* RepRecon: MLP (1024, 1024), L2, 20 epochs, trained on the train part's (hidden, baseline)
  pairs, then RSS for `--recon_queries` dev sentences against the whole corpus.
Metrics: Identity / Jaccard / TF-IDF cosine / Label / MiniLM sentence cosine; Rand = a uniformly
random corpus sentence. Seeded randomness: a benchmark, not a private release.

With --baseline_run=W0 --texthide_run=W1 (two `launch/finetune.py` workdirs on this dataset: mode
none, and mode texthide) the attack runs on FINE-TUNED encoders, the paper's setting (Tab. 3):
the index holds the baseline model's pooled representations of the corpus, the baseline row
queries with the same model's representations, and the hiding schemes query with the TextHide
model's representations, mixed and masked. A second index, the TextHide model's own clean
representations, is the attacker who holds the fine-tuned model. Section: "## TextHide attacks
on fine-tuned encoders" (RSS and abs-RSS; no RepRecon).
"""

from __future__ import annotations

import os
import pathlib
import platform
import tempfile
import time

import bench_report  # benchmarks/bench_report.py
import sentiment_data
from absl import app, flags

_DATASET = flags.DEFINE_string("dataset", "rt", "Sentiment set.")
_QUERIES = flags.DEFINE_integer("queries", 1000, "RSS queries.")
_RECON_QUERIES = flags.DEFINE_integer("recon_queries", 500, "RepRecon dev queries.")
_RECON_EPOCHS = flags.DEFINE_integer("recon_epochs", 20, "RepRecon training epochs.")
_BATCH = flags.DEFINE_integer("batch", 32, "Batch size of the hiding (mixing happens within it).")
_CACHE = flags.DEFINE_string("cache_dir", os.path.join(tempfile.gettempdir(), "dpbert_ome_cache"),
                             "Feature cache (shared with ome_sentiment.py).")
_UPDATE_MD = flags.DEFINE_bool("update_md", False, "Rewrite the BENCHMARKS.md section.")
_BASELINE_RUN = flags.DEFINE_string("baseline_run", "", "finetune workdir of mode none (fine-"
                                    "tuned attack; with --texthide_run)")
_TEXTHIDE_RUN = flags.DEFINE_string("texthide_run", "", "finetune workdir of mode texthide")

SECTION = "## TextHide representation attacks"
FINETUNED_SECTION = "## TextHide attacks on fine-tuned encoders"
SCHEMES = (("baseline", 0, 1), ("mask only (inference path)", 256, 1), ("mix-only", 0, 4),
           ("TextHide intra", 256, 4), ("m = ∞", -1, 4))


def finetuned_encoder(workdir: pathlib.Path):
    """(BERT encoder, tokenizer) of a `launch/finetune.py` run: its HF export (mode none) or
    the encoder part of texthide_model.safetensors (mode texthide)."""
    import json

    import jax.numpy as jnp
    from flax import nnx
    from safetensors.numpy import load_file

    from data_pipelines import tokenization
    from dpbert.models import hf

    export = workdir / "hf"
    texthide_file = export / "texthide_model.safetensors"
    if texthide_file.is_file():
        base = json.loads((export / "texthide_config.json").read_text())["init_from_hf"]
        model, _ = hf.load_pretrained(base)
        tensors = load_file(texthide_file)
        graphdef, state = nnx.split(model.bert)
        flat = dict(nnx.to_flat_state(state))
        for path, var in flat.items():
            key = "bert/" + "/".join(str(p) for p in path)
            if key not in tensors:
                raise KeyError(f"{texthide_file}: no tensor {key!r}")
            var.value = jnp.asarray(tensors[key])
        model.bert = nnx.merge(graphdef, nnx.from_flat_state(flat))
        vocab = pathlib.Path(base) / "vocab.txt"
    else:
        model, _ = hf.load_pretrained(export)
        vocab = export / "vocab.txt"
    return model, tokenization.WordPieceTokenizer(vocab, do_lower_case=True)


def finetuned_main(t0):
    import jax
    import numpy as np

    from dpbert.privacy import attacks
    from dpbert.models import features as feats

    cache = pathlib.Path(_CACHE.value)
    cache.mkdir(parents=True, exist_ok=True)
    texts, labels, sentence = [], [], []
    for split in ("train", "dev"):
        f = sentiment_data.features(_DATASET.value, split, cache)
        texts += f["texts"]
        labels.append(f["labels"])
        sentence.append(f["minilm_mean"])
    labels = np.concatenate(labels)
    corpus = attacks.Corpus(texts, labels, np.concatenate(sentence))
    reps = {}
    for name, run in (("baseline", _BASELINE_RUN.value), ("texthide", _TEXTHIDE_RUN.value)):
        model, tok = finetuned_encoder(pathlib.Path(run))
        reps[name] = feats.encode_texts(model, tok, texts, pooling="pooled", max_len=64)
        print(f"encoded {len(texts)} sentences with the {name} model ({run}): "
              f"{time.time() - t0:.0f} s", flush=True)
    rng = np.random.default_rng(0)
    q = rng.choice(len(texts), size=_QUERIES.value, replace=False)
    rows = [("Rand", attacks.random_baseline(np.random.default_rng(1), corpus, q), None, None)]
    for name, m, k in SCHEMES:
        source = "baseline" if (m, k) == (0, 1) else "texthide"
        hidden = attacks.hide_corpus(reps[source], labels, m, k, _BATCH.value, seed=17)[q]
        paper = attacks.rss(corpus, reps["baseline"], q, hidden)
        own = attacks.rss(corpus, reps[source], q, hidden)
        own_abs = attacks.abs_rss(corpus, reps[source], q, hidden)
        rows.append((f"{name} (m={'∞' if m < 0 else m}, k={k})", paper, own, own_abs))
        print(name, paper["identity"], own["identity"], own_abs["identity"], flush=True)
    fmt = lambda r: " | ".join(f"{r[k]:.3f}" for k in attacks.METRICS)
    lines = [
        FINETUNED_SECTION, "",
        f"`PYTHONPATH=. python benchmarks/texthide_rss.py --dataset={_DATASET.value} "
        f"--baseline_run=W0 --texthide_run=W1` on {platform.machine()}, {os.cpu_count()} CPU "
        f"cores, JAX {jax.__version__}; load average {os.getloadavg()[0]:.1f} at the end; "
        f"{time.time() - t0:.0f} s. W0 / W1: `launch/finetune.py` runs of MiniLM-L6 on "
        f"{_DATASET.value} (mode none / mode texthide intra (256, 4) with the MLP head; seed 0 "
        "of `benchmarks/qu_finetune.py`). Pooled representations of the train ∪ dev sentences "
        f"({len(texts)}), hidden in shuffled batches of {_BATCH.value} (`dpbert.privacy.texthide.encrypt`, "
        "a fresh seeded pool: the eavesdropper does not know the run's masks). Paper index "
        "(Tab. 3): the baseline model's representations; the baseline row queries with them, "
        "the other rows with the TextHide model's hidden representations. Own index: the clean "
        "representations of the model that produced the query (an attacker who holds the "
        f"fine-tuned model). {len(q)} random corpus queries. Metrics: identity, Jaccard of word "
        "sets, TF-IDF cosine, label match, MiniLM mean-pool sentence cosine.", "",
        "| scheme | paper RSS identity | Jaccard | TF-IDF | label | sentence cos | "
        "own-index RSS identity | own-index abs-RSS identity |",
        "|---|---|---|---|---|---|---|---|"]
    for name, paper, own, own_abs in rows:
        if own is None:
            lines.append(f"| {name} | {fmt(paper)} | {paper['identity']:.3f} | "
                         f"{paper['identity']:.3f} |")
        else:
            lines.append(f"| {name} | {fmt(paper)} | {own['identity']:.3f} | "
                         f"{own_abs['identity']:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if _UPDATE_MD.value:
        bench_report.write_section(FINETUNED_SECTION, text)


def main(argv):
    del argv
    if bool(_BASELINE_RUN.value) != bool(_TEXTHIDE_RUN.value):
        raise app.UsageError("--baseline_run and --texthide_run go together")
    if _BASELINE_RUN.value:
        return finetuned_main(time.time())
    import jax
    import numpy as np

    from dpbert.privacy import attacks

    t0 = time.time()
    cache = pathlib.Path(_CACHE.value)
    cache.mkdir(parents=True, exist_ok=True)
    tr = sentiment_data.features(_DATASET.value, "train", cache)
    dv = sentiment_data.features(_DATASET.value, "dev", cache)
    n_tr = len(tr["texts"])
    texts = tr["texts"] + dv["texts"]
    labels = np.concatenate([tr["labels"], dv["labels"]])
    e = np.concatenate([tr["minilm"], dv["minilm"]]).astype(np.float32)
    corpus = attacks.Corpus(texts, labels, np.concatenate([tr["minilm_mean"], dv["minilm_mean"]]))
    rng = np.random.default_rng(0)
    q = rng.choice(len(texts), size=_QUERIES.value, replace=False)
    q_dev = n_tr + rng.choice(len(dv["texts"]), size=min(_RECON_QUERIES.value, len(dv["texts"])),
                              replace=False)
    rows = [("Rand", attacks.random_baseline(np.random.default_rng(1), corpus, q), None, None)]
    for name, m, k in SCHEMES:
        hidden = attacks.hide_corpus(e, labels, m, k, _BATCH.value, seed=17)
        plain = attacks.rss(corpus, e, q, hidden[q])
        absolute = attacks.abs_rss(corpus, e, q, hidden[q])
        f = attacks.train_reprecon(jax.random.key(3), hidden[:n_tr], e[:n_tr],
                                   epochs=_RECON_EPOCHS.value)
        recon = attacks.rss(corpus, e, q_dev, f(hidden[q_dev]))
        rows.append((f"{name} (m={'∞' if m < 0 else m}, k={k})", plain, absolute, recon))
        print(name, plain, absolute["identity"], recon, f"{time.time() - t0:.0f} s", flush=True)
    recon_rand = attacks.random_baseline(np.random.default_rng(2), corpus, q_dev)

    fmt = lambda r: " | ".join(f"{r[k]:.3f}" for k in attacks.METRICS)
    lines = [
        SECTION, "",
        f"`PYTHONPATH=. python benchmarks/texthide_rss.py --dataset={_DATASET.value}` on "
        f"{platform.machine()}, {os.cpu_count()} CPU cores, JAX {jax.__version__}; load average "
        f"{os.getloadavg()[0]:.1f} at the end; {time.time() - t0:.0f} s. FROZEN MiniLM-L6 pooled "
        f"outputs of the {_DATASET.value} train ∪ dev sentences ({len(texts)}); each scheme hides "
        f"the corpus in shuffled batches of {_BATCH.value} (`dpbert.privacy.texthide.encrypt`, intra). "
        f"The index holds the clean representations. RSS: {len(q)} random corpus queries, "
        f"nearest by cosine; abs-RSS: the same on absolute values (sign masks do not change "
        f"them); RepRecon: MLP (1024, 1024), L2, Adam 1e-3, {_RECON_EPOCHS.value} epochs on the "
        f"train part, then RSS for {len(q_dev)} dev queries. Metrics: identity, Jaccard of word "
        f"sets, TF-IDF cosine, label match, MiniLM mean-pool sentence cosine. Without "
        f"fine-tuning, so not yet the paper's setting (FINETUNE_SPEC §2.5). Seeded randomness: a "
        f"benchmark, not a private release.", "",
        "| scheme | RSS identity | RSS Jaccard | RSS TF-IDF | RSS label | RSS sentence cos | "
        "abs-RSS identity | RepRecon identity | RepRecon label | RepRecon sentence cos |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for name, plain, absolute, recon in rows:
        if absolute is None:
            lines.append(f"| {name} | {fmt(plain)} | {plain['identity']:.3f} | "
                         f"{recon_rand['identity']:.3f} | {recon_rand['label']:.3f} | "
                         f"{recon_rand['sentence_cosine']:.3f} |")
        else:
            lines.append(f"| {name} | {fmt(plain)} | {absolute['identity']:.3f} | "
                         f"{recon['identity']:.3f} | {recon['label']:.3f} | "
                         f"{recon['sentence_cosine']:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if _UPDATE_MD.value:
        bench_report.write_section(SECTION, text)


if __name__ == "__main__":
    app.run(main)
