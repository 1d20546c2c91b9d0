r"""A checkpoint save with orbax's replica-parallel slicing of every array versus dpbert's.

    PYTHONPATH=. python benchmarks/checkpoint_save.py [--models=tiny,mini] [--devices=8]
        [--rounds=3] [--json]

orbax writes a replicated array "replica-parallel": each of the R devices holding a copy writes
1/R of it, cut out with an eager slice per device (a small program per slice shape and device,
compiled at the process's first save).  dpbert registers orbax's jax.Array handler with
`min_slice_bytes_for_replica_parallel` = `checkpointing.MIN_REPLICA_SLICE_BYTES` (1 MiB), so
smaller arrays are written whole by their first replica
(`dpbert.runtime.checkpointing.register_array_handler`).  For each model: the training
state's arrays as a run checkpoints them (parameters and AdamW's two moments, float32,
replicated on a mesh of `--devices` CPU devices), saved three times through
`dpbert.runtime.checkpointing.Checkpointer` (asynchronous, as the trainer does) in a fresh
process per (handler, round), rounds interleaved: the first save of a process (the slices'
programs compiled; JAX's persistent compilation cache off) and the next two (warm), each the
seconds until `save` returns (what the training loop waits for) and until the write is done.
Printed: medians and the orbax / dpbert ratios; the restored state is checked equal.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from absl import app, flags

_MODELS = flags.DEFINE_list("models", ["tiny", "mini"], "BERT presets.")
_DEVICES = flags.DEFINE_integer("devices", 8, "Simulated CPU devices holding the copies.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Fresh processes per handler.")
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object per model.")

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HANDLERS = ("orbax", "dpbert")

# One process: build the state, register the handler, save three times, check a restore.
_CHILD = r"""
import json, sys, tempfile, time
import jax, numpy as np
from flax import nnx
from dpbert.models import bert as model_lib
from dpbert.runtime import checkpointing
preset, handler = sys.argv[1], sys.argv[2]
cfg = model_lib.BertConfig.preset(preset, 30522, max_position_embeddings=512)
params = nnx.state(nnx.eval_shape(lambda: model_lib.create_model(cfg)), nnx.Param)
rng = np.random.default_rng(0)
mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
leaves = [rng.standard_normal(x.shape).astype(np.float32) for x in jax.tree.leaves(params)]
state = {name: [jax.device_put(x, replicated) for x in leaves] for name in ("params", "mu", "nu")}
ckpt = checkpointing.Checkpointer(tempfile.mkdtemp(), max_to_keep=1, async_save=True)
checkpointing.register_array_handler(None if handler == "orbax" else
                                     checkpointing.MIN_REPLICA_SLICE_BYTES)
saves = []
for step in (1, 2, 3):
    start = time.perf_counter()
    ckpt.save(step, state, {"step": step})
    returned = time.perf_counter()
    ckpt.wait()
    saves.append({"returned_s": returned - start, "done_s": time.perf_counter() - start})
restored, _ = ckpt.restore(3, checkpointing.abstract_like(state))
assert all(np.array_equal(np.asarray(a), np.asarray(b))
           for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)))
ckpt.close()
print(json.dumps({"saves": saves, "arrays": 3 * len(leaves),
                  "mib": 3 * sum(x.nbytes for x in leaves) / 2 ** 20}))
"""


def _run(model: str, handler: str) -> dict:
    env = dict(os.environ, PYTHONPATH=HERE, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={_DEVICES.value}")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", _CHILD, model, handler], cwd=HERE, env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{handler} on {model} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(runs: list[dict], first: bool, key: str) -> float:
    return statistics.median(
        s[key] for r in runs for s in (r["saves"][:1] if first else r["saves"][1:]))


def main(argv):
    del argv
    for model in _MODELS.value:
        runs = {h: [] for h in HANDLERS}
        for r in range(_ROUNDS.value):
            for h in HANDLERS:
                runs[h].append(_run(model, h))
            print(f"[{model}] round {r + 1}/{_ROUNDS.value} done", file=sys.stderr, flush=True)
        row = {"model": model, "devices": _DEVICES.value, "rounds": _ROUNDS.value,
               "arrays": runs["dpbert"][0]["arrays"], "mib": runs["dpbert"][0]["mib"]}
        for which, first in (("first", True), ("later", False)):
            for key in ("returned_s", "done_s"):
                sec = {h: _median(runs[h], first, key) for h in HANDLERS}
                row[f"{which}_{key}"] = sec
                row[f"{which}_{key}_ratio"] = sec["orbax"] / sec["dpbert"]
        print(f"[{model}] {row['arrays']} arrays, {row['mib']:.0f} MiB on {_DEVICES.value} "
              "devices; seconds orbax / dpbert (ratio): " + "; ".join(
                  f"{w} save {k.split('_')[0]} {row[f'{w}_{k}']['orbax']:.2f} / "
                  f"{row[f'{w}_{k}']['dpbert']:.2f} ({row[f'{w}_{k}_ratio']:.2f}x)"
                  for w in ("first", "later") for k in ("returned_s", "done_s")),
              file=sys.stderr, flush=True)
        if _JSON.value:
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    app.run(main)
