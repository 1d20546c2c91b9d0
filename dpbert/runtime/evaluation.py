"""Held-out evaluation on the loop: the task's metrics over (a prefix of) the eval split, in
fixed batches with a mask, and the run's closing summary line."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import ml_collections
import numpy as np

from dpbert.reporting import report as report_lib
from dpbert.runtime import sharding


@dataclasses.dataclass
class Evaluator:
    """Task metrics over (a prefix of) the held-out split, in fixed batches with a mask.

    task: the run's `loop.Task`; data: its `loop.TaskData` (the eval split, and what the
    task's `eval_metrics` reads); fn: the jitted (params, batch, mask, operand, index) ->
    `task.eval_step`'s outputs."""

    task: Any
    fn: Callable
    data: Any
    config: ml_collections.ConfigDict
    mesh: Any
    operand: Any

    def __call__(self, params) -> dict[str, float]:
        dataset = self.data.eval
        if dataset is None:
            return {}
        size = self.config.train.eval_batch_size
        n_dev = jax.device_count()
        size = max(size - size % n_dev, n_dev)
        n = dataset.num_examples
        num_batches = math.ceil(n / size)
        if self.config.train.eval_batches:
            num_batches = min(num_batches, self.config.train.eval_batches)
        rows = sharding.host_rows(size, sharding.batch_sharding(self.mesh))
        outputs = []
        for i in range(num_batches):
            idx = np.arange(i * size, (i + 1) * size)
            mask = idx < n
            local = dataset.get_batch(np.where(mask, idx, 0)[rows], step=0)
            batch = sharding.make_global_batch(local, self.mesh, size)
            m = sharding.make_global_batch({"m": mask[rows]}, self.mesh, size)["m"]
            outputs.append(jax.device_get(self.fn(params, batch, m, self.operand, i)))
        return {f"eval/{k}": v for k, v in self.task.eval_metrics(outputs, self.data).items()}


def summary_line(step: int, report: dict, initial: dict, final: dict, by_budget: bool) -> str:
    """The run's last console line: steps, the held-out metric before -> after, the epsilon."""
    parts = [f"done: {step} steps"]
    shown = [k for k in final if k.endswith(("accuracy", "f1"))][:1]
    for key in shown:
        name = key.split("/", 1)[-1].replace("_", " ")
        parts.append(f"held-out {name} {initial[key]:.3f} -> {final[key]:.3f}"
                     if key in initial else f"held-out {name} {final[key]:.3f}")
    if report.get("dp"):
        t = report["training"]
        mechanism, sampling = report_lib.mechanism_and_sampling(t)
        parts.append(f"training epsilon = {t['epsilon']:.4f} at delta = {t['delta']:g} "
                     f"({mechanism}, {t['accountant']}, {sampling} sampling)")
        if by_budget:
            parts.append("stopped by the privacy budget")
        parts.append(report["headline"])
    else:
        parts.append("no differential privacy (dp.enabled=False)")
    return " | ".join(parts)
