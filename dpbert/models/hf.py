"""Import from Hugging Face `transformers` BERT folders, and the names both directions share.

A HF BERT folder holds `config.json`, the weights (`model.safetensors`, or the older
`pytorch_model.bin`), `vocab.txt` and `tokenizer_config.json`. dpbert's module tree mirrors HF's
BERT names, so a parameter path maps to a PyTorch key mechanically:

    bert/encoder/layer/3/attention/self/query/kernel  <->  bert.encoder.layer.3.attention.self.query.weight (transposed)
    .../LayerNorm/scale <-> .../LayerNorm.weight          .../word_embeddings/embedding <-> ...weight

PyTorch `nn.Linear` stores weights as [out, in]; Flax kernels are [in, out], hence the transpose.
The MLM decoder is tied to the word embeddings and has no tensor of its own on our side; on
export HF re-ties `cls.predictions.decoder.{weight,bias}` from `bert.embeddings.word_embeddings`
and `cls.predictions.bias`, so they are not written twice.

This module reads (`load_pretrained`, `read_config`, `read_state_dict`); the export (writing a
folder, the model card, `export_from_hf`) is `dpbert.models.hf_export`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
from typing import Any, Mapping, Sequence

import jax.numpy as jnp
import numpy as np
from flax import nnx

from data_pipelines import fileio
from dpbert.models import bert as model_lib

logger = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
VOCAB_REPORT = "vocab_privacy.json"  # the DP vocabulary's report, beside its vocab.txt
# Buffers some checkpoints carry that are not parameters.
_IGNORED_SOURCE_KEYS = ("embeddings.position_ids",)
# Source keys that the tied decoder makes redundant.
_TIED_SOURCE_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
# Parameter groups that may be absent from a source checkpoint (initialised fresh, with a warning).
# A BertModel has no `cls.*`; a BertForMaskedLM has no pooler and no NSP head.
_OPTIONAL_PREFIXES = ("bert.pooler.", "cls.")


class CheckpointError(ValueError):
    """A HF folder that cannot be read as BERT; the message names the file and the key."""


# ----------------------------------------------------------------------------- names and layouts


def _flat_params(model: nnx.Module) -> dict[tuple[str, ...], nnx.Variable]:
    """{path: Param variable} for every parameter of the model (paths of str components)."""
    state = nnx.state(model, nnx.Param)
    return {tuple(str(p) for p in path): var for path, var in nnx.to_flat_state(state)}


def hf_key(path: tuple[str, ...]) -> str:
    """The PyTorch state-dict key of a dpbert parameter path."""
    *prefix, leaf = path
    if leaf in ("kernel", "embedding", "scale"):
        leaf = "weight"
    return ".".join([*prefix, leaf])


def _is_linear_kernel(path: tuple[str, ...]) -> bool:
    return path[-1] == "kernel"


def to_hf_tensor(path: tuple[str, ...], value: np.ndarray) -> np.ndarray:
    """dpbert layout -> PyTorch layout (Dense kernels [in, out] -> weights [out, in])."""
    value = np.asarray(value, dtype=np.float32)
    return np.ascontiguousarray(value.T) if _is_linear_kernel(path) else value


def from_hf_tensor(path: tuple[str, ...], value: np.ndarray) -> np.ndarray:
    """PyTorch layout -> dpbert layout."""
    value = np.asarray(value, dtype=np.float32)
    return np.ascontiguousarray(value.T) if _is_linear_kernel(path) else value


def _normalise_source_key(key: str) -> str:
    """Brings the key spellings of older checkpoints to today's HF names."""
    parts = key.split(".")
    if parts[-1] == "gamma":
        parts[-1] = "weight"
    elif parts[-1] == "beta":
        parts[-1] = "bias"
    return ".".join(parts)


# ----------------------------------------------------------------------------- config


