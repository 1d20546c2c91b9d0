"""What the fine-tuning tasks (`classification`, `ner`) share on the one DP loop.

    input modes   `privacy.mode` -> an `InputMode` (a small registry): the users' side of the
                  model (what they release, what is frozen), the loss shapes it can give the
                  clipper, its report. The dχ modes none / token_rep / text_to_text / seq_rep
                  (`dpbert.privacy.input_privacy`) are registered here; representation-privacy modes
                  (TextHide, OME) plug in with `register_input_mode` without touching a task.
    the release   happens ONCE, in `Task.prepare`, keyed by the loop's secret task key: the
                  same release on resume and in every epoch (unless
                  privacy.fresh_noise_each_epoch), another one in another run; the eval split
                  is released too. `ReleasedSplit` serves it to the loop.
    model         `dpbert.models.heads` task model from a Hugging Face folder (model.init_from_hf);
                  dropout from the config
    schedule      train.epochs -> train.num_steps = ceil(epochs x N / B) (B = the expected
                  batch size), warm-up = optimizer.warmup_fraction of it
    finetune()    `loop.run` + WORKDIR/results.json (metrics, schedule, privacy)

The tasks themselves (`dpbert.tasks.classification`, `dpbert.tasks.ner`) add their data,
their per-example loss and their eval.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import pathlib
import threading
import time
from typing import Any, Callable, Mapping

import numpy as np
from absl import logging

from data_pipelines import classification as clf
from dpbert.privacy import input_privacy
from dpbert.errors import ConfigError

RESULTS_FILE = "results.json"
# Fields of an input mode's report that results.json's privacy block repeats at its top level.
REPORTED_FIELDS = ("variant", "epsilon_claimed", "epsilon_true")
IGNORE_LABEL = -100


def need(cond: bool, field: str, value: Any, why: str) -> None:
    if not cond:
        raise ConfigError(f"config.{field}={value!r}: {why}")


# ----------------------------------------------------------------------------- input modes


class InputMode:
    """One value of `privacy.mode`: the users' side of the split model.

    A mode says which tasks and which clipper loss shapes (`dpbert.dp.clipping.LOSS_SHAPES`) it
    supports: DP-SGD needs a per-example loss, so a mode whose loss mixes examples (TextHide)
    supports only "batch" and a DP run with it is refused. `loss` / `eval_logits` may replace
    the task's own (None = keep them).
    """

    name: str = ""
    tasks: tuple[str, ...] = ("classification", "ner")
    loss_shapes: tuple[str, ...] = ("per_example", "batch")

    def validate(self, config) -> None: ...

    def user_side(self, config, model, vocab_file: str) -> Any:
        """An object with `release(features, key, *, split, epoch=None)` -> a split with
        `batch(indices)` and `len()`, and `report(*, epochs, secret_key)` -> dict."""
        raise NotImplementedError

    def trainable(self, config) -> Callable | None:
        return None

    def frozen(self, config) -> list[str]:
        return []

    def loss(self, task, graphdef, config, shape: str) -> Callable | None:
        return None

    def eval_logits(self, task, graphdef, config) -> Callable | None:
        return None

    def export(self, params, run: dict, out: pathlib.Path, report: dict | None):
        """WORKDIR/hf when the trained model is not a plain HF task model (None = the task's
        own Hugging Face export)."""
        return None


_MODES: dict[str, InputMode] = {}


def register_input_mode(mode: InputMode) -> InputMode:
    if mode.name in _MODES and _MODES[mode.name] is not mode:
        raise ValueError(f"an input mode named {mode.name!r} is already registered")
    _MODES[mode.name] = mode
    return mode


def get_input_mode(name: str) -> InputMode:
    if name not in _MODES:
        raise ConfigError(f"config.privacy.mode={name!r}: must be one of {input_mode_names()}")
    return _MODES[name]


def input_mode_names() -> tuple[str, ...]:
    return tuple(_MODES)


@dataclasses.dataclass(frozen=True)
class DchiMode(InputMode):
    """Qu et al.'s modes (`dpbert.privacy.input_privacy`): dχ on tokens or on the sentence vector."""

    name: str
    tasks: tuple[str, ...] = ("classification", "ner")
    loss_shapes: tuple[str, ...] = ("per_example", "batch")

    def settings(self, config) -> input_privacy.InputPrivacyConfig:
        p = config.privacy
        try:
            return input_privacy.InputPrivacyConfig(
                mode=self.name, eta=None if self.name == "none" else p.eta,
                fresh_noise_each_epoch=bool(p.fresh_noise_each_epoch),
                seq_rep_source=p.seq_rep_source, tokens_per_call=p.tokens_per_call,
                examples_per_call=p.examples_per_call, chunk_size=p.chunk_size)
        except ValueError as e:
            raise ConfigError(f"config.{e}") from None

    def validate(self, config) -> None:
        self.settings(config)

    def user_side(self, config, model, vocab_file: str):
        return input_privacy.InputPrivatizer.from_model(self.settings(config), model, vocab_file)

    def trainable(self, config):
        return None if self.name == "none" else input_privacy.trainable_filter(self.name)

    def frozen(self, config) -> list[str]:
        return input_privacy.frozen_parts(self.name)


