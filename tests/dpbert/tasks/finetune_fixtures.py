"""A tiny BERT checkpoint and toy data for end-to-end fine-tuning tests (seconds, not minutes).

`tiny_checkpoint(folder)` writes a Hugging Face BERT folder (1 layer, hidden 32, a 40-token
uncased vocabulary, unit-scale word embeddings so that dχ's η acts as on a real model);
`sentiment_tsvs(folder)` writes a toy sentiment task whose label is the majority of its
sentiment words; `ner_conll(folder)` writes toy CoNLL documents.
"""

from __future__ import annotations

import pathlib

import jax.numpy as jnp
import numpy as np

SPECIALS = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
POSITIVE = ["good", "great", "fun", "lovely", "superb", "moving"]
NEGATIVE = ["bad", "awful", "boring", "dull", "poor", "messy"]
NEUTRAL = ["the", "a", "movie", "film", "plot", "was", "is", "and", "it", "this", "story",
           "actor", "very", "quite", "with", "drug", "aspirin", "pain", "fever", "test", "x"]
VOCAB = SPECIALS + POSITIVE + NEGATIVE + NEUTRAL + ["##s", "##ly", "."]


def tiny_checkpoint(folder: pathlib.Path, *, seed: int = 0, hidden: int = 32,
                    layers: int = 1) -> pathlib.Path:
    from dpbert.models import hf_export
    from dpbert.models import bert as model_lib

    folder = pathlib.Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    vocab = folder.parent / f"{folder.name}.vocab_src.txt"  # the export refuses a non-HF folder
    vocab.write_text("\n".join(VOCAB) + "\n")
    config = model_lib.BertConfig(
        vocab_size=len(VOCAB), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
        intermediate_size=2 * hidden, max_position_embeddings=64)
    model = model_lib.create_model(config, seed=seed)
    table = np.random.default_rng(seed).normal(size=(len(VOCAB), hidden)).astype(np.float32)
    model.bert.embeddings.word_embeddings.embedding.set_value(jnp.asarray(table))
    hf_export.save_pretrained(model, folder, vocab)
    vocab.unlink()
    return folder


def _sentences(n: int, seed: int) -> list[tuple[int, str]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        label = int(rng.integers(0, 2))
        k = int(rng.integers(2, 5))
        major = POSITIVE if label else NEGATIVE
        minor = NEGATIVE if label else POSITIVE
        words = list(rng.choice(major, k)) + list(rng.choice(minor, k // 2)) + \
            list(rng.choice(NEUTRAL, int(rng.integers(2, 7))))
        rng.shuffle(words)
        out.append((label, " ".join(words)))
    return out


def sentiment_tsvs(folder: pathlib.Path, n_train: int = 256, n_eval: int = 64
                   ) -> tuple[pathlib.Path, pathlib.Path]:
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, n, seed in (("train", n_train, 1), ("eval", n_eval, 2)):
        path = folder / f"{name}.tsv"
        path.write_text("label\tsentence\n" + "".join(f"{y}\t{s}\n" for y, s in
                                                      _sentences(n, seed)))
        paths.append(path)
    return paths[0], paths[1]


def _toy_sentence(rng) -> tuple[list[str], list[str]]:
    """Words and BIO tags: aspirin = treatment, pain / fever = problem, "test x" = test, the
    rest O (with a little context so that position alone does not decide)."""
    words, tags = [], []
    for _ in range(int(rng.integers(2, 5))):
        kind = int(rng.integers(0, 4))
        if kind == 0:
            words += ["aspirin"]
            tags += ["B-treatment"]
        elif kind == 1:
            words += [str(rng.choice(["pain", "fever"]))]
            tags += ["B-problem"]
        elif kind == 2:
            words += ["test", "x"]
            tags += ["B-test", "I-test"]
        filler = list(rng.choice(NEUTRAL[:12], int(rng.integers(1, 3))))
        words += filler
        tags += ["O"] * len(filler)
    return words + ["."], tags + ["O"]


def ner_conll(path: pathlib.Path, num_docs: int, *, seed: int = 0,
              sentences_per_doc: tuple[int, int] = (2, 6)) -> pathlib.Path:
    from data_pipelines import ner

    rng = np.random.default_rng(seed)
    docs = []
    for d in range(num_docs):
        sents = [ner.Sentence(*map(tuple, _toy_sentence(rng)))
                 for _ in range(int(rng.integers(*sentences_per_doc)))]
        docs.append(ner.Document(f"doc{d}", tuple(sents)))
    ner.write_conll(path, docs)
    return pathlib.Path(path)
