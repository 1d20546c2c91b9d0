"""DP-SGD pretraining of BERT: `train_and_evaluate(config, workdir)`.

The run, stage by stage (every stage is a small function below):

    vocab      config.vocab.file, the init_from_hf folder's vocab.txt, or a DP WordPiece
               vocabulary built from the training corpus into WORKDIR/vocab
    data       data_pipelines.pretraining.build_datasets -> random-access train/eval examples
    model      random init of a size preset, or a Hugging Face BERT folder (init_from_hf)
    plan       N, sampling, noise multiplier (given or calibrated), accountant, budget
    step       ONE jitted, sharded function: per-example clipped gradients (ghost norms for
               the tied word embedding + vmap for the rest, or all vmap: dp.clipping) ->
               accumulate -> (last call of a logical batch) one Gaussian draw -> optax
               (`dpbert.dp.DPAggregator.update`); state donated, compiled ahead of time
    loop       host: sampler -> each host loads only its rows -> global arrays -> step;
               accountant, metrics, eval, orbax checkpoints, SIGTERM
    end        privacy_report.json, WORKDIR/hf (Hugging Face export with a privacy card)

Determinism: every random choice is a pure function of (seed, step/call, example index) --
the sampler, masking, dropout keys and noise keys -- so a run killed at any point and resumed
from its last checkpoint ends with bitwise the same parameters as an uninterrupted run (CPU).

Privacy: only aggregates over a whole batch are logged (metric totals, never per-example
values); throughput is reported from public quantities (expected batch size), not from the
realised Poisson batch sizes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pathlib
import signal
import time
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import nnx

from data_pipelines import pretraining
from dpbert import checkpointing
from dpbert import dchi
from dpbert import dp as dp_lib
from dpbert import hf
from dpbert import losses
from dpbert import metrics as metrics_lib
from dpbert import model as model_lib
from dpbert import optimizers
from dpbert import sharding

PyTree = Any
_DCHI_STREAM = 0x0D1  # key domain of dχ privatization (apart from the DP engine's streams)
_EVAL_STREAM = 1 << 30  # eval privatization keys: a step index training never reaches
CONFIG_FILE = "config.json"
RUN_FILE = "run.json"  # what an export needs: model architecture, vocab, tokenizer flags
REPORT_FILE = "privacy_report.json"
# dp.clipping values: ghost norms for dense layers and embeddings (dpbert.dp.mixed_ghost),
# for the tied embedding only (dpbert.dp.ghost), or the vmap reference.
CLIPPERS = ("mixed_ghost", "ghost_embedding", "vmap")


class ConfigError(ValueError):
    """A config value that cannot work; the message names the field."""


@flax.struct.dataclass
class TrainState:
    """Everything the jitted step reads and writes (a pytree; checkpointed by orbax).

    params: pure nested dict of float32 arrays (`nnx.to_pure_dict` of the model state).
    opt_state: the optax state.
    dp: `dpbert.dp.DPState` (accumulator, call/step counters, RNG key).
    """

    params: PyTree
    opt_state: PyTree
    dp: Any


# ---------------------------------------------------------------------------------- validation


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks that do not need the data; one ConfigError per problem, naming the field."""
    def need(cond: bool, field: str, why: str):
        if not cond:
            value = config
            for part in field.split("."):
                value = value.get(part) if hasattr(value, "get") else None
            raise ConfigError(f"config.{field}={value!r}: {why}")

    b = config.batch
    need(b.expected_batch_size > 0, "batch.expected_batch_size", "must be > 0")
    need(isinstance(b.physical_batch_size, int) and b.physical_batch_size > 0,
         "batch.physical_batch_size", "must be a positive integer")
    if b.microbatch_size is not None:
        need(b.microbatch_size > 0 and b.physical_batch_size % b.microbatch_size == 0,
             "batch.microbatch_size", f"must divide batch.physical_batch_size "
             f"({b.physical_batch_size})")
    need(config.train.num_steps > 0, "train.num_steps", "must be > 0")
    need(config.train.log_every > 0, "train.log_every", "must be > 0")
    need(config.train.eval_every >= 0, "train.eval_every", "must be >= 0")
    need(config.checkpoint.every_steps >= 0, "checkpoint.every_steps", "must be >= 0")
    if config.data.corpus in ("text", "noteevents"):
        what = ("a MIMIC-III NOTEEVENTS.csv(.gz) file (credentialed PhysioNet data, download it "
                "yourself)" if config.data.corpus == "noteevents" else
                "text files (one sentence per line, blank line between documents)")
        need(len(config.data.paths) > 0, "data.paths", f"is empty: give {what}")
        for path in config.data.paths:
            if not os.path.isfile(os.path.expanduser(path)):
                raise ConfigError(
                    f"config.data.paths: {path!r} does not exist (expected {what})")
    if config.dchi.mechanism != "none":
        need(bool(config.model.init_from_hf), "model.init_from_hf",
             "dχ privatization needs a pretrained BERT folder: its word embeddings are φ")
    need(config.model.size in model_lib.PRESETS or bool(config.model.init_from_hf),
         "model.size", f"must be one of {sorted(model_lib.PRESETS)}")
    need(config.mlm_target in losses.mlm_target_names(), "mlm_target",
         f"must be one of {losses.mlm_target_names()}")
    need(config.dchi.mechanism in dchi.MECHANISMS, "dchi.mechanism",
         f"must be one of {dchi.MECHANISMS}")
    need(config.dchi.eta > 0, "dchi.eta", "must be > 0")
    need(config.model.max_position_embeddings >= config.data.max_seq_length,
         "model.max_position_embeddings",
         f"must be >= data.max_seq_length ({config.data.max_seq_length})")
    d = config.dp
    if d.enabled:
        need(d.privacy_unit == "example", "dp.privacy_unit",
             "only 'example' (one sequence) is implemented in the training loop")
        need(d.clip_norm > 0 and math.isfinite(d.clip_norm), "dp.clip_norm",
             "must be a positive finite number")
        need(d.noise_multiplier is not None or d.target_epsilon is not None,
             "dp.noise_multiplier", "give a noise multiplier, or dp.target_epsilon to calibrate "
             "one")
        if d.noise_multiplier is not None:
            need(d.noise_multiplier > 0, "dp.noise_multiplier", "must be > 0 with DP on")
        if d.target_epsilon is not None:
            need(d.target_epsilon > 0, "dp.target_epsilon", "must be > 0")
        need(d.sampling in ("poisson", "shuffle"), "dp.sampling", "must be poisson or shuffle")
        need(d.clipping in CLIPPERS, "dp.clipping", f"must be one of {CLIPPERS}")
        need(d.noise_mode in ("global", "per_shard"), "dp.noise_mode",
             "must be global or per_shard")
        need(0 < d.overflow_probability < 1, "dp.overflow_probability", "must be in (0, 1)")
    else:
        need(b.expected_batch_size == b.physical_batch_size, "batch.expected_batch_size",
             "without DP, batches are fixed: set it equal to batch.physical_batch_size")