def config_from_hf(hf: Mapping[str, Any], source: str = "config.json",
                   dtype: str = "float32") -> model_lib.BertConfig:
    """Validates a HF config dict and turns it into a `BertConfig`."""
    model_type = hf.get("model_type")
    if model_type != "bert":
        raise CheckpointError(
            f"{source}: key 'model_type' is {model_type!r}; dpbert reads BERT checkpoints only "
            "(model_type 'bert')")
    act = hf.get("hidden_act", "gelu")
    if act != "gelu":
        raise CheckpointError(
            f"{source}: key 'hidden_act' is {act!r}; dpbert's BERT uses the exact erf GELU "
            "('gelu') and would not reproduce this model")
    pos = hf.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise CheckpointError(
            f"{source}: key 'position_embedding_type' is {pos!r}; only 'absolute' is supported")
    fields = {f.name for f in dataclasses.fields(model_lib.BertConfig)} - {"dtype"}
    kwargs = {}
    for name in fields:
        if name in hf and hf[name] is not None:
            kwargs[name] = hf[name]
    if "vocab_size" not in kwargs:
        raise CheckpointError(f"{source}: key 'vocab_size' is missing")
    try:
        return model_lib.BertConfig(**kwargs, dtype=dtype)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{source}: {e}") from e


def config_to_hf(config: model_lib.BertConfig) -> dict[str, Any]:
    """The `config.json` transformers expects for `BertForPreTraining`."""
    out = {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        "hidden_act": "gelu",
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }
    for f in dataclasses.fields(config):
        if f.name != "dtype":
            out[f.name] = getattr(config, f.name)
    return out


# ----------------------------------------------------------------------------- reading weights


def _find_weights(folder: pathlib.Path) -> pathlib.Path:
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    if (folder / "model.safetensors.index.json").is_file():
        return folder / "model.safetensors.index.json"
    raise CheckpointError(
        f"{folder}: no weights found (looked for {', '.join(WEIGHT_FILES)})")


def read_state_dict(weights: pathlib.Path) -> dict[str, np.ndarray]:
    """Reads a safetensors file (or a sharded index) or a PyTorch pickle into NumPy arrays."""
    if weights.name.endswith(".index.json"):
        index = json.loads(weights.read_text())
        out: dict[str, np.ndarray] = {}
        for shard in sorted(set(index["weight_map"].values())):
            out.update(read_state_dict(weights.parent / shard))
        return out
    if weights.suffix == ".safetensors":
        from safetensors.numpy import load_file
        try:
            return load_file(str(weights))
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{weights}: not a readable safetensors file ({e})") from e
    try:
        import torch
    except ImportError as e:
        raise CheckpointError(
            f"{weights}: reading pytorch_model.bin needs PyTorch (pip install torch==2.13.0), "
            "or convert the folder to model.safetensors") from e
    sd = torch.load(str(weights), map_location="cpu", weights_only=True)
    return {k: v.detach().to(torch.float32).numpy() for k, v in sd.items()}


def read_config(folder: pathlib.Path, *, dtype: str = "float32"
                ) -> tuple[dict[str, Any], model_lib.BertConfig]:
    """(config.json as a dict, its BertConfig) of a HF BERT folder; CheckpointError naming the
    file when the folder, the file or its JSON is missing or malformed."""
    hf_config = read_bert_config_json(folder)
    return hf_config, config_from_hf(hf_config, str(folder / "config.json"), dtype=dtype)


def read_bert_config_json(folder: str | os.PathLike) -> dict[str, Any]:
    """config.json of a Hugging Face folder, as a dict, if its model_type is 'bert';
    CheckpointError naming the file otherwise (a missing folder, file or JSON, a GPT-2 or other
    model). What every reader of a BERT folder checks first, even one that needs only the
    embeddings (dχ analyses)."""
    folder = pathlib.Path(folder)
    config_file = folder / "config.json"
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a directory (expected a Hugging Face BERT folder)")
    workdir = fileio.training_workdir_problem(folder)
    if workdir:  # its config.json is the run's config, not a model's
        raise CheckpointError(workdir)
    if not config_file.is_file():
        raise CheckpointError(f"{config_file}: missing; a Hugging Face BERT folder needs config.json")
    try:
        hf_config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{config_file}: not valid JSON ({e})") from e
    if not isinstance(hf_config, dict):
        raise CheckpointError(f"{config_file}: not a JSON object")
    model_type = hf_config.get("model_type")
    if model_type != "bert":
        raise CheckpointError(
            f"{config_file}: key 'model_type' is {model_type!r}; dpbert reads BERT checkpoints "
            "only (model_type 'bert')")
    return hf_config


# What a group of fresh keys is, for the warning and the model card.
_HEAD_NAMES = (("bert.pooler.", "the pooler"), ("cls.predictions.", "the MLM head"),
               ("cls.seq_relationship.", "the NSP head"))


