r"""DP-SGD step (vmap and ghost-embedding clipping) versus the non-private step, side by side.

    PYTHONPATH=. python benchmarks/dp_step.py [--models=tiny,mini] [--batch_size=32]

For each BERT size (vocabulary 30,522, seq 128, 20 predictions, dropout on, AdamW), on
8 fake CPU devices (data-parallel mesh, or the real devices with --platform=gpu):

* wall-clock of one jitted train step, DP (`DPAggregator.update`: per-example grads,
  clip, sum, noise, AdamW) with each clipper -- `VmapClipper` (every per-example
  gradient materialised by vmap) and `TiedEmbeddingClipper` (ghost norms for the tied
  word embedding, dp.clipping="ghost_embedding") -- and non-private (mean-loss grads,
  AdamW), same batch, same whole-batch microbatch, measured in interleaved rounds
  (median; the ratio is robust to machine load);
* XLA temp memory (`compiled.memory_analysis().temp_size_in_bytes`, per device) and
  cost-analysis bytes accessed of the single-chunk steps (deterministic; comparable
  across machines);
* the largest microbatch (global, a multiple of the device count) whose step compiles
  under a per-device temp-memory cap, for both DP steps and the non-private
  (accumulating) step;
* the time to calibrate sigma for 1,000,000 steps at the scale of Hoory et al.
  (N = 83M, batch 131,072, delta = 1e-8, epsilon = 8), plus the epsilon of that sigma
  on a 10x finer PLD grid.

Prints a markdown report (paste it into BENCHMARKS.md, section "DP-SGD step").
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

_PLATFORM = flags.DEFINE_enum("platform", "cpu", ["cpu", "gpu"],
                              "cpu: 8 fake CPU devices; gpu: the real accelerator(s).")
_MODELS = flags.DEFINE_list("models", ["tiny", "mini"], "BERT presets to benchmark.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Global physical batch size.")
_SEQ = flags.DEFINE_integer("seq_len", 128, "Sequence length.")
_PREDS = flags.DEFINE_integer("preds", 20, "Masked LM predictions per sequence.")
_VOCAB = flags.DEFINE_integer("vocab_size", 30522, "Vocabulary size (BERT uncased).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Interleaved timing rounds (after warm-up).")
_CAP_MIB = flags.DEFINE_float("memory_cap_mib", 512.0,
                              "Per-device temp-memory cap for the microbatch search.")
_SEARCH_BATCH = flags.DEFINE_integer("search_batch", 512,
                                     "Physical batch of the compile-only microbatch search.")
_CALIBRATION = flags.DEFINE_bool("calibration", True, "Also time sigma calibration at T=1M.")


def _setup_platform() -> None:
    # Must run before JAX is imported.
    if "--platform=gpu" not in sys.argv:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_force_host_platform_device_count=8").strip()
        os.environ["JAX_PLATFORMS"] = "cpu"


_setup_platform()

import platform as platform_lib  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from dpbert import losses, sharding  # noqa: E402
from dpbert import model as model_lib  # noqa: E402
from dpbert.dp import accounting, accumulation, calibration, ghost, trees  # noqa: E402

MIB = 2 ** 20


def synthetic_batch(n: int, seq: int, preds: int, vocab: int, seed: int = 0) -> dict:
    """n pretraining examples with the contract's features (full-length sequences)."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(1000, vocab, size=(n, seq)).astype(np.int32)
    seg = np.zeros((n, seq), np.int32)
    seg[:, seq // 2:] = 1
    positions = np.sort(np.stack([rng.choice(np.arange(1, seq - 1), preds, replace=False)
                                  for _ in range(n)]), axis=1).astype(np.int32)
    return {
        "input_ids": ids, "input_mask": np.ones((n, seq), np.int32), "segment_ids": seg,
        "masked_lm_positions": positions,
        "masked_lm_ids": rng.randint(1000, vocab, size=(n, preds)).astype(np.int32),
        "masked_lm_weights": np.ones((n, preds), np.float32),
        "next_sentence_labels": rng.randint(0, 2, size=(n,)).astype(np.int32),
    }


def non_private_update(loss_fn, optimizer, microbatch_size: int):
    """The ordinary step: grads of the mean per-example loss (microbatched), AdamW."""

    def update(params, opt_state, batch, key):
        b = batch["input_ids"].shape[0]
        n_chunks = b // microbatch_size

        def chunk_grad(chunk, positions):
            def total(p):
                keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(positions)
                losses_, _ = jax.vmap(loss_fn, in_axes=(None, 0, 0))(p, chunk, keys)
                return jnp.sum(losses_)
            return jax.grad(total)(params)

        positions = jnp.arange(b, dtype=jnp.int32)
        if n_chunks == 1:
            grads = chunk_grad(batch, positions)
        else:
            # Same layout as the DP clipper: [B] -> [m, n_chunks] -> scan over chunks.
            split = lambda x: jnp.moveaxis(  # noqa: E731
                x.reshape((microbatch_size, n_chunks) + x.shape[1:]), 1, 0)
            xs = (jax.tree.map(split, batch), split(positions))
            zero = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), params)
            grads, _ = jax.lax.scan(
                lambda acc, c: (jax.tree.map(jnp.add, acc, chunk_grad(*c)), None), zero, xs)
        grads = jax.tree.map(lambda g: g / b, grads)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return update