# ---------------------------------------------------------------------------------- stages


def _is_primary() -> bool:
    return jax.process_index() == 0


def prepare_corpus(config: ml_collections.ConfigDict, workdir: pathlib.Path
                   ) -> ml_collections.ConfigDict:
    """The data config to build from. A synthetic corpus is first written to the workdir as a
    NOTEEVENTS-schema CSV, so the demo exercises the same reader as real MIMIC-III notes."""
    data = ml_collections.ConfigDict(config.data.to_dict())
    if data.corpus == "synthetic":
        from data_pipelines import synthetic_notes
        path = workdir / "data" / (f"synthetic_notes_{data.synthetic_num_notes}_"
                                   f"{data.synthetic_seed}.csv.gz")
        if not path.exists() and _is_primary():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp.gz")
            synthetic_notes.write_noteevents_csv(
                tmp, synthetic_notes.generate_synthetic(data.synthetic_num_notes,
                                                        seed=data.synthetic_seed))
            os.replace(tmp, path)
        _sync("synthetic corpus")
        data.corpus = "noteevents"
        data.paths = (str(path),)
    if not data.cache_dir:
        data.cache_dir = str(workdir / "data" / "instances")
    return data


def prepare_vocab(config: ml_collections.ConfigDict, data: ml_collections.ConfigDict,
                  workdir: pathlib.Path) -> tuple[str, dict | None]:
    """(vocab.txt path, the vocabulary's privacy report or None)."""
    if config.vocab.file:
        path = pathlib.Path(config.vocab.file)
        if not path.is_file():
            raise ConfigError(f"config.vocab.file={config.vocab.file!r}: file not found")
        report = path.parent / "vocab_privacy.json"
        return str(path), (json.loads(report.read_text()) if report.is_file() else None)
    if config.model.init_from_hf:
        path = pathlib.Path(config.model.init_from_hf) / "vocab.txt"
        if not path.is_file():
            raise ConfigError(f"config.model.init_from_hf={config.model.init_from_hf!r}: has no "
                              "vocab.txt; set config.vocab.file")
        return str(path), None
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
        if _is_primary():
            from data_pipelines import dp_vocab
            v = config.vocab
            logging.info("building the %s WordPiece vocabulary (size %d) from %s",
                         "DP" if v.dp else "non-private", v.size, data.paths[0])
            dp_vocab.build_vocab(
                data.paths[0], data.corpus, v.size, v.epsilon if v.dp else None,
                v.delta if v.dp else None, v.max_words_per_example, out, dp=v.dp,
                do_lower_case=data.do_lower_case, seed=v.seed, progress=False)
        _sync("vocabulary")
    report = out / "vocab_privacy.json"
    return str(out / "vocab.txt"), (json.loads(report.read_text()) if report.is_file() else None)


