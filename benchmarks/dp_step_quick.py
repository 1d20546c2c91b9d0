"""`dp_step.py --quick`: the non-private and the default DP step only, for a device run.

Per model and device count: each step's compile seconds (and the DP / non-DP ratio, the goal of
issue 32: <= 1.3x) and its fused computations (`dp_step.fusion_counts`: the distinct ones follow
the compile's seconds without their spread), its time (median of `--rounds` interleaved
rounds), its temp memory, and the largest microbatch (devices x 2^k, compile only) whose temp
memory fits `--memory_cap_mib`, by a short search (at most `--quick_max_compiles` compiles per
step).  `--quick_per_leaf` also compiles the DP step with its noise drawn leaf by leaf
(`DPAggregator(noise_flat=False)`, the draw before issue 32), `--quick_trainer_plain` the
trainer's own non-private step (dp.enabled=False; the row's non-private step is a minimal
hand-written one), `--quick_jax_prng` the DP step with `jax.random`'s generator
(DPBERT_PRNG=jax), each for the side-by-side compile ratio; `--quick_dp_precision` also
times the DP step with its clipping's float32 contractions at another precision than HIGHEST
(a measurement of what HIGHEST costs on a GPU; not private); `--quick_profile_dir` a
`jax.profiler` trace of one more run of each step.  Which generator ran
(`dpbert.prng.generator`, DPBERT_PRNG), whether the DP step holds jaxlib's CUDA threefry
kernel (`cuda_threefry_kernel`) and the library versions go into the row.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys

import flax
import jax
import jaxlib
from absl import flags

from dpbert import prng

_PER_LEAF = flags.DEFINE_bool("quick_per_leaf", False, "--quick: also compile the DP step "
                              "with its noise drawn leaf by leaf.")
_SIGMA0 = flags.DEFINE_bool("quick_sigma0", False, "--quick: also time the DP step with "
                            "sigma = 0 (clipping without the noise), to split the DP step's "
                            "extra time between the clipping and the noise.")
_JAX_PRNG = flags.DEFINE_bool("quick_jax_prng", False, "--quick: also compile the DP step "
                               "with jax.random's generator (DPBERT_PRNG=jax) instead of the "
                               "unrolled one, for the side-by-side compile ratio.")
_DP_PRECISION = flags.DEFINE_enum(
    "quick_dp_precision", "", ["", "high", "default"], "--quick: also compile and time the DP "
    "step with its clipping's float32 contractions (the dense layers' and the embedding's "
    "clipped sums, the Gram and ghost norms; jax.lax.Precision.HIGHEST in the product) at this "
    "precision instead: on a GPU HIGHEST keeps them off the tensor cores (TF32 / bf16), which "
    "the non-private step uses. A measurement only: the product has no such setting (the "
    "rounding of the clipped sum against the norm that bounds it grows from 2^-24 to 2^-10 at "
    "TF32; see BENCHMARKS.md \"On one H200\").")
_PROFILE_DIR = flags.DEFINE_string("quick_profile_dir", "", "--quick: after the timed rounds, "
                                   "one more run of each step under jax.profiler.trace, "
                                   "written to this folder (where the DP step's time goes).")
_TRAINER_PLAIN = flags.DEFINE_bool(
    "quick_trainer_plain", False, "--quick: also compile the trainer's own non-private step "
    "(dp.enabled=False: the aggregator with the 'none' clipper, its metric sums and finiteness "
    "check; `Bench.trainer_plain_step`) and give the DP step's compile ratio against it too "
    "(the non-private step of the row is a minimal hand-written one).")
_MAX_COMPILES = flags.DEFINE_integer("quick_max_compiles", 2, "--quick: compiles per step in "
                                     "the search of the largest batch.")

MIB = 2 ** 20


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def versions() -> dict:
    return {"python": sys.version.split()[0], "jax": jax.__version__,
            "jaxlib": jaxlib.__version__, "flax": flax.__version__}


def bench(ds, preset: str, devices: int) -> dict:
    """One row; `ds` is the dp_step module (its Bench, flags and helpers)."""
    bench_ = ds.Bench(preset, devices)
    b = ds._BATCH.value
    clipper = ds.default_clipper()
    tag = f"[quick {preset} x{bench_.devices}]"
    steps = {"plain": bench_.plain_step(b), "dp": bench_.dp_step(clipper, b)}
    if _SIGMA0.value:
        steps["dp_sigma0"] = bench_.dp_step(clipper, b, noise_multiplier=0.0)
    low = f"dp_{_DP_PRECISION.value}" if _DP_PRECISION.value else None
    if low:
        steps[low] = bench_.dp_step(clipper, b)  # a new aggregator: traced afresh
    compiled, compile_s = {}, {}
    for name, (fn, args) in steps.items():
        with _dp_precision(_DP_PRECISION.value if name == low else None):
            compiled[name], compile_s[name] = ds.Bench.compile(fn, args)
        _log(f"{tag} {name} compiled in {compile_s[name]:.1f} s, temp "
             f"{ds.temp_bytes(compiled[name]) / MIB:.0f} MiB")
    per_leaf_s = None
    if _PER_LEAF.value:
        per_leaf_s = ds.Bench.compile(*bench_.dp_step(clipper, b, noise_flat=False))[1]
        _log(f"{tag} dp with the noise drawn leaf by leaf compiled in {per_leaf_s:.1f} s")
    trainer_plain_s = None
    if _TRAINER_PLAIN.value:
        trainer_plain_s = ds.Bench.compile(*bench_.trainer_plain_step(b))[1]
        _log(f"{tag} the trainer's non-private step compiled in {trainer_plain_s:.1f} s")
    jax_prng_s = None
    if _JAX_PRNG.value:
        with _generator("jax"):
            jax_prng_s = ds.Bench.compile(*bench_.dp_step(clipper, b))[1]
        _log(f"{tag} dp with jax.random's generator compiled in {jax_prng_s:.1f} s")
    times = ({} if ds._COMPILE_ONLY.value
             else ds.time_interleaved(steps, compiled, ds._ROUNDS.value,
                                      _PROFILE_DIR.value))
    if times:  # logged before the search, so a part cut short by its timeout still has them
        _log(f"{tag} step s: " + ", ".join(f"{k} {statistics.median(v):.4f}"
                                           for k, v in times.items())
             + f" (median of {len(times['dp'])} rounds)")
    cap = ds.memory_cap(preset)
    search = max(ds._SEARCH_BATCH.value, bench_.devices)
    makers = {"plain": lambda m, n: bench_.plain_step(m, n),
              "dp": lambda m, n: bench_.dp_step(clipper, m, n)}
    row = {"mode": "quick", "model": preset, "params": bench_.num_params,
           "devices": bench_.devices, "platform": jax.devices()[0].platform,
           "device_kind": jax.devices()[0].device_kind, "batch_size": b,
           "seq_len": ds._SEQ.value, "dtype": ds._DTYPE.value, "task": ds._TASK.value,
           "clipper": clipper, "generator": prng.generator(),
           "cuda_threefry_kernel": prng.CUDA_KERNEL_TARGET in compiled["dp"].as_text(),
           "noise_flat": bool(bench_.aggregator(clipper).noise_flat),
           "memory_cap_mib": cap / MIB, "versions": versions()}
    for name in ("plain", "dp"):
        found = (ds.largest_microbatch(makers[name], search, bench_.devices, cap,
                                       (b, ds.temp_bytes(compiled[name])), _MAX_COMPILES.value)
                 if ds._SEARCH.value else (None, None, 0))
        row[name] = {"compile_s": compile_s[name], **ds.fusion_counts(compiled[name]),
                     "temp_mib": ds.temp_bytes(compiled[name]) / MIB,
                     "total_mib": ds.total_bytes(compiled[name]) / MIB,
                     "s": statistics.median(times[name]) if times else None,
                     "max_batch": found[0],
                     "max_batch_temp_mib": None if found[1] is None else found[1] / MIB}
    ratio = lambda k: (row["dp"][k] / row["plain"][k]  # noqa: E731
                       if row["dp"][k] and row["plain"][k] else None)
    row["compile_ratio"] = ratio("compile_s")
    row["distinct_fusions_ratio"] = ratio("distinct_fusions")
    row["temp_memory_ratio"] = ratio("temp_mib")
    row["max_batch_ratio"] = ratio("max_batch")
    row["time_ratio"] = (statistics.median([d / p for d, p in zip(times["dp"], times["plain"])])
                         if times else None)
    if "dp_sigma0" in steps:  # the search is for the two steps above only
        row["dp_sigma0"] = {"compile_s": compile_s["dp_sigma0"],
                            "temp_mib": ds.temp_bytes(compiled["dp_sigma0"]) / MIB,
                            "s": statistics.median(times["dp_sigma0"]) if times else None}
        row["sigma0_time_ratio"] = (statistics.median(
            [z / p for z, p in zip(times["dp_sigma0"], times["plain"])]) if times else None)
    if low:
        row[low] = {"compile_s": compile_s[low], "temp_mib": ds.temp_bytes(compiled[low]) / MIB,
                    "s": statistics.median(times[low]) if times else None}
        row[f"{low}_time_ratio"] = (statistics.median(
            [z / p for z, p in zip(times[low], times["plain"])]) if times else None)
    if per_leaf_s is not None:
        row["per_leaf_compile_s"] = per_leaf_s
        row["per_leaf_compile_ratio"] = per_leaf_s / compile_s["plain"]
    if trainer_plain_s is not None:
        row["trainer_plain_compile_s"] = trainer_plain_s
        row["trainer_compile_ratio"] = compile_s["dp"] / trainer_plain_s
    if jax_prng_s is not None:
        row["jax_prng_compile_s"] = jax_prng_s
        row["jax_prng_compile_ratio"] = jax_prng_s / compile_s["plain"]
    _log(f"{tag} DP / non-DP compile ratio {row['compile_ratio']:.2f}x")
    return row


@contextlib.contextmanager
def _dp_precision(name: str | None):
    """The clippers' float32 contractions at `name` (None: as they are) while tracing inside:
    the module constants `ghost._HIGHEST` and `mixed_ghost._HIGHEST`, read when traced."""
    if not name:
        yield
        return
    from dpbert.dp import ghost, mixed_ghost  # noqa: PLC0415

    before = ghost._HIGHEST, mixed_ghost._HIGHEST  # noqa: SLF001
    ghost._HIGHEST = mixed_ghost._HIGHEST = getattr(jax.lax.Precision, name.upper())  # noqa: SLF001
    _log(f"[quick] the clipping's contractions at precision {name} (a measurement, not private)")
    try:
        yield
    finally:
        ghost._HIGHEST, mixed_ghost._HIGHEST = before  # noqa: SLF001


@contextlib.contextmanager
def _generator(name: str):
    """`prng.generator()` returns `name` while tracing inside (it reads DPBERT_PRNG then)."""
    before = os.environ.get(prng.GENERATOR_ENV)
    os.environ[prng.GENERATOR_ENV] = name
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(prng.GENERATOR_ENV, None)
        else:
            os.environ[prng.GENERATOR_ENV] = before


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def line(row: dict) -> str:
    """One readable line per row (without --json)."""
    p, d = row["plain"], row["dp"]
    s = (f"{row['model']} x{row['devices']} {row['platform']} {row['dtype']} batch "
         f"{row['batch_size']} ({row['clipper']}, {row['generator']}): compile non-DP "
         f"{p['compile_s']:.1f} s, DP {d['compile_s']:.1f} s ({_x(row['compile_ratio'])}; "
         f"distinct fusions {p['distinct_fusions']} / {d['distinct_fusions']}, "
         f"{_x(row['distinct_fusions_ratio'])}); "
         f"time ratio {_x(row['time_ratio'])}; temp {d['temp_mib']:.0f} / {p['temp_mib']:.0f} "
         f"MiB ({_x(row['temp_memory_ratio'])}); largest batch {d['max_batch']} / "
         f"{p['max_batch']}")
    if "trainer_compile_ratio" in row:
        s += (f"; the trainer's non-private step {row['trainer_plain_compile_s']:.1f} s (DP / it "
              f"{_x(row['trainer_compile_ratio'])})")
    if "per_leaf_compile_s" in row:
        s += (f"; DP with the noise leaf by leaf {row['per_leaf_compile_s']:.1f} s "
              f"({_x(row['per_leaf_compile_ratio'])})")
    return s
