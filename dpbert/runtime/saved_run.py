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
from dpbert.runtime.evaluation import summary_line
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


def finished(workdir: pathlib.Path, config, saved: dict | None) -> dict | None:
    """The saved report of a run that `config` would not train further, or None: its newest
    checkpoint (`saved`, its meta) is at train.num_steps or was stopped by the same budget
    (dp.target_epsilon / dp.total_epsilon as then), and its export of that step is in
    WORKDIR/hf. A rerun of a finished run then exits at once (no data, compile or evaluation;
    a damaged checkpoint is not noticed then: the export is what the run delivered)."""
    if not saved or not saved.get("privacy_report"):
        return None
    report = saved["privacy_report"]
    try:  # the final save's report (a periodic save of the same step may hold an older one)
        written = json.loads((workdir / REPORT_FILE).read_text(encoding="utf-8"))
        if written.get("steps") == report.get("steps"):
            report = written
    except (OSError, ValueError):
        pass
    # Only once the run's export of that step is written (a run stopped between its last
    # save and the export, or one without an export, goes the long way: restore, export).
    try:
        exported = json.loads((workdir / "hf" / REPORT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not config.train.export_hf or exported.get("steps") != int(saved["step"]):
        return None
    if int(saved["step"]) >= config.train.num_steps:
        return report
    training = report.get("training") or {}
    if not training.get("stopped_by_budget"):
        return None
    budget = report.get("budget") or {}
    then = ((budget.get("total_epsilon"), budget.get("target_epsilon")) if budget else
            (None, training.get("target_epsilon")))
    now = (config.dp.get("total_epsilon"), config.dp.target_epsilon)
    return report if then == now else None


def finished_summary(workdir: pathlib.Path, step: int, report: dict) -> str:
    """The closing line of a finished run, from its report and metrics.jsonl."""
    evals = {}
    try:
        with open(workdir / "metrics.jsonl", encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                if any(k.startswith("eval/") for k in row):
                    evals.setdefault(row["step"], {}).update(row)
    except (OSError, ValueError):
        pass
    by_budget = bool((report.get("training") or {}).get("stopped_by_budget"))
    return summary_line(step, report, evals.get(0, {}) if step else {}, evals.get(step, {}),
                        by_budget)


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