def _sync(what: str) -> None:
    """All processes wait for process 0 (which wrote `what` to the shared workdir)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(f"dpbert:{what}")


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
        return _with_dropout(model, m)
    cfg = model_lib.BertConfig.preset(
        m.size, vocab_size, dtype=m.dtype, hidden_dropout_prob=m.hidden_dropout_prob,
        attention_probs_dropout_prob=m.attention_probs_dropout_prob,
        max_position_embeddings=m.max_position_embeddings)
    return model_lib.create_model(cfg, seed=config.seed)


def _with_dropout(model: model_lib.BertForPreTraining, m: ml_collections.ConfigDict):
    cfg = model.config.replace(hidden_dropout_prob=m.hidden_dropout_prob,
                               attention_probs_dropout_prob=m.attention_probs_dropout_prob)
    fresh = nnx.eval_shape(lambda: model_lib.BertForPreTraining(cfg, rngs=nnx.Rngs(0)))
    nnx.update(fresh, nnx.state(model, nnx.Param))
    return fresh


def make_privatizer(config: ml_collections.ConfigDict, model: model_lib.BertForPreTraining,
                    vocab_file: str) -> tuple[dchi.Privatizer | None, bool]:
    """(privatizer or None, whether the word embedding is frozen).

    φ is the starting model's word-embedding table, copied now; during privacy-adaptive
    pretraining the table is frozen (stop-gradient, no noise, no optimizer update), and so is
    the MLM decoder tied to it, so the privacy level that η stands for cannot drift and the
    exported model's embeddings are exactly φ.
    """
    d = config.dchi
    if d.mechanism == "none":
        return None, False
    privatizer = dchi.Privatizer.from_model(
        model, vocab_file, eta=float(d.eta), mechanism=d.mechanism, mlm_target=config.mlm_target,
        prob_samples=d.prob_samples, chunk_size=d.chunk_size)
    return privatizer, True


@dataclasses.dataclass(frozen=True)
class Plan:
    """The run's numbers, fixed before the first step (all public)."""

    num_examples: int
    num_shards: int
    calls_per_batch: int
    noise_multiplier: float | None
    num_steps: int
    sampler: Any = dataclasses.field(repr=False)  # (seed, call) -> padded indices + mask
    spec: Any | None  # dp_lib.AccountingSpec of the mechanism really run; None without DP
    max_steps_by_budget: int | None


def make_plan(config: ml_collections.ConfigDict, num_examples: int, num_shards: int) -> Plan:
    b, d = config.batch, config.dp
    if b.physical_batch_size % num_shards:
        raise ConfigError(
            f"config.batch.physical_batch_size={b.physical_batch_size} is not divisible by the "
            f"{num_shards} devices that split the batch")
    if b.microbatch_size is not None and b.microbatch_size % num_shards:
        raise ConfigError(f"config.batch.microbatch_size={b.microbatch_size} is not divisible by "
                          f"the {num_shards} devices that split the batch")
    if b.expected_batch_size > num_examples:
        raise ConfigError(f"config.batch.expected_batch_size={b.expected_batch_size} exceeds the "
                          f"{num_examples} training examples")
    if not d.enabled:
        sampler = dp_lib.make_sampler("shuffle", num_examples=num_examples,
                                      expected_batch_size=b.physical_batch_size,
                                      physical_batch_size=b.physical_batch_size, seed=config.seed)
        return Plan(num_examples, num_shards, 1, None, config.train.num_steps, sampler, None,
                    None)
    if d.delta >= 1.0 / num_examples:
        raise ConfigError(f"config.dp.delta={d.delta} must be < 1/N = {1.0 / num_examples:.3g} "
                          f"for the N={num_examples} training examples")
    if d.sampling == "poisson":
        # Enough calls that a Poisson batch overflows (and is truncated, which is accounted)
        # with probability <= overflow_probability per step.
        capacity = dp_lib.capacity_for_overflow_probability(
            num_examples, b.expected_batch_size, d.overflow_probability)
        calls = max(1, math.ceil(capacity / b.physical_batch_size))
    else:
        calls = round(b.expected_batch_size / b.physical_batch_size)
        if calls * b.physical_batch_size != b.expected_batch_size:
            raise ConfigError(f"config.batch.expected_batch_size={b.expected_batch_size} must be a "
                              f"multiple of batch.physical_batch_size with sampling='shuffle'")
    sampler = dp_lib.make_sampler(d.sampling, num_examples=num_examples,
                                  expected_batch_size=b.expected_batch_size,
                                  physical_batch_size=b.physical_batch_size,
                                  calls_per_batch=calls, seed=config.seed)
    # The accounted mechanism is read off the sampler (sampling, N, q, truncation size).
    spec = dp_lib.AccountingSpec.from_sampler(
        sampler, noise_multiplier=d.noise_multiplier or 1.0, delta=d.delta,
        noise_mode=d.noise_mode, num_shards=num_shards, accountant=d.accountant)
    if d.noise_multiplier is None:
        sigma = dp_lib.calibrate_noise_multiplier(
            target_epsilon=d.target_epsilon, steps=config.train.num_steps,
            expected_batch_size=spec.expected_batch_size, num_examples=spec.num_examples,
            delta=spec.delta, accountant=spec.accountant, sampling=spec.sampling,
            noise_mode=spec.noise_mode, num_shards=spec.num_shards,
            max_batch_size=spec.max_batch_size)
        logging.info("calibrated noise multiplier %.4f for epsilon %.3f at %d steps", sigma,
                     d.target_epsilon, config.train.num_steps)
        spec = spec.replace(noise_multiplier=sigma)
    num_steps, by_budget = config.train.num_steps, None
    if d.target_epsilon is not None:
        by_budget = dp_lib.max_steps_within_budget(spec, d.target_epsilon,
                                                   upper_limit=max(num_steps, 1))
        num_steps = min(num_steps, by_budget)
        if num_steps == 0:
            raise ConfigError(f"config.dp.target_epsilon={d.target_epsilon}: not even one step "
                              f"fits the budget with noise multiplier {spec.noise_multiplier}")
    return Plan(num_examples, num_shards, calls, spec.noise_multiplier, num_steps, sampler, spec,
                by_budget)


