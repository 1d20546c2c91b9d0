"""Tests for data_pipelines.dp_vocab: calibration, bounding, noise, WordPiece, builds."""

import collections
import gzip
import json
import math
import os
import pathlib

import numpy as np
import pytest
from scipy import stats as sps

from data_pipelines import corpora, dp_vocab, wordpiece

SECRET = "zqxvorbleth"      # planted in a few examples: must never reach vocab.txt
PLANTED = "kromblewide"     # planted in many examples: must reach vocab.txt


def _synthetic_corpus(path: pathlib.Path, num_docs: int = 600, secret_docs: int = 3,
                      planted_docs: int = 400, seed: int = 0) -> pathlib.Path:
    """A text corpus of made-up Zipf-distributed words, with SECRET and PLANTED inside.

    Documents have ~30 word tokens (< 64 distinct), so with K=64 the bounded count of a
    word is exactly the number of documents that contain it.
    """
    rng = np.random.default_rng(seed)
    syllables = ["ka", "lo", "mi", "ne", "tu", "ra", "si", "po", "de", "gu", "ba", "fe"]
    lexicon = ["".join(rng.choice(syllables, size=rng.integers(1, 4)))
               for _ in range(400)]
    probs = 1.0 / np.arange(1, len(lexicon) + 1)
    probs /= probs.sum()
    lines = []
    for d in range(num_docs):
        for _ in range(3):
            words = list(rng.choice(lexicon, size=10, p=probs))
            if d < secret_docs:
                words.append(SECRET)
            if d >= num_docs - planted_docs:
                words.append(PLANTED)
            lines.append(" ".join(words).capitalize() + ".")
        lines.append("")
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def synthetic_corpus(tmp_path_factory):
    return _synthetic_corpus(tmp_path_factory.mktemp("corpus") / "synthetic.txt.gz")


