"""BERT pretraining (MLM + NSP) as a task on the DP loop: `train_and_evaluate(config, workdir)`.

    vocab   config.vocab.file, the init_from_hf folder's vocab.txt, or a DP WordPiece
            vocabulary built from the training corpus into WORKDIR/vocab
    data    `data_pipelines.pretraining.build_datasets` (a synthetic corpus is first written
            to WORKDIR/data as a NOTEEVENTS-schema CSV, read like real MIMIC-III notes)
    model   a size preset, or a Hugging Face BERT folder (init_from_hf)
    loss    per-example MLM (a registered target: vanilla / prob / denoising) + NSP; the
            factored view of the tied word embedding for the ghost clipper
    dχ      privacy-adaptive pretraining: every example privatized on the devices inside the
            step, φ (the word embedding) frozen
    export  `BertForPreTraining` in Hugging Face format with the privacy card
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from data_pipelines import dp_vocab, fileio, identity, synthetic_notes, tokenization
from data_pipelines import pretraining as pretraining_data
from dpbert.privacy import dchi
from dpbert.tasks import preflight
from dpbert.models import hf, hf_export
from dpbert.runtime import hosts, loop
from dpbert.models import losses
from dpbert.runtime import metrics as metrics_lib
from dpbert.models import bert as model_lib
from dpbert.core import units as privacy_units
from dpbert.dp import clipping, trees
from dpbert.errors import ConfigError, need

_DCHI_STREAM = 0x0D1  # key domain of dχ privatization (apart from the DP engine's streams)
_EVAL_STREAM = 1 << 30  # eval privatization keys: a step index training never reaches
# What only the NSP loss trains (path names): frozen when train.nsp is False.
NSP_ONLY_PATHS = ("seq_relationship", "pooler")
NO_NSP_CARD = ("## Next-sentence head\n\nPretrained with the masked-LM loss alone "
               "(`train.nsp=False`): the next-sentence head (`cls.seq_relationship`) and the "
               "pooler it reads were not trained by this run and keep their initial values "
               "(random, or the starting model's with `model.init_from_hf`). "
               "Fine-tuning that reads the pooled output trains the pooler with its head.")


def _one_sequence_per_unit(config) -> bool:
    """Whether dp.privacy_unit is one training sequence (not a `PrivacyUnit.per_unit` unit of
    several; False for a name that is no unit, which `dpbert.dp.plan.validate` refuses)."""
    unit = privacy_units.find(config.dp.privacy_unit)
    return unit is not None and not unit.per_unit


class PretrainingTask:
    name = "pretraining"
    model_kind = "pretraining"  # dpbert.models.trainable.HEADS

    def auto_clipping(self, config) -> str:
        """dp.clipping="auto": mixed ghost clipping (ghost norms of the dense kernels and
        embeddings, one backward; the fastest and leanest, BENCHMARKS.md "DP-SGD step") for
        one sequence per unit; per note / patient the tied-embedding ghost clipper (a unit's
        loss has no dense-layer taps)."""
        return "mixed_ghost" if _one_sequence_per_unit(config) else "ghost_embedding"

    def validate(self, config: ml_collections.ConfigDict) -> None:
        need(config.data.get("duplicate_ids", identity.DEFAULT_RULE) in identity.RULES,
             "data.duplicate_ids", config.data.get("duplicate_ids"),
             f"must be one of {', '.join(identity.RULES)}")
        if config.data.corpus in ("text", "noteevents"):
            what = ("a MIMIC-III NOTEEVENTS.csv(.gz) file (credentialed PhysioNet data, "
                    "download it yourself)" if config.data.corpus == "noteevents" else
                    "text files (one sentence per line, blank line between documents)")
            need(len(config.data.paths) > 0, "data.paths", config.data.paths,
                 f"is empty: give {what}")
            for path in config.data.paths:
                if not os.path.isfile(os.path.expanduser(path)):
                    raise ConfigError(
                        f"config.data.paths: {path!r} does not exist (expected {what})")
        if config.dchi.mechanism != "none":
            need(bool(config.model.init_from_hf), "model.init_from_hf",
                 config.model.init_from_hf,
                 "dχ privatization needs a pretrained BERT folder: its word embeddings are φ")
        need(config.model.size in model_lib.PRESETS or bool(config.model.init_from_hf),
             "model.size", config.model.size, f"must be one of {sorted(model_lib.PRESETS)}")
        need(config.mlm_target in losses.mlm_target_names(), "mlm_target", config.mlm_target,
             f"must be one of {losses.mlm_target_names()}")
        need(config.dchi.mechanism in dchi.MECHANISMS, "dchi.mechanism", config.dchi.mechanism,
             f"must be one of {dchi.MECHANISMS}")
        # dchi.eta: `dpbert.runtime.config_checks` (one check of η for every task).
        need(config.dchi.mechanism == "none" or _one_sequence_per_unit(config),
             "dchi.mechanism", config.dchi.mechanism,
             f"dχ privatization works per example; it cannot be combined with "
             f"dp.privacy_unit={config.dp.privacy_unit!r}")
        if not (config.vocab.file or config.model.init_from_hf):  # built here: check first
            floor = dp_vocab.min_vocab_size(config.data.do_lower_case)
            need(config.vocab.size >= floor, "vocab.size", config.vocab.size, "must be >= the " +
                 dp_vocab.vocab_size_floor(config.data.do_lower_case,
                                           lower_case_field="data.do_lower_case"))
        need(not config.dp.enabled or config.dp.clipping != "mixed_ghost"
             or _one_sequence_per_unit(config), "dp.clipping", config.dp.clipping,
             f"mixed_ghost clips one example (its dense-layer taps and position-table identity "
             f"assume one sequence); with dp.privacy_unit={config.dp.privacy_unit!r} use "
             f"'ghost_embedding' or 'vmap'")
        try:  # the data fields (held-out split per unit, ...) before any vocabulary is built
            data = config.data
            if not data.cache_dir:   # `prepare` puts it in the workdir: a canary record's home
                data = copy.deepcopy(data)
                data.cache_dir = "WORKDIR/data/instances"
            pretraining_data.check_config(data, config.dp.privacy_unit)
        except ValueError as e:
            raise ConfigError(f"config.{e}") from None
        need(not config.get("fill_mask") or config.fill_mask.count("[MASK]") == 1,
             "fill_mask", config.get("fill_mask"), "needs exactly one [MASK]")
        need(config.model.max_position_embeddings >= config.data.max_seq_length,
             "model.max_position_embeddings", config.model.max_position_embeddings,
             f"must be >= data.max_seq_length ({config.data.max_seq_length})")

    # ---------------------------------------------------------------------------- data

    def prepare(self, config, workdir: pathlib.Path, task_key) -> loop.TaskData:
        data_config = prepare_corpus(config, workdir)
        preflight.check(config, data_config, workdir)  # data.preflight: before anything is built
        vocab_file, vocab_report, origin = prepare_vocab(config, data_config, workdir)
        if config.get("fill_mask"):  # before any training: it tokenizes with this vocabulary
            fill_mask_ids(tokenization.WordPieceTokenizer(
                vocab_file, do_lower_case=data_config.do_lower_case), config.fill_mask,
                data_config.max_seq_length)
        vocab_file = keep_vocab_in_workdir(vocab_file, workdir)
        unit = config.dp.privacy_unit
        train_ds, eval_ds = pretraining_data.build_datasets(data_config, vocab_file, unit)
        canary_file = train_ds.metadata.get("canary_file")
        if canary_file and hosts.is_primary():  # kept with the run, for launch/exposure.py
            fileio.atomic_write_text(workdir / "canaries.json",
                                     pathlib.Path(canary_file).read_text())
        return loop.TaskData(train_ds, eval_ds, vocab_report, origin,
                             max_seq_length=data_config.max_seq_length,
                             extra={"vocab_file": vocab_file,
                                    "do_lower_case": data_config.do_lower_case,
                                    "task_key": task_key},
                             unit_ids=train_ds.unit_ids, units=train_ds.metadata.get("units"))

    # --------------------------------------------------------------------------- model

    def build_model(self, config, data: loop.TaskData) -> model_lib.BertForPreTraining:
        return build_model(config, len(tokenization.load_vocab(data.extra["vocab_file"])))

    def trainable(self, config):
        # dχ: the user-side word embedding (and the decoder tied to it) is frozen. Without the
        # NSP loss (train.nsp=False) its head and the pooler it reads get no gradient: frozen,
        # so they get no noise either and are not in the d of σ·√d/B.
        frozen = (("word_embeddings",) if config.dchi.mechanism != "none" else ()) + (
            () if config.train.get("nsp", True) else NSP_ONLY_PATHS)
        return trees.freeze_paths_containing(*frozen) if frozen else None

    def loss(self, graphdef, config, shape: str, data: loop.TaskData):
        frozen = config.dchi.mechanism != "none"
        kw = dict(deterministic=False, mlm_target=config.mlm_target,
                  frozen_word_embedding=frozen, nsp=config.train.get("nsp", True))
        if shape == "factored":
            return losses.make_factored_pretraining_loss(graphdef, **kw)
        loss_fn = losses.make_pretraining_loss(graphdef, **kw)
        return clipping.batch_loss(loss_fn) if shape == "batch" else loss_fn

    def batch_transform(self, config, model, data) -> loop.BatchTransform | None:
        """dχ: a fresh privatization of every example each time it is seen (key unique to the
        logical step and call, the example's to its position); held-out text privatized as
        users would privatize theirs (fixed keys per eval batch, a stream apart)."""
        d = config.dchi
        if d.mechanism == "none":
            return None
        # φ is the starting model's word-embedding table, copied now; it stays frozen, so the
        # privacy level that η stands for cannot drift.
        privatizer = dchi.Privatizer.from_model(
            model, data.extra["vocab_file"], eta=float(d.eta), mechanism=d.mechanism,
            mlm_target=config.mlm_target, prob_samples=d.prob_samples, chunk_size=d.chunk_size)
        # Keyed by position in the batch, like dropout: secret in a DP run (positions depend on
        # which examples the secret sampler drew; `randomness.dropout_key`), else the seed.
        root = (jnp.asarray(np.asarray(data.extra["task_key"], np.uint32).reshape(2))
                if config.dp.enabled and not config.dp.insecure_seeded_noise
                else jax.random.PRNGKey(config.seed))
        key = jax.random.fold_in(root, _DCHI_STREAM)
        eval_key = jax.random.fold_in(key, _EVAL_STREAM)
        # The keys travel in the operand, an argument of the jitted step: closed over, they
        # would be constants of the compiled program, which the persistent compilation cache
        # writes to disk (tests/dpbert/runtime/test_cached_programs.py).
        return loop.BatchTransform(
            (privatizer, key, eval_key),
            train=lambda op, batch, step, micro: dchi.privatize_batch(
                op[0], batch, dchi.batch_key(op[1], step, micro)),
            eval=lambda op, batch, index: dchi.privatize_batch(
                op[0], batch, dchi.batch_key(op[2], index)))

    # ---------------------------------------------------------------------------- eval

    def eval_step(self, graphdef, config, data: loop.TaskData):
        loss_fn = losses.make_pretraining_loss(graphdef, deterministic=True,
                                               mlm_target=config.mlm_target,
                                               nsp=config.train.get("nsp", True))

        def step(params, batch, mask):
            keys = jnp.zeros((mask.shape[0], 2), jnp.uint32)
            _, m = jax.vmap(loss_fn, in_axes=(None, 0, 0))(params, batch, keys)
            w = mask.astype(jnp.float32)
            return jax.tree.map(lambda x: jnp.sum(x * w), m)

        return step

    def eval_metrics(self, outputs: list, data: loop.TaskData) -> dict[str, float]:
        return metrics_lib.summarize(jax.tree.map(lambda *x: sum(x), *outputs))

    def train_metrics(self, sums: dict) -> dict[str, float]:
        return metrics_lib.summarize(sums)

    # -------------------------------------------------------------------------- export

    def run_info(self, config, model, data: loop.TaskData) -> dict:
        vocab = pathlib.Path(data.extra["vocab_file"])
        return {"model_config": dataclasses.asdict(model.config),
                # Relative to the workdir (which may move), checked by hash on export.
                "vocab_file": str(vocab.relative_to(vocab.parent.parent)),
                "vocab_sha256": tokenization.vocab_fingerprint(vocab),
                "do_lower_case": data.extra["do_lower_case"],
                "max_seq_length": data.max_seq_length,
                "init_from_hf": config.model.init_from_hf or None,
                "fill_mask": config.get("fill_mask") or None,
                "nsp": bool(config.train.get("nsp", True)),
                # Into the run's report, so the export's card and report keep them.
                "report_fields": _adaptive_fields(config)}

    def export(self, params, run: dict, workdir: pathlib.Path, out: pathlib.Path,
               report: dict | None):
        vocab = workdir / run["vocab_file"]
        if not vocab.is_file() or tokenization.vocab_fingerprint(vocab) != run["vocab_sha256"]:
            raise ConfigError(f"{vocab}: missing or not the vocabulary this run trained with "
                              "(its sha256 differs from run.json's); refusing to export")
        config = model_lib.BertConfig(**run["model_config"])
        graphdef, _ = nnx.split(nnx.eval_shape(
            lambda: model_lib.BertForPreTraining(config, rngs=nnx.Rngs(0))))
        model = nnx.merge(graphdef, params)
        saved = hf_export.save_pretrained(model, out, vocab,
                                          do_lower_case=run["do_lower_case"],
                                          model_max_length=run["max_seq_length"],
                                          privacy_report=report,
                                          source=run.get("init_from_hf"),
                                          card_sections=(() if run.get("nsp", True)
                                                         else (NO_NSP_CARD,)))
        if run.get("fill_mask"):  # checked in `prepare`; never fails a finished export
            try:
                guesses = fill_mask(model, tokenization.WordPieceTokenizer(
                    vocab, do_lower_case=run["do_lower_case"]), run["fill_mask"])
                hosts.announce(f"fill-in: {run['fill_mask']!r} -> " + " | ".join(
                    f"{token} {p:.2f}" for token, p in guesses))
            except ConfigError as e:
                logging.warning("no fill-in: %s", e)
        return saved


def fill_mask_ids(tokenizer: tokenization.WordPieceTokenizer, text: str,
                  max_length: int) -> tuple[np.ndarray, int]:
    """[CLS] text [SEP] as ids [1, n] and the position of its one [MASK]; a ConfigError when
    there is not exactly one [MASK] or the n tokens exceed max_length."""
    ids = tokenizer.encode(text)
    where = np.flatnonzero(ids == tokenizer.special.mask)
    if len(where) != 1:
        raise ConfigError(f"config.fill_mask={text!r}: needs exactly one [MASK] token")
    sp = tokenizer.special
    ids = np.concatenate([[sp.cls], ids, [sp.sep]]).astype(np.int32)[None]
    if ids.shape[1] > max_length:
        raise ConfigError(f"config.fill_mask={text!r}: {ids.shape[1]} tokens with this "
                          f"vocabulary, longer than the {max_length} the run's sequences have")
    return ids, int(where[0]) + 1


def fill_mask(model: model_lib.BertForPreTraining, tokenizer: tokenization.WordPieceTokenizer,
              text: str, top_k: int = 5) -> list[tuple[str, float]]:
    """The model's top_k tokens (with their probabilities) for the one [MASK] of `text`, a
    public sentence (config.fill_mask): [CLS] text [SEP], no dropout. Post-processing of the
    trained model, so it costs no privacy."""
    ids, where = fill_mask_ids(tokenizer, text, model.config.max_position_embeddings)
    graphdef, state = nnx.split(model)
    probs = np.asarray(_mask_probabilities(graphdef, state, jnp.asarray(ids),
                                           jnp.asarray([[where]], jnp.int32)))
    top = np.argsort(-probs, kind="stable")[:top_k]
    return [(tokenizer.vocab[i], float(probs[i])) for i in top]


@functools.partial(jax.jit, static_argnums=0)
def _mask_probabilities(graphdef, state, ids: jax.Array, where: jax.Array) -> jax.Array:
    """float32 [V]: the MLM distribution at position `where` of `ids` [1, n], no dropout; one
    program (run op by op, the forward cost ~0.5-1.7 s of every export on the CPU)."""
    out = nnx.merge(graphdef, state)(ids, jnp.zeros_like(ids), jnp.ones_like(ids), where,
                                     deterministic=True)
    return jax.nn.softmax(out.mlm_logits[0, 0].astype(jnp.float32))


def _adaptive_fields(config) -> dict:
    """The privacy-adaptive settings a derived model must keep ({} without dχ): the mechanism,
    η, the MLM target (and its draws), what was frozen."""
    d = config.dchi
    if d.mechanism == "none":
        return {}
    return {"privacy_adaptive": {
        "method": "privacy-adaptive pretraining (Qu et al. 2021): every input token "
                  "dχ-privatized on the fly, on the training devices",
        "mechanism": d.mechanism, "eta": float(d.eta), "mlm_target": config.mlm_target,
        **({"prob_samples": int(d.prob_samples)} if config.mlm_target == "prob" else {}),
        "frozen": "the word embedding (the user-side φ) and the MLM decoder tied to it",
        "init_from_hf": config.model.init_from_hf or None}}


TASK = PretrainingTask()


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | os.PathLike, *,
                       devices: list[jax.Device] | None = None) -> dict:
    """Pretrains (or resumes) as `config` says in `workdir`; returns the privacy report."""
    return loop.run(TASK, config, workdir, devices=devices)


# ------------------------------------------------------------------------------- stages


def prepare_corpus(config: ml_collections.ConfigDict, workdir: pathlib.Path
                   ) -> ml_collections.ConfigDict:
    """The data config to build from. A synthetic corpus is first written to the workdir as a
    NOTEEVENTS-schema CSV, so the demo exercises the same reader as real MIMIC-III notes."""
    data = ml_collections.ConfigDict(config.data.to_dict())
    if data.corpus == "synthetic":
        path = workdir / "data" / (f"synthetic_notes_{data.synthetic_num_notes}_"
                                   f"{data.synthetic_seed}.csv.gz")
        if not path.exists() and hosts.is_primary():
            path.parent.mkdir(parents=True, exist_ok=True)
            with fileio.atomic_path(path) as tmp:
                synthetic_notes.write_noteevents_csv(
                    tmp, synthetic_notes.generate_synthetic(data.synthetic_num_notes,
                                                            seed=data.synthetic_seed))
        hosts.sync("synthetic corpus")
        data.corpus = "noteevents"
        data.paths = (str(path),)
    if not data.cache_dir:
        data.cache_dir = str(workdir / "data" / "instances")
    return data


def keep_vocab_in_workdir(vocab_file: str, workdir: pathlib.Path) -> str:
    """The run's vocabulary always lives in WORKDIR/vocab (built there, or copied there with
    its vocab_privacy.json), so a moved workdir exports with the right one; on resume a
    configured vocabulary that differs from it is refused."""
    source, kept = pathlib.Path(vocab_file), workdir / "vocab" / "vocab.txt"
    if source.resolve() == kept.resolve():
        return str(kept)
    if kept.is_file():
        if tokenization.vocab_fingerprint(source) != tokenization.vocab_fingerprint(kept):
            raise ConfigError(f"{source}: differs from the vocabulary this run started with "
                              f"({kept}); use the same vocabulary or a fresh --workdir")
        return str(kept)
    if hosts.is_primary():
        kept.parent.mkdir(parents=True, exist_ok=True)
        report = source.parent / hf.VOCAB_REPORT
        if report.is_file():
            fileio.atomic_write_text(kept.parent / hf.VOCAB_REPORT, report.read_text())
        fileio.atomic_write_text(kept, source.read_text(encoding="utf-8"))
    hosts.sync("vocabulary copy")
    return str(kept)


def read_vocab_report(vocab_file: pathlib.Path) -> dict | None:
    """The vocab_privacy.json beside a vocab.txt (None when there is none)."""
    report = vocab_file.parent / hf.VOCAB_REPORT
    return json.loads(report.read_text()) if report.is_file() else None


def prepare_vocab(config: ml_collections.ConfigDict, data: ml_collections.ConfigDict,
                  workdir: pathlib.Path) -> tuple[str, dict | None, str]:
    """(vocab.txt path, the vocabulary's privacy report or None, where it came from: "file",
    "checkpoint" or "built"). A vocab_privacy.json beside the vocab.txt (dpbert's exports carry
    it) is the vocabulary's report: its cost enters the run's total."""
    if config.vocab.file:
        path = pathlib.Path(config.vocab.file)
        if not path.is_file():
            raise ConfigError(f"config.vocab.file={config.vocab.file!r}: file not found")
        _check_vocab_file(path, f"config.vocab.file={config.vocab.file!r}")
        return str(path), read_vocab_report(path), "file"
    if config.model.init_from_hf:
        path = pathlib.Path(config.model.init_from_hf) / "vocab.txt"
        if not path.is_file():
            inner = path.parent / "hf"  # a workdir (or a copy of one) given for its export
            hint = (f"; its model is probably {inner} (--config.model.init_from_hf={inner})"
                    if (inner / "vocab.txt").is_file() else "")
            raise ConfigError(f"config.model.init_from_hf={config.model.init_from_hf!r}: has no "
                              f"vocab.txt{hint}; or set config.vocab.file")
        _check_vocab_file(path, f"config.model.init_from_hf={config.model.init_from_hf!r}")
        return str(path), read_vocab_report(path), "checkpoint"
    out = workdir / "vocab"
    if not (out / "vocab.txt").is_file():
        if data.corpus not in ("text", "noteevents"):
            raise ConfigError(
                f"config.vocab.file is empty and data.corpus={data.corpus!r}: a vocabulary can be "
                "built here only from a text or noteevents corpus; build one with "
                "launch/build_vocab.py and set config.vocab.file")
        if len(data.paths) != 1:
            raise ConfigError(f"config.data.paths={tuple(data.paths)!r}: building the vocabulary "
                              "here needs exactly one corpus file; use launch/build_vocab.py")
        if hosts.is_primary():
            v = config.vocab
            print(f"building the {'DP' if v.dp else 'non-private'} WordPiece vocabulary (size "
                  f"{v.size}) from {data.paths[0]} ...", flush=True)
            # Per patient, a patient's notes are one vocabulary example (at most K distinct
            # words together), so the vocabulary counts once per patient.
            dp_vocab.build_vocab(
                data.paths[0], data.corpus, v.size, v.epsilon if v.dp else None,
                v.delta if v.dp else None, v.max_words_per_example, out, dp=v.dp,
                do_lower_case=data.do_lower_case, seed=v.seed, progress=False,
                max_bad_fraction=data.max_bad_fraction,
                unit=(privacy_units.get(config.dp.privacy_unit).vocab_record
                      if data.corpus == "noteevents" else privacy_units.DOCUMENT_RECORD),
                duplicate_ids=data.get("duplicate_ids", identity.DEFAULT_RULE),
                knobs=("--config.vocab.epsilon", "--config.vocab.size"))
        hosts.sync("vocabulary")
    return str(out / "vocab.txt"), read_vocab_report(out / "vocab.txt"), "built"


def _check_vocab_file(path: pathlib.Path, field: str) -> None:
    """The user's vocab.txt is read (special tokens, duplicates) before it is copied into
    WORKDIR/vocab: a problem names the user's file, and no broken copy is kept that a rerun
    with the file fixed would find different ("use a fresh --workdir")."""
    try:
        tokenization.load_vocab(path)
    except ValueError as e:
        raise ConfigError(f"{field}: {e}") from None


def build_model(config: ml_collections.ConfigDict, vocab_size: int
                ) -> model_lib.BertForPreTraining:
    m = config.model
    if m.init_from_hf:
        model, model_config = hf.load_pretrained(m.init_from_hf, dtype=m.dtype, seed=config.seed)
        if model_config.vocab_size != vocab_size:
            raise ConfigError(
                f"config.model.init_from_hf={m.init_from_hf!r} has vocab_size "
                f"{model_config.vocab_size} but the vocabulary has {vocab_size} tokens")
        if model_config.max_position_embeddings < config.data.max_seq_length:
            raise ConfigError(f"config.data.max_seq_length={config.data.max_seq_length} exceeds "
                              f"the checkpoint's max_position_embeddings "
                              f"{model_config.max_position_embeddings}")
        # Dropout follows the experiment config, not the checkpoint's config.json.
        cfg = model.config.replace(hidden_dropout_prob=m.hidden_dropout_prob,
                                   attention_probs_dropout_prob=m.attention_probs_dropout_prob)
        fresh = nnx.eval_shape(lambda: model_lib.BertForPreTraining(cfg, rngs=nnx.Rngs(0)))
        nnx.update(fresh, nnx.state(model, nnx.Param))
        return fresh
    cfg = model_lib.BertConfig.preset(
        m.size, vocab_size, dtype=m.dtype, hidden_dropout_prob=m.hidden_dropout_prob,
        attention_probs_dropout_prob=m.attention_probs_dropout_prob,
        max_position_embeddings=m.max_position_embeddings)
    logging.info("model: BERT %s, vocabulary %d", m.size, vocab_size)
    return model_lib.create_model(cfg, seed=config.seed)
