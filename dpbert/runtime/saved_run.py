"""A run's saved state in its workdir: the checkpoints with their privacy report
(`Saver`, used by the loop), and reading a saved step back (`load_saved_step`: exports, the
exposure test).

    WORKDIR/config.json          the run's config (CONFIG_FILE)
    WORKDIR/run.json             what an export needs: the task, model architecture, vocab, ...
                                 (RUN_FILE; its sha256 is in every checkpoint)
    WORKDIR/privacy_report.json  the report of the newest complete checkpoint (REPORT_FILE)
    WORKDIR/checkpoints/STEP     orbax checkpoints (private: the run's secrets are in them)
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Any

import numpy as np

from dpbert.errors import ConfigError
from dpbert.runtime import checkpointing
from dpbert.runtime.hosts import write_json

CONFIG_FILE = "config.json"
RUN_FILE = "run.json"  # what an export needs: the task, model architecture, vocab, ...
REPORT_FILE = "privacy_report.json"


class Saver:
    """Checkpoints + the report: privacy_report.json is written only for a step whose
    checkpoint is complete, so the report is never newer than the newest checkpoint."""

    def __init__(self, ckpt, workdir, signature, secret, *, data_hash, run_hash, task_key, plan,
                 sampler, report_at, inherited=()):
        self.ckpt, self.workdir, self.plan, self.sampler = ckpt, workdir, plan, sampler
        self.report_at = report_at
        self.fixed = {"signature": signature, "secret_randomness": secret,
                      "data_fingerprint": data_hash, "run_sha256": run_hash,
                      "task_key": [int(x) for x in np.asarray(task_key).reshape(-1)],
                      # The starting model's DP-SGD segments composed into this run's epsilon.
                      "inherited": list(inherited)}
        self.pending: tuple[int, dict] | None = None

    def save(self, step: int, state, by_budget: bool = False) -> None:
        self._flush()
        report = self.report_at(step, by_budget)
        if step not in self.ckpt.all_steps():  # the periodic save may have written it
            # The checkpoint is private: the sampler's secret seed, and in `state` the secret
            # noise key and the un-noised accumulator.
            ledger = self.plan.ledger
            self.ckpt.save(step, state, {
                "step": step, **self.fixed, "sampler": self.sampler.state_dict(),
                "accounting": (ledger.to_json(step - ledger.closed_steps)
                               if ledger is not None else None),
                "privacy_report": report})
        self.pending = (step, report)

    def _flush(self, durable: bool = False) -> dict | None:
        """Writes the pending report once its checkpoint is complete (with `durable`, once it
        is also flushed to disk)."""
        if self.pending is None:
            return None
        self.ckpt.wait()
        step, report = self.pending
        self.pending = None
        if self.ckpt.latest_step() != step:
            raise OSError(f"the checkpoint of step {step} was not written (disk full?); "
                          f"privacy_report.json stays at the newest intact checkpoint "
                          f"(step {self.ckpt.latest_step()})")
        if durable:
            self.ckpt.sync(step)
        write_json(self.workdir / REPORT_FILE, report)
        return report

    def close(self, durable: bool = False) -> dict | None:
        """Waits for the pending save (`durable`: and fsyncs it), writes its report, closes."""
        report = self._flush(durable)
        self.ckpt.close()
        return report


def fresh_start_message(ckpt, damaged: set[int]) -> str:
    """What a run without a usable checkpoint says: that it starts at step 0, and why when the
    folder is not empty (an unfinished save of a killed run, damaged steps)."""
    unfinished = ckpt.unfinished_saves()
    why = []
    if unfinished:
        why.append(f"unfinished save(s) {', '.join(unfinished)} of a run killed while saving "
                   "are ignored")
    if damaged:
        why.append(f"damaged step(s) {sorted(damaged)}")
    return (f"no checkpoint in {ckpt.directory}" + (f" ({'; '.join(why)})" if why else "")
            + ": starting fresh at step 0")


def run_info_hash(run_info: dict) -> str:
    """sha256 of run.json's content (stored in every checkpoint, checked on export)."""
    blob = json.dumps(run_info, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def load_saved_step(workdir: str | os.PathLike, step: int | None = None
                    ) -> tuple[dict[str, Any], Any, dict[str, Any], int]:
    """(run.json, parameters as host arrays, meta, step) of a saved step (default: the newest)
    of a training workdir; a run.json that does not match the checkpoint is refused."""
    workdir = pathlib.Path(workdir)
    run_file = workdir / RUN_FILE
    if not run_file.is_file():
        raise FileNotFoundError(f"{run_file}: missing; is {workdir} a dpbert training workdir?")
    run_info = json.loads(run_file.read_text())
    ckpt = checkpointing.Checkpointer(workdir / "checkpoints", async_save=False)
    try:
        steps = ckpt.all_steps()
        if not steps:
            raise FileNotFoundError(f"{workdir / 'checkpoints'}: no checkpoint")
        if step is None:
            step = max(steps)
        elif step not in steps:
            raise ValueError(f"{workdir}: no checkpoint at step {step}; saved steps: {steps}")
        params, meta = ckpt.restore_params(step)
    finally:
        ckpt.close()
    if meta.get("run_sha256") not in (None, run_info_hash(run_info)):
        raise ConfigError(f"{run_file} does not match the checkpoint of step {step} (it was "
                          "rewritten by another run, or copied from another workdir); refusing "
                          "to use it")
    return run_info, params, meta, int(step)