def _vocab_tokens(path: pathlib.Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


# --------------------------------------------------------------------------- calibration


@pytest.mark.parametrize("eps,k,delta", [(8.0, 64, 1e-6), (1.0, 16, 1e-6), (2.0, 1, 1e-5)])
def test_basic_calibration_is_hoory_formula(eps, k, delta):
    p = dp_vocab.calibrate_histogram(eps, delta, k, "basic")
    eps_w, delta_w = eps / k, delta / k
    assert p.epsilon_per_word == pytest.approx(eps_w)
    assert p.delta_per_word == pytest.approx(delta_w)
    assert p.noise_scale == pytest.approx(2.0 / eps_w)
    assert p.threshold == pytest.approx(1.0 + 2.0 * math.log(2.0 / delta_w) / eps_w)
    # Basic composition gives back the targets.
    assert k * p.epsilon_per_word == pytest.approx(eps)
    assert k * p.delta_per_word == pytest.approx(delta)


@pytest.mark.parametrize("eps,k,delta", [(8.0, 64, 1e-6), (1.0, 16, 1e-6), (4.0, 256, 1e-8),
                                         (0.5, 1, 1e-5)])
def test_pld_calibration_against_dp_accounting(eps, k, delta):
    p = dp_vocab.calibrate_histogram(eps, delta, k, "pld")
    assert p.delta_noise + p.delta_threshold == pytest.approx(delta)
    # The Laplace part, re-accounted on dp_accounting's default (finer) PLD grid.
    eps_noise = dp_vocab.laplace_composition_epsilon(p.noise_scale, k, p.delta_noise)
    assert eps_noise <= eps * (1 + 1e-3)
    if k > 1:  # tight: 3% less noise would break the target
        assert dp_vocab.laplace_composition_epsilon(0.97 * p.noise_scale, k,
                                                    p.delta_noise) > eps
    # Never more noise than basic composition of K sensitivity-1 Laplace mechanisms.
    assert p.noise_scale <= k / eps + 1e-9
    # Threshold: K new words, each released w.p. exp(-(tau-1)/b)/2, sum to delta_thr.
    p_new = 0.5 * math.exp(-(p.threshold - 1.0) / p.noise_scale)
    assert k * p_new == pytest.approx(p.delta_threshold, rel=1e-9)
    assert p.delta_per_word == pytest.approx(p_new, rel=1e-9)
    assert p.epsilon_per_word == pytest.approx(1.0 / p.noise_scale)


def test_pld_threshold_lower_than_basic():
    pld = dp_vocab.calibrate_histogram(8.0, 1e-6, 64, "pld")
    basic = dp_vocab.calibrate_histogram(8.0, 1e-6, 64, "basic")
    assert pld.threshold < 0.5 * basic.threshold


@pytest.mark.parametrize("kwargs,match", [
    (dict(epsilon=0.0), "epsilon"), (dict(epsilon=-1.0), "epsilon"),
    (dict(epsilon=float("nan")), "epsilon"), (dict(epsilon=float("inf")), "epsilon"),
    (dict(delta=0.0), "delta"), (dict(delta=1.0), "delta"), (dict(delta=-1e-6), "delta"),
    (dict(max_words_per_example=0), "max_words_per_example"),
    (dict(max_words_per_example=2.5), "max_words_per_example"),
    (dict(accounting="rdp"), "accounting"),
])
def test_bad_targets_raise(kwargs, match):
    args = dict(epsilon=8.0, delta=1e-6, max_words_per_example=64, accounting="pld")
    args.update(kwargs)
    with pytest.raises(dp_vocab.VocabError, match=match):
        dp_vocab.calibrate_histogram(**args)


def test_per_word_conditions():
    p = dp_vocab.calibrate_histogram(8.0, 1e-6, 64, "basic")  # eps'=0.125, delta'=1.6e-8
    dp_vocab.check_conditions(p, 10_000)
    with pytest.raises(dp_vocab.VocabError, match="at least 2 examples"):
        dp_vocab.check_conditions(p, 1)
    # delta >= 1/n: the same rule and words as training's accountant (the per-word
    # delta' = delta/K < delta is then below 1/n too).
    with pytest.raises(dp_vocab.VocabError,
                       match=r"vocabulary delta=1e-06 must be < 1/num_examples = 1e-08 "
                             r"\(num_examples=100000000\); a larger delta allows releasing"):
        dp_vocab.check_conditions(p, 10**8)
    big = dp_vocab.calibrate_histogram(50.0, 1e-9, 1, "basic")  # eps'=50 > ln n
    with pytest.raises(dp_vocab.VocabError, match=r"per-word epsilon .*ln n"):
        dp_vocab.check_conditions(big, 1000)


# --------------------------------------------------------------------------- bounding


def test_bound_example_brute_force():
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(200)] * 3  # 200 distinct, each 3 times
    out = dp_vocab.bound_example(words, 64, rng)
    assert len(out) == 64 and len(set(out)) == 64 and set(out) <= set(words)
    assert out == sorted(out)
    few = ["b", "a", "b", "c", "a"]
    assert dp_vocab.bound_example(few, 64, rng) == ["a", "b", "c"]  # each once
    # Same seed, same choice; other seed, other choice.
    a = dp_vocab.bound_example(words, 8, np.random.default_rng(1))
    b = dp_vocab.bound_example(list(reversed(words)), 8, np.random.default_rng(1))
    c = dp_vocab.bound_example(words, 8, np.random.default_rng(2))
    assert a == b and a != c


def test_bounding_is_uniform_not_first_k():
    """Every distinct word is kept with probability K/d, whatever its position."""
    rng = np.random.default_rng(123)
    d, k, trials = 10, 3, 20_000
    words = [f"{chr(97 + i)}" for i in range(d)]  # "a" comes first in the text
    kept = collections.Counter()
    for _ in range(trials):
        kept.update(dp_vocab.bound_example(words, k, rng))
    p = k / d
    sd = math.sqrt(trials * p * (1 - p))
    for w in words:
        assert abs(kept[w] - trials * p) < 6 * sd, (w, kept[w])
    # A "first K" rule would keep a, b, c always and j never.
    assert kept["j"] > 0.2 * trials


