"""The fine-tuning tasks' starting model: the Hugging Face folder of model.init_from_hf, its
tokenizer and the task model built from it (with the config's dropout)."""

from __future__ import annotations

import json
import pathlib

from flax import nnx

from data_pipelines import classification as clf
from dpbert.models import heads, hf_heads


def tokenizer(config):
    """The data's WordPiece tokenizer, checked against the checkpoint (vocab file and size)."""
    folder = pathlib.Path(config.model.init_from_hf)
    hf_config = json.loads((folder / "config.json").read_text())
    return clf.tokenizer_for_checkpoint(folder, vocab_file=config.vocab.file or None,
                                        vocab_size=hf_config.get("vocab_size"))


def load_model(config, kind: str, labels):
    """The task model from model.init_from_hf, with the config's dropout."""
    m = config.model
    model, cfg = hf_heads.load_task_model(m.init_from_hf, kind, list(labels),
                                          classifier_dropout=m.classifier_dropout,
                                          dtype=m.dtype, seed=config.seed)
    cfg = cfg.replace(hidden_dropout_prob=m.hidden_dropout_prob,
                      attention_probs_dropout_prob=m.attention_probs_dropout_prob)
    fresh = nnx.eval_shape(lambda: heads.TASK_MODELS[kind](
        cfg, list(labels), classifier_dropout=model.classifier_dropout, rngs=nnx.Rngs(0)))
    nnx.update(fresh, nnx.state(model, nnx.Param))
    return fresh
