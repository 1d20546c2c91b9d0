"""What the fine-tuning tasks (`classification`, `ner`) share on the one DP loop.

    FineTuningTask   the parts of `dpbert.runtime.loop.Task` they share: the users' release
                     in `prepare` (`dpbert.tasks.release`), the model from model.init_from_hf
                     (`dpbert.tasks.starting_model`), the input mode's loss / eval / export in
                     place of the task's own where the mode has them; what the task's examples
                     offer an input mode (`capabilities`, `dpbert.tasks.input_modes.base`)
    validate_common  the checks every fine-tuning task makes: the checkpoint, the input mode
                     against the task's capabilities, the clipper's loss shape
    finetune()       `loop.run` with the schedule (`dpbert.tasks.schedule`: train.epochs ->
                     train.num_steps) + WORKDIR/results.json (`dpbert.tasks.results`)
    run()            the task `config.task` names (what launch/finetune.py runs)

`privacy.mode` selects an input mode from `dpbert.tasks.input_modes.registry`. A task object
holds no run state: what one run prepared lives in its `loop.TaskData` (`data.extra`), which
the loop passes back to `loss`, `eval_step` and `eval_metrics`. The tasks themselves
(`dpbert.tasks.classification`, `dpbert.tasks.ner`) add their data, their per-example loss and
their eval.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Sequence

import numpy as np
from flax import nnx

from data_pipelines import tokenization
from dpbert import tasks
from dpbert.dp import clipping
from dpbert.errors import ConfigError, need
from dpbert.models import bert as model_lib
from dpbert.models import heads, hf_heads
from dpbert.runtime import hosts, loop
from dpbert.tasks import (pretraining, prefix_cache, recipe, release, results, schedule,
                          starting_model)
from dpbert.tasks.input_modes import registry
from dpbert.tasks.input_modes.base import CAPABILITIES, ONE_SEQUENCE, TOKENS, InputMode


def validate_common(task: FineTuningTask, config) -> InputMode:
    """Checks every fine-tuning task makes; returns the input mode."""
    m = config.model
    need(bool(m.init_from_hf), "model.init_from_hf", m.init_from_hf,
         "give a Hugging Face BERT folder to fine-tune (e.g. MiniLM, or a dpbert export)")
    folder = pathlib.Path(m.init_from_hf)
    need(folder.is_dir() and (folder / "config.json").is_file(), "model.init_from_hf",
         m.init_from_hf, "not a Hugging Face BERT folder (no config.json there)")
    try:
        positions = int(json.loads((folder / "config.json").read_text())
                        .get("max_position_embeddings", 512))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"config.model.init_from_hf={m.init_from_hf!r}: config.json is not "
                          f"readable JSON ({e})") from None
    need(config.data.max_seq_length <= positions, "data.max_seq_length",
         config.data.max_seq_length,
         f"exceeds the checkpoint's max_position_embeddings ({positions})")
    mode = registry.get(config.privacy.mode)
    missing = [c for c in mode.needs if c not in task.capabilities]
    need(not missing, "privacy.mode", config.privacy.mode,
         f"not available for the {task.name} task (the mode needs {_describe(missing)}; the "
         f"task offers {_describe(task.capabilities)})")
    mode.validate(config)
    shape = clipping.get_clipper(config.dp.clipping if config.dp.enabled else "none").loss_shape
    if shape == "factored" and ONE_SEQUENCE not in task.capabilities:
        need(False, "dp.clipping", config.dp.clipping,
             f"the ghost clippers take one sequence per example; a {task.name} example is "
             "a document of several windows; use dp.clipping='vmap'")
    # A mode whose loss mixes examples has no clipper at all: the field to change is
    # dp.enabled, not dp.clipping (its "auto" was resolved to vmap, a value nobody set).
    need("per_example" in mode.loss_shapes or not config.dp.enabled, "dp.enabled",
         config.dp.enabled, f"privacy.mode={mode.name!r}: its loss mixes examples, so "
         "per-example clipping (DP-SGD) is impossible; set dp.enabled=False (the mode is then "
         "the run's privacy mechanism) or choose another privacy.mode")
    if shape not in mode.loss_shapes:
        why = ("the ghost clippers differentiate the encoder's input vectors, and its "
               "examples carry only a sentence representation for the head; use "
               "dp.clipping='vmap'" if shape == "factored" else
               f"it supports the clippers of loss shape {list(mode.loss_shapes)}")
        need(False, "dp.clipping" if config.dp.enabled else "dp.enabled",
             config.dp.clipping if config.dp.enabled else config.dp.enabled,
             f"privacy.mode={mode.name!r}: {why}")
    need(config.train.epochs >= 0, "train.epochs", config.train.epochs, "must be >= 0")
    need(config.optimizer.warmup_fraction is None or 0 <= config.optimizer.warmup_fraction < 1,
         "optimizer.warmup_fraction", config.optimizer.warmup_fraction, "must be in [0, 1)")
    return mode


def _describe(capabilities: Sequence[str]) -> str:
    return ", ".join(f"{c} ({CAPABILITIES[c]})" for c in capabilities) or "nothing"


# ----------------------------------------------------------------------------- the run


def finetune(task, config, workdir, *, devices=None) -> dict:
    """Fine-tunes (or resumes) with `task` on the DP loop; writes and returns
    WORKDIR/results.json."""
    started = time.time()
    # Config errors before reading any data (the recipe's batch assumes a large N here) ...
    loop.validate(task, recipe.resolve(config))
    num_train = task.count_train_examples(config)
    # ... then the recipe for this N (dpbert.tasks.recipe), checked again.
    config = schedule.resolve_schedule(recipe.resolve(config, num_train), num_train)
    loop.validate(task, config)
    if (caution := recipe.caution(config)) is not None:
        hosts.announce("WARNING: " + caution)
    report = loop.run(task, config, workdir, devices=devices)
    workdir = pathlib.Path(workdir).absolute()
    out = results.collect(task.name, config, workdir, report, num_train=num_train,
                          eta=registry.get(config.privacy.mode).eta(config), started=started)
    if hosts.is_primary():
        hosts.write_json(workdir / results.RESULTS_FILE, out)
    return out


def run(config, workdir, *, devices=None) -> dict:
    """Fine-tunes with the task `config.task` names (`dpbert.tasks.get_task`: one object
    serves every run); returns results.json's content."""
    names = [n for n in tasks.task_names() if isinstance(tasks.get_task(n), FineTuningTask)]
    if config.get("task") not in names:
        raise ConfigError(f"config.task={config.get('task')!r}: must be "
                          f"{' or '.join(map(repr, names))} (use configs/finetune_*.py)")
    return finetune(tasks.get_task(config.task), config, workdir, devices=devices)


