"""Hugging Face import/export of the fine-tuning models (`dpbert.models.heads`).

    load_task_model(folder, "sequence_classification", labels)   # any HF BERT folder
    save_task_model(model, out, vocab_file)                       # transformers loads it

Import reads a HF BERT folder of any of these layouts: `BertModel` (no `bert.` prefix, e.g.
MiniLM), `BertForPreTraining` / `BertForMaskedLM` (dpbert's own export included), or a
`BertForSequenceClassification` / `BertForTokenClassification` (continuing a fine-tuning).
The encoder (embeddings + layers) must be there; the pooler and the classifier are taken from the
source when it has them and initialised fresh (seeded) otherwise, named in a warning. Pretraining
heads (`cls.*`) and, for the token model, the pooler are not used (logged at INFO). A source
classifier is only taken over when its label names agree with `labels`: reusing a head whose
classes mean something else would be silently wrong, so that is a `CheckpointError`.

Export writes what `transformers` expects: `config.json` with `architectures`, `num_labels`,
`id2label`, `label2id`, `classifier_dropout` and, for sequence classification,
`problem_type = "single_label_classification"`; weights named as HF names them (the token model
has no pooler, as HF's `add_pooling_layer=False`), so `from_pretrained` reports no missing and no
unexpected key. Everything else (vocab, tokenizer config, model card, atomic write) is
`dpbert.models.hf_export.save_pretrained`.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
from typing import Any, Mapping, Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from dpbert.models import heads
from dpbert.models import hf, hf_export
from dpbert.models import bert as model_lib

logger = logging.getLogger(__name__)

CheckpointError = hf.CheckpointError

ARCHITECTURES = {
    "sequence_classification": "BertForSequenceClassification",
    "token_classification": "BertForTokenClassification",
}
_HEAD_PREFIXES = ("cls.", "classifier.")
_DEFAULT_LABEL = re.compile(r"LABEL_\d+")


def _source_labels(hf_config: Mapping[str, Any]) -> list[str] | None:
    """The label names of a HF config (id order), or None when it has none or only HF's
    placeholder names LABEL_i."""
    id2label = hf_config.get("id2label")
    if not id2label:
        return None
    try:
        names = [str(id2label[k]) for k in sorted(id2label, key=lambda k: int(k))]
    except (TypeError, ValueError):
        return None
    if all(_DEFAULT_LABEL.fullmatch(n) for n in names):
        return None
    return names


def load_task_model(path: str | os.PathLike, task: str, labels: Sequence[str] | int | None, *,
                    classifier_dropout: float | None = None, dtype: str = "float32",
                    seed: int = 0) -> tuple[nnx.Module, model_lib.BertConfig]:
    """A task model initialised from a HF BERT folder.

    Args:
      path: HF BERT folder (config.json + model.safetensors or pytorch_model.bin).
      task: "sequence_classification" or "token_classification".
      labels: label names (index = class id) or a count; None takes them from the folder's
        config.json (a fine-tuned folder).
      classifier_dropout: dropout before the classifier; None = the folder's
        `classifier_dropout`, else `hidden_dropout_prob` (HF's rule).
      dtype: compute dtype.
      seed: initialises whatever the folder lacks (pooler, classifier).

    Raises:
      CheckpointError: unreadable folder, a missing encoder weight, a wrong shape, or a source
        classifier whose labels differ from `labels`. Messages name the file and the key.
    """
    if task not in ARCHITECTURES:
        raise ValueError(f"unknown task {task!r}; choose one of {sorted(ARCHITECTURES)}")
    folder = pathlib.Path(path)
    config_file = folder / "config.json"
    hf_config, config = hf.read_config(folder, dtype=dtype)
    source_labels = _source_labels(hf_config)
    if labels is None:
        if source_labels is None:
            raise CheckpointError(f"{config_file}: has no label names (id2label); pass labels")
        labels = source_labels
    if classifier_dropout is None:
        classifier_dropout = hf_config.get("classifier_dropout")
    weights = hf._find_weights(folder)
    source = {hf._normalise_source_key(k): v for k, v in hf.read_state_dict(weights).items()}
    if not any(k.startswith("bert.") for k in source):  # a BertModel: no prefix
        source = {(k if k.startswith(_HEAD_PREFIXES) else "bert." + k): v
                  for k, v in source.items()}

    model = heads.create_task_model(task, config, labels, classifier_dropout=classifier_dropout,
                                    seed=seed)
    if "classifier.weight" in source and source_labels is not None and (
            list(model.labels) != source_labels):
        raise CheckpointError(
            f"{config_file}: the checkpoint's classifier was trained for labels {source_labels}, "
            f"but this task's labels are {list(model.labels)}; use the same labels in the same "
            "order, or start from a checkpoint without a classifier")
    fresh = []
    for p, var in hf._flat_params(model).items():
        key = hf.hf_key(p)
        if key not in source:
            if key.startswith(("bert.pooler.", "classifier.")):
                fresh.append(key)
                continue
            raise CheckpointError(f"{weights}: key {key!r} is missing (needed by the BERT encoder)")
        value = hf.from_hf_tensor(p, source.pop(key))
        if value.shape != var.shape:
            raise CheckpointError(
                f"{weights}: key {key!r} has shape {hf.source_shape(p, value)}, expected "
                f"{hf.source_shape(p, np.zeros(var.shape))} for this config.json and "
                f"{model.num_labels} labels")
        var.set_value(jnp.asarray(value))
    unused = sorted(k for k in source if not k.endswith(hf._IGNORED_SOURCE_KEYS))
    expected_unused = [k for k in unused if k.startswith(("cls.", "bert.pooler."))]
    other = [k for k in unused if k not in expected_unused]
    if fresh:
        logger.warning("%s: not in the source checkpoint, initialised fresh: %s", weights,
                       ", ".join(fresh))
    if expected_unused:
        logger.info("%s: not used by %s: %s", weights, ARCHITECTURES[task],
                    ", ".join(expected_unused))
    if other:
        logger.warning("%s: ignored keys that %s does not have: %s", weights,
                       ARCHITECTURES[task], ", ".join(other))
    return model, config


def task_of(model: nnx.Module) -> str:
    for task, cls in heads.TASK_MODELS.items():
        if isinstance(model, cls):
            return task
    raise TypeError(f"not a dpbert task model: {type(model).__name__}")


def hf_config_overrides(model: nnx.Module) -> dict[str, Any]:
    """The config.json keys transformers needs for the task model's architecture."""
    task = task_of(model)
    out: dict[str, Any] = {
        "num_labels": model.num_labels,
        "id2label": {str(i): name for i, name in enumerate(model.labels)},
        "label2id": {name: i for i, name in enumerate(model.labels)},
        "classifier_dropout": model.classifier_dropout,
        "tie_word_embeddings": False,
    }
    if task == "sequence_classification":
        out["problem_type"] = "single_label_classification"
    return out


def save_task_model(model: nnx.Module, path: str | os.PathLike, vocab_file: str | os.PathLike,
                    *, do_lower_case: bool = True, model_max_length: int | None = None,
                    privacy_report: Mapping[str, Any] | None = None,
                    input_privacy_report: Mapping[str, Any] | None = None,
                    source: str | None = None) -> pathlib.Path:
    """Writes a HF folder that `transformers.<architecture>.from_pretrained` loads.

    `privacy_report`: the DP-SGD report of the fine-tuning run (if it used DP-SGD);
    `input_privacy_report`: the dχ input-privacy release (`dpbert.privacy.input_privacy`), stated in
    the model card.
    """
    architecture = ARCHITECTURES[task_of(model)]
    sections = []
    if input_privacy_report:
        sections.append(input_privacy_card_section(input_privacy_report))
        if (input_privacy_report.get("mode") == "seq_rep"
                and input_privacy_report.get("seq_rep_source") == "cls_hidden"):
            note = ("**Caveat:** the classifier was trained on the [CLS] hidden state (seq_rep "
                    "source `cls_hidden`), but transformers' BertForSequenceClassification "
                    "applies it to the pooled output: this export does not reproduce the "
                    "fine-tuned predictions.")
            logger.warning("%s: %s", path, note.replace("**", ""))
            sections.append(note)
    return hf_export.save_pretrained(
        model, path, vocab_file, do_lower_case=do_lower_case, model_max_length=model_max_length,
        privacy_report=privacy_report, source=source, architecture=architecture,
        hf_config_overrides=hf_config_overrides(model), card_sections=sections)


def input_privacy_card_section(report: Mapping[str, Any]) -> str:
    """Markdown for the model card: what the users' input privacy was during fine-tuning."""
    mode = report.get("mode", "none")
    lines = ["## Input privacy during fine-tuning (dχ, Qu et al. 2021)" if mode in (
        "none", "token_rep", "text_to_text", "seq_rep") else
        f"## Representation privacy during fine-tuning ({mode})", ""]
    if mode == "none":
        lines.append("The fine-tuning data was not privatized (mode `none`): the service saw the "
                     "raw text.")
    else:
        lines.append(f"Mode `{mode}`: {report.get('statement', '')}".rstrip())
        lines += ["", "| field | value |", "|---|---|"]
        lines += [f"| {k} | {json.dumps(v) if not isinstance(v, str) else v} |"
                  for k, v in report.items() if k != "statement"]
    return "\n".join(lines)
