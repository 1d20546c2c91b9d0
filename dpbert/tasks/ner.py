"""Token classification (NER, BIO tags) as a task on the DP loop.

    python launch/finetune.py --config=configs/finetune_ner.py --workdir=W \\
        --config.model.init_from_hf=HF_FOLDER [--config.data.fold=2]
        [--config.data.train=TRAIN.conll --config.data.eval=TEST.conll]

    data    default: the i2b2-2010-shaped synthetic notes (`data_pipelines.synthetic_ner`,
            problem / test / treatment, 7 BIO tags), split k-fold BY DOCUMENT (data.num_folds,
            data.fold, data.fold_seed); or CoNLL files (data.train, and data.eval or the same
            k-fold)
    labels  the first WordPiece of each word carries its tag, the other pieces -100
    units     a document's pieces are cut into windows of max_seq_length (stride data.stride);
            ALL windows of a document form ONE training example ([W, S] arrays + window_mask):
            the sampler draws documents, the clipper bounds a document's gradient, so the
            DP-SGD privacy unit is one document, exactly (no group-privacy factor)
    loss    mean token cross-entropy over the document's labelled words
    eval    windows of the held-out documents, each word scored once (in the window where it
            has the most context); eval_step returns the predictions, eval_metrics maps them
            back to words and computes entity-level exact-match micro-F1 (conlleval rules) on
            the host, plus per-type F1 and word accuracy
    export  WORKDIR/hf: `BertForTokenClassification.from_pretrained` loads it
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from data_pipelines import classification as clf
from data_pipelines import identity, ner, synthetic_ner
from data_pipelines import ner_metrics
from dpbert.errors import ConfigError
from dpbert.runtime.hosts import announce
from dpbert.tasks import finetuning, release, task_losses
from dpbert.tasks.input_modes.base import TOKENS


@functools.lru_cache(maxsize=4)
def _synthetic(num_notes: int, seed: int) -> tuple:
    return tuple(synthetic_ner.generate_i2b2_like(num_notes, seed=seed))


def documents(config) -> tuple[list, list, tuple[str, ...]]:
    """(train documents, eval documents, tag names) as the config says.

    An eval file that is the training file (or a byte-identical copy) is refused. Without
    data.labels, an eval tag that no training document has is an error naming its line (the
    tag is not shown: `ner.read_conll`)."""
    d = config.data
    if d.train and d.eval:
        clf.check_eval_file(d.train, d.eval)
    # A training file without -DOCSTART- is ONE document: refused with that reason (one
    # document cannot be split into folds, nor make a DP-SGD batch of documents).
    docs = list(_synthetic(d.synthetic_num_notes, d.synthetic_seed)) if not d.train else \
        ner.read_conll(d.train, tags=tuple(d.labels) or None, min_documents=2)
    if d.eval:
        if d.labels:
            test = ner.read_conll(d.eval, tags=tuple(d.labels))
        else:
            test = ner.read_conll(d.eval, tags=ner.tag_names(docs),
                                  tags_from=f"the training documents ({d.train}); the tag sets "
                                            "differ (set data.labels to fix the tag set)")
        train = docs
    else:
        try:
            folds = ner.kfold_documents(docs, d.num_folds, seed=d.fold_seed)
        except ValueError as e:
            raise ConfigError(f"config.data.num_folds={d.num_folds}: {e}") from None
        train_idx, test_idx = folds[d.fold]
        train, test = [docs[i] for i in train_idx], [docs[i] for i in test_idx]
    if d.labels:
        tags = tuple(d.labels)
    elif not d.train:
        tags = ner.I2B2_TAGS
    else:
        tags = ner.tag_names(train)
        unknown = sorted(set(ner.tag_names(test)) - set(tags))
        if unknown:   # k-fold (an eval file's tags were checked as it was read)
            raise ner.DataError(f"{d.eval or d.train}: {len(unknown)} tag(s) of the held-out "
                                "documents do not occur in the training documents; the tag sets "
                                "differ (set data.labels to fix the tag set)")
    return train, test, tags


class NerTask(finetuning.FineTuningTask):
    name = "ner"
    model_kind = "token_classification"
    # A label per word of a document of several windows: no sentence vector, no one sequence.
    capabilities = (TOKENS,)

    def validate(self, config) -> None:
        finetuning.validate_common(self, config)
        d = config.data
        if not d.train and d.eval:
            raise ConfigError("config.data.eval is set but data.train is empty: give both "
                              "CoNLL files, or neither (synthetic notes, k-fold)")
        if not d.eval and not 0 <= d.fold < d.num_folds:
            raise ConfigError(f"config.data.fold={d.fold}: must be in [0, data.num_folds="
                              f"{d.num_folds})")
        if not 0 < d.stride <= d.max_seq_length - 2:
            raise ConfigError(f"config.data.stride={d.stride}: must be in [1, "
                              f"max_seq_length - 2 = {d.max_seq_length - 2}]")
        if config.train.eval_batches:
            raise ConfigError(f"config.train.eval_batches={config.train.eval_batches}: entity "
                              "F1 needs every held-out word; set it to 0")

    def count_train_examples(self, config) -> int:
        return len(documents(config)[0])

    def load(self, config, tokenizer) -> finetuning.Loaded:
        d = config.data
        train_docs, test_docs, tags = documents(config)
        overlap = ner.document_overlap(train_docs, test_docs)
        if overlap:
            logging.warning(
                "%s: %d of %d held-out documents (%.1f %%) have exactly the words of a "
                "training document%s; the evaluation metrics are not fully held-out",
                d.eval or d.train or "synthetic notes", overlap, len(test_docs),
                100.0 * overlap / len(test_docs),
                f" ({d.train})" if d.eval else " (the same text with other tags)")
        kw = dict(max_seq_len=d.max_seq_length, stride=d.stride, unit="document")
        train = ner.encode_documents(train_docs, tokenizer, tags, **kw)
        test = ner.encode_documents(test_docs, tokenizer, tags, **kw)
        # A duplicated document is two examples (the unit is one document; doc_ids are names
        # made from the file and the position, not identities): say how many, never which.
        copies = identity.count_exact_duplicates(doc.sentences for doc in train_docs)
        if copies:
            warning = identity.fine_tuning_warning(
                d.train or f"synthetic notes (seed {d.synthetic_seed})", copies,
                len(train_docs), "document")
            announce(warning)
        groups = release.group_rows(train.features["example_id"])
        announce(
            f"NER data: {len(train_docs)} training documents ({len(groups)} examples of up to "
            f"{groups.shape[1]} windows), {len(test_docs)} held-out documents "
            f"({len(test.features['input_ids'])} windows); tags {clf.describe_labels(tags)}")
        # eval_metrics maps the held-out windows' predictions back to words: their layout and
        # the gold tags, kept with the run's data (TaskData.extra), not on the task.
        held_out = (test, ner.sentences_of(ner.gold_tags(test_docs)))
        return finetuning.Loaded(train.features, test.features, tuple(tags), len(groups),
                                 groups=groups, extra={"ner_eval": held_out})

    def unit_definition(self, config) -> str:
        return ("one document (note): all its windows of up to "
                f"{config.data.max_seq_length} WordPieces form ONE training example; documents "
                "are not merged by content or doc_id: a document that appears twice is two "
                "examples (covered only as a group of 2)")

    # ------------------------------------------------------------------------- loss, eval

    def example_loss(self, graphdef, *, deterministic: bool, start_layer: int | None = None):
        if start_layer is not None:  # prefix_cacheable is False: never cached
            raise ValueError("the NER task does not run from a cached prefix")
        def loss_fn(params, example, rng):
            model = nnx.merge(graphdef, params)
            rngs = None if deterministic else nnx.Rngs(dropout=rng)
            logits = model(example["input_ids"], example["segment_ids"], example["input_mask"],
                           deterministic=deterministic, rngs=rngs,
                           word_embeddings=example.get("word_embeddings"))   # [W, S, C]
            return task_losses.token_metrics(logits.reshape(-1, logits.shape[-1]),
                                             example["labels"].reshape(-1))

        return loss_fn

    def eval_step(self, graphdef, config, data):
        def step(params, batch, mask):
            model = nnx.merge(graphdef, params)
            logits = model(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                           word_embeddings=batch.get("word_embeddings"))     # [B, S, C]
            labels = jnp.where(mask[:, None], batch["labels"], task_losses.IGNORE_LABEL)
            _, sums = jax.vmap(task_losses.token_metrics)(logits, labels)
            return {"pred": jnp.argmax(logits, -1).astype(jnp.int32), "mask": mask,
                    "loss_sum": jnp.sum(sums["loss_sum"]),
                    "token_count": jnp.sum(sums["token_count"])}

        return step

    def eval_metrics(self, outputs: list, data) -> dict[str, float]:
        encoded, gold = data.extra["ner_eval"]
        pred = np.concatenate([o["pred"][np.asarray(o["mask"], bool)] for o in outputs])
        words = ner.word_predictions(pred, encoded)
        predicted = ner.sentences_of(words)
        f1 = ner_metrics.entity_f1(gold, predicted)
        flat_gold = [t for s in gold for t in s]
        flat_pred = [t for s in predicted for t in s]
        pieces = max(float(sum(o["token_count"] for o in outputs)), 1.0)
        out = {"f1": f1["f1"], "precision": f1["precision"], "recall": f1["recall"]}
        out.update({f"f1_{t}": v["f1"] for t, v in f1["per_type"].items()})
        out.update(loss=float(sum(o["loss_sum"] for o in outputs)) / pieces,  # per labelled piece
                   word_accuracy=float(np.mean([g == p for g, p in zip(flat_gold, flat_pred)])),
                   num_documents=float(len(encoded.sentence_lengths)))
        return out

    def train_metrics(self, sums: dict) -> dict[str, float]:
        t = max(float(sums["token_count"]), 1.0)
        return {"loss": float(sums["loss_sum"]) / t, "word_accuracy": float(sums["correct"]) / t}


TASK = NerTask()


def finetune(config, workdir, *, devices=None) -> dict:
    """Fine-tunes as `config` says in `workdir` (resuming it); returns results.json's content."""
    return finetuning.finetune(TASK, config, workdir, devices=devices)
