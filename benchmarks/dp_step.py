r"""DP-SGD step (each clipper) versus the non-private step, side by side.

    PYTHONPATH=. python benchmarks/dp_step.py [--models=tiny,mini] [--devices=1,8] [--json]
    PYTHONPATH=. python benchmarks/dp_step.py --models=base,large --compile_only --json
    PYTHONPATH=. python benchmarks/dp_step.py --quick --models=tiny,mini --devices=1 --json

For each BERT size (vocabulary 30,522, seq 128, 20 predictions, dropout on, AdamW) and each
device count (fake CPU devices, a data-parallel mesh; or the real devices with --platform=gpu):

* wall-clock of one jitted train step: DP (`DPAggregator.update`: clipped per-example
  gradient sum, noise, AdamW) with each clipper of `--clippers` -- `vmap` (VmapClipper: every
  per-example gradient materialised), `ghost_embedding` (TiedEmbeddingClipper), `mixed_ghost`
  (MixedGhostClipper) -- and non-private (mean-loss gradients, AdamW), same batch, whole batch
  in one microbatch, measured in interleaved rounds (ratios taken per round, then the median);
* the noise draw alone (`DPAggregator.noisy_gradient` on a zero sum, with dpbert's generator
  and with `jax.random.normal`), and the DP step of the default clipper with sigma = 0, whose
  difference to the DP step is what the noise really costs inside the step;
* deterministic compiler figures of the same steps: per-device temp memory
  (`memory_analysis().temp_size_in_bytes`), FLOPs and bytes accessed (`cost_analysis()`);
* the largest global microbatch (devices x 2^k) whose step compiles under a per-device
  temp-memory cap, for every DP step and the non-private (accumulating) step;
* optionally the time to calibrate sigma at the scale of Hoory et al. (--calibration).

`--task=classification` benchmarks the fine-tuning step instead (sentence classification with
2 labels, the loss of `launch/finetune.py`; the ghost clippers take
`dpbert.tasks.task_losses.FactoredClassificationLoss`, the default clipper is what
dp.clipping="auto" gives a classification run in mode none); `--models=minilm` is
MiniLM-L6-H384's shape (6 layers, hidden 384, 12 heads), the checkpoint the fine-tuning
benchmarks use.

`--compile_only` skips every timing (the deterministic figures for base and large on a CPU).
`--json` prints one JSON object per (model, device count); the top-level `time_ratio`,
`temp_memory_ratio`, `flops_ratio` and `max_microbatch_ratio` are the default clipper's
(configs/common.py `dp.clipping`), `clippers[name]` has them for every clipper.  `--write`
replaces the generated part of the "## DP-SGD step" section of BENCHMARKS.md.  `--quick`
(benchmarks/dp_step_quick.py): only the non-private and the default DP step, timed, with their
compile seconds (and the DP / non-DP compile ratio), temp memory and the largest batch by a
short search; `--quick_per_leaf` adds the compile seconds of the DP step drawing its noise leaf
by leaf (the draw before issue 32), side by side.  `benchmarks/compile_fresh.py` compiles each
step once in a fresh process (as a run does; here the later steps find JAX's caches warm).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

_PLATFORM = flags.DEFINE_enum("platform", "cpu", ["cpu", "gpu"],
                              "cpu: fake CPU devices; gpu: the real accelerator(s).")
_MODELS = flags.DEFINE_list("models", ["tiny", "mini"], "BERT presets to benchmark (also "
                            "'minilm': MiniLM-L6-H384's shape).")
_TASK = flags.DEFINE_enum("task", "pretraining", ["pretraining", "classification"],
                          "The step's loss: MLM + NSP pretraining, or sentence classification.")
_DEVICES = flags.DEFINE_list("devices", ["8"], "Device counts to measure on (e.g. 1,8).")
_CLIPPERS = flags.DEFINE_list("clippers", ["vmap", "ghost_embedding", "mixed_ghost"],
                              "DP clippers (dp.clipping values).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Global physical batch size.")
_NOISE_DRAW = flags.DEFINE_enum(
    "noise_draw", "spread", ["replicated", "spread"],
    "Where a replicated parameter's noise is added: to each device's slice of the reduced "
    "sum, then all-gathered (the trainer's layout, sharding.noise_layouts), or drawn whole "
    "on every device.")
_SEQ = flags.DEFINE_integer("seq_len", 128, "Sequence length.")
_PREDS = flags.DEFINE_integer("preds", 20, "Masked LM predictions per sequence.")
_VOCAB = flags.DEFINE_integer("vocab_size", 30522, "Vocabulary size (BERT uncased).")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Interleaved timing rounds (after warm-up).")
_CAP_MIB = flags.DEFINE_float(
    "memory_cap_mib", None, "Per-device temp-memory cap of the microbatch search (default: "
    "512 MiB for tiny/mini, 16 GiB for larger models).")
_SEARCH_BATCH = flags.DEFINE_integer("search_batch", 512,
                                     "Physical batch of the compile-only microbatch search.")
_SEARCH = flags.DEFINE_bool("microbatch_search", True, "Search the largest microbatch.")
_COMPILE_ONLY = flags.DEFINE_bool("compile_only", False, "Deterministic figures only.")
_CALIBRATION = flags.DEFINE_bool("calibration", False, "Also time sigma calibration at T=1M.")
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object per model and device count.")
_WRITE = flags.DEFINE_bool("write", False, "Replace the DP-SGD step section of BENCHMARKS.md.")
_QUICK = flags.DEFINE_bool("quick", False, "Only the non-private and the default DP step: "
                           "times, compile seconds, temp memory, the largest batch by a short "
                           "search (benchmarks/dp_step_quick.py).")
_NOISE_FLAT = flags.DEFINE_enum(
    "noise_flat", "auto", ["auto", "true", "false"],
    "Draw all of the noise in one loop (DPAggregator noise_flat; auto: on one device, as the "
    "trainer does).")


def _setup_platform() -> None:
    # Must run before JAX is imported.
    if ("--platform=gpu" not in sys.argv
            and "device_count" not in os.environ.get("XLA_FLAGS", "")):  # torch_step.py: 1
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_force_host_platform_device_count=8").strip()
        os.environ["JAX_PLATFORMS"] = "cpu"


_setup_platform()

import json  # noqa: E402
import math  # noqa: E402
import platform as platform_lib  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

import bench_report  # noqa: E402  (benchmarks/ is the script's folder, on sys.path)
import dp_step_quick  # noqa: E402
from configs import common as common_config  # noqa: E402
from configs import finetune_classification  # noqa: E402
from dpbert.tasks import classification as classification_task  # noqa: E402
from dpbert.tasks import pretraining as pretraining_task  # noqa: E402
from dpbert.models import heads  # noqa: E402
from dpbert.models import losses  # noqa: E402
from dpbert.runtime import compile_cache, sharding  # noqa: E402
from dpbert.tasks import task_losses  # noqa: E402
from dpbert.models import bert as model_lib  # noqa: E402
from dpbert.dp import accounting, accumulation, calibration, clipping  # noqa: E402
from dpbert.dp import mixed_ghost, noise  # noqa: E402

MIB = 2 ** 20
SECTION = "## DP-SGD step"
# The clipper dp.clipping="auto" gives a pretraining run with the default config (one
# sequence per unit, the shapes benchmarked here).
DEFAULT_CLIPPER = pretraining_task.TASK.auto_clipping(common_config.get_config())
# The same for a classification run in mode none (--task=classification).
DEFAULT_FINETUNE_CLIPPER = classification_task.TASK.auto_clipping(
    finetune_classification.get_config())
# Shapes beside model_lib.PRESETS: (layers, hidden, heads), intermediate 4 x hidden.
EXTRA_SHAPES = {"minilm": (6, 384, 12)}


def default_clipper() -> str:
    return DEFAULT_FINETUNE_CLIPPER if _TASK.value == "classification" else DEFAULT_CLIPPER


def model_config(preset: str) -> model_lib.BertConfig:
    positions = max(512, _SEQ.value)
    if preset in EXTRA_SHAPES:
        layers, hidden, heads_ = EXTRA_SHAPES[preset]
        return model_lib.BertConfig(vocab_size=_VOCAB.value, hidden_size=hidden,
                                    num_hidden_layers=layers, num_attention_heads=heads_,
                                    intermediate_size=4 * hidden,
                                    max_position_embeddings=positions, dtype=_DTYPE.value)
    return model_lib.BertConfig.preset(preset, _VOCAB.value, dtype=_DTYPE.value,
                                       max_position_embeddings=positions)


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


def make_clipper(name: str, config: accumulation.DPConfig, trainable=None):
    """(clipper, needs the factored loss) for a dp.clipping value (the clipper registry), or
    mixed_ghost:<dense_norm> for `MixedGhostClipper`'s per-layer rule variants."""
    args = (config.clip_norm, config.microbatch_size, config.num_shards, trainable)
    if name.startswith("mixed_ghost:"):  # e.g. mixed_ghost:gram (dense_norm variants)
        return mixed_ghost.MixedGhostClipper(*args, dense_norm=name.split(":")[1]), True
    entry = clipping.get_clipper(name)
    if not entry.private:
        raise ValueError(f"{name!r} is not a DP clipper")
    return entry.make(*args), entry.loss_shape == "factored"


