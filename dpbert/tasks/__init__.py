"""Tasks on the one DP training loop (`dpbert.runtime.loop`): each is its data, its per-example
loss, its eval and its export. A new task is a module here (with a module-level `TASK` object)
and one entry in `_TASKS`; a fine-tuning task (a `finetuning.FineTuningTask`) then runs with
launch/finetune.py and `--config.task=NAME`.

    pretraining.py      BERT MLM + NSP (launch/train.py)
    classification.py   sentence (pair) classification      } fine-tuning tasks:
    ner.py              token classification (BIO tags)     } finetuning.py is what they share
    finetuning.py  release.py  schedule.py  results.py  starting_model.py  task_losses.py
    input_modes/        privacy.mode: what the users release (dχ, OME, TextHide)
    export.py           a saved step of a workdir -> its task's export (launch/export_hf.py)
"""

import importlib

_TASKS = {"pretraining": "dpbert.tasks.pretraining",
          "classification": "dpbert.tasks.classification",
          "ner": "dpbert.tasks.ner"}


def get_task(name: str):
    """The task object registered under `name` (what run.json's "task" names): its module's
    `TASK`, one object for every run (tasks hold no run state)."""
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; known: {sorted(_TASKS)}")
    return importlib.import_module(_TASKS[name]).TASK


def task_names() -> tuple[str, ...]:
    return tuple(sorted(_TASKS))