# ----------------------------------------------------------------------------- the task base


@dataclasses.dataclass
class Loaded:
    """A task's features before the release: `train` / `eval` dicts of arrays (rows with
    `example_id`), the label names, (NER) the rows that form one training example, and what
    the task's eval needs later (`extra`, into `TaskData.extra`)."""

    train: dict[str, np.ndarray]
    eval: dict[str, np.ndarray]
    labels: tuple[str, ...]
    num_train: int
    groups: np.ndarray | None = None
    extra: dict = dataclasses.field(default_factory=dict)


class FineTuningTask:
    """The parts of `dpbert.runtime.loop.Task` the fine-tuning tasks share. Subclasses set `name`,
    `model_kind`, `capabilities` and implement `count_train_examples`, `load`,
    `unit_definition`, `example_loss`, `eval_step`, `eval_metrics`, `train_metrics`.

    capabilities: what the task's examples and model offer an input mode
    (`dpbert.tasks.input_modes.base`: TOKENS, SENTENCE, ONE_SEQUENCE); `validate_common`
    refuses a mode that needs more. The object holds no run state (one object serves every
    run): what a run prepared is in its `TaskData`."""

    name = ""
    model_kind = ""
    capabilities: tuple[str, ...] = (TOKENS,)

    def validate(self, config) -> None:
        validate_common(self, config)

    def auto_clipping(self, config) -> str:
        """dp.clipping="auto": mixed ghost clipping (ghost norms of the word embedding's
        lookups and the dense kernels, one backward; BENCHMARKS.md "Fine-tuning step:
        classification on MiniLM's shape") where the task and the input mode offer the
        factored loss, else vmap."""
        mode = registry.MODES.get(config.privacy.mode)   # an unknown mode is refused by validate
        if ONE_SEQUENCE in self.capabilities and mode is not None and \
                "factored" in mode.loss_shapes:
            return "mixed_ghost"
        return "vmap"

    def factored_loss(self, graphdef, start_layer: int | None = None):
        """The task's loss for the ghost clippers (`dpbert.dp.ghost.FactoredLoss`), or None;
        `start_layer`: examples carry the cached frozen prefix's output."""
        del graphdef, start_layer
        return None

    def prepare(self, config, workdir: pathlib.Path, task_key) -> loop.TaskData:
        tok = starting_model.tokenizer(config)
        loaded = self.load(config, tok)
        vocab_file = pretraining.keep_vocab_in_workdir(tok.vocab_file, workdir)
        model = starting_model.load_model(config, self.model_kind, loaded.labels)
        user = registry.get(config.privacy.mode).user_side(config, model, vocab_file)
        train, eval_ = release.release_splits(config, user, loaded.train, loaded.eval, task_key,
                                              num_train=loaded.num_train, groups=loaded.groups)
        prefix_layers = None
        if prefix_cache.applies(config, self):
            train, eval_, prefix_layers = prefix_cache.cached_splits(config, model, train,
                                                                     eval_, workdir)
        report = user.report(epochs=schedule.epochs_seen(config, loaded.num_train),
                             secret_key=not config.dp.insecure_seeded_noise)
        # The vocabulary's own report (copied beside it into the workdir, if it had one): its
        # cost is part of the total unless the starting model's total already holds it.
        vocab_report = pretraining.read_vocab_report(pathlib.Path(vocab_file))
        return loop.TaskData(
            train, eval_, vocab_report, "file" if config.vocab.file else "checkpoint",
            max_seq_length=config.data.max_seq_length,
            # user_side: what a mode's loss / eval may need (TextHide: the secret pool).
            extra={"model": model, "vocab_file": vocab_file, "labels": loaded.labels,
                   "do_lower_case": tok.do_lower_case, "input_privacy": report,
                   "user_side": user, "prefix_layers": prefix_layers, **loaded.extra},
            unit_definition=self.unit_definition(config))

    def build_model(self, config, data):
        return data.extra.pop("model")

    def trainable(self, config):
        return registry.get(config.privacy.mode).trainable(config)

    def loss(self, graphdef, config, shape: str, data):
        custom = registry.get(config.privacy.mode).loss(graphdef, config, shape, data)
        if custom is not None:
            return custom
        factored = (self.factored_loss(graphdef, data.extra.get("prefix_layers"))
                    if shape == "factored" else None)
        if factored is not None:
            return factored
        loss_fn = self.example_loss(graphdef, deterministic=False,
                                    start_layer=data.extra.get("prefix_layers"))
        if shape == "batch":
            return clipping.batch_loss(loss_fn)
        if shape != "per_example":
            raise ConfigError(f"config.dp.clipping={config.dp.clipping!r}: the {self.name} "
                              f"task has no {shape!r} loss; use dp.clipping='vmap'")
        return loss_fn

    def batch_transform(self, config, model, data):
        # The users' release happened once, in prepare; a mode may carry a secret into the step.
        return registry.get(config.privacy.mode).batch_transform(config, data)

    def run_info(self, config, model, data) -> dict:
        vocab = pathlib.Path(data.extra["vocab_file"])
        return {"model_kind": self.model_kind,
                "model_config": dataclasses.asdict(model.config),
                "labels": list(data.extra["labels"]),
                "classifier_dropout": model.classifier_dropout,
                "vocab_file": str(vocab.relative_to(vocab.parent.parent)),
                "vocab_sha256": tokenization.vocab_fingerprint(vocab),
                "do_lower_case": data.extra["do_lower_case"],
                "max_seq_length": data.max_seq_length,
                "init_from_hf": config.model.init_from_hf,
                "input_privacy": data.extra["input_privacy"],
                "unit_definition": data.unit_definition,
                "num_eval_examples": data.eval.num_examples}

    def export(self, params, run: dict, workdir: pathlib.Path, out: pathlib.Path,
               report: dict | None):
        custom = registry.get(run["input_privacy"]["mode"]).export(params, run, out, report)
        if custom is not None:
            return custom
        vocab = workdir / run["vocab_file"]
        if not vocab.is_file() or tokenization.vocab_fingerprint(vocab) != run["vocab_sha256"]:
            raise ConfigError(f"{vocab}: missing or not the vocabulary this run trained with "
                              "(its sha256 differs from run.json's); refusing to export")
        cfg = model_lib.BertConfig(**run["model_config"])
        graphdef, _ = nnx.split(nnx.eval_shape(lambda: heads.TASK_MODELS[run["model_kind"]](
            cfg, run["labels"], classifier_dropout=run["classifier_dropout"],
            rngs=nnx.Rngs(0))))
        return hf_heads.save_task_model(
            nnx.merge(graphdef, params), out, vocab, do_lower_case=run["do_lower_case"],
            model_max_length=run["max_seq_length"], privacy_report=report,
            input_privacy_report=run["input_privacy"], source=run["init_from_hf"])