class Bench:
    """Builds and compiles the DP and non-private steps of one model on a mesh."""

    def __init__(self, preset: str, devices: int):
        self.mesh = sharding.make_mesh(data=-1, fsdp=1, devices=jax.devices()[:devices])
        self.devices = self.mesh.devices.size
        config = model_config(preset)
        # Compile-only runs never allocate the model (BERT-large's parameters and optimizer
        # state, once per compiled step, would not fit in a CPU host's memory).
        self.abstract = _COMPILE_ONLY.value
        classify = _TASK.value == "classification"
        make = ((lambda: heads.create_task_model("sequence_classification", config, 2))
                if classify else (lambda: model_lib.create_model(config)))
        graphdef, params = nnx.split(nnx.eval_shape(make) if self.abstract else make())
        self.num_params = sum(x.size for x in jax.tree.leaves(params))
        if classify:
            self.loss_fn = task_losses.make_classification_loss(graphdef)
            self.factored_loss = task_losses.FactoredClassificationLoss(graphdef)
        else:
            self.loss_fn = losses.make_pretraining_loss(graphdef)
            self.factored_loss = losses.make_factored_pretraining_loss(graphdef)
        self.optimizer = optax.adamw(1e-4, weight_decay=0.01)
        rep = sharding.replicated(self.mesh)
        self.p_sh = sharding.param_shardings(params, self.mesh)
        if self.abstract:
            self.params = jax.tree.map(
                lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                nnx.to_pure_dict(params), nnx.to_pure_dict(self.p_sh))
            self.p_sh = nnx.to_pure_dict(self.p_sh)
            opt_state = jax.eval_shape(self.optimizer.init, self.params)
            self.o_sh = jax.tree.map(lambda _: rep, opt_state)
            self.opt_state = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), opt_state)
        else:
            self.params = jax.device_put(params, self.p_sh)
            opt_state = self.optimizer.init(params)
            self.o_sh = jax.tree.map(lambda _: rep, opt_state)
            self.opt_state = jax.device_put(opt_state, self.o_sh)
        b = _BATCH.value
        batch = synthetic_batch(b, _SEQ.value, _PREDS.value, _VOCAB.value)
        if classify:
            batch = {"input_ids": batch["input_ids"], "segment_ids": batch["segment_ids"],
                     "input_mask": batch["input_mask"], "label": batch["next_sentence_labels"]}
        self.batch = {k: jax.device_put(v, sharding.batch_sharding(self.mesh, v.ndim))
                      for k, v in batch.items()}
        self.mask = jax.device_put(np.ones(b, bool), sharding.batch_sharding(self.mesh))
        self.rep = rep

    def fresh(self, tree):
        """A copy (each step donates its own params/opt_state); abstract trees as they are."""
        return tree if self.abstract else _fresh(tree)

    def dp_state(self, agg):
        sharding_ = agg.state_sharding(self.p_sh, self.rep)
        if self.abstract:
            return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                                jax.eval_shape(lambda p: agg.init(p, 0), self.params), sharding_)
        return jax.device_put(agg.init(self.params, 0), sharding_)

    def abstract_batch(self, batch_size: int):
        """ShapeDtypeStructs of a sharded batch of `batch_size` (for compile-only runs)."""
        def sds(x):
            shape = (batch_size,) + x.shape[1:]
            return jax.ShapeDtypeStruct(shape, x.dtype,
                                        sharding=sharding.batch_sharding(self.mesh, x.ndim))
        return jax.tree.map(sds, self.batch), sds(self.mask)

    def aggregator(self, clipper: str, microbatch_size: int | None = None,
                   noise_multiplier: float = 1.0, trainable=None,
                   noise_draw: str | None = None, noise_flat: bool | None = None):
        config = accumulation.DPConfig(clip_norm=1.0, noise_multiplier=noise_multiplier,
                                       expected_batch_size=float(_BATCH.value),
                                       microbatch_size=microbatch_size, num_shards=self.devices)
        clip, factored = make_clipper(clipper, config, trainable)
        # As the trainer does (dpbert.runtime.loop): a replicated parameter's noise is added to each
        # device's slice of the sum (--noise_draw=replicated: drawn whole on every device).
        layouts = (sharding.noise_layouts(self.p_sh, self.params)
                   if (noise_draw or _NOISE_DRAW.value) == "spread" else None)
        flat = (self.devices == 1 if _NOISE_FLAT.value == "auto"
                else _NOISE_FLAT.value == "true") if noise_flat is None else noise_flat
        return accumulation.DPAggregator(
            config, self.factored_loss if factored else self.loss_fn, self.optimizer,
            trainable=trainable, clipper=clip, noise_layouts=layouts, noise_flat=flat)

    def dp_step(self, clipper: str, microbatch_size: int, batch_size: int | None = None,
                noise_multiplier: float = 1.0, noise_draw: str | None = None,
                noise_flat: bool | None = None):
        """(jitted DP step, its arguments); abstract batch if `batch_size` is given."""
        agg = self.aggregator(clipper, microbatch_size, noise_multiplier,
                              noise_draw=noise_draw, noise_flat=noise_flat)
        state = self.dp_state(agg)
        fn = jax.jit(agg.update, donate_argnums=(1, 2),
                     out_shardings=(self.p_sh, self.o_sh,
                                    agg.state_sharding(self.p_sh, self.rep), self.rep))
        batch, mask = ((self.batch, self.mask) if batch_size is None
                       else self.abstract_batch(batch_size))
        # The noise std as an argument, as the training loop passes it (the program holds no
        # sigma; `DPAggregator.update`'s noise_stddev).
        args = (state, self.fresh(self.params), self.fresh(self.opt_state), batch, mask,
                agg.stddev_argument())
        return fn, args

    def noise_only(self, generator: str = "dpbert"):
        """(jitted noise draw of the DP step, its arguments): `DPAggregator.noisy_gradient` on
        an all-zero clipped sum; generator "jax" swaps in `jax.random.normal` (leaf by leaf)."""
        agg = self.aggregator("vmap", noise_flat=None if generator == "dpbert" else False)
        state = jax.device_put(agg.init(self.params, 0), agg.state_sharding(self.p_sh, self.rep))
        zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32, device=x.sharding),
                             self.params)

        def draw(state, zeros):
            if generator == "dpbert":
                return agg.noisy_gradient(state, zeros)
            fast = noise.threefry_normal
            noise.threefry_normal = lambda k, shape, sh=None: jax.random.normal(
                k, shape, jnp.float32, out_sharding=sh)
            try:
                return agg.noisy_gradient(state, zeros)
            finally:
                noise.threefry_normal = fast

        return jax.jit(draw, out_shardings=self.p_sh), (state, zeros)

    def plain_step(self, microbatch_size: int, batch_size: int | None = None):
        fn = jax.jit(non_private_update(self.loss_fn, self.optimizer, microbatch_size),
                     donate_argnums=(0, 1), out_shardings=(self.p_sh, self.o_sh))
        batch = self.batch if batch_size is None else self.abstract_batch(batch_size)[0]
        args = (self.fresh(self.params), self.fresh(self.opt_state), batch,
                jax.random.PRNGKey(0))
        return fn, args

    def trainer_plain_step(self, microbatch_size: int, batch_size: int | None = None):
        """(jitted step, its arguments): the trainer's own non-private step (dp.enabled=False:
        `DPAggregator` with the "none" clipper, `clipping.BatchGradient`, no noise: its metric
        sums, its finiteness check and its state, as `plan.make_updater` builds it), where
        `plain_step` is a minimal hand-written one."""
        config = accumulation.DPConfig(clip_norm=math.inf, noise_multiplier=0.0,
                                       expected_batch_size=float(_BATCH.value),
                                       microbatch_size=microbatch_size, num_shards=self.devices)
        clip = clipping.get_clipper("none").make(math.inf, microbatch_size, self.devices, None)
        agg = accumulation.DPAggregator(config, clipping.batch_loss(self.loss_fn),
                                        self.optimizer, clipper=clip)
        fn = jax.jit(agg.update, donate_argnums=(1, 2),
                     out_shardings=(self.p_sh, self.o_sh,
                                    agg.state_sharding(self.p_sh, self.rep), self.rep))
        batch, mask = ((self.batch, self.mask) if batch_size is None
                       else self.abstract_batch(batch_size))
        return fn, (self.dp_state(agg), self.fresh(self.params), self.fresh(self.opt_state),
                    batch, mask)

    @staticmethod
    def compile(fn, args):
        """Compiled as the training loop compiles its step (`compile_ahead`), and seconds."""
        start = time.perf_counter()
        compiled = compile_cache.compile_ahead(fn, *args)
        return compiled, time.perf_counter() - start


