"""The processes of a run: which one writes, how they wait for it, and progress lines.

Every process of a multi-host run executes the same program; process 0 (the primary) writes the
shared workdir's files and prints, the others wait for it where they read what it wrote.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jax
from absl import logging
from jax.experimental import multihost_utils

from data_pipelines import fileio


def is_primary() -> bool:
    return jax.process_index() == 0


def sync(what: str) -> None:
    """All processes wait for process 0 (which wrote `what` to the shared workdir)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(f"dpbert:{what}")


def write_json(path: pathlib.Path, obj: Any) -> None:
    """Atomically (temp file + rename), on process 0 only."""
    if is_primary():
        fileio.atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True,
                                                  default=str) + "\n")


def announce(message: str) -> None:
    """A progress line (logged; printed by process 0) for stages that can take a minute."""
    logging.info(message)
    if is_primary():
        print(message, flush=True)
