"""Exporting a saved step of a training workdir with its task's export: the one place that
looks a task up by the name its run.json records (the loop never imports a task)."""

from __future__ import annotations

import os
import pathlib

from data_pipelines import fileio
from dpbert import tasks
from dpbert.errors import ConfigError
from dpbert.runtime.saved_run import load_saved_step


def export_from_workdir(workdir: str | os.PathLike, out: str | os.PathLike,
                        step: int | None = None) -> pathlib.Path:
    """Exports a saved step (default: the newest) of a training workdir with its task's export
    and that step's privacy report."""
    # Not the workdir itself, nor a folder holding it (the export's swap would delete it);
    # WORKDIR/hf, where training exports, is fine.
    problem = fileio.path_problem(out, sources=[(f"workdir {workdir}", workdir)],
                                  inside_sources_ok=True)
    if problem:
        raise ConfigError(f"{out}: {problem}")
    workdir = pathlib.Path(workdir)
    run_info, params, meta, step = load_saved_step(workdir, step)
    task = tasks.get_task(run_info.get("task", "pretraining"))
    out = pathlib.Path(out)
    task.export(params, run_info, workdir, out, meta.get("privacy_report"))
    return out