def _fresh(tree):
    """A copy with the same shardings (each step donates its own params/opt_state)."""
    return jax.tree.map(lambda x: jax.device_put(jnp.array(x, copy=True), x.sharding), tree)


def temp_bytes(compiled) -> int:
    return int(compiled.memory_analysis().temp_size_in_bytes)


def total_bytes(compiled) -> int:
    """Everything the step holds on a device: arguments + outputs - donated (aliased) + temp.
    (Donating the parameters and optimizer state moves some of their copies into temp.)"""
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
               + m.temp_size_in_bytes)


def fusion_counts(compiled) -> dict[str, int]:
    """The compiled program's fused computations: how many ("fusions") and how many distinct
    ("distinct_fusions": equal up to value names and metadata).  XLA:CPU compiles one kernel
    per distinct fused computation, so the distinct count is a deterministic proxy for the
    compile's seconds (tiny BERT: non-private 185, DP 267, 1.44x, where `--quick` read 1.49x in
    seconds), which vary by +-0.5 s from run to run on a 2-core machine.  Only a proxy: kernels
    differ in size (in XLA's LLVM log the small ones cost ~4-6 ms each, the largest 150-270 ms),
    so fewer distinct kernels need not mean fewer seconds (issue 32, 2026-12-02: a change that
    removed 19 small ones showed no gain by the clock; BENCHMARKS.md)."""
    text = compiled.as_text()
    bodies = {}
    for m in re.finditer(r"\n%?([\w.\-]+) (\([^\n]*\) -> [^\n]*) \{\n(.*?)\n\}", text, re.S):
        body = re.sub(r", metadata=\{[^}]*\}", "", m.group(3))
        bodies[m.group(1)] = re.sub(r"[\w.\-]+: ", ": ", m.group(2)) + re.sub(r"%[\w.\-]+", "%",
                                                                             body)
    called = re.findall(r" fusion\([^\n]*calls=%?([\w.\-]+)", text)
    return {"fusions": len(called), "distinct_fusions": len({bodies[c] for c in called})}