def test_word_histogram_brute_force():
    texts = ["Hello, World! hello", "héllo there\nthere", "", "A b c d e f"]
    splitter = dp_vocab.WordSplitter(True)
    assert splitter("Hello, World! héllo") == ["hello", ",", "world", "!", "hello"]
    raw, n = dp_vocab.word_histogram(texts, None, entropy=0)
    assert n == 4
    assert raw == {"hello": 3, ",": 1, "world": 1, "!": 1, "there": 2,
                   "a": 1, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1}
    bounded, _ = dp_vocab.word_histogram(texts, 64, entropy=0)
    assert bounded == {"hello": 2, ",": 1, "world": 1, "!": 1, "there": 1,
                       "a": 1, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1}
    two, _ = dp_vocab.word_histogram(texts, 2, entropy=0)
    assert sum(two.values()) == 2 + 2 + 0 + 2 and max(two.values()) <= 2


def test_word_histogram_independent_of_workers():
    rng = np.random.default_rng(5)
    texts = [" ".join(f"t{x}" for x in rng.integers(0, 300, size=50)) for _ in range(90)]
    one, n1 = dp_vocab.word_histogram(texts, 8, entropy=42, num_workers=1, chunk_size=16)
    two, n2 = dp_vocab.word_histogram(texts, 8, entropy=42, num_workers=2, chunk_size=16)
    other, _ = dp_vocab.word_histogram(texts, 8, entropy=43, num_workers=1, chunk_size=16)
    assert n1 == n2 == 90 and one == two and one != other
    assert sum(one.values()) == 90 * 8


# --------------------------------------------------------------------------- noise


def test_laplace_noise_scale():
    """Noisy minus true counts follow Laplace(0, b) (KS), and not Laplace(0, 1.2 b)."""
    b = 4.0
    hist = {f"w{i}": 10_000 + i % 7 for i in range(20_000)}  # far above the threshold
    out = dp_vocab.noisy_threshold(hist, b, threshold=50.0, rng=np.random.default_rng(0))
    assert len(out) == len(hist)
    noise = np.array([out[w] - hist[w] for w in sorted(hist)])
    assert sps.kstest(noise, sps.laplace(scale=b).cdf).pvalue > 1e-3
    assert sps.kstest(noise, sps.laplace(scale=1.2 * b).cdf).pvalue < 1e-8
    assert abs(noise.mean()) < 6 * b * math.sqrt(2 / len(noise))


def test_threshold_survival_probability():
    """P[c + Lap(b) >= tau] = exp(-(tau - c)/b)/2 for c <= tau (binomial, 6 sigma)."""
    b, tau, m = 3.0, 40.0, 40_000
    for c in (tau, tau - 2 * b, tau + b):
        hist = {f"w{i}": c for i in range(m)}
        kept = len(dp_vocab.noisy_threshold(hist, b, tau, np.random.default_rng(int(c))))
        p = sps.laplace(loc=c, scale=b).sf(tau)
        assert abs(kept - m * p) < 6 * math.sqrt(m * p * (1 - p)) + 1, (c, kept, m * p)
    # Zero counts are never released, whatever the noise.
    assert dp_vocab.noisy_threshold({"z": 0}, 100.0, -1e9, np.random.default_rng(0)) == {}


def test_planted_word_below_threshold_never_survives_many_seeds(synthetic_corpus):
    """SECRET (3 examples) never survives over 2000 noise draws; PLANTED always does."""
    privacy = dp_vocab.calibrate_histogram(8.0, 1e-6, 64, "pld")
    hist, n = dp_vocab.word_histogram(dp_vocab.iter_examples(synthetic_corpus, "text"),
                                      64, entropy=0)
    assert n == 600 and hist[SECRET] == 3 and hist[PLANTED] == 400
    assert hist[SECRET] < privacy.threshold < hist[PLANTED]
    secret_hits = planted_misses = 0
    for seed in range(2000):
        out = dp_vocab.noisy_threshold(hist, privacy.noise_scale, privacy.threshold,
                                       np.random.default_rng(seed))
        secret_hits += SECRET in out
        planted_misses += PLANTED not in out
    # Per draw P[secret] = exp(-(tau-3)/b)/2 ~ 1e-8: 2000 draws hit with prob ~2e-5.
    assert secret_hits == 0
    assert planted_misses == 0
    # The check can fail: with no threshold the secret is released.
    leaky = dp_vocab.noisy_threshold(hist, privacy.noise_scale, -math.inf,
                                     np.random.default_rng(0))
    assert SECRET in leaky


