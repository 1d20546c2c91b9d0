"""What an input mode is (`InputMode`), what a task offers it (capabilities), and the folder
writer of the modes whose export is not a Hugging Face task model.

Capabilities: a fine-tuning task declares what its examples and model offer
(`FineTuningTask.capabilities`), a mode what it needs (`InputMode.needs`);
`dpbert.tasks.finetuning.validate_common` refuses a mode whose needs the task does not offer.
Neither names the other: a new task or a new mode is checked against every existing one.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import tempfile
from typing import Any, Callable

from dpbert.reporting import card, lineage
from dpbert.reporting import report as report_lib

# The encoder reads each example token by token (ids, or one vector per token): a release of
# tokens or of token vectors (mode none and the dχ token modes) fits.
TOKENS = "tokens"
# One label per example, predicted from ONE sentence vector (the pooled output): the head can
# read a released sentence vector (seq_rep, OME) or a hidden one (TextHide) instead.
SENTENCE = "sentence"
# One example is one sequence (not a document of several windows): the ghost clippers' factored
# loss applies (dp.clipping="auto" takes mixed_ghost where the mode offers that loss shape).
ONE_SEQUENCE = "one_sequence"
CAPABILITIES = {TOKENS: "examples the encoder reads token by token",
                SENTENCE: "one label per example, predicted from one sentence vector",
                ONE_SEQUENCE: "one sequence per example"}


class InputMode:
    """One value of `privacy.mode`: the users' side of the split model.

    A mode says what it needs of a task (`needs`, capabilities above) and which clipper loss
    shapes (`dpbert.dp.clipping.LOSS_SHAPES`) it supports: DP-SGD needs a per-example loss, so
    a mode whose loss mixes examples (TextHide) supports only "batch" and a DP run with it is
    refused. `loss` / `eval_logits` may replace the task's own (None = keep them); they read
    what the mode's user side keeps (`data.extra["user_side"]`) from the run's `TaskData`.
    """

    name: str = ""
    needs: tuple[str, ...] = (TOKENS,)
    loss_shapes: tuple[str, ...] = ("per_example", "batch")

    def validate(self, config) -> None: ...

    def user_side(self, config, model, vocab_file: str) -> Any:
        """An object with `release(features, key, *, split, epoch=None)` -> a split with
        `batch(indices)` and `len()`, and `report(*, epochs, secret_key)` -> dict."""
        raise NotImplementedError

    def eta(self, config) -> float | None:
        """The dχ η results.json reports (None: the mode has no η)."""
        return None

    def trainable(self, config) -> Callable | None:
        return None

    def frozen(self, config) -> list[str]:
        return []

    def loss(self, graphdef, config, shape: str, data) -> Callable | None:
        return None

    def eval_logits(self, graphdef, config, data) -> Callable | None:
        return None

    def batch_transform(self, config, data) -> Any:
        """A `dpbert.runtime.loop.BatchTransform` (None: none): how a secret the mode's loss
        or eval needs reaches the jitted step as an argument, not as a constant."""
        return None

    def export(self, params, run: dict, out: pathlib.Path, report: dict | None):
        """WORKDIR/hf when the trained model is not a plain HF task model (None = the task's
        own Hugging Face export)."""
        return None


def lineage_section(report: dict | None) -> list[str]:
    """The card lines on the starting model's privacy (`dpbert.reporting.lineage`), if it had
    any."""
    lines = card.lineage_lines(report or {})
    return ["## Starting model", "", *lines, ""] if lines else []


def write_folder(out: pathlib.Path, texts: dict, tensors: dict, save_file,
                 report: dict | None = None) -> pathlib.Path:
    """Writes `out` as a whole (a sibling temporary folder renamed into place), with the run's
    public privacy report (`report.public_report`: no exact corpus statistic)."""
    texts = {**texts, lineage.REPORT_FILE: json.dumps(report_lib.public_report(report),
                                                      indent=2, sort_keys=True) + "\n"}
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        for name, text in texts.items():
            (tmp / name).write_text(text, encoding="utf-8")
        for name, arrays in tensors.items():
            save_file(arrays, str(tmp / name))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out
