"""Export to Hugging Face `transformers` BERT folders: `save_pretrained` (a folder replaced as a
whole, with a model card and the public privacy report), `export_from_hf` (a HF folder
round-tripped through dpbert) and the checks of an export's destination.

The names and layouts (dpbert parameter path <-> PyTorch key, the transpose of Dense kernels)
and the reading side are `dpbert.models.hf`'s; the card's privacy section is
`dpbert.reporting.card`'s.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from flax import nnx

from data_pipelines import fileio, tokenization
from dpbert.models import bert as model_lib
from dpbert.models import hf
from dpbert.models.hf import CheckpointError
from dpbert.reporting import card as card_lib
from dpbert.reporting import lineage
from dpbert.reporting import report as report_lib


class ExportError(ValueError):
    """An export destination that cannot be used; the message names the folder."""


def state_dict(model: nnx.Module) -> dict[str, np.ndarray]:
    """The PyTorch-layout state dict (float32 NumPy), tied decoder not duplicated."""
    return {hf.hf_key(p): hf.to_hf_tensor(p, np.asarray(jax.device_get(var[...])))
            for p, var in hf._flat_params(model).items()}


def model_card(config: model_lib.BertConfig, *, privacy_report: Mapping[str, Any] | None,
               source: str | None, num_params: int, do_lower_case: bool,
               architecture: str = "BertForPreTraining",
               extra_sections: Sequence[str] = ()) -> str:
    """A model card (README.md) whose privacy section states only what is true.

    `architecture` is the transformers class the folder is for; `extra_sections` are Markdown
    blocks appended at the end (e.g. a fine-tuning run's input-privacy statement)."""
    lines = [
        "---",
        "library_name: transformers",
        "tags:",
        "- bert",
        "- dpbert",
        *(["- differential-privacy"] if privacy_report and privacy_report.get("private")
          else []),
        "---",
        "",
        "# BERT exported by dpbert",
        "",
        f"A `{architecture}` model ({config.num_hidden_layers} layers, hidden "
        f"{config.hidden_size}, {config.num_attention_heads} heads, vocabulary "
        f"{config.vocab_size}, {num_params:,} parameters; "
        f"{'uncased' if do_lower_case else 'cased'}) written by dpbert on "
        f"{datetime.date.today().isoformat()}.",
        "",
        "```python",
        f"from transformers import {architecture}, BertTokenizerFast",
        f'model = {architecture}.from_pretrained("PATH")',
        "```",
        "",
    ]
    if source:
        lines += [f"Weights were converted from `{source}`.", ""]
    lines += card_lib.card_section(privacy_report)
    lines += card_lib.privacy_adaptive_section(privacy_report)
    for section in extra_sections:
        lines += [section.rstrip("\n"), ""]
    return "\n".join(lines)


def looks_like_hf_folder(path: str | os.PathLike) -> bool:
    """Whether `path` holds a Hugging Face model (config.json and weights): the only kind of
    non-empty folder `save_pretrained` replaces."""
    folder = pathlib.Path(path)
    return (folder / "config.json").is_file() and any(
        (folder / name).is_file() for name in (*hf.WEIGHT_FILES, "model.safetensors.index.json"))


def check_export_destination(path: str | os.PathLike, *, overwrite: bool,
                             sources: Sequence[tuple[str, str | os.PathLike]] = (),
                             inside_sources_ok: bool = False) -> None:
    """Raises ExportError unless `path` can receive an export: absent, an empty folder, or (with
    `overwrite`) a previous Hugging Face export; its parent must be writable. Never an empty
    path, the current directory (or a folder holding it), nor a folder that is, lies inside
    (unless `inside_sources_ok`) or holds one of `sources` ((name, path) pairs: what the export
    reads; `fileio.path_problem`): the swap that puts the export in place would delete it."""
    problem = fileio.path_problem(path, sources=sources, inside_sources_ok=inside_sources_ok)
    if problem:
        raise ExportError(f"{path}: {problem}")
    out = pathlib.Path(path)
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out}: is a file; the export needs a folder")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise ExportError(
                f"{out}: is not empty; an export into it would mix the files of two models "
                "(e.g. a stale tokenizer.json); choose an empty or new folder, or pass "
                "--overwrite to replace a previous export")
        if not looks_like_hf_folder(out):
            raise ExportError(
                f"{out}: is not empty and is not a Hugging Face model folder (no config.json + "
                "weights); not replacing it even with --overwrite")
    problem = fileio.output_folder_problem(out)
    if problem:
        raise ExportError(f"{out}: {problem}")