# ---------------------------------------------------------------------------------- updaters


class PublicUpdater:
    """The non-private step (dp.enabled=False): mean gradient of the batch, then optax.

    Same interface as `dpbert.dp.DPAggregator` so the loop has one path; it keeps its counters
    and key in a `DPState` whose accumulator is None.
    """

    def __init__(self, loss_fn: Callable, optimizer: optax.GradientTransformation):
        self.loss_fn = loss_fn
        self.optimizer = optimizer

    def init(self, params: PyTree, rng: int) -> Any:
        return dp_lib.DPState(grad_acc=None, micro_step=jnp.zeros((), jnp.int32),
                              step=jnp.zeros((), jnp.int32),
                              rng=jnp.asarray(jax.random.PRNGKey(rng), jnp.uint32))

    def update(self, state, params, opt_state, batch, mask):
        key = jax.random.fold_in(state.rng, state.step)
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(mask.shape[0]))
        weights = mask.astype(jnp.float32)

        def mean_loss(p):
            per_example, m = jax.vmap(self.loss_fn, in_axes=(None, 0, 0))(p, batch, keys)
            sums = jax.tree.map(lambda x: jnp.sum(x * weights), m)
            return jnp.sum(per_example * weights) / jnp.maximum(jnp.sum(weights), 1.0), sums

        grads, sums = jax.grad(mean_loss, has_aux=True)(params)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        sums["num_nonfinite"] = jnp.zeros((), jnp.int32)
        return params, opt_state, state.replace(step=state.step + 1), sums


def make_eval_step(loss_fn: Callable, dchi_key: jax.Array) -> Callable:
    """(params, batch, mask, privatizer, index) -> metric totals over the real examples (no
    dropout). With dχ on, the held-out text is privatized as users would privatize theirs
    (fixed keys per eval batch, a stream apart from training's)."""
    def eval_step(params, batch, mask, privatizer, index):
        if privatizer is not None:
            batch = dchi.privatize_batch(privatizer, batch, dchi.batch_key(
                jax.random.fold_in(dchi_key, _EVAL_STREAM), index))
        keys = jnp.zeros((mask.shape[0], 2), jnp.uint32)
        _, m = jax.vmap(loss_fn, in_axes=(None, 0, 0))(params, batch, keys)
        w = mask.astype(jnp.float32)
        return jax.tree.map(lambda x: jnp.sum(x * w), m)
    return eval_step


# ---------------------------------------------------------------------------------- shardings


def _path_key(path) -> tuple[str, ...]:
    out = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                out.append(str(getattr(k, attr)))
                break
    return tuple(out)


