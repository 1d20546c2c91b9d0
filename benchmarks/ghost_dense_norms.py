r"""Would ghost norms for the encoder's dense layers pay? Per-layer costs side by side.

    PYTHONPATH=. python benchmarks/ghost_dense_norms.py [--batch=32] [--seq=128]
        [--models=tiny,mini,base] [--rounds=5] [--update_md]

The default clipper (`dp.clipping="ghost_embedding"`) still gets the encoder's per-example
gradients from `jax.vmap`. For one Dense layer y = x W (x [S, I], output gradient g [S, O] per
example) this script times, on the default JAX device and in interleaved rounds (medians):

* `batch`: the non-private weight gradient sum_i x_i^T g_i (what a plain step computes);
* `vmap`: the per-example gradients G_i = x_i^T g_i materialised [B, I, O], their squared norms,
  clip factors s_i and the clipped sum sum_i s_i G_i (what `VmapClipper` does per layer);
* `ghost`: the squared norms from the Gram matrices, ||G_i||^2 = sum_{s,t} (x_s.x_t)(g_s.g_t)
  (cost ~ S^2 (I + O) instead of S I O, no [B, I, O] array), then the clipped sum as one
  matmul with rescaled output gradients, sum_i x_i^T (s_i g_i).

for the encoder's dense shapes of each BERT size (per layer: 4 x [H, H] attention, [H, 4H] and
[4H, H] MLP), and totals weighted by how often each shape occurs. Inputs are random: the costs do
not depend on the values. Ratios > 1 mean slower than the non-private gradient. `--update_md`
rewrites the `## Ghost norms for dense layers` section of BENCHMARKS.md.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time

from absl import app, flags
import jax
import jax.numpy as jnp

import bench_report  # benchmarks/bench_report.py (the script's folder is on sys.path)

from dpbert.models import bert as model_lib

_BATCH = flags.DEFINE_integer("batch", 32, "Examples per batch.")
_SEQ = flags.DEFINE_integer("seq", 128, "Sequence length (S).")
_MODELS = flags.DEFINE_list("models", ["tiny", "mini", "base"], "BERT size presets.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Interleaved timing rounds (median reported).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Calls per round (the round's median is kept).")
_UPDATE_MD = flags.DEFINE_bool("update_md", False, "Rewrite the section in BENCHMARKS.md.")

_HIGHEST = jax.lax.Precision.HIGHEST
_CLIP = 1.0


def batch_gradient(x, g):
    return jnp.einsum("bsi,bso->io", x, g, precision=_HIGHEST)


def vmap_clipped_sum(x, g):
    grads = jnp.einsum("bsi,bso->bio", x, g, precision=_HIGHEST)
    norms = jnp.sqrt(jnp.sum(grads * grads, axis=(1, 2)))
    scale = 1.0 / jnp.maximum(1.0, norms / _CLIP)
    return jnp.einsum("b,bio->io", scale, grads, precision=_HIGHEST)


def ghost_clipped_sum(x, g):
    gram_x = jnp.einsum("bsi,bti->bst", x, x, precision=_HIGHEST)
    gram_g = jnp.einsum("bso,bto->bst", g, g, precision=_HIGHEST)
    norms = jnp.sqrt(jnp.maximum(jnp.sum(gram_x * gram_g, axis=(1, 2)), 0.0))
    scale = 1.0 / jnp.maximum(1.0, norms / _CLIP)
    return jnp.einsum("bsi,bso->io", x, g * scale[:, None, None], precision=_HIGHEST)


def dense_shapes(size: str) -> list[tuple[int, int, int]]:
    """(I, O, count) of the encoder's dense kernels for a size preset."""
    cfg = model_lib.BertConfig.preset(size, vocab_size=30522)
    h, m, n = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    return [(h, h, 4 * n), (h, m, n), (m, h, n)]


