"""Sentence and sentence-pair classification as a task on the DP loop.

    python launch/finetune.py --config=configs/finetune_classification.py --workdir=W \\
        --config.model.init_from_hf=HF_FOLDER --config.data.train=TRAIN.tsv \\
        --config.data.eval=EVAL.tsv [--config.privacy.mode=text_to_text --config.privacy.eta=75]

    data    `label<TAB>text[<TAB>text_b]` files (`data_pipelines.classification`): labels from
            the training file (numeric ones in numeric order), the eval file must use the same
            set; tokenized with the checkpoint's vocabulary (a vocab.file that differs from it,
            or a vocabulary of another size than the model's, is refused)
    users   `privacy.mode` (`dpbert.tasks.input_modes`): the release of train AND eval, once,
            keyed by the run's secret task key; its examples offer every capability
            (TOKENS, SENTENCE, ONE_SEQUENCE), so every input mode applies
    model   HF `BertForSequenceClassification` (dropout + linear on the pooled output)
    loss    per-example cross-entropy (`dpbert.tasks.task_losses`); with DP-SGD (one example = one
            row of the training file is the privacy unit) dp.clipping="auto" takes the mixed
            ghost clipper (`task_losses.FactoredClassificationLoss`) where the input mode
            feeds the encoder (none, token_rep, text_to_text), else vmap
    eval    accuracy and loss over the whole released eval split
    export  WORKDIR/hf: `BertForSequenceClassification.from_pretrained` loads it; the card
            states the input privacy and the DP-SGD report

`finetune(config, workdir)` runs it and writes WORKDIR/results.json.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from data_pipelines import classification as clf
from data_pipelines import identity
from dpbert.errors import ConfigError
from dpbert.runtime.hosts import announce
from dpbert.tasks import finetuning, task_losses
from dpbert.tasks.input_modes import registry
from dpbert.tasks.input_modes.base import ONE_SEQUENCE, SENTENCE, TOKENS


class ClassificationTask(finetuning.FineTuningTask):
    name = "classification"
    model_kind = "sequence_classification"
    # One sequence per example, one label from its sentence vector (the pooled output).
    capabilities = (TOKENS, SENTENCE, ONE_SEQUENCE)
    # train.trainable head / top:K compute the frozen prefix once (dpbert.tasks.prefix_cache).
    prefix_cacheable = True

    def validate(self, config) -> None:
        finetuning.validate_common(self, config)
        for which in ("train", "eval"):
            if not config.data[which]:
                raise ConfigError(f"config.data.{which} is empty: give a "
                                  "label<TAB>text[<TAB>text_b] file")
        if not 3 <= config.data.max_seq_length <= 512:
            raise ConfigError(f"config.data.max_seq_length={config.data.max_seq_length}: must "
                              "be in [3, 512]")
        if config.data.max_train_examples < 0:
            raise ConfigError(f"config.data.max_train_examples="
                              f"{config.data.max_train_examples}: must be >= 0 (0 = all)")

    def count_train_examples(self, config) -> int:
        # The first data read (before the loop writes anything): the eval file must not be the
        # training file, both files must read, and their labels must make one label map (a
        # number written two ways, one label, an eval label set that differs; data.labels
        # given or read from the training file).
        d = config.data
        clf.check_eval_file(d.train, d.eval)
        train_rows, eval_rows = clf.read_tsv(d.train), clf.read_tsv(d.eval)
        clf.label_map_of(train_rows, eval_rows, d.train, d.eval, tuple(d.labels) or None)
        n = len(train_rows)
        return min(n, d.max_train_examples or n)

    def load(self, config, tokenizer) -> finetuning.Loaded:
        d = config.data
        data = clf.load_train_eval(d.train, d.eval, tokenizer, max_seq_len=d.max_seq_length,
                                   labels=tuple(d.labels) or None)
        train = data.train
        if d.max_train_examples:
            train = {k: v[:d.max_train_examples] for k, v in train.items()}
        n = len(train["input_ids"])
        # A duplicated row is two examples (the unit is one row): say how many, never which.
        rows = clf.read_tsv(d.train)[:n]
        copies = identity.count_exact_duplicates((r.label, r.text_a, r.text_b) for r in rows)
        if copies:
            warning = identity.fine_tuning_warning(d.train, copies, len(rows), "row")
            announce(warning)
        if n < config.batch.expected_batch_size:
            raise ConfigError(f"config.batch.expected_batch_size="
                              f"{config.batch.expected_batch_size} exceeds the {n} training "
                              "examples")
        announce(f"classification data: {n:,} training / "
                 f"{len(data.eval['input_ids']):,} eval examples, labels "
                 f"{clf.describe_labels(data.labels.names)}"
                 f"{', sentence pairs' if data.sentence_pair else ''}")
        return finetuning.Loaded(train, data.eval, data.labels.names, n)

    def unit_definition(self, config) -> str:
        return ("one labelled example: one row of the training file (label<TAB>text"
                f"[<TAB>text_b]), at most {config.data.max_seq_length} WordPieces; rows are "
                "not merged by content: a row that appears twice in the file is two examples "
                "(its text is covered only as a group of 2)")

    # ------------------------------------------------------------------------- loss, eval

    def example_loss(self, graphdef, *, deterministic: bool, start_layer: int | None = None):
        return task_losses.make_classification_loss(graphdef, deterministic=deterministic,
                                                    start_layer=start_layer)

    def factored_loss(self, graphdef, start_layer: int | None = None):
        return task_losses.FactoredClassificationLoss(graphdef, start_layer=start_layer)

    def eval_step(self, graphdef, config, data):
        logits_fn = registry.get(config.privacy.mode).eval_logits(graphdef, config, data)
        if logits_fn is None:
            loss_fn = self.example_loss(graphdef, deterministic=True,
                                        start_layer=data.extra.get("prefix_layers"))

            def step(params, batch, mask):
                return task_losses.batch_metric_sums(loss_fn, params, batch, mask)
        else:
            def step(params, batch, mask):
                _, m = jax.vmap(task_losses.classification_metrics)(logits_fn(params, batch),
                                                                    batch["label"])
                return {k: jnp.sum(jnp.where(mask, v, 0.0)) for k, v in m.items()}
        return step

    def eval_metrics(self, outputs: list, data) -> dict[str, float]:
        sums = {k: float(np.sum([o[k] for o in outputs])) for k in outputs[0]}
        return self.train_metrics(sums)

    def train_metrics(self, sums: dict) -> dict[str, float]:
        n = max(float(sums["count"]), 1.0)
        return {"accuracy": float(sums["correct"]) / n, "loss": float(sums["loss_sum"]) / n}


TASK = ClassificationTask()


def finetune(config, workdir, *, devices=None) -> dict:
    """Fine-tunes as `config` says in `workdir` (resuming it); returns results.json's content."""
    return finetuning.finetune(TASK, config, workdir, devices=devices)