def opt_state_shardings(opt_state: PyTree, params: PyTree, param_shardings: PyTree,
                        mesh) -> PyTree:
    """Optimizer-state leaves that mirror a parameter (Adam moments, ...) get its sharding.

    A leaf mirrors the parameter whose path is a suffix of the leaf's path (optax nests the
    parameter tree under its own keys, e.g. (0, 'mu', 'bert', ...)) and has its shape; every
    other leaf (step counts, masked-out placeholders) is replicated. This works through chains,
    masks and multi_transform alike.
    """
    rep = sharding.replicated(mesh)
    flat_params = {_path_key(p): x.shape for p, x in jax.tree_util.tree_leaves_with_path(params)}
    flat_shardings = {_path_key(p): s for p, s in
                      jax.tree_util.tree_leaves_with_path(param_shardings)}

    def one(path, leaf):
        key = _path_key(path)
        for start in range(len(key)):
            suffix = key[start:]
            if suffix in flat_params and flat_params[suffix] == leaf.shape:
                return flat_shardings[suffix]
        return rep

    return jax.tree_util.tree_map_with_path(one, opt_state)


def state_shardings(state: TrainState, param_shardings: PyTree, mesh) -> TrainState:
    rep = sharding.replicated(mesh)
    opt = opt_state_shardings(state.opt_state, state.params, param_shardings, mesh)
    dp_state = state.dp.replace(
        grad_acc=None if state.dp.grad_acc is None else param_shardings,
        micro_step=rep, step=rep, rng=rep)
    return TrainState(params=param_shardings, opt_state=opt, dp=dp_state)


def pure_param_shardings(model: nnx.Module, mesh) -> PyTree:
    """NamedShardings shaped like `nnx.to_pure_dict(nnx.state(model))`."""
    return nnx.to_pure_dict(sharding.param_shardings(nnx.state(model, nnx.Param), mesh))


# ---------------------------------------------------------------------------------- the run


class _Preempted:
    """SIGTERM (preemption) sets a flag; the loop saves a checkpoint and exits cleanly."""

    def __init__(self):
        self.flag = False
        self._previous = None

    def __enter__(self):
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread (e.g. some test runners)
            self._previous = None
        return self

    def _handle(self, signum, frame):
        logging.warning("SIGTERM received: saving a checkpoint at the end of this step")
        self.flag = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def _write_json(path: pathlib.Path, obj: Any) -> None:
    if not _is_primary():
        return
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