def save_pretrained(model: model_lib.BertForPreTraining, path: str | os.PathLike,
                    vocab_file: str | os.PathLike, *, do_lower_case: bool = True,
                    model_max_length: int | None = None,
                    privacy_report: Mapping[str, Any] | None = None,
                    source: str | None = None, overwrite: bool = True,
                    architecture: str = "BertForPreTraining",
                    hf_config_overrides: Mapping[str, Any] | None = None,
                    card_sections: Sequence[str] = ()) -> pathlib.Path:
    """Writes a HF BERT folder that `transformers.BertForPreTraining.from_pretrained` loads.

    Task models (`dpbert.models.heads`) pass their `architecture` and the config keys HF needs for it
    (`hf_config_overrides`, e.g. id2label); `dpbert.models.hf_heads.save_task_model` does that.

    Files: config.json, model.safetensors, vocab.txt, tokenizer_config.json, README.md (a model
    card with a privacy section), privacy_report.json (`report.public_report` of
    `privacy_report`, the training's report, or of None: a conversion without a run; no exact
    corpus statistic; a run that starts from this folder composes it, `dpbert.reporting.lineage`), and
    vocab_privacy.json when the vocabulary has one beside it (only its shippable fields: its
    privacy cost then travels with the vocabulary into runs that start from this folder).

    The folder is replaced as a whole, never merged: everything is written to a sibling
    temporary folder, which then takes the place of `path` by renames (the previous export is
    moved aside first and deleted last, and put back if the swap fails). So a reader sees the
    old export or the new one, never a mix (no stale tokenizer.json of another vocabulary
    beside these weights), and a failure before the swap leaves `path` as it was.

    Args:
      overwrite: whether an existing non-empty `path` may be replaced (it must then be a
        Hugging Face export: `looks_like_hf_folder`). Training's own WORKDIR/hf relies on the
        default; `launch/export_hf.py` passes its --overwrite flag.

    Raises:
      ExportError: `path` is a file, not empty (without `overwrite`), not a HF folder, or not
        writable.
      ValueError: the vocabulary does not match the model.
    """
    from safetensors.numpy import save_file

    config: model_lib.BertConfig = model.config
    vocab = tokenization.load_vocab(vocab_file)
    if len(vocab) != config.vocab_size:
        raise ValueError(f"{vocab_file}: has {len(vocab)} tokens but the model's vocab_size is "
                         f"{config.vocab_size}")
    out = pathlib.Path(path)
    check_export_destination(out, overwrite=overwrite)
    tensors = state_dict(model)
    tokenizer_config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": do_lower_case,
        "model_max_length": model_max_length or config.max_position_embeddings,
        "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
        "cls_token": "[CLS]", "mask_token": "[MASK]",
    }
    public_report = report_lib.public_report(privacy_report)
    card = model_card(config, privacy_report=public_report, source=source,
                      num_params=model_lib.count_params(model), do_lower_case=do_lower_case,
                      architecture=architecture, extra_sections=card_sections)
    hf_config = hf.config_to_hf(config)
    hf_config["architectures"] = [architecture]
    hf_config.update(hf_config_overrides or {})
    parent = out.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.tmp-export-"))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would hide the export from other users
    try:
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
        (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
        (tmp / "README.md").write_text(card, encoding="utf-8")
        (tmp / lineage.REPORT_FILE).write_text(
            json.dumps(public_report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        vocab_report = pathlib.Path(vocab_file).parent / hf.VOCAB_REPORT
        if vocab_report.is_file():
            public = report_lib.public_vocab_report(json.loads(vocab_report.read_text()))
            (tmp / hf.VOCAB_REPORT).write_text(json.dumps(public, indent=2) + "\n")
        _swap_in(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _swap_in(new: pathlib.Path, out: pathlib.Path) -> None:
    """Puts folder `new` at `out` (same filesystem): the old `out`, if any, is renamed aside,
    `new` renamed in, then the old one deleted; on failure the old one is put back."""
    old = None
    if out.exists():
        old = pathlib.Path(tempfile.mkdtemp(dir=out.absolute().parent,
                                            prefix=f".{out.name}.old-export-"))
        os.rmdir(old)
        os.replace(out, old)
    try:
        os.replace(new, out)
    except BaseException:
        if old is not None:
            os.replace(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def export_from_hf(src: str | os.PathLike, dst: str | os.PathLike, *,
                   overwrite: bool = False) -> pathlib.Path:
    """Round-trips a HF BERT folder through dpbert (load, then save; `overwrite` as for
    `save_pretrained`, checked before the source is loaded). The same weights carry the same
    privacy: the source's privacy_report.json (if any) is the export's.

    Refused with a CheckpointError naming what would be lost: a task model (config.json's
    `architectures` other than the pretraining classes, or a trained head such as
    classifier.* in its weights), whose head and labels a BertForPreTraining export would
    drop; and a training workdir (its model is WORKDIR/hf)."""
    src = pathlib.Path(src)
    workdir = fileio.training_workdir_problem(src)
    if workdir:  # its privacy_report.json and config.json are a run's, not a model's
        raise CheckpointError(f"{workdir}; to export one of its checkpoints, give it as "
                              "--workdir")
    # The source may be neither the destination, nor inside it (the swap would delete it), nor
    # hold it (the export would land inside the model it reads), whatever symlinks or relative
    # spellings name them.
    check_export_destination(dst, overwrite=overwrite, sources=[(f"folder {src}", src)])
    hf_config = hf.read_bert_config_json(src)
    task = [a for a in hf_config.get("architectures") or [] if a not in _PRETRAINING_CLASSES]
    heads = _head_keys(src)
    if task or heads:  # before the weights are read: the refusal costs nothing
        raise CheckpointError(_task_model_message(src, hf_config, task, heads))
    source_report = lineage.read_report(src)
    model, _, missing, unexpected = hf._load_pretrained(src)
    heads = [k for k in unexpected if not k.startswith(("bert.", "cls."))]
    if heads:  # (weights that are not safetensors: seen only once loaded)
        raise CheckpointError(_task_model_message(src, hf_config, [], heads))
    do_lower_case = True
    tok_cfg = src / "tokenizer_config.json"
    if tok_cfg.is_file():
        do_lower_case = bool(json.loads(tok_cfg.read_text()).get("do_lower_case", True))
    vocab = src / "vocab.txt"
    if not vocab.is_file():
        raise CheckpointError(f"{vocab}: missing; the export needs the source's vocab.txt")
    # A headless source (a BertModel: no MLM/NSP head) is exported as BertForPreTraining with
    # heads initialised at random here; transformers cannot warn (the weights are present in
    # the export), so the card says so.
    sections = [fresh_heads_section(src, missing)] if missing else []
    return save_pretrained(model, dst, vocab, do_lower_case=do_lower_case, source=str(src),
                           overwrite=overwrite, privacy_report=source_report,
                           card_sections=sections)


# What export_from_hf writes (BertForPreTraining) keeps every weight of these: the encoder, the
# pooler, the MLM and NSP heads. Other architectures (BertForSequenceClassification, ...) carry
# a trained task head that the export would drop.
_PRETRAINING_CLASSES = ("BertModel", "BertForPreTraining", "BertForMaskedLM", "BertLMHeadModel",
                        "BertForNextSentencePrediction")


def _head_keys(folder: pathlib.Path) -> list[str]:
    """The weight names of `folder` outside the encoder and the pretraining heads (a task
    head: classifier.*, qa_outputs.*), from a safetensors header (no tensor is read); [] when
    the weights are not safetensors."""
    weights = folder / "model.safetensors"
    if not weights.is_file():
        return []
    try:
        from safetensors import safe_open
        with safe_open(str(weights), framework="numpy") as f:
            keys = list(f.keys())
    except Exception:  # noqa: BLE001 - unreadable here: load_pretrained names the problem
        return []
    return sorted(k for k in keys if not k.startswith(("bert.", "cls."))
                  and not k.endswith(hf._IGNORED_SOURCE_KEYS)
                  and any(k.startswith("bert.") for k in keys))


def _task_model_message(src: pathlib.Path, hf_config: Mapping[str, Any],
                        architectures: Sequence[str], head_keys: Sequence[str]) -> str:
    """Why `src` (a fine-tuned task model) is not exported as BertForPreTraining: what the
    export would lose."""
    labels = hf_config.get("id2label") or {}
    shown = ", ".join(head_keys[:4]) + (f" and {len(head_keys) - 4} more"
                                        if len(head_keys) > 4 else "")
    if architectures:
        what = (f"{src}/config.json names a {', '.join(architectures)} (a task model); this "
                "export writes a BertForPreTraining, which would drop its trained task head"
                + (f" ({shown})" if head_keys else ""))
    else:
        what = (f"{src}: its weights hold a trained head that BertForPreTraining does not "
                f"have ({shown}); this export would drop it")
    lost = (f" and its {len(labels)} labels (id2label)"
            if isinstance(labels, dict) and labels else "")
    return (f"{what}{lost}. Refusing: the folder is already a Hugging Face model (transformers "
            "loads it as it is); to fine-tune or pretrain further from its encoder, give it to "
            "a run as --config.model.init_from_hf")


def fresh_heads_section(src: str | os.PathLike, missing: Sequence[str]) -> str:
    """The model card's note on heads that the source lacked and this export initialised at
    random (`missing`: their HF keys)."""
    heads = hf.fresh_heads(missing)
    outputs = {"the pooler": "the pooled output", "the MLM head": "the masked-LM predictions",
               "the NSP head": "the next-sentence scores"}
    meaningless = [v for k, v in outputs.items() if any(h.startswith(k) for h in heads)]
    if any(h.startswith("the pooler") for h in heads) and \
            "the next-sentence scores" not in meaningless:
        meaningless.append("the next-sentence scores (computed from the pooled output)")
    return "\n".join([
        "## Freshly initialised heads",
        "",
        f"`{src}` has no weights for {_join(heads)}: this export initialised "
        f"{'it' if len(heads) == 1 else 'them'} at random, so {_join(meaningless)} mean "
        "nothing until the model is trained further. Every other weight (the encoder) is the "
        "source's. `transformers` cannot warn about this when it loads this folder, since the "
        "weights are present in it.",
        "",
        "Initialised fresh: " + ", ".join(f"`{k}`" for k in missing) + ".",
    ])


def _join(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