class Bench:
    """Builds and compiles the DP and non-private steps of one model on a mesh."""

    def __init__(self, preset: str):
        self.mesh = sharding.make_mesh(data=-1, fsdp=1)
        self.devices = self.mesh.devices.size
        config = model_lib.BertConfig.preset(preset, _VOCAB.value,
                                             max_position_embeddings=max(512, _SEQ.value))
        graphdef, params = nnx.split(model_lib.create_model(config))
        self.num_params = sum(x.size for x in jax.tree.leaves(params))
        self.loss_fn = losses.make_pretraining_loss(graphdef)
        self.factored_loss = losses.make_factored_pretraining_loss(graphdef)
        self.optimizer = optax.adamw(1e-4, weight_decay=0.01)
        rep = sharding.replicated(self.mesh)
        self.p_sh = sharding.param_shardings(params, self.mesh)
        self.params = jax.device_put(params, self.p_sh)
        opt_state = self.optimizer.init(params)
        self.o_sh = jax.tree.map(lambda _: rep, opt_state)
        self.opt_state = jax.device_put(opt_state, self.o_sh)
        b = _BATCH.value
        batch = synthetic_batch(b, _SEQ.value, _PREDS.value, _VOCAB.value)
        self.batch = {k: jax.device_put(v, sharding.batch_sharding(self.mesh, v.ndim))
                      for k, v in batch.items()}
        self.mask = jax.device_put(np.ones(b, bool), sharding.batch_sharding(self.mesh))
        self.rep = rep

    def abstract_batch(self, batch_size: int):
        """ShapeDtypeStructs of a sharded batch of `batch_size` (for compile-only runs)."""
        def sds(x):
            shape = (batch_size,) + x.shape[1:]
            return jax.ShapeDtypeStruct(shape, x.dtype,
                                        sharding=sharding.batch_sharding(self.mesh, x.ndim))
        return jax.tree.map(sds, self.batch), sds(self.mask)

    def dp_step(self, microbatch_size: int, batch_size: int | None = None, trainable=None,
                clipper: str = "vmap"):
        """(jitted DP step, its arguments); abstract batch if `batch_size` is given.

        clipper: "vmap" (`VmapClipper`) or "ghost" (`TiedEmbeddingClipper`).
        """
        config = accumulation.DPConfig(clip_norm=1.0, noise_multiplier=1.0,
                                       expected_batch_size=float(_BATCH.value),
                                       microbatch_size=microbatch_size,
                                       num_shards=self.devices)
        # As the trainer does: every device draws its part of the noise.
        spread = sharding.spread_over_devices(self.mesh)
        if clipper == "ghost":
            agg = accumulation.DPAggregator(
                config, self.factored_loss, self.optimizer, trainable=trainable,
                clipper=ghost.TiedEmbeddingClipper(config.clip_norm, microbatch_size,
                                                   self.devices, trainable),
                noise_draw_sharding=spread)
        else:
            agg = accumulation.DPAggregator(config, self.loss_fn, self.optimizer,
                                            trainable=trainable, noise_draw_sharding=spread)
        state = jax.device_put(agg.init(self.params, 0), agg.state_sharding(self.p_sh, self.rep))
        fn = jax.jit(agg.update, donate_argnums=(1, 2),
                     out_shardings=(self.p_sh, self.o_sh,
                                    agg.state_sharding(self.p_sh, self.rep), self.rep))
        batch, mask = ((self.batch, self.mask) if batch_size is None
                       else self.abstract_batch(batch_size))
        args = (state, _fresh(self.params), _fresh(self.opt_state), batch, mask)
        return fn, args

    def noise_only(self):
        """(jitted noise draw of the DP step, its arguments): `DPAggregator.noisy_gradient`
        on an all-zero clipped sum, i.e. the part of the DP step that is not clipping."""
        config = accumulation.DPConfig(clip_norm=1.0, noise_multiplier=1.0,
                                       expected_batch_size=float(_BATCH.value),
                                       num_shards=self.devices)
        agg = accumulation.DPAggregator(config, self.loss_fn, self.optimizer,
                                        noise_draw_sharding=sharding.spread_over_devices(self.mesh))
        state = jax.device_put(agg.init(self.params, 0), agg.state_sharding(self.p_sh, self.rep))
        zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32, device=x.sharding),
                             self.params)
        return jax.jit(agg.noisy_gradient, out_shardings=self.p_sh), (state, zeros)

    def plain_step(self, microbatch_size: int, batch_size: int | None = None):
        fn = jax.jit(non_private_update(self.loss_fn, self.optimizer, microbatch_size),
                     donate_argnums=(0, 1), out_shardings=(self.p_sh, self.o_sh))
        batch = self.batch if batch_size is None else self.abstract_batch(batch_size)[0]
        args = (_fresh(self.params), _fresh(self.opt_state), batch, jax.random.PRNGKey(0))
        return fn, args

    @staticmethod
    def compile(fn, args):
        start = time.perf_counter()
        compiled = fn.lower(*args).compile()
        return compiled, time.perf_counter() - start


