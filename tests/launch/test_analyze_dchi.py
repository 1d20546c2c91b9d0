"""launch/analyze_dchi.py and dpbert/privacy/dchi_analysis.py: CLI smoke test on a tiny fake HF folder,
helpers, bad input."""

import gzip
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

from dpbert.privacy import dchi_analysis as lib

REPO = pathlib.Path(__file__).resolve().parents[2]
SPECIALS = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [f"word{i}" for i in range(60)]
DIM = 16




@pytest.fixture(scope="module")
def fake_hf(tmp_path_factory):
    """A HF BERT folder with only what the analysis reads, plus a gzipped corpus."""
    folder = tmp_path_factory.mktemp("fake_bert")
    vocab = SPECIALS + WORDS
    table = np.random.default_rng(0).normal(size=(len(vocab), DIM)).astype(np.float32)
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "bert", "vocab_size": len(vocab), "hidden_size": DIM}))
    save_file({"embeddings.word_embeddings.weight": table}, str(folder / "model.safetensors"))
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    rng = np.random.default_rng(1)
    corpus = folder / "corpus.txt.gz"
    with gzip.open(corpus, "wt") as f:
        for _ in range(200):
            f.write(" ".join(rng.choice(WORDS, 8)).upper() + "\n\n")
    return folder, corpus, table


def test_cli_smoke(fake_hf, tmp_path):
    folder, corpus, _ = fake_hf
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO), XLA_FLAGS="", JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "launch/analyze_dchi.py", f"--embeddings={folder}", "--eta=2,50",
         f"--corpus={corpus}", f"--out={out}", "--samples_per_token=50",
         "--max_tokens=1000", "--chunk_size=16", "--queries_per_call=1024"],
        capture_output=True, text=True, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "wrote" in proc.stdout
    # No --vocab_sample on a CPU: a sample of 200 (here all 60 tokens), said on the console and
    # in results.json, with how to get the full analysis.
    assert "note: on a CPU, N_w/S_w use a seeded sample of 200" in proc.stdout
    assert "--vocab_sample=0 runs the full analysis" in proc.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["notes"][0].startswith("on a CPU")
    assert results["embedding_dim"] == DIM and results["num_regular_tokens"] == len(WORDS)
    assert results["settings"]["vocab_tokens_for_N_w_S_w"] == len(WORDS)
    assert results["settings"]["corpus_tokens"] == 1000
    low, high = results["per_eta"]
    for r in (low, high):
        assert r["expected_noise_norm"] == pytest.approx(DIM / r["eta"])
        # 60 draws of Gamma(16): 4 standard errors of the mean is 13 %.
        assert abs(r["noise_norm_relative_error"]) < 4 / np.sqrt(DIM * len(WORDS))
        assert 0 <= r["N_w"]["min"] <= r["N_w"]["max"] <= 50
        assert 1 <= r["S_w"]["min"] <= r["S_w"]["max"] <= 50
        assert sum(r["N_w_histogram"]) == len(WORDS)
    assert high["inversion_accuracy"] > 0.9 > low["inversion_accuracy"]
    assert high["N_w"]["mean"] > low["N_w"]["mean"]
    knn = list(results["knn_mean_distance"].values())
    assert list(results["knn_mean_distance"])[-1] == "|V|" and knn == sorted(knn)
    for name in ("geometry.png", "plausible_deniability.png", "inversion.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_vocab_sample_defaults_to_a_sample_on_cpu():
    """The full N_w/S_w analysis is ~118 M queries (~10 h on 2 cores) for 6 η: not a default."""
    n, note = lib.resolve_vocab_sample(None, "cpu")
    assert n == lib.CPU_VOCAB_SAMPLE == 200 and "--vocab_sample=0" in note
    assert lib.resolve_vocab_sample(None, "gpu") == (0, None)
    assert lib.resolve_vocab_sample(0, "cpu") == (0, None)
    assert lib.resolve_vocab_sample(50, "cpu") == (50, None)
    assert lib.estimated_queries(29_523, 1000, 100_000, 4) == 118_492_000


def test_knn_mean_distances_brute_force():
    rng = np.random.default_rng(2)
    table = rng.normal(size=(30, 4)).astype(np.float32)
    regular = np.arange(3, 30)
    queries = np.array([3, 10, 29])
    got = lib.knn_mean_distances(table, regular, queries, (1, 5, 100, None), block=2)
    d = np.linalg.norm(table[queries, None].astype(np.float64) - table[None, regular], axis=-1)
    d = np.sort(d, axis=1)[:, 1:]                          # drop the token itself
    assert got["1"] == pytest.approx(d[:, 0].mean(), rel=1e-9)
    assert got["5"] == pytest.approx(d[:, 4].mean(), rel=1e-9)
    assert got["100"] == got["|V|"] == pytest.approx(d[:, -1].mean(), rel=1e-9)


def test_read_corpus_lines(tmp_path):
    tsv = tmp_path / "x.tsv"
    tsv.write_text("1\tgood film\n0\tbad one\n\n")
    assert lib.read_corpus_lines(tsv) == ["good film", "bad one"]
    with pytest.raises(lib.AnalysisError, match=r"--corpus: .*absent.txt does not exist"):
        lib.read_corpus_lines(tmp_path / "absent.txt")
    (tmp_path / "binary.txt").write_bytes(b"ok line\n\xcd\xff private?\n")
    with pytest.raises(lib.AnalysisError, match=r"binary.txt is not UTF-8 text$"):
        lib.read_corpus_lines(tmp_path / "binary.txt")
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(lib.AnalysisError, match="has no text"):
        lib.read_corpus_lines(tmp_path / "empty.txt")


def test_bad_input_is_one_clear_error(fake_hf, tmp_path):
    folder, corpus, _ = fake_hf
    with pytest.raises(lib.AnalysisError, match=r"--eta: 'x' is not a number"):
        lib.parse_etas(["50", "x"])
    with pytest.raises(lib.AnalysisError, match=r"--eta: '-3' must be"):
        lib.parse_etas(["-3"])
    # Issue 35: --eta=1e-40 reported "mean|N| inf, inversion 0.0000" as measured results;
    # training's bound (config_checks.MIN_ETA) applies.
    with pytest.raises(lib.AnalysisError, match=r"--eta: '1e-40' is below 1e-06, the smallest "
                                                r"η training accepts"):
        lib.parse_etas(["50", "1e-40"])
    assert lib.parse_etas(["1e-6"]) == [1e-6]
    with pytest.raises(lib.AnalysisError, match=r"--embeddings: .*not a directory"):
        lib.run_analysis(str(tmp_path / "nope"), [50.0], str(corpus), str(tmp_path / "o"))
    with pytest.raises(lib.AnalysisError, match="--samples_per_token must be >= 1"):
        lib.run_analysis(str(folder), [50.0], str(corpus), str(tmp_path / "o"),
                         samples_per_token=0)
    with pytest.raises(lib.AnalysisError, match="--corpus: .*missing.txt does not exist"):
        lib.run_analysis(str(folder), [50.0], str(tmp_path / "missing.txt"), str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()   # nothing written before the inputs are checked