def _report(plan: Plan, config, steps: int, vocab_report: dict | None,
            stopped_by_budget: bool) -> dict:
    if plan.spec is None:
        report = {"dp": False, "epsilon": None, "steps": steps,
                  "note": "trained without differential privacy (dp.enabled=False)"}
    else:
        report = dp_lib.privacy_report(plan.spec, steps, clip_norm=config.dp.clip_norm,
                                       privacy_unit=config.dp.privacy_unit)
        report["dp"] = True
        report["target_epsilon"] = config.dp.target_epsilon
        report["stopped_by_budget"] = stopped_by_budget
        report["not_covered"] = (
            "Training and held-out metrics (metrics.jsonl, TensorBoard, the console) are exact "
            "aggregates over batches of the private data, not privatized: epsilon does not "
            "cover them. Share the model and this report, not the logs.")
    if vocab_report is not None:
        keep = ("dp", "epsilon", "delta", "max_words_per_example", "example_definition",
                "mechanism", "accounting")
        report["vocabulary"] = {k: vocab_report[k] for k in keep if k in vocab_report}
    return report


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | os.PathLike, *,
                       devices: list[jax.Device] | None = None) -> dict:
    """Trains (or resumes) the run described by `config` in `workdir`; returns the final
    privacy report (also written to WORKDIR/privacy_report.json).

    `devices` restricts the mesh to these devices (default: all of them).
    """
    validate_config(config)
    workdir = pathlib.Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    config_dict = config.to_dict()
    signature = checkpointing.run_signature(config_dict)
    ckpt = checkpointing.Checkpointer(workdir / "checkpoints",
                                      max_to_keep=config.checkpoint.max_to_keep,
                                      async_save=config.checkpoint.async_save)
    latest = ckpt.latest_step()
    if latest is not None:  # refuse an incompatible checkpoint before any expensive work
        checkpointing.check_compatible(ckpt.read_meta(latest)["signature"], signature,
                                       str(workdir))
    _write_json(workdir / CONFIG_FILE, config_dict)

    data_config = prepare_corpus(config, workdir)
    vocab_file, vocab_report = prepare_vocab(config, data_config, workdir)
    train_ds, eval_ds = pretraining.build_datasets(data_config, vocab_file)
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, devices)
    plan = make_plan(config, train_ds.num_examples, sharding.num_batch_shards(mesh))
    logging.info("plan: %s", plan)

    model = build_model(config, len(hf.read_vocab(vocab_file)))
    _write_json(workdir / RUN_FILE, {
        "model_config": dataclasses.asdict(model.config), "vocab_file": vocab_file,
        "do_lower_case": data_config.do_lower_case,
        "max_seq_length": data_config.max_seq_length,
        "init_from_hf": config.model.init_from_hf or None})
    privatizer, frozen = make_privatizer(config, model, vocab_file)
    trainable = dp_lib.freeze_paths_containing("word_embeddings") if frozen else None
    graphdef, param_state = nnx.split(model)
    params = nnx.to_pure_dict(param_state)
    opt_config = ml_collections.ConfigDict(config.optimizer.to_dict())
    opt_config.total_steps = max(plan.num_steps, opt_config.warmup_steps + 1)
    optimizer = optimizers.make_optimizer(opt_config, params, trainable=trainable)
    b = config.batch
    ghost = config.dp.enabled and config.dp.clipping in ("ghost_embedding", "mixed_ghost")
    # The factored loss is the same function, plus the views (tied word embedding, dense taps)
    # that the ghost clippers need.
    make_loss = losses.make_factored_pretraining_loss if ghost else losses.make_pretraining_loss
    loss_fn = make_loss(graphdef, deterministic=False, mlm_target=config.mlm_target,
                        frozen_word_embedding=frozen)
    if config.dp.enabled:
        dp_config = dp_lib.DPConfig(
            clip_norm=config.dp.clip_norm, noise_multiplier=plan.noise_multiplier,
            expected_batch_size=b.expected_batch_size, microbatch_size=b.microbatch_size,
            accumulation_steps=plan.calls_per_batch, noise_mode=config.dp.noise_mode,
            num_shards=plan.num_shards)
        clipper_cls = {"mixed_ghost": dp_lib.MixedGhostClipper,
                       "ghost_embedding": dp_lib.TiedEmbeddingClipper}.get(config.dp.clipping)
        clipper = (clipper_cls(dp_config.clip_norm, dp_config.microbatch_size,
                               dp_config.num_shards, trainable)
                   if clipper_cls else None)  # None: DPAggregator's default VmapClipper
        updater = dp_lib.DPAggregator(dp_config, loss_fn, optimizer, trainable=trainable,
                                      clipper=clipper,
                                      noise_draw_sharding=sharding.spread_over_devices(mesh))
    else:
        updater = PublicUpdater(loss_fn, optimizer)
    sampler = plan.sampler

    shardings_tree = state_shardings(
        TrainState(params, jax.eval_shape(optimizer.init, params),
                   jax.eval_shape(functools.partial(updater.init, rng=config.seed), params)),
        pure_param_shardings(model, mesh), mesh)
    init_fn = jax.jit(lambda p: TrainState(p, optimizer.init(p), updater.init(p, config.seed)),
                      out_shardings=shardings_tree)
    state = init_fn(params)
    del model, param_state, params

    budget = None
    if plan.spec is not None and config.dp.target_epsilon is not None:
        budget = dp_lib.PrivacyBudget(plan.spec, config.dp.target_epsilon,
                                      max_steps=plan.max_steps_by_budget)
    start_step = 0
    if latest is not None:
        state, meta = ckpt.restore(latest, checkpointing.abstract_like(state))
        sampler.load_state_dict(meta["sampler"])
        start_step = int(meta["step"])
        if budget is not None:
            # The limit is a pure function of the plan (the run may have been extended with a
            # larger train.num_steps); only the count of steps taken carries over.
            if start_step > budget.max_steps:
                raise ConfigError(
                    f"config.dp.target_epsilon={config.dp.target_epsilon}: the checkpoint at "
                    f"step {start_step} already exceeds it (the budget allows "
                    f"{budget.max_steps} steps)")
            budget.load_state_dict({**budget.state_dict(), "steps_taken": start_step})
        logging.info("resumed from %s at step %d", ckpt.directory / str(latest), start_step)

    batch_sharding = sharding.batch_sharding(mesh)
    rows = sharding.host_rows(b.physical_batch_size, batch_sharding)
    example = train_ds.get_batch(np.zeros(len(rows), np.int64), step=0)
    abstract_batch = {k: jax.ShapeDtypeStruct((b.physical_batch_size, *v.shape[1:]), v.dtype,
                                              sharding=sharding.batch_sharding(mesh, v.ndim))
                      for k, v in example.items()}
    abstract_mask = jax.ShapeDtypeStruct((b.physical_batch_size,), jnp.bool_,
                                         sharding=batch_sharding)

    dchi_key = jax.random.fold_in(jax.random.PRNGKey(config.seed), _DCHI_STREAM)

    def step_fn(state: TrainState, batch, mask, privatizer):
        if privatizer is not None:
            # A fresh privatization of every example every time it is seen: the key is unique
            # to (logical step, call within it), the example's key to its position.
            batch = dchi.privatize_batch(privatizer, batch, dchi.batch_key(
                dchi_key, state.dp.step, state.dp.micro_step))
        params, opt_state, dp_state, sums = updater.update(state.dp, state.params,
                                                           state.opt_state, batch, mask)
        return TrainState(params, opt_state, dp_state), sums

    if privatizer is not None:
        privatizer = jax.device_put(privatizer, sharding.replicated(mesh))
    compiled = jax.jit(step_fn, donate_argnums=0,
                       out_shardings=(shardings_tree, sharding.replicated(mesh))).lower(
        checkpointing.abstract_like(state), abstract_batch, abstract_mask,
        privatizer).compile()
    _log_memory("train step", compiled)
    eval_loss = losses.make_pretraining_loss(graphdef, deterministic=True,
                                             mlm_target=config.mlm_target)
    eval_fn = jax.jit(make_eval_step(eval_loss, dchi_key), out_shardings=sharding.replicated(mesh))

    def load(call: int):
        indices, mask = sampler.batch(call)
        step = call // plan.calls_per_batch
        local = train_ds.get_batch(indices[rows], step=step)
        return local, mask[rows]

    writer = metrics_lib.MetricWriter(workdir)
    initial_eval = {}
    if eval_ds is not None and start_step == 0 and config.train.eval_every:
        # The untrained model's held-out numbers, so the log shows what training changed.
        initial_eval = evaluate(eval_fn, state.params, eval_ds, config, mesh, privatizer)
        writer.write(0, initial_eval)
    progress = metrics_lib.Progress(plan.num_steps, start_step)
    step = start_step
    stopped_by_budget = False
    totals, t_last, steps_since = None, time.time(), 0
    calls = range(start_step * plan.calls_per_batch, plan.num_steps * plan.calls_per_batch)
    batches = pretraining.prefetch(load, calls.start, calls.stop,
                                   buffer_size=max(1, config.data.prefetch))

    def save(step_now: int) -> None:
        if step_now in ckpt.all_steps():  # e.g. the periodic save already wrote the last step
            return
        report = _report(plan, config, step_now, vocab_report, stopped_by_budget)
        meta = {"step": step_now, "signature": signature, "sampler": sampler.state_dict(),
                "budget": budget.state_dict() if budget else None,
                "data_fingerprint": train_ds.metadata.get("fingerprint"),
                "privacy_report": report}
        ckpt.save(step_now, state, meta)
        _write_json(workdir / REPORT_FILE, report)

    with _Preempted() as preempted:
        try:
            while step < plan.num_steps:
                for _ in range(plan.calls_per_batch):
                    local, local_mask = next(batches)
                    batch = sharding.make_global_batch(local, mesh, b.physical_batch_size)
                    mask = sharding.make_global_batch({"m": local_mask}, mesh,
                                                      b.physical_batch_size)["m"]
                    state, sums = compiled(state, batch, mask, privatizer)
                    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
                sampler.call = (step + 1) * plan.calls_per_batch
                step += 1
                steps_since += 1
                if budget is not None:
                    budget.record_step()
                if step % config.train.log_every == 0 or step == plan.num_steps:
                    scalars = metrics_lib.summarize(jax.device_get(totals), "train/")
                    scalars["train/num_nonfinite"] = float(totals["num_nonfinite"])
                    dt = time.time() - t_last
                    scalars["perf/step_time"] = dt / steps_since
                    scalars["perf/examples_per_sec"] = steps_since * b.expected_batch_size / dt
                    scalars["perf/tokens_per_sec"] = (scalars["perf/examples_per_sec"]
                                                      * data_config.max_seq_length)
                    if plan.spec is not None:
                        scalars["privacy/epsilon"] = dp_lib.progress_epsilon(plan.spec, step)
                    writer.write(step, scalars)
                    progress.report(step, scalars)
                    totals, t_last, steps_since = None, time.time(), 0
                if eval_ds is not None and config.train.eval_every and \
                        step % config.train.eval_every == 0 and step < plan.num_steps:
                    writer.write(step, evaluate(eval_fn, state.params, eval_ds, config, mesh,
                                                privatizer))
                if config.checkpoint.every_steps and step % config.checkpoint.every_steps == 0:
                    save(step)
                if preempted.flag:
                    logging.warning("preempted: checkpoint saved at step %d; rerun the same "
                                    "command to resume", step)
                    save(step)
                    ckpt.close()
                    raise SystemExit(143)
        finally:
            del batches  # stops the reader thread
    # plan.num_steps is already capped by the budget; record_step() would refuse a step past it.
    if plan.max_steps_by_budget is not None and step == plan.max_steps_by_budget < \
            config.train.num_steps:
        stopped_by_budget = True
        logging.warning("stopped at step %d of %d: one more step would exceed "
                        "dp.target_epsilon=%s", step, config.train.num_steps,
                        config.dp.target_epsilon)
    final_eval = {}
    if eval_ds is not None:
        final_eval = evaluate(eval_fn, state.params, eval_ds, config, mesh, privatizer)
        writer.write(step, final_eval)
    save(step)
    ckpt.close()
    writer.close()
    report = _report(plan, config, step, vocab_report, stopped_by_budget)
    _write_json(workdir / REPORT_FILE, report)
    if config.train.export_hf and _is_primary():
        _export(nnx.merge(graphdef, jax.device_get(state.params)), workdir / "hf",
                json.loads((workdir / RUN_FILE).read_text()), report)
    if _is_primary():
        print(_summary_line(step, report, initial_eval, final_eval, stopped_by_budget),
              flush=True)
    return report