# Tasks with a ghost-clipping ("factored") loss: one sequence per example.
FACTORED_TASKS = ("classification",)

for _name in input_privacy.MODES:
    # seq_rep examples carry the sentence vector only (the head alone trains): no ghost loss.
    register_input_mode(DchiMode(_name, ("classification",) if _name == "seq_rep"
                                 else ("classification", "ner"),
                                 ("per_example", "batch") if _name == "seq_rep"
                                 else ("per_example", "batch", "factored")))


def validate_common(task_name: str, config) -> InputMode:
    """Checks every fine-tuning task makes; returns the input mode."""
    from dpbert.dp import clipping  # noqa: PLC0415

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
    mode = get_input_mode(config.privacy.mode)
    need(task_name in mode.tasks, "privacy.mode", config.privacy.mode,
         f"not available for the {task_name} task (it supports {list(mode.tasks)})")
    mode.validate(config)
    shape = clipping.get_clipper(config.dp.clipping if config.dp.enabled else "none").loss_shape
    if shape == "factored" and task_name not in FACTORED_TASKS:
        need(False, "dp.clipping", config.dp.clipping,
             f"the ghost clippers take one sequence per example; a {task_name} example is "
             "a document of several windows; use dp.clipping='vmap'")
    if shape not in mode.loss_shapes:
        why = ("its loss mixes examples, so per-example clipping (DP-SGD) is impossible; set "
               "dp.enabled=False" if "per_example" not in mode.loss_shapes else
               "the ghost clippers differentiate the encoder's input vectors, and its "
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


# ----------------------------------------------------------------------------- tokenizer, model


def tokenizer(config):
    """The data's WordPiece tokenizer, checked against the checkpoint (vocab file and size)."""
    folder = pathlib.Path(config.model.init_from_hf)
    hf_config = json.loads((folder / "config.json").read_text())
    return clf.tokenizer_for_checkpoint(folder, vocab_file=config.vocab.file or None,
                                        vocab_size=hf_config.get("vocab_size"))


def load_model(config, kind: str, labels):
    """The task model from model.init_from_hf, with the config's dropout."""
    from flax import nnx  # noqa: PLC0415

    from dpbert.models import heads  # noqa: PLC0415

    from dpbert.models import hf_heads  # noqa: PLC0415

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


# ----------------------------------------------------------------------------- datasets


def content_sha256(features: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(features):
        a = np.ascontiguousarray(features[k])
        h.update(f"{k}:{a.dtype}:{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


class ReleasedSplit:
    """A released split as the loop's random-access dataset.

    release: the split as the service received it (`input_privacy.Release`), or a function
      epoch -> Release (fresh noise every epoch: epoch = step // steps_per_epoch).
    groups: int [N, W] rows of the release that form one example (-1 = none): NER's documents
      (all windows of a document are ONE example, the privacy unit); the batch then has a
      window axis [n, W, ...] and `window_mask` [n, W]; `labels` of missing windows are
      IGNORE_LABEL.
    """

    def __init__(self, release, *, num_examples: int, content: str,
                 steps_per_epoch: float | None = None, groups: np.ndarray | None = None):
        self._release = release
        self._steps_per_epoch = steps_per_epoch
        self._cache: dict[int, Any] = {}
        self._lock = threading.Lock()
        self.groups = groups
        self.num_examples = int(num_examples)
        self.metadata = {"content_sha256": content}

    def release(self, step: int = 0):
        if not callable(self._release):
            return self._release
        epoch = int(step // self._steps_per_epoch)
        with self._lock:
            if epoch not in self._cache:
                self._cache = {epoch: self._release(epoch)}  # epochs only move forward
            return self._cache[epoch]

    def get_batch(self, indices: np.ndarray, *, step: int) -> dict[str, np.ndarray]:
        release = self.release(step)
        indices = np.asarray(indices, np.int64)
        if self.groups is None:
            return release.batch(indices)
        rows = self.groups[indices]                                   # [n, W]
        flat = release.batch(np.maximum(rows, 0).reshape(-1))
        out = {k: v.reshape(rows.shape + v.shape[1:]) for k, v in flat.items()}
        present = rows >= 0
        out["window_mask"] = present.astype(np.int32)
        if "labels" in out:
            out["labels"] = np.where(present[..., None], out["labels"], IGNORE_LABEL)
        return out


def group_rows(example_id: np.ndarray) -> np.ndarray:
    """int [U, W_max]: the rows of each unit (example_id 0..U-1 in order), -1 padded."""
    example_id = np.asarray(example_id)
    units, counts = np.unique(example_id, return_counts=True)
    if not np.array_equal(units, np.arange(len(units))):
        raise ValueError("example ids must be 0..U-1")
    groups = np.full((len(units), counts.max()), -1, np.int64)
    for u in range(len(units)):
        rows = np.flatnonzero(example_id == u)
        groups[u, :len(rows)] = rows
    return groups


def release_splits(config, user, train: dict, eval_: dict, task_key, *, num_train: int,
                   groups: np.ndarray | None = None) -> tuple[ReleasedSplit, ReleasedSplit]:
    """The users' release of the train and eval features (module docstring)."""
    import jax.numpy as jnp  # noqa: PLC0415

    key = jnp.asarray(np.asarray(task_key, np.uint32).reshape(2))
    fresh = bool(config.privacy.fresh_noise_each_epoch) and config.privacy.mode != "none"
    steps_per_epoch = num_train / config.batch.expected_batch_size

    def release(features, split, epoch=None):
        t0 = time.time()
        out = user.release(features, key, split=split, epoch=epoch)
        if config.privacy.mode != "none":
            tokens = int(np.sum(features["input_mask"]))
            announce(f"released the {split} split{'' if epoch is None else f' (epoch {epoch})'}"
                     f" as mode {config.privacy.mode} ({tokens:,} tokens) in "
                     f"{time.time() - t0:.0f} s")
        return out

    content = content_sha256(train)
    train_split = ReleasedSplit(
        (lambda e: release(train, "train", e)) if fresh else release(train, "train"),
        num_examples=num_train, content=content, steps_per_epoch=steps_per_epoch,
        groups=groups)
    eval_split = ReleasedSplit(release(eval_, "eval"), num_examples=len(eval_["input_ids"]),
                               content=content_sha256(eval_))
    return train_split, eval_split


def announce(message: str) -> None:
    logging.info(message)
    print(message, flush=True)


# ----------------------------------------------------------------------------- schedule


def resolve_schedule(config, num_train: int):
    """A copy of `config` with train.num_steps = ceil(epochs x N / B) when train.epochs > 0
    and optimizer.warmup_steps = round(warmup_fraction x num_steps) when that is set."""
    config = copy.deepcopy(config)
    b = float(config.batch.expected_batch_size)
    if config.train.epochs:
        config.train.num_steps = max(1, math.ceil(config.train.epochs * num_train / b))
    if config.optimizer.warmup_fraction is not None:
        config.optimizer.warmup_steps = int(round(config.optimizer.warmup_fraction *
                                                  config.train.num_steps))
    return config


def schedule_report(config, num_train: int) -> dict:
    b = float(config.batch.expected_batch_size)
    steps = int(config.train.num_steps)
    return {"num_steps": steps, "epochs": steps * b / num_train,
            "requested_epochs": float(config.train.epochs) or None,
            "num_train_examples": num_train, "expected_batch_size": b,
            "warmup_steps": int(config.optimizer.warmup_steps),
            "rule": "num_steps = ceil(train.epochs x N / B), B = batch.expected_batch_size "
                    "(with Poisson sampling an epoch is N/B steps in expectation)"}


def epochs_seen(config, num_train: int) -> int:
    """How many (possibly partial) epochs the run's steps cover: releases with fresh noise."""
    return max(1, math.ceil(config.train.num_steps * config.batch.expected_batch_size
                            / num_train - 1e-9))


# ----------------------------------------------------------------------------- the run


def final_eval(workdir: pathlib.Path) -> dict[str, float]:
    """The last held-out metrics the loop wrote (the final evaluation comes last)."""
    last: dict[str, float] = {}
    path = workdir / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if any(k.startswith("eval/") for k in record):
                last = {k[len("eval/"):]: v for k, v in record.items() if k.startswith("eval/")}
    return last


def finetune(task, config, workdir, *, devices=None) -> dict:
    """Fine-tunes (or resumes) with `task` on the DP loop; writes and returns
    WORKDIR/results.json."""
    from dpbert.runtime import loop  # noqa: PLC0415

    t0 = time.time()
    loop.validate(task, config)  # config errors before reading any data
    num_train = task.count_train_examples(config)
    config = resolve_schedule(config, num_train)
    report = loop.run(task, config, workdir, devices=devices)
    workdir = pathlib.Path(workdir).absolute()
    run = json.loads((workdir / loop.RUN_FILE).read_text())
    metrics = final_eval(workdir)
    results = {"task": task.name, **{f"eval_{k}": v for k, v in metrics.items()},
               "num_train_examples": num_train, "num_eval_examples": run["num_eval_examples"],
               "labels": run["labels"], "schedule": schedule_report(config, num_train),
               "steps": report["steps"],
               "privacy": {"mode": config.privacy.mode,
                           "eta": float(config.privacy.eta)
                           if config.privacy.mode in input_privacy.MODES[1:] else None,
                           **{k: run["input_privacy"][k] for k in REPORTED_FIELDS
                              if k in run["input_privacy"]},
                           "frozen": run["input_privacy"]["frozen"],
                           "input_privacy": run["input_privacy"],
                           "privacy_unit": run["unit_definition"],
                           "dp_sgd": report if report.get("dp") else None,
                           "dp_sgd_headline": report.get("headline")},
               "model": {"init_from_hf": config.model.init_from_hf,
                         "hf_export": str(workdir / "hf") if config.train.export_hf else None},
               "wall_seconds": time.time() - t0}
    if loop.is_primary():
        loop.write_json(workdir / RESULTS_FILE, results)
    return results


# ----------------------------------------------------------------------------- the task base


@dataclasses.dataclass
class Loaded:
    """A task's features before the release: `train` / `eval` dicts of arrays (rows with
    `example_id`), the label names, and (NER) the rows that form one training example."""

    train: dict[str, np.ndarray]
    eval: dict[str, np.ndarray]
    labels: tuple[str, ...]
    num_train: int
    groups: np.ndarray | None = None
    extra: dict = dataclasses.field(default_factory=dict)


class FineTuningTask:
    """The parts of `dpbert.runtime.loop.Task` the fine-tuning tasks share. Subclasses set `name`,
    `model_kind` and implement `count_train_examples`, `load`, `unit_definition`,
    `example_loss`, `eval_step`, `eval_metrics`, `train_metrics`."""

    name = ""
    model_kind = ""

    def validate(self, config) -> None:
        validate_common(self.name, config)

    def auto_clipping(self, config) -> str:
        """dp.clipping="auto": mixed ghost clipping (ghost norms of the word embedding's
        lookups and the dense kernels, one backward; BENCHMARKS.md "Fine-tuning step:
        classification on MiniLM's shape") where the task and the input mode offer the
        factored loss, else vmap."""
        mode = _MODES.get(config.privacy.mode)   # an unknown mode is refused by validate
        if self.name in FACTORED_TASKS and mode is not None and "factored" in mode.loss_shapes:
            return "mixed_ghost"
        return "vmap"

    def factored_loss(self, graphdef):
        """The task's loss for the ghost clippers (`dpbert.dp.ghost.FactoredLoss`), or None."""
        del graphdef
        return None

    def prepare(self, config, workdir: pathlib.Path, task_key):
        from dpbert.runtime import loop  # noqa: PLC0415
        from dpbert.tasks import pretraining  # noqa: PLC0415

        tok = tokenizer(config)
        loaded = self.load(config, tok)
        vocab_file = pretraining.keep_vocab_in_workdir(tok.vocab_file, workdir)
        model = load_model(config, self.model_kind, loaded.labels)
        mode = get_input_mode(config.privacy.mode)
        user = mode.user_side(config, model, vocab_file)
        # What a mode's loss / eval may need (TextHide: the secret pool, the label count).
        self.user_side, self.labels = user, loaded.labels
        train, eval_ = release_splits(config, user, loaded.train, loaded.eval, task_key,
                                      num_train=loaded.num_train, groups=loaded.groups)
        report = user.report(epochs=epochs_seen(config, loaded.num_train),
                             secret_key=not config.dp.insecure_seeded_noise)
        # The vocabulary's own report (copied beside it into the workdir, if it had one): its
        # cost is part of the total unless the starting model's total already holds it.
        vocab_report = pretraining.read_vocab_report(pathlib.Path(vocab_file))
        return loop.TaskData(
            train, eval_, vocab_report, "file" if config.vocab.file else "checkpoint",
            max_seq_length=config.data.max_seq_length,
            extra={"model": model, "vocab_file": vocab_file, "labels": loaded.labels,
                   "do_lower_case": tok.do_lower_case, "input_privacy": report,
                   **loaded.extra},
            unit_definition=self.unit_definition(config))

    def build_model(self, config, data):
        return data.extra.pop("model")

    def trainable(self, config):
        return get_input_mode(config.privacy.mode).trainable(config)

    def loss(self, graphdef, config, shape: str):
        from dpbert.dp import clipping  # noqa: PLC0415

        custom = get_input_mode(config.privacy.mode).loss(self, graphdef, config, shape)
        if custom is not None:
            return custom
        factored = self.factored_loss(graphdef) if shape == "factored" else None
        if factored is not None:
            return factored
        loss_fn = self.example_loss(graphdef, deterministic=False)
        if shape == "batch":
            return clipping.batch_loss(loss_fn)
        if shape != "per_example":
            raise ConfigError(f"config.dp.clipping={config.dp.clipping!r}: the {self.name} "
                              f"task has no {shape!r} loss; use dp.clipping='vmap'")
        return loss_fn

    def batch_transform(self, config, model, data):
        return None  # the users' release happened once, in prepare

    def run_info(self, config, model, data) -> dict:
        from data_pipelines import tokenization  # noqa: PLC0415

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
        from flax import nnx  # noqa: PLC0415

        from data_pipelines import tokenization  # noqa: PLC0415
        from dpbert.models import heads  # noqa: PLC0415
        from dpbert.models import hf_heads  # noqa: PLC0415
        from dpbert.models import bert as model_lib  # noqa: PLC0415

        custom = get_input_mode(run["input_privacy"]["mode"]).export(params, run, out, report)
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


def run(config, workdir, *, devices=None) -> dict:
    """Fine-tunes with the task `config.task` names (a fresh task object per run: the NER task
    keeps its held-out layout between prepare and eval); returns results.json's content."""
    from dpbert import tasks  # noqa: PLC0415

    if config.get("task") not in ("classification", "ner"):
        raise ConfigError(f"config.task={config.get('task')!r}: must be 'classification' or "
                          "'ner' (use configs/finetune_*.py)")
    return finetune(type(tasks.get_task(config.task))(), config, workdir, devices=devices)


# The representation-privacy modes (OME) register themselves; imported last (they subclass
# InputMode from this module).
from dpbert.tasks import representation_modes  # noqa: E402,F401
