"""Tasks on the one DP training loop (`dpbert.runtime.loop`): each is its data, its per-example loss,
its eval and its export. A new task is a module here and one entry in `_TASKS`."""

import importlib

_TASKS = {"pretraining": "dpbert.tasks.pretraining",
          "classification": "dpbert.tasks.classification",
          "ner": "dpbert.tasks.ner"}


def get_task(name: str):
    """The task object registered under `name` (what run.json's "task" names)."""
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; known: {sorted(_TASKS)}")
    return importlib.import_module(_TASKS[name]).TASK


def task_names() -> tuple[str, ...]:
    return tuple(sorted(_TASKS))