def fresh_heads(missing: Sequence[str]) -> list[str]:
    """The heads that `missing` HF keys (initialised fresh by `load_pretrained`) belong to, as
    'the MLM head (cls.predictions.*)' phrases, in a fixed order."""
    out = []
    for prefix, name in _HEAD_NAMES:
        if any(k.startswith(prefix) for k in missing):
            out.append(f"{name} ({prefix}*)")
    return out


def load_pretrained(path: str | os.PathLike, *, dtype: str = "float32", seed: int = 0
                    ) -> tuple[model_lib.BertForPreTraining, model_lib.BertConfig]:
    """Loads a HF BERT folder (BertModel, BertForMaskedLM or BertForPreTraining layouts).

    Keys may carry the `bert.` prefix or not. Heads absent from the source (pooler, MLM head,
    NSP head) are initialised fresh (seeded by `seed`) and named in a warning
    (`load_pretrained_with_fresh_keys` returns them too). Any missing encoder weight, unexpected
    shape or malformed file is a `CheckpointError` naming the file and the key.
    """
    model, config, _ = load_pretrained_with_fresh_keys(path, dtype=dtype, seed=seed)
    return model, config


def load_pretrained_with_fresh_keys(
        path: str | os.PathLike, *, dtype: str = "float32", seed: int = 0
) -> tuple[model_lib.BertForPreTraining, model_lib.BertConfig, list[str]]:
    """`load_pretrained`, and the HF keys that were not in the source and were initialised
    fresh (empty for a complete `BertForPreTraining` folder)."""
    model, config, missing, _ = _load_pretrained(path, dtype=dtype, seed=seed)
    return model, config, missing


def _load_pretrained(path: str | os.PathLike, *, dtype: str = "float32", seed: int = 0
                     ) -> tuple[model_lib.BertForPreTraining, model_lib.BertConfig, list[str],
                                list[str]]:
    """`load_pretrained_with_fresh_keys`, and the source keys that BertForPreTraining does not
    have (ignored, with a warning)."""
    folder = pathlib.Path(path)
    hf_config, config = read_config(folder, dtype=dtype)
    weights = _find_weights(folder)
    source = {_normalise_source_key(k): v for k, v in read_state_dict(weights).items()}
    # A BertModel checkpoint has no `bert.` prefix; the heads never do.
    if not any(k.startswith("bert.") for k in source):
        source = {(k if k.startswith("cls.") else "bert." + k): v for k, v in source.items()}

    model = model_lib.create_model(config, seed=seed)
    params = _flat_params(model)
    missing = []
    for p, var in params.items():
        key = hf_key(p)
        if key not in source:
            if key.startswith(_OPTIONAL_PREFIXES):
                missing.append(key)
                continue
            raise CheckpointError(f"{weights}: key {key!r} is missing (needed by the BERT encoder)")
        value = from_hf_tensor(p, source.pop(key))
        if value.shape != var.shape:
            raise CheckpointError(
                f"{weights}: key {key!r} has shape {tuple(source_shape(p, value))}, expected "
                f"{tuple(source_shape(p, np.zeros(var.shape)))} for this config.json")
        var.set_value(jnp.asarray(value))

    decoder = source.pop("cls.predictions.decoder.weight", None)
    if decoder is not None:
        table = np.asarray(params[("bert", "embeddings", "word_embeddings", "embedding")][...])
        if decoder.shape != table.shape or not np.allclose(decoder, table):
            logger.warning("%s: cls.predictions.decoder.weight differs from the word embeddings; "
                           "dpbert ties them and keeps the word embeddings", weights)
    source.pop("cls.predictions.decoder.bias", None)  # HF ties it to cls.predictions.bias
    unexpected = [k for k in source if not k.endswith(_IGNORED_SOURCE_KEYS)]
    if missing:
        logger.warning("%s: not in the source checkpoint, initialised fresh: %s", weights,
                       ", ".join(missing))
    if unexpected:
        logger.warning("%s: ignored keys that BertForPreTraining does not have: %s", weights,
                       ", ".join(sorted(unexpected)))
    return model, config, missing, sorted(unexpected)


def source_shape(path: tuple[str, ...], value: np.ndarray) -> tuple[int, ...]:
    """The shape a dpbert array has in the PyTorch layout (for error messages)."""
    return tuple(reversed(value.shape)) if _is_linear_kernel(path) else tuple(value.shape)