def _summary_line(step: int, report: dict, initial: dict, final: dict,
                  stopped_by_budget: bool) -> str:
    parts = [f"done: {step} steps"]
    if final:
        acc = f"held-out MLM accuracy {final['eval/mlm_accuracy']:.3f}"
        if initial:
            acc = (f"held-out MLM accuracy {initial['eval/mlm_accuracy']:.3f} -> "
                   f"{final['eval/mlm_accuracy']:.3f} (loss {initial['eval/mlm_loss']:.2f} -> "
                   f"{final['eval/mlm_loss']:.2f})")
        parts.append(acc)
    if report.get("dp"):
        parts.append(f"epsilon = {report['epsilon']:.4f} at delta = {report['delta']:g} "
                     f"({report['accountant']}, {report['sampling']} sampling)")
        if stopped_by_budget:
            parts.append("stopped by the privacy budget")
    else:
        parts.append("no differential privacy (dp.enabled=False)")
    return " | ".join(parts)


def _export(model: model_lib.BertForPreTraining, out: pathlib.Path, run: dict,
            report: dict | None) -> pathlib.Path:
    return hf.save_pretrained(model, out, run["vocab_file"], do_lower_case=run["do_lower_case"],
                              model_max_length=run["max_seq_length"],
                              privacy_report=report if report and report.get("dp") else None,
                              source=run.get("init_from_hf"))


