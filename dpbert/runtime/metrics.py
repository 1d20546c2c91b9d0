"""Training metrics: TensorBoard event files, a JSON-lines log, and a console progress line.

Everything written here is an aggregate over a whole batch (totals of per-example sums divided by
totals of counts), never a per-example value (DESIGN.md, privacy rules). Only process 0 writes.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import sys
import time
from typing import Mapping

import jax
import numpy as np


def summarize(sums: Mapping[str, float], prefix: str = "") -> dict[str, float]:
    """Batch totals of the loss's per-example metric sums -> means.

    Expects keys mlm_loss_sum, mlm_correct, mlm_weight, nsp_loss, nsp_correct, count.
    """
    count = max(float(sums.get("count", 0.0)), 1.0)
    weight = max(float(sums.get("mlm_weight", 0.0)), 1.0)
    out = {
        "mlm_loss": float(sums["mlm_loss_sum"]) / weight,
        "mlm_accuracy": float(sums["mlm_correct"]) / weight,
        "nsp_loss": float(sums["nsp_loss"]) / count,
        "nsp_accuracy": float(sums["nsp_correct"]) / count,
    }
    out["loss"] = out["mlm_loss"] + out["nsp_loss"]
    return {prefix + k: v for k, v in out.items()}


def _fmt_seconds(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s"


def _summary_writer():
    """tensorboardX's SummaryWriter class, imported without PyTorch where PyTorch is not loaded
    yet: tensorboardX tries `import torch` only to accept torch tensors (we write floats), and
    that import was 1.5 s of every launcher's start.  A None entry in sys.modules makes the
    import raise ImportError, which tensorboardX expects (it works without PyTorch)."""
    if "tensorboardX" in sys.modules or "torch" in sys.modules:
        from tensorboardX import SummaryWriter  # noqa: PLC0415
        return SummaryWriter
    sys.modules["torch"] = None
    try:
        from tensorboardX import SummaryWriter  # noqa: PLC0415
    finally:
        del sys.modules["torch"]
    return SummaryWriter


class MetricWriter:
    """Writes scalars to TensorBoard (tensorboardX) and `metrics.jsonl` in the workdir."""

    def __init__(self, workdir: str | os.PathLike, *, enabled: bool | None = None):
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self.workdir = pathlib.Path(workdir)
        self._tb = None
        self._jsonl = None
        if self.enabled:
            self._tb = _summary_writer()(str(self.workdir / "tensorboard"))
            self._jsonl = open(self.workdir / "metrics.jsonl", "a", encoding="utf-8")

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        clean = {k: float(v) for k, v in scalars.items() if v is not None}
        for k, v in clean.items():
            self._tb.add_scalar(k, v, step)
        self._jsonl.write(json.dumps({"step": step, **clean}) + "\n")
        self._jsonl.flush()
        self._tb.flush()

    def close(self) -> None:
        if self.enabled:
            self._tb.close()
            self._jsonl.close()


class Progress:
    """A concise console line per logging interval: step, loss, accuracy, ε, throughput, ETA."""

    def __init__(self, total_steps: int, start_step: int = 0, stream=None):
        self.total = total_steps
        self.start_step = start_step
        self.start = time.time()
        self.stream = stream or sys.stdout
        self.enabled = jax.process_index() == 0

    def line(self, step: int, scalars: Mapping[str, float]) -> str:
        done = step - self.start_step
        elapsed = time.time() - self.start
        eta = elapsed / done * (self.total - step) if done > 0 else float("nan")
        parts = [f"step {step}/{self.total}"]
        # The task's first accuracy metric (mlm_accuracy for pretraining).
        accuracy = next((k for k in scalars if k.startswith("train/") and
                         k.endswith("accuracy")), None)
        short = accuracy[len("train/"):].replace("accuracy", "acc") if accuracy else ""
        for key, fmt in (("train/loss", "loss {:.3f}"), (accuracy, short + " {:.3f}"),
                         ("privacy/epsilon", "training eps {:.3f}"),
                         ("perf/examples_per_sec", "{:.1f} ex/s"),
                         ("perf/units_per_sec", "{:.1f} units/s")):
            if key in scalars and scalars[key] is not None and np.isfinite(scalars[key]):
                parts.append(fmt.format(scalars[key]))
        parts.append(f"ETA {_fmt_seconds(eta)}")
        return " | ".join(parts)

    def report(self, step: int, scalars: Mapping[str, float]) -> None:
        if self.enabled:
            print(self.line(step, scalars), file=self.stream, flush=True)