def _fresh(tree):
    """A copy with the same shardings (each step donates its own params/opt_state)."""
    return jax.tree.map(lambda x: jax.device_put(jnp.array(x, copy=True), x.sharding), tree)


def temp_bytes(compiled) -> int:
    return int(compiled.memory_analysis().temp_size_in_bytes)


def bytes_accessed(compiled) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost.get("bytes accessed", float("nan")))


def time_interleaved(steps: dict, rounds: int) -> dict[str, list[float]]:
    """Runs each step once per round, in alternating order; returns seconds per step."""
    state = {name: args for name, (_, args) in steps.items()}
    times = {name: [] for name in steps}

    def run(name):
        fn = steps[name][0]
        args = state[name]
        start = time.perf_counter()
        out = fn(*args)
        jax.block_until_ready(out)
        elapsed = time.perf_counter() - start
        # Feed outputs back (the inputs were donated).
        if name.startswith("dp"):
            params, opt_state, dp_state, _ = out
            state[name] = (dp_state, params, opt_state) + args[3:]
        elif name == "plain":
            params, opt_state = out
            state[name] = (params, opt_state) + args[2:]
        # (anything else does not donate its arguments: they are reused as they are)
        return elapsed

    names = list(steps)
    for name in names:  # warm-up (first run allocates)
        run(name)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name].append(run(name))
    return times


def largest_microbatch(make_step, search_batch: int, devices: int, cap: float,
                       known: tuple[int, int]):
    """Largest m = devices * 2^k <= search_batch whose step's temp memory is <= cap.

    Starts from a linear prediction from `known` = (microbatch, temp bytes) and compiles
    upwards / downwards from there (usually 2 compiles).  Returns (m, temp bytes, tried).
    """
    candidates = []
    m = devices
    while m <= search_batch:
        candidates.append(m)
        m *= 2
    m0, t0 = known
    fits_guess = [c for c in candidates if c * t0 / m0 <= cap]
    i = candidates.index(fits_guess[-1]) if fits_guess else 0
    memo: dict[int, int] = {}

    def mem(c):
        if c not in memo:
            memo[c] = temp_bytes(Bench.compile(*make_step(c, search_batch))[0])
        return memo[c]

    if mem(candidates[i]) <= cap:
        while i + 1 < len(candidates) and mem(candidates[i + 1]) <= cap:
            i += 1
        return candidates[i], mem(candidates[i]), len(memo)
    while i > 0:
        i -= 1
        if mem(candidates[i]) <= cap:
            return candidates[i], mem(candidates[i]), len(memo)
    return None, None, len(memo)


