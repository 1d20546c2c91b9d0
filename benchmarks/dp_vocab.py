r"""Benchmark: DP WordPiece vocabulary build vs. the non-private tokenizers trainer.

On ``../shared/data/corpus/web_bible.txt.gz`` (2,438 documents, ~0.93 M words):

1. wall time of :func:`data_pipelines.dp_vocab.build_vocab` (calibration, streaming
   count with contribution bounding, noise + threshold, WordPiece learning) against
   ``tokenizers``' ``WordPieceTrainer`` trained non-privately on the same documents
   with the same normaliser, pre-tokenizer and vocabulary size; runs are interleaved
   and repeated and the ratio is taken per pair, so machine load affects both sides;
2. surviving words at several epsilon (K=64, delta=1e-6), for both accountings;
3. utility on held-out documents (train on the first 2,000, test on the other 438):
   [UNK] rate and WordPiece tokens per word, DP vs. non-private.

  PYTHONPATH=. python benchmarks/dp_vocab.py [--repeats=3] [--write]

``--write`` replaces the ``## DP vocabulary`` section of BENCHMARKS.md.
"""

import gzip
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

import bench_report  # benchmarks/bench_report.py (the script's folder is on sys.path)

from data_pipelines import corpora, dp_vocab

_REPEATS = flags.DEFINE_integer("repeats", 3, "Interleaved timing repetitions.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 8000, "Vocabulary size for both builders.")
_WORKERS = flags.DEFINE_integer("num_workers", 2, "Counting processes of the DP build.")
_WRITE = flags.DEFINE_boolean("write", False, "Update the section in BENCHMARKS.md.")

REPO = pathlib.Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "data" / "corpus" / "web_bible.txt.gz"
SECTION = "## DP vocabulary"
EPSILONS = (1.0, 2.0, 4.0, 8.0, 16.0)
K, DELTA = 64, 1e-6


def _hf_wordpiece(path: pathlib.Path, vocab_size: int):
    """Non-private baseline: tokenizers' WordPieceTrainer on the raw documents."""
    from tokenizers import Tokenizer, models, trainers

    splitter = dp_vocab.WordSplitter(True)
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = splitter.normalizer
    tok.pre_tokenizer = splitter.pre_tokenizer
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        show_progress=False)
    tok.train_from_iterator(("\n".join(d) for d in corpora.read_text_documents(path)),
                            trainer=trainer)
    return tok


def _time_pair(tmp: pathlib.Path, i: int) -> tuple[float, float, dict]:
    """One DP build and one baseline build, back to back."""
    dp_vocab.calibrate_histogram.cache_clear()  # the DP side pays its calibration
    t0 = time.perf_counter()
    res = dp_vocab.build_vocab(CORPUS, "text", _VOCAB_SIZE.value, 8.0, DELTA, K,
                               tmp / f"dp{i}", seed=i, num_workers=_WORKERS.value,
                               progress=False)
    t_dp = time.perf_counter() - t0
    t0 = time.perf_counter()
    _hf_wordpiece(CORPUS, _VOCAB_SIZE.value)
    t_hf = time.perf_counter() - t0
    return t_dp, t_hf, res.report


def _survivors() -> list[tuple[float, int, int, float, float]]:
    """(epsilon, survivors pld, survivors basic, tau pld, tau basic) at K=64."""
    hist, _ = dp_vocab.word_histogram(dp_vocab.iter_examples(CORPUS, "text"), K, entropy=0)
    rows = []
    for eps in EPSILONS:
        row = [eps]
        taus = []
        for mode in ("pld", "basic"):
            p = dp_vocab.calibrate_histogram(eps, DELTA, K, mode)
            out = dp_vocab.noisy_threshold(hist, p.noise_scale, p.threshold,
                                           np.random.default_rng(0))
            row.append(len(out))
            taus.append(p.threshold)
        rows.append((row[0], row[1], row[2], taus[0], taus[1]))
    return rows


