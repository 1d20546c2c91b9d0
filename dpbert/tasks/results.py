"""WORKDIR/results.json of a fine-tuning run: the final held-out metrics, the schedule and the
privacy of everything the run did (input mode, DP-SGD, the starting model's lineage)."""

from __future__ import annotations

import json
import pathlib
import time

from dpbert.runtime.saved_run import RUN_FILE
from dpbert.tasks import recipe, schedule

RESULTS_FILE = "results.json"
# Fields of an input mode's report that results.json's privacy block repeats at its top level.
REPORTED_FIELDS = ("variant", "epsilon_claimed", "epsilon_true")


def final_eval(workdir: pathlib.Path) -> dict[str, float]:
    """The last held-out metrics the loop wrote (the final evaluation comes last)."""
    last: dict[str, float] = {}
    path = workdir / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if any(k.startswith("eval/") for k in record):
                last = {k[len("eval/"):]: v for k, v in record.items() if k.startswith("eval/")}
    return last


def collect(task_name: str, config, workdir: pathlib.Path, report: dict, *, num_train: int,
            eta: float | None, started: float) -> dict:
    """results.json's content after `loop.run` returned `report` (the run's privacy report);
    `eta`: the input mode's η (None: it has none), `started`: the run's start (time.time())."""
    run = json.loads((workdir / RUN_FILE).read_text())
    metrics = final_eval(workdir)
    return {"task": task_name, **{f"eval_{k}": v for k, v in metrics.items()},
            "num_train_examples": num_train, "num_eval_examples": run["num_eval_examples"],
            "labels": run["labels"], "schedule": schedule.schedule_report(config, num_train),
            "recipe": recipe.report(config),
            "steps": report["steps"],
            # What trained (train.trainable): its parameter count is the d of σ·√d / B.
            "trainable": run.get("trainable"),
            "privacy": {"mode": config.privacy.mode, "eta": eta,
                        **{k: run["input_privacy"][k] for k in REPORTED_FIELDS
                           if k in run["input_privacy"]},
                        "frozen": run["input_privacy"]["frozen"],
                        "input_privacy": run["input_privacy"],
                        "privacy_unit": run["unit_definition"],
                        "dp_sgd": report if report.get("dp") else None,
                        "dp_sgd_headline": report.get("headline")},
            "model": {"init_from_hf": config.model.init_from_hf,
                      "hf_export": str(workdir / "hf") if config.train.export_hf else None},
            "wall_seconds": time.time() - started}