def bench_model(preset: str) -> dict:
    bench = Bench(preset)
    b = _BATCH.value
    print(f"[{preset}] {bench.num_params / 1e6:.1f}M params, batch {b}, "
          f"{bench.devices} devices", file=sys.stderr, flush=True)
    frozen = trees.freeze_paths_containing("word_embeddings")
    steps = {"dp": bench.dp_step(b), "dp_ghost": bench.dp_step(b, clipper="ghost"),
             "plain": bench.plain_step(b), "dp_frozen_emb": bench.dp_step(b, trainable=frozen),
             "noise": bench.noise_only()}
    compiled, compile_s = {}, {}
    for name, (fn, args) in steps.items():
        compiled[name], compile_s[name] = Bench.compile(fn, args)
        print(f"[{preset}] {name} compiled in {compile_s[name]:.1f} s", file=sys.stderr,
              flush=True)
    times = time_interleaved(steps, _ROUNDS.value)
    ratio = lambda name: statistics.median(  # noqa: E731
        [d / p for d, p in zip(times[name], times["plain"])])
    cap = _CAP_MIB.value * MIB
    search = _SEARCH_BATCH.value
    dp_m = largest_microbatch(lambda m, n: bench.dp_step(m, n), search, bench.devices, cap,
                              (b, temp_bytes(compiled["dp"])))
    ghost_m = largest_microbatch(lambda m, n: bench.dp_step(m, n, clipper="ghost"), search,
                                 bench.devices, cap, (b, temp_bytes(compiled["dp_ghost"])))
    plain_m = largest_microbatch(lambda m, n: bench.plain_step(m, n), search, bench.devices,
                                 cap, (b, temp_bytes(compiled["plain"])))
    print(f"[{preset}] microbatch search: {dp_m[2]} + {ghost_m[2]} + {plain_m[2]} compiles",
          file=sys.stderr, flush=True)
    return {
        "preset": preset, "params": bench.num_params,
        "dp_s": statistics.median(times["dp"]), "plain_s": statistics.median(times["plain"]),
        "ghost_s": statistics.median(times["dp_ghost"]), "ghost_ratio": ratio("dp_ghost"),
        "ghost_temp": temp_bytes(compiled["dp_ghost"]),
        "ghost_bytes": bytes_accessed(compiled["dp_ghost"]),
        "ghost_m": ghost_m[0], "ghost_m_mem": ghost_m[1], "ghost_compile": compile_s["dp_ghost"],
        "frozen_s": statistics.median(times["dp_frozen_emb"]),
        "noise_s": statistics.median(times["noise"]), "noise_ratio": ratio("noise"),
        "time_ratio": ratio("dp"), "frozen_ratio": ratio("dp_frozen_emb"),
        "dp_temp": temp_bytes(compiled["dp"]), "plain_temp": temp_bytes(compiled["plain"]),
        "dp_bytes": bytes_accessed(compiled["dp"]),
        "plain_bytes": bytes_accessed(compiled["plain"]),
        "dp_m": dp_m[0], "dp_m_mem": dp_m[1], "plain_m": plain_m[0], "plain_m_mem": plain_m[1],
        "dp_compile": compile_s["dp"], "plain_compile": compile_s["plain"],
    }


def bench_calibration() -> dict:
    kwargs = dict(expected_batch_size=131072, num_examples=83_000_000, steps=1_000_000,
                  delta=1e-8)
    wall, cpu = time.perf_counter(), time.process_time()
    sigma = calibration.calibrate_noise_multiplier(target_epsilon=8.0, **kwargs)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    eps = accounting.compute_epsilon(noise_multiplier=sigma, **kwargs)
    fine = accounting.compute_epsilon(noise_multiplier=sigma, pld_discretization=1e-5,
                                      **kwargs)
    return {"sigma": sigma, "wall": wall, "cpu": cpu, "eps": eps, "eps_fine": fine}