# --------------------------------------------------------------------------- WordPiece


def test_public_alphabet():
    initial, inside = dp_vocab.public_alphabet(True)
    assert set("abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'\"()-[]") <= set(initial)
    assert "A" not in initial and "é" not in initial  # lowercased, accents stripped
    assert {"ß", "α", "я", "“", "”", "’", "—", "°", "µ"} <= set(initial)
    assert "##a" in inside and "##7" in inside and "##°" in inside
    assert "##," not in inside and "##." not in inside  # punctuation is its own word
    assert len(set(initial)) == len(initial) and all(len(c) == 1 for c in initial)
    cased, _ = dp_vocab.public_alphabet(False)
    assert {"A", "Z", "é", "Ω"} <= set(cased)


def test_training_items_reproduce_counts():
    counts = {"alpha": 3.4, "beta": 1.2, "gamma": 10.6}
    items = list(wordpiece._training_items(counts, max_words=10**6, batch_words=5))
    got = collections.Counter(w for item in items for w in item.split())
    assert got == {"alpha": 3, "beta": 1, "gamma": 11}
    scaled = collections.Counter(
        w for item in wordpiece._training_items({"a": 1000, "b": 10, "c": 1}, 101)
        for w in item.split())
    # Scaled by 101/1011, at least 1 each.
    assert scaled == {"a": 100, "b": 1, "c": 1}