def median_time(fn, *args) -> float:
    times = []
    for _ in range(_REPEATS.value):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv):
    del argv
    b, s = _BATCH.value, _SEQ.value
    methods = {"batch": batch_gradient, "vmap": vmap_clipped_sum, "ghost": ghost_clipped_sum}
    shapes = sorted({(i, o) for size in _MODELS.value for i, o, _ in dense_shapes(size)})
    cases = {}
    for i, o in shapes:
        kx, kg = jax.random.split(jax.random.key(i * 100_003 + o))
        x = jax.random.normal(kx, (b, s, i), jnp.float32)
        g = jax.random.normal(kg, (b, s, o), jnp.float32) * 1e-2
        compiled = {name: jax.jit(fn).lower(x, g).compile() for name, fn in methods.items()}
        # Same clipped sum both ways (the ghost norm is exact, not an estimate).
        ref, got = compiled["vmap"](x, g), compiled["ghost"](x, g)
        err = float(jnp.max(jnp.abs(ref - got)) / jnp.max(jnp.abs(ref)))
        if err > 1e-4:
            sys.exit(f"ghost and vmap clipped sums differ for [{i}, {o}]: {err:.2e}")
        temp = {name: c.memory_analysis().temp_size_in_bytes / 2**20
                for name, c in compiled.items()}
        cases[(i, o)] = dict(compiled=compiled, args=(x, g), temp=temp, times={n: [] for n in methods})
        print(f"[{i} x {o}] compiled; ghost vs vmap rel. diff {err:.1e}", flush=True)

    for r in range(_ROUNDS.value):
        for case in cases.values():
            for name, fn in case["compiled"].items():
                case["times"][name].append(median_time(fn, *case["args"]))
        print(f"round {r + 1}/{_ROUNDS.value} done", flush=True)

    med = {k: {n: statistics.median(t) for n, t in c["times"].items()} for k, c in cases.items()}
    lines = [
        f"`PYTHONPATH=. python benchmarks/ghost_dense_norms.py --batch={b} --seq={s} "
        f"--models={','.join(_MODELS.value)}` on {platform.machine()}, {os.cpu_count()} CPU "
        f"cores, JAX {jax.__version__} on {jax.devices()[0].platform} (1 device); load average "
        f"{os.getloadavg()[0]:.1f} at the end. Median of {_ROUNDS.value} interleaved rounds. "
        "Ratios are per-example clipped sum / non-private gradient for the same layer.",
        "",
        "| dense kernel [I, O] | non-private gradient ms | vmap clipped sum ms | ghost clipped sum "
        "ms | vmap ratio | ghost ratio | vmap temp MiB | ghost temp MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (i, o), m in sorted(med.items()):
        t = cases[(i, o)]["temp"]
        lines.append(f"| [{i}, {o}] | {1e3 * m['batch']:.2f} | {1e3 * m['vmap']:.2f} | "
                     f"{1e3 * m['ghost']:.2f} | {m['vmap'] / m['batch']:.2f}x | "
                     f"{m['ghost'] / m['batch']:.2f}x | {t['vmap']:.0f} | {t['ghost']:.0f} |")
    lines += ["", "All encoder dense kernels of a model (weighted by how often each shape occurs):",
              "", "| model | non-private ms | vmap ms | ghost ms | vmap ratio | ghost ratio | "
              "ghost / vmap |", "|---|---|---|---|---|---|---|"]
    for size in _MODELS.value:
        tot = {n: sum(c * med[(i, o)][n] for i, o, c in dense_shapes(size)) for n in methods}
        lines.append(f"| {size} | {1e3 * tot['batch']:.1f} | {1e3 * tot['vmap']:.1f} | "
                     f"{1e3 * tot['ghost']:.1f} | {tot['vmap'] / tot['batch']:.2f}x | "
                     f"{tot['ghost'] / tot['batch']:.2f}x | {tot['ghost'] / tot['vmap']:.2f}x |")
    text = "\n".join(lines)
    print(text)
    if _UPDATE_MD.value:
        bench_report.write_section("## Ghost norms for dense layers",
                                   "## Ghost norms for dense layers\n\n" + text + "\n",
                                   keep_subsections=True)


if __name__ == "__main__":
    app.run(main)