def main(argv):
    del argv
    rows = [bench_model(m) for m in _MODELS.value]
    cal = bench_calibration() if _CALIBRATION.value else None
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    devices = jax.devices()
    print(f"`PYTHONPATH=. python benchmarks/dp_step.py --models={','.join(_MODELS.value)} "
          f"--batch_size={_BATCH.value}` on {platform_lib.machine()}, {os.cpu_count()} CPU "
          f"cores, JAX {jax.__version__} on {len(devices)} x {devices[0].platform} "
          f"({devices[0].device_kind}); load average {load:.1f} at the end. "
          f"Vocabulary {_VOCAB.value}, seq {_SEQ.value}, {_PREDS.value} predictions, "
          f"global batch {_BATCH.value}, dropout on, AdamW; DP: C=1, sigma=1, whole batch "
          f"in one microbatch. Median of {_ROUNDS.value} interleaved rounds. DP ratios are "
          "DP step / non-DP step; `vmap` = VmapClipper (dp.clipping=\"vmap\"), `ghost` = "
          "TiedEmbeddingClipper (dp.clipping=\"ghost_embedding\", the default).\n")
    print("| model | params | clipper | DP step s | non-DP step s | time ratio | DP temp MiB | "
          "non-DP temp MiB | temp ratio | bytes-accessed ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        for name, key, ratio in (("vmap", "dp", "time_ratio"), ("ghost", "ghost", "ghost_ratio")):
            print(f"| {r['preset']} | {r['params'] / 1e6:.1f}M | {name} | {r[key + '_s']:.2f} | "
                  f"{r['plain_s']:.2f} | {r[ratio]:.2f}x | "
                  f"{r[key + '_temp'] / MIB:.0f} | {r['plain_temp'] / MIB:.0f} | "
                  f"{r[key + '_temp'] / r['plain_temp']:.2f}x | "
                  f"{r[key + '_bytes'] / r['plain_bytes']:.2f}x |")
    print("\nParts of the DP step, timed alone in the same rounds: the noise draw "
          "(`DPAggregator.noisy_gradient` on a zero sum: one N(0, sigma^2 C^2) array per "
          "parameter, float32), and the vmap DP step with the (tied, 30,522-row) word "
          "embedding frozen (no embedding/decoder gradient and no noise on it):\n")
    print("| model | noise draw s | vs. non-DP | DP step, word embedding frozen, s | "
          "vs. non-DP |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['preset']} | {r['noise_s']:.2f} | {r['noise_ratio']:.2f}x | "
              f"{r['frozen_s']:.2f} | {r['frozen_ratio']:.2f}x |")
    print(f"\nLargest global microbatch (devices x 2^k, batch {_SEARCH_BATCH.value}) whose "
          f"step compiles under {_CAP_MIB.value:.0f} MiB temp memory per device:\n")
    print("| model | DP vmap microbatch | its temp MiB | DP ghost microbatch | its temp MiB | "
          "non-DP microbatch | its temp MiB |")
    print("|---|---|---|---|---|---|---|")
    fmt = lambda m, mem: ("none", "-") if m is None else (str(m), f"{mem / MIB:.0f}")  # noqa
    for r in rows:
        cells = [c for k in ("dp", "ghost", "plain") for c in fmt(r[k + "_m"], r[k + "_m_mem"])]
        print(f"| {r['preset']} | " + " | ".join(cells) + " |")
    print("\nCompile times (s): " + ", ".join(
        f"{r['preset']} DP vmap {r['dp_compile']:.1f} / DP ghost {r['ghost_compile']:.1f} / "
        f"non-DP {r['plain_compile']:.1f}" for r in rows))
    if cal:
        print(f"\nCalibration, T = 1,000,000 steps, N = 83M, batch 131,072, delta = 1e-8, "
              f"target epsilon 8 (PLD): sigma = {cal['sigma']:.5f} in {cal['wall']:.2f} s "
              f"wall / {cal['cpu']:.2f} s CPU; reported epsilon {cal['eps']:.5f}; the same "
              f"sigma on a 10x finer PLD grid (1e-5): epsilon {cal['eps_fine']:.5f}.")


if __name__ == "__main__":
    app.run(main)
