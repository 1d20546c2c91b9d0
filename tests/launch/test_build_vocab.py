"""End-to-end tests of launch/build_vocab.py (the issue 5 acceptance scenario)."""

import json
import os
import pathlib
import subprocess
import sys

from tests.data_pipelines.test_dp_vocab import PLANTED, SECRET, _synthetic_corpus

REPO = pathlib.Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, str(REPO / "launch" / "build_vocab.py"), *args],
                          capture_output=True, text=True, env=env, timeout=300, check=False)


def test_cli_secret_below_threshold_absent(tmp_path):
    from transformers import BertTokenizerFast

    corpus = _synthetic_corpus(tmp_path / "corpus.txt.gz")
    out = tmp_path / "vocab"
    proc = _run(f"--input={corpus}", "--format=text", "--vocab_size=1500", "--epsilon=8",
                "--delta=1e-6", "--max_words_per_example=64", f"--out={out}",
                "--num_workers=2")
    assert proc.returncode == 0, proc.stderr
    tokens = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert len(tokens) == 1500 and SECRET not in tokens and PLANTED in tokens
    report = json.loads((out / "vocab_privacy.json").read_text())
    assert (report["epsilon"], report["delta"], report["K"]) == (8.0, 1e-6, 64)
    assert report["dp"] is True and "seeded from 128 bits of OS entropy" in report["noise_rng"]
    tok = BertTokenizerFast(vocab=str(out / "vocab.txt"))
    assert tok.unk_token not in tok.tokenize("Brand-new wörds, never seen: 42°C!")


def test_cli_errors_are_one_line(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b c\n\nd e f\n")
    proc = _run(f"--input={corpus}", "--vocab_size=2000", "--epsilon=1", "--delta=3",
                f"--out={tmp_path / 'o'}")
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last == "build_vocab: error: delta must be in (0, 1), got 3.0"
    assert not (tmp_path / "o").exists()
    proc = _run(f"--input={tmp_path / 'nope.csv'}", "--format=noteevents",
                "--vocab_size=2000", "--epsilon=1", "--delta=1e-6", f"--out={tmp_path / 'o'}")
    assert proc.returncode == 2 and "nope.csv" in proc.stderr
    proc = _run(f"--input={corpus}", "--vocab_size=2000", f"--out={tmp_path / 'o'}")
    assert proc.returncode != 0 and "--epsilon and --delta are required" in proc.stderr
