r"""The DP step's compile time as a run pays it: each step compiled once, in a fresh process.

    PYTHONPATH=. python benchmarks/compile_fresh.py [--models=tiny,mini] [--rounds=4] [--json]
    PYTHONPATH=. python benchmarks/compile_fresh.py --base=/path/to/other/checkout

`dp_step.py --quick` compiles its steps one after another in one process, so each after the
first finds JAX's tracing caches warm; a training run compiles its step once, cold.  Here every
(step, round) is its own process: the non-private step, the default DP step with sigma = 0
(clipping only) and the DP step (clipping and noise), BERT of each size, batch 32, seq 128, one
CPU device, timed from `jit(...).lower` to the end of `.compile()` (tracing + XLA), rounds
interleaved; printed: the median seconds and the DP / non-DP ratio (issue 32's goal: <= 1.3),
the same against the trainer's own non-private step (`Bench.trainer_plain_step`: what
dp.enabled=False compiles, where "plain" is a minimal hand-written step),
and the same for the CPU seconds the process spent (XLA compiles on every core: less sensitive
to a busy machine than the wall clock, which varies by +-20 % from run to run on 2 cores).
`--base`: the same, side by side, for another checkout of the code (e.g. the commit before a
change), rounds interleaved with this one's.

`--target=h100`: XLA:GPU's compile of the same steps for one NVIDIA H100, on this machine
without a GPU (JAX's deviceless ahead-of-time compile: a topology from the H100's target
description, `accelerator/h100_target.txtpb`; abstract arguments on it).  It needs JAX's CUDA
plugin for the installed jax, e.g. in a copy of the environment (`--python`):

    cp -a .venv /tmp/gpu-venv && /tmp/gpu-venv/bin/pip install jax-cuda13-plugin==$JAX \
        jax-cuda13-pjrt==$JAX        # $JAX: the installed jax's version, e.g. 0.10.2
    PYTHONPATH=. .venv/bin/python benchmarks/compile_fresh.py --target=h100 --models=tiny,base \
        --python=/tmp/gpu-venv/bin/python [--base=/path/to/other/checkout]

dpbert's default generator is resolved as in a process with that one GPU (`dpbert.prng`: JAX's
threefry kernel).  No GPU runs anything and nothing is autotuned (no device to time on), so
the seconds are XLA:GPU's passes and code generation on this machine's CPU, not a device's
start-up; the row also gives each step's fused computations and XLA's temp memory for the GPU.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from absl import app, flags

_MODELS = flags.DEFINE_list("models", ["tiny", "mini"], "BERT presets.")
_ROUNDS = flags.DEFINE_integer("rounds", 4, "Fresh-process compiles per step and checkout.")
_BASE = flags.DEFINE_string("base", "", "Another checkout to measure side by side.")
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object per model.")
_TARGET = flags.DEFINE_enum("target", "cpu", ["cpu", "h100"], "cpu: one CPU device; h100: "
                            "XLA:GPU's compile for one H100, without a GPU (see above).")
_PYTHON = flags.DEFINE_string("python", sys.executable, "The children's interpreter (for "
                              "--target=h100 one with JAX's CUDA plugin).")

STEPS = ("plain", "trainer_plain", "dp_sigma0", "dp")
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = {"h100": os.path.join(HERE, "benchmarks", "accelerator", "h100_target.txtpb")}

# One compile, in the checkout given as the working directory (dp_step's Bench builds it).
_CHILD = r"""
import json, sys, time
sys.path[:0] = ["benchmarks", "."]
import dp_step as ds
from absl import flags
model, step, target = sys.argv[1], sys.argv[2], sys.argv[3]
flags.FLAGS([sys.argv[0], f"--models={model}", "--devices=1"])
bench = ds.Bench(model, 1)
b = ds._BATCH.value
if step == "trainer_plain" and not hasattr(ds.Bench, "trainer_plain_step"):
    print(json.dumps(None))  # a --base checkout from before it
    sys.exit(0)
fn, args = (bench.plain_step(b) if step == "plain" else
            bench.trainer_plain_step(b) if step == "trainer_plain" else
            bench.dp_step(ds.default_clipper(), b,
                          noise_multiplier=0.0 if step == "dp_sigma0" else 1.0))
if target:  # deviceless: XLA:GPU for the target's one device, abstract arguments on it
    import jax
    from jax.experimental import topologies
    from dpbert import prng
    if hasattr(prng, "_one_gpu"):  # its default generator as in a process with that one GPU
        prng._one_gpu = lambda: True
    topology = topologies.get_topology_desc(platform="cuda", topology="1x1x1",
                                            target_config=open(target).read())
    one = jax.sharding.NamedSharding(topologies.make_mesh(topology, (1,), ("d",)),
                                     jax.sharding.PartitionSpec())
    args = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), args)
    fn = jax.jit(fn.__wrapped__, donate_argnums=(0, 1) if step == "plain" else (1, 2))