def cost(compiled, key: str) -> float:
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
    return float(analysis.get(key, float("nan")))


def time_interleaved(steps: dict, compiled: dict, rounds: int,
                     profile_dir: str = "") -> dict[str, list[float]]:
    """Runs each step once per round, in alternating order; returns seconds per step.
    `profile_dir`: then one more run of each step (not timed) under `jax.profiler.trace`, each
    inside a `TraceAnnotation` of its name, written there (the XLA kernels of each step)."""
    state = {name: args for name, (_, args) in steps.items()}
    times = {name: [] for name in steps}

    def run(name):
        args = state[name]
        start = time.perf_counter()
        out = compiled[name](*args)
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
    if profile_dir:
        with jax.profiler.trace(profile_dir):
            for name in names:
                with jax.profiler.TraceAnnotation(f"step {name}"):
                    run(name)
    return times


def largest_microbatch(make_step, search_batch: int, devices: int, cap: float,
                       known: tuple[int, int], max_compiles: int | None = None):
    """Largest m = devices * 2^k <= search_batch whose step's temp memory is <= cap.

    Starts from a linear prediction from `known` = (microbatch, temp bytes) and compiles
    upwards / downwards from there (usually 2 compiles; at most `max_compiles`, then the
    largest that fitted so far).  Returns (m, temp bytes, tried).
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
            if max_compiles is not None and len(memo) >= max_compiles:
                return float("inf")  # out of compiles: counts as not fitting
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


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def memory_cap(preset: str) -> float:
    if _CAP_MIB.value is not None:
        return _CAP_MIB.value * MIB
    return (512.0 if preset in ("tiny", "mini", "minilm") else 16384.0) * MIB


def bench_model(preset: str, devices: int) -> dict:
    bench = Bench(preset, devices)
    b = _BATCH.value
    tag = f"[{preset} x{bench.devices}]"
    _log(f"{tag} {bench.num_params / 1e6:.1f}M params, batch {b}, {_DTYPE.value}")
    clippers = list(_CLIPPERS.value)
    steps = {"plain": bench.plain_step(b)}
    for c in clippers:
        steps["dp:" + c] = bench.dp_step(c, b)
    # The default clipper's step with sigma = 0: what the noise adds to time and memory.
    default = default_clipper() if default_clipper() in clippers else clippers[-1]
    steps["dp_sigma0:" + default] = bench.dp_step(default, b, noise_multiplier=0.0)
    # On a mesh, the default clipper's step with the other noise layout (--noise_draw).
    other = "replicated" if _NOISE_DRAW.value == "spread" else "spread"
    if bench.devices > 1:
        steps["dp_noise_" + other] = bench.dp_step(default, b, noise_draw=other)
    if not _COMPILE_ONLY.value:
        steps["noise"] = bench.noise_only("dpbert")
        steps["noise_jax"] = bench.noise_only("jax")
    compiled, compile_s = {}, {}
    for name, (fn, args) in steps.items():
        compiled[name], compile_s[name] = Bench.compile(fn, args)
        _log(f"{tag} {name} compiled in {compile_s[name]:.1f} s, temp "
             f"{temp_bytes(compiled[name]) / MIB:.0f} MiB")
    times = {} if _COMPILE_ONLY.value else time_interleaved(steps, compiled, _ROUNDS.value)

    def ratio(name, base="plain"):
        if not times:
            return None
        return statistics.median([d / p for d, p in zip(times[name], times[base])])

    def spread(name, base="plain"):
        """(min, max) of the per-round ratios: how noisy the median is."""
        rs = [d / p for d, p in zip(times[name], times[base])] if times else []
        return [min(rs), max(rs)] if rs else None

    cap = memory_cap(preset)
    search = max(_SEARCH_BATCH.value, bench.devices)
    plain_m = (largest_microbatch(lambda m, n: bench.plain_step(m, n), search, bench.devices,
                                  cap, (b, temp_bytes(compiled["plain"])))
               if _SEARCH.value else (None, None, 0))
    plain = {"temp_mib": temp_bytes(compiled["plain"]) / MIB,
             "total_mib": total_bytes(compiled["plain"]) / MIB,
             "flops": cost(compiled["plain"], "flops"),
             "bytes_accessed": cost(compiled["plain"], "bytes accessed"),
             "compile_s": compile_s["plain"], "max_microbatch": plain_m[0],
             "max_microbatch_temp_mib": None if plain_m[1] is None else plain_m[1] / MIB}
    if times:
        plain["s"] = statistics.median(times["plain"])
    result = {"model": preset, "params": bench.num_params, "devices": bench.devices,
              "batch_size": b, "seq_len": _SEQ.value, "dtype": _DTYPE.value,
              "task": _TASK.value, "default_clipper": default_clipper(), "plain": plain,
              "clippers": {}}
    for c in clippers:
        name = "dp:" + c
        m = (largest_microbatch(lambda m, n, c=c: bench.dp_step(c, m, n), search, bench.devices,
                                cap, (b, temp_bytes(compiled[name])))
             if _SEARCH.value else (None, None, 0))
        entry = {
            "time_ratio": ratio(name), "time_ratio_range": spread(name),
            "temp_memory_ratio": temp_bytes(compiled[name]) / temp_bytes(compiled["plain"]),
            "total_memory_ratio": total_bytes(compiled[name]) / total_bytes(compiled["plain"]),
            "flops_ratio": cost(compiled[name], "flops") / plain["flops"],
            "bytes_accessed_ratio": (cost(compiled[name], "bytes accessed")
                                     / plain["bytes_accessed"]),
            "max_microbatch_ratio": (m[0] / plain_m[0] if m[0] and plain_m[0] else None),
            "temp_mib": temp_bytes(compiled[name]) / MIB, "compile_s": compile_s[name],
            "max_microbatch": m[0], "max_microbatch_temp_mib": None if m[1] is None
            else m[1] / MIB}
        if times:
            entry["s"] = statistics.median(times[name])
        result["clippers"][c] = entry
        _log(f"{tag} {c}: {json.dumps(entry)}")
    top = result["clippers"].get(default_clipper()) or result["clippers"][clippers[-1]]
    for k in ("time_ratio", "temp_memory_ratio", "flops_ratio", "max_microbatch_ratio"):
        result[k] = top[k]
    sigma0 = "dp_sigma0:" + default
    noisy = "dp:" + default
    # Temp memory the noise adds to the step (the draw is made to wait for the clipped sum,
    # `dpbert.dp.noise._after`; drawn in the middle of the backward it held erfinv's
    # parameter-sized intermediates next to the activations).
    result["noise"] = {"clipper": default, "temp_mib_added": (
        temp_bytes(compiled[noisy]) - temp_bytes(compiled[sigma0])) / MIB}
    if times and bench.devices > 1:
        result["noise"]["other_layout"] = {
            "noise_draw": other, "time_ratio": ratio("dp_noise_" + other),
            "time_ratio_range": spread("dp_noise_" + other)}
    if times:
        result["noise"].update({
            "draw_s": statistics.median(times["noise"]), "draw_ratio": ratio("noise"),
            "jax_draw_s": statistics.median(times["noise_jax"]),
            "jax_draw_ratio": ratio("noise_jax"),
            # (DP step - DP step with sigma = 0) / non-private step, per round.
            "in_step_ratio": statistics.median(
                [(d - z) / p for d, z, p in zip(times[noisy], times[sigma0], times["plain"])])})
    return result


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


def _x(v, digits=2) -> str:
    return "-" if v is None else f"{v:.{digits}f}x"


def _other(noise_row: dict) -> str:
    o = noise_row.get("other_layout")
    if not o or o["time_ratio"] is None:
        return "-"
    lo, hi = o["time_ratio_range"]
    return f"{o['noise_draw']}: {o['time_ratio']:.2f}x ({lo:.2f}-{hi:.2f})"


def markdown(rows: list[dict], cal: dict | None, command: str) -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    dev = jax.devices()[0]
    timed = not _COMPILE_ONLY.value
    lines = [SECTION, "",
             f"`{command}` on {platform_lib.machine()}, {os.cpu_count()} CPU cores, JAX "
             f"{jax.__version__} on {dev.platform} ({dev.device_kind}); load average "
             f"{load:.1f} at the end. Task {_TASK.value}. Vocabulary {_VOCAB.value}, seq "
             f"{_SEQ.value}, "
             + (f"{_PREDS.value} predictions, " if _TASK.value == "pretraining" else "2 labels, ")
             + f"global batch {_BATCH.value}, {_DTYPE.value} compute, "
             "dropout on, AdamW; DP: C=1, sigma=1, whole batch in one microbatch. "
             + (f"Times: median of {_ROUNDS.value} interleaved rounds (ratio per round; the "
                "range is the rounds' min-max). " if timed else "Compile only (no timings). ")
             + "Ratios are DP step / non-private step (both donate parameters and optimizer "
             "state); temp memory is per device, total memory = arguments + outputs - donated + "
             "temp; FLOPs and bytes from XLA's cost analysis. Default clipper: "
             f"`{default_clipper()}`.", ""]
    lines += ["| model | devices | clipper | DP s | non-DP s | time ratio (range) | temp MiB "
              "DP / non-DP | temp ratio | total memory ratio | FLOPs ratio | bytes ratio | max "
              "microbatch DP / non-DP | microbatch ratio |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["plain"]
        for c, e in r["clippers"].items():
            rng = e["time_ratio_range"]
            t = ("-" if e["time_ratio"] is None else
                 f"{e['time_ratio']:.2f}x ({rng[0]:.2f}-{rng[1]:.2f})")
            lines.append(
                f"| {r['model']} | {r['devices']} | {c} | "
                f"{e.get('s', float('nan')):.2f} | {p.get('s', float('nan')):.2f} | {t} | "
                f"{e['temp_mib']:.0f} / {p['temp_mib']:.0f} | {_x(e['temp_memory_ratio'])} | "
                f"{_x(e['total_memory_ratio'])} | "
                f"{_x(e['flops_ratio'])} | {_x(e['bytes_accessed_ratio'])} | "
                f"{e['max_microbatch']} / {p['max_microbatch']} | "
                f"{_x(e['max_microbatch_ratio'])} |")
    if timed:
        lines += ["", "The noise: `noisy_gradient` on a zero sum (one N(0, sigma^2 C^2) float32 "
                  f"array per parameter, layout `--noise_draw={_NOISE_DRAW.value}`, result "
                  "replicated) with dpbert's generator and with `jax.random.normal` (same "
                  "values), and inside the step: (DP step - the same step with sigma = 0) / "
                  "non-private step; temp memory the noise adds: DP step - the same step with "
                  "sigma = 0. On a mesh, the last column is the default clipper's time ratio with "
                  "the other noise layout (spread: added to each device's slice of the sum, then "
                  "all-gathered; replicated: drawn whole on every device).", "",
                  "| model | devices | draw s | draw / non-DP | jax.random draw s | "
                  "jax.random / non-DP | in the step (clipper) | temp MiB added | "
                  "other noise layout: time ratio (range) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            n = r["noise"]
            lines.append(f"| {r['model']} | {r['devices']} | {n['draw_s']:.3f} | "
                         f"{_x(n['draw_ratio'], 3)} | {n['jax_draw_s']:.3f} | "
                         f"{_x(n['jax_draw_ratio'], 3)} | {_x(n['in_step_ratio'], 3)} "
                         f"({n['clipper']}) | {n['temp_mib_added']:.1f} | {_other(n)} |")
    else:
        lines += ["", "Temp memory the noise adds (DP step - the same step with sigma = 0, "
                  "MiB): " + "; ".join(f"{r['model']} x{r['devices']} "
                                       f"{r['noise']['clipper']} {r['noise']['temp_mib_added']:.1f}"
                                       for r in rows) + "."]
    caps = sorted({memory_cap(r["model"]) / MIB for r in rows})
    lines += ["", f"Max microbatch: the largest global microbatch (devices x 2^k, physical batch "
              f"{_SEARCH_BATCH.value}) whose step compiles under "
              f"{' / '.join(f'{c:.0f}' for c in caps)} MiB temp memory per device.", "",
              "Compile times (s): " + "; ".join(
                  f"{r['model']} x{r['devices']}: non-DP {r['plain']['compile_s']:.1f}, " +
                  ", ".join(f"{c} {e['compile_s']:.1f}" for c, e in r["clippers"].items())
                  for r in rows)]
    if cal:
        lines += ["", f"Calibration, T = 1,000,000 steps, N = 83M, batch 131,072, delta = 1e-8, "
                  f"target epsilon 8 (PLD): sigma = {cal['sigma']:.5f} in {cal['wall']:.2f} s "
                  f"wall / {cal['cpu']:.2f} s CPU; reported epsilon {cal['eps']:.5f}; the same "
                  f"sigma on a 10x finer PLD grid (1e-5): epsilon {cal['eps_fine']:.5f}."]
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    rows = []
    for preset in _MODELS.value:
        for devices in (int(d) for d in _DEVICES.value):
            if devices > len(jax.devices()):
                raise ValueError(f"--devices={devices}: only {len(jax.devices())} devices")
            if _QUICK.value:
                row = dp_step_quick.bench(sys.modules[__name__], preset, devices)
                print(json.dumps(row) if _JSON.value else dp_step_quick.line(row), flush=True)
                continue
            row = bench_model(preset, devices)
            rows.append(row)
            if _JSON.value:
                print(json.dumps(row), flush=True)
    if _QUICK.value:
        return
    cal = bench_calibration() if _CALIBRATION.value else None
    command = "PYTHONPATH=. python benchmarks/dp_step.py " + " ".join(sys.argv[1:])
    text = markdown(rows, cal, command.strip())
    if not _JSON.value:
        print(text)
    if _WRITE.value:
        bench_report.write_section(SECTION, text, keep_subsections=True)


if __name__ == "__main__":
    app.run(main)