def _utility(tmp: pathlib.Path) -> list[tuple[str, int, float, float]]:
    """(name, surviving words, [UNK] %, tokens per word) on held-out documents."""
    from transformers import BertTokenizerFast

    docs = list(corpora.read_text_documents(CORPUS))
    train, test = docs[:2000], docs[2000:]
    path = tmp / "train.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(d) for d in train) + "\n")
    splitter = dp_vocab.WordSplitter(True)
    texts = ["\n".join(d) for d in test]
    num_words = sum(len(splitter(t)) for t in texts)
    rows = []
    for name, kwargs in (("DP eps=8 (pld)", dict(dp=True, accounting="pld")),
                         ("DP eps=8 (basic)", dict(dp=True, accounting="basic")),
                         ("non-private", dict(dp=False))):
        res = dp_vocab.build_vocab(path, "text", _VOCAB_SIZE.value, 8.0, DELTA, K,
                                   tmp / f"u_{len(rows)}", seed=0, progress=False, **kwargs)
        tok = BertTokenizerFast(vocab=str(res.vocab_path))
        ids = [i for t in texts for i in tok(t, add_special_tokens=False)["input_ids"]]
        unk = 100.0 * sum(i == tok.unk_token_id for i in ids) / len(ids)
        rows.append((name, res.report["num_surviving_words"], unk, len(ids) / num_words))
    return rows


def main(argv: list[str]) -> None:
    del argv
    if not CORPUS.is_file():
        sys.exit(f"benchmark needs {CORPUS} (the shared real data beside the checkout)")
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        pairs = [_time_pair(tmp, i) for i in range(_REPEATS.value)]
        survivors = _survivors()
        utility = _utility(tmp)
    t_dp = statistics.median(p[0] for p in pairs)
    t_hf = statistics.median(p[1] for p in pairs)
    ratio = statistics.median(p[0] / p[1] for p in pairs)
    sec = pairs[-1][2]["seconds"]
    machine = (f"{platform.machine()}, {os.cpu_count()} CPU cores, Python "
               f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f} at the end")
    lines = [
        SECTION, "",
        f"`PYTHONPATH=. python benchmarks/dp_vocab.py` on `web_bible.txt.gz` (2,438 documents, "
        f"~0.93 M words), vocab_size={_VOCAB_SIZE.value}, {machine}. "
        f"Median of {_REPEATS.value} interleaved pairs.", "",
        "| builder | seconds | ratio |", "|---|---|---|",
        f"| DP build (eps=8, delta=1e-6, K=64, pld, {_WORKERS.value} workers) | "
        f"{t_dp:.2f} | {ratio:.2f}x |",
        f"| tokenizers WordPieceTrainer, non-private | {t_hf:.2f} | 1.00x |", "",
        f"DP build breakdown (last run): calibration {sec['calibrate']:.2f} s, streaming "
        f"count {sec['count']:.2f} s, WordPiece {sec['wordpiece']:.2f} s.", "",
        f"Surviving words (K={K}, delta=1e-6; {pairs[-1][2]['num_distinct_words']} distinct "
        "words after bounding; one noise draw):", "",
        "| epsilon | survivors (pld) | threshold (pld) | survivors (basic) | threshold (basic) |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {e:g} | {sp} | {tp:.0f} | {sb} | {tb:.0f} |"
              for e, sp, sb, tp, tb in survivors]
    lines += ["", "Held-out utility (vocab from the first 2,000 documents, measured on the "
              "other 438):", "", "| vocabulary | surviving words | [UNK] % | tokens per word |",
              "|---|---|---|---|"]
    lines += [f"| {n} | {s} | {u:.3f} | {f:.3f} |" for n, s, u, f in utility]
    text = "\n".join(lines) + "\n"
    print(text)
    if _WRITE.value:
        bench_report.write_section(SECTION, text)



if __name__ == "__main__":
    app.run(main)
