"""Privacy analyses of dχ token privatization on a BERT embedding space (Qu et al. 2021, Sec. 5).

The library behind `launch/analyze_dchi.py`. For each η:

* geometry (Fig. 3): mean ‖M_rep(φ(w)) − φ(w)‖ over every regular token against its expectation
  n/η, and the mean distance of a token to its k-th nearest regular neighbour;
* plausible deniability (Fig. 4): N_w (outputs equal to the input) and S_w (distinct outputs) of
  `samples_per_token` runs of M_txt per regular token (all of them, or `vocab_sample`);
* token-embedding inversion (Table 3): privatize the embeddings of the corpus's tokens with M_rep,
  invert by nearest neighbour, report the accuracy.

Regular tokens exclude [PAD] [UNK] [CLS] [SEP] [MASK] [unusedN]. Cost: N_w/S_w take
|tokens| × samples_per_token nearest-neighbour queries per η over the whole vocabulary (29,523
regular tokens × 1,000 samples ≈ 30 M queries per η for a bert-base vocabulary: hours on a CPU),
so on a CPU the launcher samples `CPU_VOCAB_SAMPLE` tokens unless told otherwise
(`resolve_vocab_sample`). Only aggregates are written (the corpus may be private).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import pathlib
import random
import time
from typing import Any, Sequence

from absl import logging

from data_pipelines import fileio
from dpbert.runtime import config_checks

# The k of Qu et al.'s Fig. 3; the last entry stands for |V| (the farthest token).
KNN_KS = (1, 2, 3, 4, 5, 10, 20, 50, 100, 200, 500, 1000, 5000, 10000, None)


class AnalysisError(ValueError):
    """Bad input; the message names the flag, file or value."""


# ----------------------------------------------------------------------------- inputs


def parse_etas(values: Sequence[str]) -> list[float]:
    etas = []
    for v in values:
        try:
            eta = float(v)
        except ValueError:
            raise AnalysisError(f"--eta: {v!r} is not a number") from None
        if not (math.isfinite(eta) and eta > 0):
            raise AnalysisError(f"--eta: {v!r} must be a finite number > 0")
        if eta < config_checks.MIN_ETA:
            # Training's bound (config.privacy.eta, config.dchi.eta): below it the noise (norm
            # about d/η) overflows float32, and the "measured" results are inf and 0.
            raise AnalysisError(
                f"--eta: {v!r} is below {config_checks.MIN_ETA:g}, the smallest η training "
                f"accepts. The dχ noise has a norm of about d/η (d = the embedding width), "
                f"{1 / eta:.1e} x d here, which overflows float32 (mean|N| would be inf, the "
                "inversion accuracy 0); already at η = 1 the noise (norm ≈ d) drowns every "
                f"word embedding, so use η >= {config_checks.MIN_ETA:g} (Qu et al. use 50-175)")
        etas.append(eta)
    if not etas:
        raise AnalysisError("--eta: give at least one value")
    return etas


def _open_text(path: pathlib.Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def read_corpus_lines(path: str | os.PathLike) -> list[str]:
    """Non-empty text lines; for `.tsv[.gz]` files the last tab-separated field."""
    path = pathlib.Path(path)
    if not path.is_file():
        problem = fileio.special_file_problem(path) or (
            "is a directory; expected a text file" if path.is_dir() else "does not exist")
        raise AnalysisError(f"--corpus: {path} {problem}")
    tsv = path.name.endswith((".tsv", ".tsv.gz"))
    try:
        with _open_text(path) as f:
            lines = [line.rstrip("\n").split("\t")[-1] if tsv else line.rstrip("\n")
                     for line in f]
    except UnicodeDecodeError:
        # Not the decoder's message: it quotes the offending byte (the corpus may be private).
        raise AnalysisError(f"--corpus: {path} is not UTF-8 text") from None
    except (OSError, EOFError) as e:
        raise AnalysisError(f"--corpus: cannot read {path} "
                            f"({getattr(e, 'strerror', None) or type(e).__name__})") from None
    lines = [line for line in lines if line.strip()]
    if not lines:
        raise AnalysisError(f"--corpus: {path} has no text")
    return lines


def corpus_token_ids(lines: list[str], folder: pathlib.Path, special: Any, max_tokens: int,
                     seed: int) -> list[int]:
    """Up to `max_tokens` regular token ids from randomly ordered corpus lines."""
    from tokenizers import BertWordPieceTokenizer

    lowercase = True
    tok_cfg = folder / "tokenizer_config.json"
    if tok_cfg.is_file():
        lowercase = bool(json.loads(tok_cfg.read_text()).get("do_lower_case", True))
    tokenizer = BertWordPieceTokenizer(str(folder / "vocab.txt"), lowercase=lowercase)
    order = list(range(len(lines)))
    random.Random(seed).shuffle(order)
    ids: list[int] = []
    step = 256
    for start in range(0, len(order), step):
        batch = [lines[i] for i in order[start:start + step]]
        for enc in tokenizer.encode_batch(batch, add_special_tokens=False):
            ids.extend(i for i in enc.ids if not special[i])
        if len(ids) >= max_tokens:
            break
    return ids[:max_tokens]


# Regular tokens sampled for N_w/S_w by default on a CPU (BENCHMARKS.md's MiniLM run used 200).
CPU_VOCAB_SAMPLE = 200


def resolve_vocab_sample(vocab_sample: int | None, backend: str) -> tuple[int, str | None]:
    """The `vocab_sample` to use and, when it was chosen here, a note saying why and how to get
    the full analysis. None = automatic: all tokens on an accelerator, CPU_VOCAB_SAMPLE on a CPU
    (the full vocabulary is ~10 hours on 2 cores)."""
    if vocab_sample is not None:
        return vocab_sample, None
    if backend != "cpu":
        return 0, None
    return CPU_VOCAB_SAMPLE, (
        f"on a CPU, N_w/S_w use a seeded sample of {CPU_VOCAB_SAMPLE} regular tokens (the "
        "whole vocabulary takes hours: ~30 M nearest-neighbour queries per η for a bert-base "
        "vocabulary); --vocab_sample=0 runs the full analysis (best on an accelerator), "
        "--vocab_sample=N another sample size")


def estimated_queries(num_tokens: int, samples_per_token: int, corpus_tokens: int,
                      num_etas: int) -> int:
    """Nearest-neighbour queries of a run (the unit of its progress bar)."""
    return num_etas * (num_tokens * samples_per_token + corpus_tokens)


# ----------------------------------------------------------------------------- computations


def summarize(values: Any) -> dict[str, float]:
    import numpy as np

    v = np.asarray(values, np.float64)
    out = {"mean": float(v.mean()), "std": float(v.std()), "min": float(v.min()),
           "max": float(v.max())}
    for q in (1, 5, 25, 50, 75, 95, 99):
        out[f"p{q}"] = float(np.percentile(v, q))
    return out


def knn_mean_distances(table: Any, regular: Any, queries: Any, ks: Sequence[int | None],
                       block: int = 256) -> dict[str, float]:
    """Mean distance from each query token to its k-th nearest regular token (itself excluded).

    table float32 [V, n]; regular int [R] neighbour ids; queries int [Q] ⊆ regular. k=None is
    the farthest token (the paper's k = |V|). Keys are str(k) (or "|V|").
    """
    import numpy as np

    emb = table[regular].astype(np.float64)
    sq = np.sum(emb ** 2, axis=1)
    position = {int(t): i for i, t in enumerate(regular)}
    num_others = len(regular) - 1
    kth = [num_others if k is None else min(k, num_others) for k in ks]
    sums = np.zeros(len(ks))
    for start in range(0, len(queries), block):
        rows = np.array([position[int(q)] for q in queries[start:start + block]])
        d2 = sq[rows, None] + sq[None, :] - 2.0 * emb[rows] @ emb.T
        d2[np.arange(len(rows)), rows] = np.inf      # the token itself is not a neighbour
        d2 = np.sort(np.maximum(d2, 0.0), axis=1)[:, :num_others]
        sums += np.sqrt(d2[:, [k - 1 for k in kth]]).sum(axis=0)
    means = sums / len(queries)
    return {("|V|" if k is None else str(k)): float(m) for k, m in zip(ks, means)}


def run_analysis(embeddings: str, etas: list[float], corpus: str, out: str, *,
                 samples_per_token: int = 1000, vocab_sample: int = 0, knn_queries: int = 2000,
                 max_tokens: int = 100_000, seed: int = 0, chunk_size: int = 4096,
                 queries_per_call: int = 8192, progress: bool = True,
                 notes: Sequence[str] = ()) -> dict[str, Any]:
    """Runs all analyses and writes results.json and the plots into `out`; returns the results.

    `vocab_sample` 0 = every regular token for N_w/S_w (see `resolve_vocab_sample`); `notes`
    are stored in results.json (e.g. why a sample was used)."""
    import jax
    import numpy as np
    from tqdm import tqdm

    from dpbert.privacy import dchi

    from dpbert.models import hf

    for name, value, low in (("samples_per_token", samples_per_token, 1),
                             ("vocab_sample", vocab_sample, 0), ("knn_queries", knn_queries, 0),
                             ("max_tokens", max_tokens, 1), ("chunk_size", chunk_size, 1),
                             ("queries_per_call", queries_per_call, 1)):
        if value < low:
            raise AnalysisError(f"--{name} must be >= {low}, got {value}")
    problem = fileio.output_folder_problem(out, sources=[(f"--embeddings={embeddings}",
                                                          embeddings)])
    if problem:
        raise AnalysisError(f"--out={out}: {problem}")
    started = time.time()
    folder = pathlib.Path(embeddings)
    try:
        # A BERT folder, as fine-tuning and export require (a GPT-2 or other model folder is
        # refused by its config.json, not analysed as if its embeddings were BERT's).
        hf.read_bert_config_json(folder)
        table, vocab = dchi.load_embedding_table(folder)
    except (FileNotFoundError, ValueError) as e:
        raise AnalysisError(f"--embeddings: {e}") from e
    special = dchi.special_token_mask(vocab)
    regular = np.flatnonzero(~special)
    if len(regular) < 2:
        raise AnalysisError(f"--embeddings: {folder} has fewer than two regular tokens")
    lines = read_corpus_lines(corpus)
    for note in notes:  # inputs are valid: now say what this run will (not) do
        logging.info("%s", note)
    out_dir = pathlib.Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)

    rng = np.random.default_rng(seed)
    pd_ids = regular if vocab_sample == 0 or vocab_sample >= len(regular) else np.sort(
        rng.choice(regular, vocab_sample, replace=False))
    knn_ids = regular if knn_queries == 0 or knn_queries >= len(regular) else np.sort(
        rng.choice(regular, knn_queries, replace=False))
    corpus_ids = np.asarray(corpus_token_ids(lines, folder, special, max_tokens, seed), np.int32)
    if corpus_ids.size == 0:
        raise AnalysisError(f"--corpus: {corpus} has no token of this vocabulary")

    index = dchi.build_search_index(table, ~special, chunk_size)
    dim = table.shape[1]
    pd_fn = jax.jit(dchi.plausible_deniability, static_argnames="samples")
    inv_fn = jax.jit(dchi.inversion_hits)
    noise_fn = jax.jit(lambda key, x, eta: dchi.m_rep(key, x, eta) - x)
    regular_table = jax.numpy.asarray(table[regular])
    base = jax.random.key(seed)
    tokens_per_call = max(1, queries_per_call // samples_per_token)

    knn = knn_mean_distances(table, regular, knn_ids, KNN_KS)
    per_eta = []
    # Progress in nearest-neighbour queries, the unit of work of every stage.
    stages = tqdm(total=len(etas) * (len(pd_ids) * samples_per_token + len(corpus_ids)),
                  unit="query", unit_scale=True, desc="dχ analysis", disable=not progress)
    for e_idx, eta in enumerate(etas):
        k_noise, k_pd, k_inv = jax.random.split(jax.random.fold_in(base, e_idx), 3)
        noise = noise_fn(k_noise, regular_table, eta)
        noise_norms = np.linalg.norm(np.asarray(noise, np.float64), axis=1)

        n_w, s_w = [], []
        for c, start in enumerate(range(0, len(pd_ids), tokens_per_call)):
            ids = pd_ids[start:start + tokens_per_call]
            # Fixed-size calls (pad with the first id, drop after) so jit compiles once.
            padded = np.resize(ids, tokens_per_call) if len(ids) < tokens_per_call else ids
            nw, sw = pd_fn(jax.random.fold_in(k_pd, c), padded, index, eta,
                           samples=samples_per_token)
            n_w.append(np.asarray(nw)[:len(ids)])
            s_w.append(np.asarray(sw)[:len(ids)])
            stages.update(len(ids) * samples_per_token)
        n_w, s_w = np.concatenate(n_w), np.concatenate(s_w)

        hits = 0
        for c, start in enumerate(range(0, len(corpus_ids), queries_per_call)):
            ids = corpus_ids[start:start + queries_per_call]
            padded = np.resize(ids, queries_per_call) if len(ids) < queries_per_call else ids
            hit = np.asarray(inv_fn(jax.random.fold_in(k_inv, c), padded, index, eta))
            hits += int(hit[:len(ids)].sum())
            stages.update(len(ids))

        expected = dim / eta
        per_eta.append({
            "eta": eta,
            "expected_noise_norm": expected,
            "mean_noise_norm": float(noise_norms.mean()),
            "noise_norm_relative_error": float(noise_norms.mean() / expected - 1.0),
            "noise_samples": int(noise_norms.size),
            "inversion_accuracy": hits / len(corpus_ids),
            "inversion_tokens": int(len(corpus_ids)),
            "N_w": summarize(n_w),
            "S_w": summarize(s_w),
            "N_w_histogram": np.histogram(n_w, bins=20, range=(0, samples_per_token))[0].tolist(),
            "S_w_histogram": np.histogram(s_w, bins=20, range=(0, samples_per_token))[0].tolist(),
        })
    stages.close()

    results = {
        "embeddings": str(folder),
        "vocab_size": len(vocab),
        "embedding_dim": dim,
        "num_regular_tokens": int(len(regular)),
        "settings": {
            "samples_per_token": samples_per_token,
            "vocab_tokens_for_N_w_S_w": int(len(pd_ids)),
            "knn_query_tokens": int(len(knn_ids)),
            "corpus": str(corpus),
            "corpus_tokens": int(len(corpus_ids)),
            "seed": seed,
            "chunk_size": chunk_size,
        },
        "knn_mean_distance": knn,
        "per_eta": per_eta,
        "elapsed_s": round(time.time() - started, 1),
    }
    if notes:
        results["notes"] = list(notes)
    _write_json(out_dir / "results.json", results)
    write_plots(results, out_dir)
    return results


# ----------------------------------------------------------------------------- outputs


def _write_json(path: pathlib.Path, obj: Any) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def write_plots(results: dict[str, Any], out_dir: pathlib.Path) -> None:
    """geometry.png (Fig. 3), plausible_deniability.png (Fig. 4), inversion.png (Table 3)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    per_eta = results["per_eta"]
    samples = results["settings"]["samples_per_token"]

    fig, ax = plt.subplots(figsize=(7, 4.5))
    knn = results["knn_mean_distance"]
    labels = list(knn)
    ax.plot(range(len(labels)), [knn[k] for k in labels], "o", color="tab:blue",
            label="mean k-th nearest-neighbour distance")
    for r in per_eta:
        ax.axhline(r["mean_noise_norm"], color="black", lw=0.8)
        ax.text(0, r["mean_noise_norm"], f"η={r['eta']:g}", va="bottom", ha="left", fontsize=8)
    ax.set_xticks(range(len(labels)), labels, rotation=45)
    ax.set_xlabel("k")
    ax.set_ylabel("Euclidean distance")
    ax.set_title(f"Embedding geometry (n={results['embedding_dim']}); lines: mean noise ‖N‖")
    ax.legend(loc="center left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "geometry.png", dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    edges = np.linspace(0, samples, 21)
    for r in per_eta:
        for ax, key in zip(axes, ("N_w_histogram", "S_w_histogram")):
            ax.stairs(r[key], edges, label=f"η={r['eta']:g}")
    for ax, name in zip(axes, ("N_w (outputs equal to the input)", "S_w (distinct outputs)")):
        ax.set_xlabel(f"{name}, of {samples} samples")
        ax.set_ylabel("tokens")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    fig.suptitle(f"Plausible deniability over {results['settings']['vocab_tokens_for_N_w_S_w']}"
                 " regular tokens")
    fig.tight_layout()
    fig.savefig(out_dir / "plausible_deniability.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    etas = [r["eta"] for r in per_eta]
    ax.plot(etas, [r["inversion_accuracy"] for r in per_eta], "o-",
            label=f"inversion accuracy ({results['settings']['corpus_tokens']} corpus tokens)")
    ax.plot(etas, [r["N_w"]["mean"] / samples for r in per_eta], "s--",
            label="mean N_w / samples (vocabulary)")
    ax.set_xlabel("η")
    ax.set_ylabel("fraction")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "inversion.png", dpi=120)
    plt.close(fig)


def print_table(results: dict[str, Any]) -> None:
    print(f"{'eta':>6} {'n/eta':>8} {'mean|N|':>8} {'rel.err':>8} {'inversion':>9} "
          f"{'N_w mean':>8} {'N_w max':>7} {'S_w mean':>8} {'S_w min':>7}")
    for r in results["per_eta"]:
        print(f"{r['eta']:6g} {r['expected_noise_norm']:8.3f} {r['mean_noise_norm']:8.3f} "
              f"{r['noise_norm_relative_error']:+8.4f} {r['inversion_accuracy']:9.4f} "
              f"{r['N_w']['mean']:8.1f} {r['N_w']['max']:7.0f} {r['S_w']['mean']:8.1f} "
              f"{r['S_w']['min']:7.0f}")