try:  # as the training loop compiles (dpbert.runtime.compile_cache.compile_ahead)
    from dpbert.runtime.compile_cache import gc_paused
except ImportError:  # a --base checkout from before it
    import contextlib
    gc_paused = contextlib.nullcontext
with gc_paused():
    start, cpu = time.perf_counter(), time.process_time()
    lowered = fn.lower(*args)
    mid = time.perf_counter()
    compiled = lowered.compile()
row = {"lower_s": mid - start, "compile_s": time.perf_counter() - mid,
       "cpu_s": time.process_time() - cpu,
       "temp_mib": compiled.memory_analysis().temp_size_in_bytes / 2 ** 20}
if hasattr(ds, "fusion_counts"):
    row.update(ds.fusion_counts(compiled))
print(json.dumps(row))
"""


def _compile_once(root: str, model: str, step: str) -> dict:
    env = dict(os.environ, PYTHONPATH=root)
    target = TARGETS.get(_TARGET.value, "")
    if target:
        env["JAX_PLATFORMS"] = "cpu"  # no GPU here: JAX's CUDA backend is not started
    out = subprocess.run([_PYTHON.value, "-c", _CHILD, model, step, target], cwd=root,
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{step} on {model} in {root} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _summary(runs: dict[str, list[dict]]) -> dict:
    steps = [s for s in STEPS if all(r is not None for r in runs[s])]
    total = {s: statistics.median(r["lower_s"] + r["compile_s"] for r in runs[s]) for s in steps}
    cpu = {s: statistics.median(r["cpu_s"] for r in runs[s]) for s in steps}
    trainer = "trainer_plain" in total
    return {"seconds": total, "cpu_seconds": cpu, "cpu_compile_ratio": cpu["dp"] / cpu["plain"],
            "lower_s": {s: statistics.median(r["lower_s"] for r in runs[s]) for s in steps},
            "temp_mib": {s: statistics.median(r["temp_mib"] for r in runs[s]) for s in steps},
            "distinct_fusions": {s: runs[s][0].get("distinct_fusions") for s in steps},
            "compile_ratio": total["dp"] / total["plain"],
            "sigma0_compile_ratio": total["dp_sigma0"] / total["plain"],
            "trainer_compile_ratio": total["dp"] / total["trainer_plain"] if trainer else None,
            "runs": runs}


_PLUGIN_CHECK = ("import importlib.util, sys; sys.exit(not any(importlib.util.find_spec("
                 "f'jax_plugins.xla_cuda{v}') for v in (13, 12)))")


def main(argv):
    del argv
    if _TARGET.value != "cpu" and subprocess.run(
            [_PYTHON.value, "-c", _PLUGIN_CHECK], check=False).returncode:
        raise app.UsageError(
            f"--target={_TARGET.value} needs JAX's CUDA plugin in --python={_PYTHON.value} "
            "(pip install jax-cuda13-plugin==V jax-cuda13-pjrt==V, V its jax version; the "
            "module docstring has the commands)")
    roots = {"this": HERE}
    if _BASE.value:
        roots["base"] = os.path.abspath(_BASE.value)
    for model in _MODELS.value:
        runs = {name: {s: [] for s in STEPS} for name in roots}
        for r in range(_ROUNDS.value):
            for name, root in roots.items():
                for step in STEPS:
                    runs[name][step].append(_compile_once(root, model, step))
            print(f"[{model}] round {r + 1}/{_ROUNDS.value} done", file=sys.stderr, flush=True)
        row = {"model": model, "rounds": _ROUNDS.value, "target": _TARGET.value,
               **{name: _summary(runs[name]) for name in roots}}
        for name in roots:
            s = row[name]
            trainer = ("" if s["trainer_compile_ratio"] is None else
                       f"; the trainer's non-private step {s['seconds']['trainer_plain']:.2f} s: DP "
                       f"/ it {s['trainer_compile_ratio']:.2f}x")
            print(f"[{model}] {name}: plain {s['seconds']['plain']:.2f} s, DP sigma=0 "
                  f"{s['seconds']['dp_sigma0']:.2f} s, DP {s['seconds']['dp']:.2f} s: DP / "
                  f"non-DP {s['compile_ratio']:.2f}x (sigma=0 {s['sigma0_compile_ratio']:.2f}x); "
                  f"CPU seconds {s['cpu_seconds']['plain']:.2f} / {s['cpu_seconds']['dp_sigma0']:.2f}"
                  f" / {s['cpu_seconds']['dp']:.2f}: {s['cpu_compile_ratio']:.2f}x{trainer}",
                  file=sys.stderr, flush=True)
        if _JSON.value:
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    app.run(main)
