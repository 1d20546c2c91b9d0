r"""Dropout masks from dpbert's unrolled threefry versus jax.random's, side by side.

    PYTHONPATH=. python benchmarks/dropout_masks.py [--models=tiny,mini] [--devices=1,8]

The model's dropout (`dpbert.prng.Dropout`) draws the same masks as ``flax.nnx.Dropout``, bit
for bit, from an unrolled threefry (`dpbert.prng.bernoulli`) instead of
``jax.random.bernoulli``, whose CPU lowering runs the 20 rounds as a rolled loop.  For each
model this compiles four steps (the shapes of `benchmarks/dp_step.py`: seq 128, 20 predictions,
AdamW, batch 32): the non-private step and the DP step (default clipper), each once with
jax.random's masks and once with dpbert's, and times them in `--rounds` interleaved rounds.
It prints the per-step medians (and minima), each step's time ratio (dpbert / jax.random
masks), and the DP / non-private ratio under each.  Both variants draw identical masks, so
the DP step's first MLM loss sum is checked equal under both.
"""

from __future__ import annotations

import os
import sys
import time

from absl import app

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp_step  # noqa: E402  (its flags: --models, --devices, --rounds; sets up the devices)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from dpbert import prng  # noqa: E402

_FAST = prng.bernoulli


def _masks(which: str) -> None:
    """Switches the model's dropout masks (read by `prng.Dropout` when a step is traced)."""
    prng.bernoulli = _FAST if which == "dpbert" else (
        lambda key, p, shape, sharding=None: jax.random.bernoulli(
            key, p, shape, out_sharding=sharding))


def bench(preset: str, devices: int, rounds: int) -> dict:
    steps = {}
    for which in ("jax", "dpbert"):
        _masks(which)
        b = dp_step.Bench(preset, devices)
        for kind, (fn, args) in (("plain", b.plain_step(32)),
                                 ("dp", b.dp_step(dp_step.default_clipper(), 32))):
            compiled, _ = dp_step.Bench.compile(fn, args)
            steps[(kind, which)] = [compiled, args]
    _masks("dpbert")

    def run(name):
        compiled, args = steps[name]
        start = time.perf_counter()
        out = compiled(*args)
        jax.block_until_ready(out)
        elapsed = time.perf_counter() - start
        if name[0] == "dp":
            params, opt_state, state, metrics = out
            steps[name][1] = (state, params, opt_state) + args[3:]
            return elapsed, float(metrics["mlm_loss_sum"])
        params, opt_state = out
        steps[name][1] = (params, opt_state) + args[2:]
        return elapsed, None

    names = list(steps)
    first = {name: run(name)[1] for name in names}  # warm-up; same masks, same loss
    assert first[("dp", "jax")] == first[("dp", "dpbert")], first
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name].append(run(name)[0])
    t = {name: np.asarray(v) for name, v in times.items()}
    med = {f"{k}:{w}": float(np.median(v)) for (k, w), v in t.items()}
    return {
        "model": preset, "devices": devices, "rounds": rounds, "median_s": med,
        "min_s": {f"{k}:{w}": float(v.min()) for (k, w), v in t.items()},
        "plain_time_ratio": float(np.median(t[("plain", "dpbert")] / t[("plain", "jax")])),
        "dp_time_ratio": float(np.median(t[("dp", "dpbert")] / t[("dp", "jax")])),
        "dp_over_plain_jax_masks": float(np.median(t[("dp", "jax")] / t[("plain", "jax")])),
        "dp_over_plain_dpbert_masks": float(
            np.median(t[("dp", "dpbert")] / t[("plain", "dpbert")])),
    }


def main(argv):
    del argv
    for preset in dp_step._MODELS.value:
        for devices in dp_step._DEVICES.value:
            row = bench(preset, int(devices), dp_step._ROUNDS.value)
            med = row["median_s"]
            print(f"{preset} x{row['devices']}: non-private {med['plain:jax']:.3f} -> "
                  f"{med['plain:dpbert']:.3f} s ({row['plain_time_ratio']:.3f}x), DP "
                  f"{med['dp:jax']:.3f} -> {med['dp:dpbert']:.3f} s "
                  f"({row['dp_time_ratio']:.3f}x); DP / non-private "
                  f"{row['dp_over_plain_jax_masks']:.3f}x -> "
                  f"{row['dp_over_plain_dpbert_masks']:.3f}x", flush=True)
            print(row, flush=True)


if __name__ == "__main__":
    app.run(main)