def test_learn_wordpiece_layout():
    counts = {"running": 50, "runner": 40, "jumping": 30, "jumper": 20, "the": 100}
    tokens, learned = dp_vocab.learn_wordpiece(counts, 1000, True)
    assert len(tokens) == 1000 and len(set(tokens)) == 1000
    assert tokens[0] == "[PAD]" and tokens[1] == "[unused0]" and tokens[99] == "[unused98]"
    assert tokens[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert "the" in tokens and "running" in tokens and "##ing" in tokens
    assert learned > 0 and tokens[-1].startswith("[unused")
    floor = dp_vocab.min_vocab_size()
    with pytest.raises(dp_vocab.VocabError, match="vocab_size"):
        dp_vocab.learn_wordpiece(counts, floor - 1)
    # Cased text needs a larger alphabet: the message says so (it named no reason).
    with pytest.raises(dp_vocab.VocabError, match=(
            r"vocab_size=1000 is below the 1382 tokens: the special tokens \(99 unused\) and "
            r"the public alphabet of CASED text: do_lower_case=False keeps upper- and "
            r"lower-case letters .* 594 more tokens than the 788 of uncased text")):
        dp_vocab.learn_wordpiece(counts, 1000, False)
    no_words, learned0 = dp_vocab.learn_wordpiece({}, floor + 3)
    assert learned0 == 0 and len(no_words) == floor + 3


# --------------------------------------------------------------------------- builds


def test_build_vocab_secret_absent_planted_present(synthetic_corpus, tmp_path):
    from transformers import BertTokenizerFast

    for seed in range(3):
        res = dp_vocab.build_vocab(synthetic_corpus, "text", 1200, 8.0, 1e-6, 64,
                                   tmp_path / f"dp{seed}", seed=seed, progress=False)
        tokens = _vocab_tokens(res.vocab_path)
        assert len(tokens) == 1200
        assert SECRET not in tokens and "##" + SECRET not in tokens
        assert not any(SECRET[:6] in t for t in tokens)
        assert PLANTED in tokens
        counts = res.counts_path.read_text().split("\n")
        assert not any(line.startswith(SECRET) for line in counts)
    report = json.loads(res.privacy_path.read_text())
    assert report["dp"] is True and report["epsilon"] == 8.0
    assert report["delta"] == 1e-6 and report["K"] == 64
    assert report["num_examples"] == 600
    assert report["threshold"] > 3 and report["example_definition"].startswith("one document")
    for key in ("epsilon_per_word", "delta_per_word", "num_distinct_words",
                "num_surviving_words", "mechanism"):
        assert key in report
    tok = BertTokenizerFast(vocab=str(res.vocab_path))
    assert tok.pad_token_id == 0 and tok.unk_token_id == 100 and tok.mask_token_id == 103
    assert tok.tokenize(f"{PLANTED.upper()}!") == [PLANTED, "!"]
    # The check can fail: the non-private vocabulary does contain the secret.
    res = dp_vocab.build_vocab(synthetic_corpus, "text", 1200, None, None, 64,
                               tmp_path / "nodp", dp=False, progress=False)
    assert SECRET in _vocab_tokens(res.vocab_path)
    report = json.loads(res.privacy_path.read_text())
    assert report["dp"] is False and "NON-PRIVATE" in report["mechanism"]
    assert report["epsilon"] is None


def test_build_vocab_errors_leave_output_alone(synthetic_corpus, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "vocab.txt").write_text("keep me\n")
    with pytest.raises(dp_vocab.VocabError, match="already exists"):
        dp_vocab.build_vocab(synthetic_corpus, "text", 1200, 8.0, 1e-6, 64, out,
                             progress=False)
    assert (out / "vocab.txt").read_text() == "keep me\n"
    fresh = tmp_path / "fresh"
    bad = [(dict(epsilon=-1.0), "epsilon"), (dict(delta=2.0), "delta"),
           (dict(vocab_size=10), "vocab_size=10"), (dict(fmt="csv"), "format"),
           (dict(do_lower_case=False), "vocab_size=1200 is below the 1382 tokens: .* of CASED "
                                       "text: do_lower_case=False"),
           (dict(num_workers=0), "num_workers"),
           (dict(delta=0.5), r"delta=0.5 must be < 1/num_examples = 0.00167 "
                             r"\(num_examples=600\)")]  # checked after counting
    for kw, match in bad:
        args = dict(input_path=synthetic_corpus, fmt="text", vocab_size=1200, epsilon=8.0,
                    delta=1e-6, max_words_per_example=64, out_dir=fresh, progress=False)
        args.update(kw)
        with pytest.raises(dp_vocab.VocabError, match=match):
            dp_vocab.build_vocab(**args)
        assert not fresh.exists()
    with pytest.raises(corpora.CorpusError, match="missing.txt"):
        dp_vocab.build_vocab(tmp_path / "missing.txt", "text", 1200, 8.0, 1e-6, 64, fresh)


@pytest.mark.shared_data
def test_vocab_tokenizes_unseen_text_with_few_unk(shared_data, tmp_path):
    """Train on 2,000 web_bible documents; < 1% [UNK] on the 438 held-out ones."""
    from transformers import BertTokenizerFast

    docs = list(corpora.read_text_documents(shared_data / "corpus" / "web_bible.txt.gz"))
    train, test = docs[:2000], docs[2000:]
    path = tmp_path / "train.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(d) for d in train) + "\n")
    res = dp_vocab.build_vocab(path, "text", 8000, 8.0, 1e-6, 64, tmp_path / "v", seed=0,
                               progress=False)
    report = res.report
    assert 50 < report["num_surviving_words"] < 2000  # few survivors, as the issue says
    tok = BertTokenizerFast(vocab=str(res.vocab_path))
    assert len(tok) == 8000
    ids = [i for d in test for i in tok("\n".join(d), add_special_tokens=False)["input_ids"]]
    unk = sum(i == tok.unk_token_id for i in ids) / len(ids)
    assert len(ids) > 100_000 and unk < 0.01, unk
    # Frequent words are whole tokens.
    assert tok.tokenize("And the LORD said") == ["and", "the", "lord", "said"]


@pytest.mark.shared_data
def test_build_vocab_on_noteevents_sample(shared_data, tmp_path):
    from transformers import BertTokenizerFast

    res = dp_vocab.build_vocab(shared_data / "clinical" / "NOTEEVENTS_sample.csv.gz",
                               "noteevents", 2000, 8.0, 1e-6, 64, tmp_path / "n",
                               seed=0, num_workers=2, progress=False)
    r = res.report
    assert r["num_examples"] == 900 and r["format"] == "noteevents"
    assert r["example_definition"].startswith("one MIMIC-III note")
    assert r["num_surviving_words"] > 20 and r["reader"]["records_kept"] == 900
    tok = BertTokenizerFast(vocab=str(res.vocab_path))
    assert "pneumothorax" in tok.get_vocab() or "##thorax" in tok.get_vocab()
    assert tok.unk_token not in tok.tokenize("No acute cardiopulmonary process. ___ 2 cm.")


# --------------------------------------------------------------------------- bad input (issue 16)


def test_large_epsilon_calibrates():
    """eps=100 was an IndexError inside dp_accounting (a search below its grid)."""
    p = dp_vocab.calibrate_histogram(100.0, 1e-6, 64)
    assert 1 / dp_vocab.MAX_PER_WORD_EPSILON < p.noise_scale < 64 / 100
    assert dp_vocab.laplace_composition_epsilon(p.noise_scale, 64, p.delta_noise) <= 100.0


def test_delta_below_pld_resolution_falls_back_to_basic_composition():
    """delta=1e-300 was a ValueError from dp_accounting's root search (no bracket)."""
    p = dp_vocab.calibrate_histogram(8.0, 1e-300, 64)
    assert p.noise_scale == 64 / 8.0   # K Laplace(K/eps): (eps, 0)-DP by basic composition
    assert p.threshold > 5000


@pytest.mark.parametrize("epsilon", [1e4, 1e300])
def test_huge_epsilon_refused_fast(synthetic_corpus, tmp_path, epsilon):
    """eps=1e3..1e4 ran for minutes and grew past 3 GB in dp_accounting."""
    import time
    start = time.perf_counter()
    with pytest.raises(dp_vocab.VocabError, match=r"per-word epsilon of 40, .* no corpus has ln n >= 40"):
        dp_vocab.build_vocab(synthetic_corpus, "text", 1200, epsilon, 1e-6, 64,
                             tmp_path / "out", progress=False)
    assert time.perf_counter() - start < 10
    assert not (tmp_path / "out").exists()
    # The floor is a valid (noisier) calibration: by basic composition, K Laplace(b) are
    # (K/b, 0)-DP and K/b <= epsilon.
    p = dp_vocab.calibrate_histogram(epsilon, 1e-6, 64)
    assert p.noise_scale == 1 / dp_vocab.MAX_PER_WORD_EPSILON and 64 / p.noise_scale <= epsilon


def test_bad_sizes_and_outputs_refused(synthetic_corpus, tmp_path):
    args = dict(input_path=synthetic_corpus, fmt="text", vocab_size=1200, epsilon=8.0,
                delta=1e-6, max_words_per_example=64, out_dir=tmp_path / "o", progress=False)
    for kw, match in [(dict(num_unused=-3), "num_unused must be an integer >= 0, got -3"),
                      (dict(num_unused=2.5), "num_unused must be an integer"),
                      (dict(vocab_size=0), "vocab_size must be an integer >= 1, got 0"),
                      (dict(vocab_size=True), "vocab_size must be an integer"),
                      (dict(vocab_size=10**9), "vocab_size=1000000000 is above 1000000"),
                      (dict(max_words_per_example=10**6), r"must be an integer in \[1, 10000\]"),
                      (dict(num_workers=10**4), r"num_workers must be an integer in \[1, "),
                      (dict(max_words_per_example=True), "max_words_per_example"),
                      (dict(accounting="rdp"), "accounting must be one of")]:
        with pytest.raises(dp_vocab.VocabError, match=match):
            dp_vocab.build_vocab(**{**args, **kw})
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(dp_vocab.VocabError, match="is a file, not a folder"):
        dp_vocab.build_vocab(**{**args, "out_dir": a_file})
    with pytest.raises(dp_vocab.VocabError, match="is a file"):
        dp_vocab.build_vocab(**{**args, "out_dir": a_file / "sub"})
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    # root ignores permission bits: then a read-only mount stands in.
    ro_out = ro / "vocab" if os.getuid() != 0 else pathlib.Path("/sys/dpbert_vocab")
    try:
        with pytest.raises(dp_vocab.VocabError, match="read-only"):
            dp_vocab.build_vocab(**{**args, "out_dir": ro_out})
    finally:
        ro.chmod(0o700)


def test_wrong_format_binary_and_tiny_corpora_refused(tmp_path):
    csv_path = tmp_path / "NOTEEVENTS.csv"
    csv_path.write_text(",".join(corpora.NOTEEVENTS_COLUMNS) + "\n"
                        + '1,2,3,,,,Radiology,X,,,"some note"\n')
    with pytest.raises(corpora.CorpusError, match="NOTEEVENTS header.*'noteevents'"):
        dp_vocab.build_vocab(csv_path, "text", 1200, 8.0, 1e-6, 64, tmp_path / "a",
                             progress=False)
    binary = tmp_path / "garbage.bin"
    binary.write_bytes(np.random.default_rng(0).integers(0, 256, 50_000, dtype=np.uint8)
                       .tobytes())
    with pytest.raises(corpora.CorpusError, match="cannot be parsed"):
        dp_vocab.build_vocab(binary, "text", 1200, 8.0, 1e-6, 64, tmp_path / "b",
                             progress=False)
    # 30 documents: no word is used by ~90 examples, so nothing survives the threshold.
    tiny = _synthetic_corpus(tmp_path / "tiny.txt.gz", num_docs=30, secret_docs=0,
                             planted_docs=30)
    with pytest.raises(dp_vocab.VocabError,
                       match=r"0 learned tokens: \d+ word\(s\) survived .* about \d+ of the 30 "
                             r"examples use it"):
        dp_vocab.build_vocab(tiny, "text", 1200, 8.0, 1e-6, 64, tmp_path / "c",
                             progress=False, seed=0, min_learned_tokens=1)
    assert not (tmp_path / "c").exists()
    # min_learned_tokens=0 (training's default for now): built, with a warning that says so.
    res = dp_vocab.build_vocab(tiny, "text", 1200, 8.0, 1e-6, 64, tmp_path / "c",
                               progress=False, seed=0)
    assert res.report["num_learned_tokens"] == 0
    assert res.report["warnings"][0].startswith("DP vocabulary too small to be useful? only 0 "
                                                "learned tokens")


def test_small_dp_vocab_warns_with_numbers(synthetic_corpus, tmp_path):
    res = dp_vocab.build_vocab(synthetic_corpus, "text", 8000, 8.0, 1e-6, 64, tmp_path / "v",
                               progress=False, seed=0)
    (warning,) = res.report["warnings"]
    learned = res.report["num_learned_tokens"]
    slots = 8000 - dp_vocab.min_vocab_size()
    assert f"only {learned} learned tokens for {slots} slots" in warning
    assert "of the 600 examples use it" in warning
    assert json.loads(res.privacy_path.read_text())["warnings"] == [warning]


def test_a_patient_vocabulary_of_a_text_corpus_says_why_it_cannot_be(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b c\n\nd e f\n")
    with pytest.raises(dp_vocab.VocabError, match="only format='noteevents' has.*unit='document'"):
        dp_vocab.build_vocab(corpus, "text", 2000, 8.0, 1e-6, 64, tmp_path / "v", unit="patient")