def export_from_workdir(workdir: str | os.PathLike, out: str | os.PathLike,
                        step: int | None = None) -> pathlib.Path:
    """Exports a saved step (default: the newest) of a training workdir to a HF folder whose
    model card carries that step's privacy report."""
    workdir = pathlib.Path(workdir)
    run_file = workdir / RUN_FILE
    if not run_file.is_file():
        raise FileNotFoundError(f"{run_file}: missing; is {workdir} a dpbert training workdir?")
    run = json.loads(run_file.read_text())
    ckpt = checkpointing.Checkpointer(workdir / "checkpoints", async_save=False)
    steps = ckpt.all_steps()
    if not steps:
        raise FileNotFoundError(f"{workdir / 'checkpoints'}: no checkpoint to export")
    if step is None:
        step = max(steps)
    elif step not in steps:
        raise ValueError(f"{workdir}: no checkpoint at step {step}; saved steps: {steps}")
    params, meta = ckpt.restore_params(step)
    ckpt.close()
    config = model_lib.BertConfig(**run["model_config"])
    model = nnx.eval_shape(lambda: model_lib.BertForPreTraining(config, rngs=nnx.Rngs(0)))
    graphdef, _ = nnx.split(model)
    model = nnx.merge(graphdef, params)
    return _export(model, pathlib.Path(out), run, meta.get("privacy_report"))


def evaluate(eval_fn, params, eval_ds, config, mesh, privatizer=None) -> dict[str, float]:
    """Mean metrics over (a prefix of) the held-out split."""
    size = config.train.eval_batch_size
    size = max(size - size % jax.device_count(), jax.device_count())
    n = eval_ds.num_examples
    num_batches = math.ceil(n / size)
    if config.train.eval_batches:
        num_batches = min(num_batches, config.train.eval_batches)
    rows = sharding.host_rows(size, sharding.batch_sharding(mesh))
    totals = None
    for i in range(num_batches):
        idx = np.arange(i * size, (i + 1) * size)
        mask = idx < n
        idx = np.where(mask, idx, 0)
        local = eval_ds.get_batch(idx[rows], step=0)
        batch = sharding.make_global_batch(local, mesh, size)
        m = sharding.make_global_batch({"m": mask[rows]}, mesh, size)["m"]
        sums = eval_fn(params, batch, m, privatizer, i)
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    return metrics_lib.summarize(jax.device_get(totals), "eval/")


def _log_memory(name: str, compiled) -> None:
    try:
        mem = compiled.memory_analysis()
    except Exception:  # some backends do not implement it
        mem = None
    if mem is None:
        logging.info("%s compiled (no memory analysis on this backend)", name)
        return
    mib = lambda x: f"{x / 2**20:.1f} MiB"
    logging.info("%s compiled: arguments %s, outputs %s, temporaries %s, code %s", name,
                 mib(mem.argument_size_in_bytes), mib(mem.output_size_in_bytes),
                 mib(mem.temp_size_in_bytes), mib(mem.generated_code_size_in_bytes))
