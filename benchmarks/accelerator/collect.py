"""speed.sh's helper: the versions that ran, the demo's figures, and the one JSON of all parts.

    python benchmarks/accelerator/collect.py versions            > versions.json
    python benchmarks/accelerator/collect.py demo WORKDIR LOG    > demo.json
    python benchmarks/accelerator/collect.py combine PARTS_DIR   > $OUT/speed.json
"""

from __future__ import annotations

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
            "dm-tree", "portpicker", "tensorboardX", "torch", "transformers", "opacus", "numpy")


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


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "versions":
        print(json.dumps(versions()))
    elif what == "demo":
        print(json.dumps(demo(sys.argv[2], sys.argv[3])))
    elif what == "combine":
        print(json.dumps(combine(sys.argv[2]), indent=1))
    else:
        raise SystemExit(f"unknown: {what}")
