"""One DP training loop for every task: `run(task, config, workdir)`.

    checks     the task's and the DP plan's config checks; a lock on the workdir; a checkpoint
               from another config (or other data) refused before any expensive work
    secrets    the noise key and sampler seed: drawn from OS entropy for a fresh run, read from
               the checkpoint on resume (`dpbert.dp.randomness`)
    data       task.prepare -> random-access train / eval datasets (+ vocabulary report)
    plan       `dpbert.dp.plan.make_plan`: sampler, calls per batch, clipper, noise, ledger,
               budget; a non-private run is the same plan without noise
    step       ONE jitted, sharded function: [task's batch transform] -> clipped per-example
               gradients -> accumulate -> (last call of a logical batch) one Gaussian draw ->
               optax (`DPAggregator.update`); state donated, compiled ahead of time
    loop       sampler -> each host loads only its rows -> global arrays -> step; metrics,
               eval, orbax checkpoints, SIGTERM / Ctrl-C, a stop on non-finite parameters
    end        privacy_report.json (`dpbert.reporting.report`), WORKDIR/hf (the task's export)

A task (`Task` below) is a small object: its data, its per-example loss, its eval, its export.
Pretraining is `dpbert.tasks.pretraining`; fine-tuning tasks plug in the same way.

Randomness: initialisation and MLM masking derive from config.seed (public; masks are keyed by
an example's identity, never its position, `data_pipelines.datasets`); the DP noise key, the
sampler's seed and, in a DP run, the dropout key are secret, kept only in checkpoints, so a
resumed run is bitwise the run it would have been (CPU) and nobody who reads config.json, a log
or the export can predict the noise, the batches or which dropout mask a unit got
(`randomness.dropout_key` says why dropout must be secret). Only aggregates over whole batches
are logged, never per-example values; throughput comes from public quantities (the expected
batch size).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import time
from typing import Any, Callable, Protocol

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from data_pipelines import datasets, fileio
from dpbert import prng
from dpbert.dp import plan as plan_lib
from dpbert.dp import randomness
from dpbert.dp import trees
from dpbert.errors import ConfigError
from dpbert.models import trainable as trainable_lib
from dpbert.reporting import lineage as lineage_lib
from dpbert.reporting import report as report_lib
from dpbert.runtime import checkpointing
from dpbert.runtime import compile_cache
from dpbert.runtime import config_checks
from dpbert.runtime import metrics as metrics_lib
from dpbert.runtime import optimizers
from dpbert.runtime import run_privacy
from dpbert.runtime import saved_run
from dpbert.runtime import sharding
from dpbert.runtime.evaluation import Evaluator, summary_line
from dpbert.runtime.guards import Lock, Stop
from dpbert.runtime.hosts import announce, is_primary, write_json
from dpbert.runtime.saved_run import (CONFIG_FILE, RUN_FILE, Saver, fresh_start_message,
                                      run_info_hash)

PyTree = Any


@flax.struct.dataclass
class TrainState:
    """Everything the jitted step reads and writes (a pytree; checkpointed by orbax).

    params: pure nested dict of float32 arrays (`nnx.to_pure_dict` of the model state).
    opt_state: the optax state.
    dp: `dpbert.dp.DPState` (accumulator, counters, dropout key, SECRET noise key).
    """

    params: PyTree
    opt_state: PyTree
    dp: Any


@dataclasses.dataclass
class TaskData:
    """What `Task.prepare` returns. Datasets have `num_examples`, `metadata` (with
    `content_sha256`, and `unit_multiplicity` when known) and
    `get_batch(indices int64 [n], *, step) -> dict of arrays [n, ...]`."""

    train: Any
    eval: Any | None
    vocab_report: dict | None = None
    vocab_origin: str = "file"  # "built" here from the corpus, "file" or "checkpoint"
    max_seq_length: int | None = None
    extra: dict = dataclasses.field(default_factory=dict)
    # What one training example (the privacy unit "example") is, in words, for the report;
    # None = one pretraining sequence.
    unit_definition: str | None = None
    # dp.privacy_unit note / patient: int64 [train.num_examples], the unit (0..U-1) of every
    # training example, and what the report says about the units (`units` metadata of
    # `data_pipelines.pretraining.build_datasets`); None for a per-example task.
    unit_ids: np.ndarray | None = None
    units: dict | None = None


@dataclasses.dataclass(frozen=True)
class BatchTransform:
    """A change of the batch inside the jitted step (dχ privatization): `operand` is a pytree
    placed on every device; `train(operand, batch, step, micro_step)` and
    `eval(operand, batch, index)` return the batch the loss sees."""

    operand: Any
    train: Callable[..., dict]
    eval: Callable[..., dict]


class Task(Protocol):
    """One kind of training run on this loop (see `dpbert.tasks.pretraining`).

    A task object holds no run state (one object serves every run, `dpbert.tasks.get_task`):
    what `prepare` made for a run is its `TaskData` (`extra` for the task's own things), which
    the loop hands back to the methods that need it."""

    name: str
    model_kind: str  # its head for train.trainable (dpbert.models.trainable.HEADS)

    def validate(self, config: ml_collections.ConfigDict) -> None: ...
    def auto_clipping(self, config) -> str: ...  # what dp.clipping="auto" means for this task
    def prepare(self, config, workdir: pathlib.Path,
                task_key: np.ndarray) -> TaskData: ...  # task_key: secret uint32[2]
    def build_model(self, config, data: TaskData) -> nnx.Module: ...
    def trainable(self, config) -> Any: ...  # a dpbert.dp.trees.TrainableFilter
    def loss(self, graphdef, config, shape: str,
             data: TaskData) -> Callable: ...  # shape: clipping.LOSS_SHAPES
    def batch_transform(self, config, model, data: TaskData) -> BatchTransform | None: ...
    def eval_step(self, graphdef, config,
                  data: TaskData) -> Callable: ...  # (params, batch, mask) -> pytree
    def eval_metrics(self, outputs: list,
                     data: TaskData) -> dict[str, float]: ...  # host, from eval_step's
    def train_metrics(self, sums: dict) -> dict[str, float]: ...  # host, batch totals
    def run_info(self, config, model, data: TaskData) -> dict: ...  # into run.json
    def export(self, params, run: dict, workdir: pathlib.Path, out: pathlib.Path,
               report: dict | None): ...


def validate(task: Task, config: ml_collections.ConfigDict) -> None:
    """The loop's own checks, the plan's and the task's; one ConfigError per problem."""
    config_checks.check(config)  # seeds, canary repetitions, dχ's η: shared by every task
    for field in ("num_steps", "log_every"):
        if not config.train[field] > 0:
            raise ConfigError(f"config.train.{field}={config.train[field]!r}: must be > 0")
    if not config.train.eval_every >= 0:
        raise ConfigError(f"config.train.eval_every={config.train.eval_every!r}: must be >= 0")
    if not config.checkpoint.every_steps >= 0:
        raise ConfigError(f"config.checkpoint.every_steps={config.checkpoint.every_steps!r}: "
                          "must be >= 0")
    trainable_lib.parse(config.train.trainable)  # K against the layer count once it is known
    if config.dp.get("clipping") == plan_lib.AUTO_CLIPPING:
        # Resolved once, here: config.json, the plan and the report name the clipper used.
        config.dp.clipping = task.auto_clipping(config)
    plan_lib.validate(config.dp, config.batch)
    opt_config = ml_collections.ConfigDict(config.optimizer.to_dict())
    warmup = opt_config.get("warmup_steps")
    if isinstance(warmup, int) and not isinstance(warmup, bool) and warmup >= 0:
        # the optimizer's own checks (a NaN learning rate, b1 >= 1, ...) before any data is built
        opt_config.total_steps = max(int(config.train.num_steps), warmup + 1)
        optimizers.make_optimizer(opt_config, None)
    task.validate(config)


def run(task: Task, config: ml_collections.ConfigDict, workdir: str | os.PathLike, *,
        devices: list[jax.Device] | None = None) -> dict:
    """Trains (or resumes) `task` as `config` says in `workdir`; returns the final privacy
    report (also written to WORKDIR/privacy_report.json). `devices` restricts the mesh."""
    validate(task, config)
    # Here, not in `validate` (which fine-tuning calls before and after its recipe): once a run.
    warning = plan_lib.mechanism_optimizer_warning(config.dp, config.optimizer.get("name"))
    if warning:
        logging.warning(warning)
    # Not empty, not the current directory, not the starting model's folder: checked before
    # anything (the lock, checkpoints/, data/) is written.
    init_from = config.get("model", {}).get("init_from_hf") or ""
    problem = fileio.output_folder_problem(
        workdir, sources=[(f"config.model.init_from_hf={init_from}", init_from)])
    if problem:
        raise ConfigError(f"--workdir={workdir}: {problem}")
    workdir = pathlib.Path(workdir).absolute()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        if not os.access(workdir, os.W_OK):
            raise PermissionError("not writable")
    except OSError as e:
        raise ConfigError(f"--workdir={workdir}: cannot write there ({e.strerror or e})")
    with Lock(workdir), checkpointing.quiet_failed_reads():
        damaged: set[int] = set()
        while True:
            try:
                return _run(task, config, workdir, devices, damaged)
            except _DamagedCheckpoint as e:  # resume from the one before, say which
                logging.warning("checkpoint step %d is damaged (%s); resuming from the newest "
                                "intact one before it", e.step, e.reason)
                damaged.add(e.step)


class _DamagedCheckpoint(Exception):
    def __init__(self, step: int, reason: str):
        super().__init__(step, reason)
        self.step, self.reason = step, reason


def _run(task: Task, config, workdir: pathlib.Path, devices, damaged: set[int]) -> dict:
    prng.generator()  # DPBERT_PRNG resolved (one GPU: JAX's threefry kernel) before any trace
    config_dict = config.to_dict()
    signature = checkpointing.run_signature(config_dict)
    ckpt = checkpointing.Checkpointer(workdir / "checkpoints",
                                      max_to_keep=config.checkpoint.max_to_keep,
                                      async_save=config.checkpoint.async_save)
    latest, saved = ckpt.latest_intact(skip=damaged)
    if saved is not None:  # refuse an incompatible checkpoint before any expensive work
        checkpointing.check_compatible(saved["signature"], signature, str(workdir))
        secrets = None  # the run's secrets live in its checkpoint
        sampler_seed, secret = int(saved["sampler"]["seed"]), bool(saved["secret_randomness"])
        task_key = np.asarray(saved["task_key"], np.uint32)
    else:
        # Without DP-SGD the noise and sampler may come from the public seed (reproducible
        # runs); the task key is secret unless the run says it is insecure.
        secrets = randomness.for_run(config.dp.insecure_seeded_noise or not config.dp.enabled,
                                     config.seed,
                                     seeded_task_key=config.dp.insecure_seeded_noise)
        sampler_seed, secret = secrets.sampler_seed, secrets.secret
        task_key = secrets.task_key_array()

    # The starting model's privacy (before any data work: a refusal costs nothing).
    lineage = lineage_lib.load(
        config.model.get("init_from_hf", ""), config.model.get("init_data", "same"),
        privacy_unit=config.dp.privacy_unit, dp_enabled=config.dp.enabled,
        delta=config.dp.delta, accountant=config.dp.accountant)
    inherited = lineage.segments if lineage is not None else ()
    if saved is not None and saved.get("inherited", []) != [s.to_json() for s in inherited]:
        raise ConfigError(
            f"{workdir}: the starting model's privacy report ({config.model.init_from_hf}/"
            f"{lineage_lib.REPORT_FILE}) differs from the one this run started with; its DP-SGD "
            "is composed into this run's epsilon, so it cannot change on resume. Restore it, "
            "or use a fresh --workdir")
    if lineage is not None and lineage.voids:
        announce(f"WARNING: not private: {lineage.voids}")

    done = saved_run.finished(workdir, config, saved)
    if done is not None:  # nothing to train: no data, compile or evaluation
        announce(f"{workdir}: this run finished at step {saved['step']} (its checkpoint, "
                 f"privacy_report.json and export are there); nothing to train. Raise "
                 "train.num_steps (or the budget) to train on, or use a fresh --workdir")
        if is_primary():
            print(saved_run.finished_summary(workdir, int(saved["step"]), done), flush=True)
        return done
    data = task.prepare(config, workdir, task_key)
    data_hash = data.train.metadata.get("content_sha256")
    if saved is not None and saved.get("data_fingerprint") != data_hash:
        raise ConfigError(
            f"{workdir}: the training examples differ from those the checkpoint was trained on "
            f"(content sha256 {str(saved.get('data_fingerprint'))[:12]}... -> "
            f"{str(data_hash)[:12]}...); privacy accounting assumes one dataset. Use a fresh "
            "--workdir for new data.")
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, devices)
    vocab_part = run_privacy.vocabulary_part(config, data, config.dp.privacy_unit)
    dp, budget = run_privacy.training_dp(config, vocab_part, lineage)
    announce("planning (sampler, noise, privacy budget) ...")
    try:
        plan = plan_lib.make_plan(
            dp, config.batch, num_steps=config.train.num_steps,
            num_examples=data.train.num_examples, num_shards=sharding.num_batch_shards(mesh),
            sampler_seed=sampler_seed, saved_ledger=saved.get("accounting") if saved else None,
            start_step=int(saved["step"]) if saved else 0, unit_ids=data.unit_ids,
            inherited=inherited)
    except ConfigError as e:
        if budget is None or "target_epsilon" not in str(e):
            raise
        raise ConfigError(f"config.dp.total_epsilon={config.dp.total_epsilon} leaves the "
                          f"training epsilon {report_lib.fmt_eps(dp.target_epsilon)} after "
                          f"the vocabulary's {report_lib.fmt_eps(budget['other_parts_epsilon'])}"
                          f" (the plan's dp.target_epsilon below): {e}") from None
    logging.info("plan: %s", plan)
    run_privacy.check_total_delta(config, plan, vocab_part, lineage, workdir)
    run_privacy.say_unused_unit_slots(plan)
    # Written once the run is known to go ahead (a refused rerun leaves it as it was).
    write_json(workdir / CONFIG_FILE, config_dict)

    model = task.build_model(config, data)
    run_info = {"task": task.name, **task.run_info(config, model, data)}
    transform = task.batch_transform(config, model, data)
    # What trains: the input mode's filter and train.trainable (dpbert.models.trainable).
    layers = model.config.num_hidden_layers
    trainable = trainable_lib.both(task.trainable(config), trainable_lib.parse(
        config.train.trainable, layers).predicate(task.model_kind, layers))
    graphdef, param_state = nnx.split(model)
    params = nnx.to_pure_dict(param_state)
    run_info["trainable"] = trainable_lib.describe(config.train.trainable, params, trainable)
    write_json(workdir / RUN_FILE, run_info)
    announce(f"training {run_info['trainable']['parameters']:,} of "
             f"{run_info['trainable']['total_parameters']:,} parameters "
             f"(train.trainable={config.train.trainable})")
    opt_config = ml_collections.ConfigDict(config.optimizer.to_dict())
    opt_config.total_steps = max(plan.num_steps, opt_config.warmup_steps + 1)
    optimizer = optimizers.make_optimizer(opt_config, params, trainable=trainable)
    param_sh = sharding.pure_param_shardings(model, mesh)
    # A replicated parameter's noise is added to each device's slice of the reduced sum and
    # all-gathered (sharding.noise_layouts); sharded parameters get theirs in their own layout.
    # On one device all of the noise comes from one draw (one copy of the generator in the
    # step: it compiles in a fraction of the time; the same values).
    updater = plan.make_updater(task.loss(graphdef, config, plan.loss_shape, data), optimizer,
                                trainable=trainable,
                                noise_layouts=sharding.noise_layouts(param_sh, params),
                                noise_flat=mesh.devices.size == 1)
    rep = sharding.replicated(mesh)
    # The secret noise key is an argument (not a constant baked into the program); on resume
    # the restored state brings its own.
    noise_key = secrets.noise_key_array() if secrets is not None else np.zeros(2, np.uint32)
    # Dropout: secret in a DP run (keyed by batch position, which depends on the secret sample;
    # `randomness.dropout_key`), the public seed otherwise (reproducible).
    # Both keys are arguments of the jitted init: a constant would be written into the
    # persistent compilation cache (dpbert.runtime.compile_cache) with the program.
    dropout = np.asarray(randomness.dropout_key(task_key) if config.dp.enabled and secret
                         else jax.random.PRNGKey(config.seed), np.uint32)
    init = lambda p, k, d: TrainState(p, optimizer.init(p),  # noqa: E731
                                      updater.init(p, d, k))
    abstract = jax.eval_shape(init, params, noise_key, dropout)
    state_sh = TrainState(param_sh, sharding.opt_state_shardings(abstract.opt_state, params,
                                                                 param_sh, mesh),
                          updater.state_sharding(param_sh, rep))
    state = jax.jit(init, out_shardings=state_sh)(params, noise_key, dropout)
    del model, param_state, params, noise_key, dropout

    start_step = 0
    if latest is not None:
        # A state of another layout is refused, not taken for a damaged step (which would be
        # deleted and the run started afresh).
        problem = ckpt.layout_problem(latest, checkpointing.abstract_like(state))
        if problem:
            ckpt.close()
            raise checkpointing.IncompatibleCheckpointError(f"{workdir}: {problem}")
        try:
            state, meta = ckpt.restore(latest, checkpointing.abstract_like(state))
        except Exception as e:  # orbax raises several types for truncated or missing files
            ckpt.close()
            raise _DamagedCheckpoint(latest, f"{type(e).__name__}: "
                                             f"{checkpointing.first_line(e)}") from e
        plan.sampler.load_state_dict(meta["sampler"])
        start_step = int(meta["step"])
        announce(f"resumed from {ckpt.directory / str(latest)} at step {start_step}")
    else:
        announce(fresh_start_message(ckpt, damaged))
    # A damaged step is retrained from the one before; its remains would keep the new save
    # of that step from being written (a step that exists is not saved again).
    for step in sorted(s for s in damaged if s in ckpt.all_steps()):
        logging.warning("deleting the damaged checkpoint step %d (it is trained again)", step)
        ckpt.delete(step)

    b = config.batch
    rows = sharding.host_rows(b.physical_batch_size, sharding.batch_sharding(mesh))
    load_rows = _row_loader(plan, data.train)
    slots = (len(rows),) + ((plan.max_examples_per_unit,) if plan.per_unit else ())
    example, _ = load_rows(np.zeros(slots, np.int64), np.zeros(slots, bool), 0)
    abstract_batch = {k: jax.ShapeDtypeStruct((b.physical_batch_size, *v.shape[1:]), v.dtype,
                                              sharding=sharding.batch_sharding(mesh, v.ndim))
                      for k, v in example.items()}
    abstract_mask = jax.ShapeDtypeStruct((b.physical_batch_size,), jnp.bool_,
                                         sharding=sharding.batch_sharding(mesh))
    operand = None if transform is None else jax.device_put(transform.operand, rep)

    # The noise std is an argument, not a constant of the program: a fresh start whose sigma
    # was calibrated again (the demo rebuilds its DP vocabulary, so its example count and
    # sigma change) or a sweep over epsilon finds its train step in the persistent cache.
    noise_stddev = jax.device_put(updater.stddev_argument(), rep)
    # So are the optimizer's numbers (learning rate, warmup and total steps, weight decay, head
    # scale): a sweep over them finds its train step in the cache too (`optimizers.SWEPT`).
    numbers = jax.device_put(optimizers.numbers_argument(opt_config), rep)

    def step_fn(state: TrainState, batch, mask, operand, noise_stddev, numbers):
        if transform is not None:
            batch = transform.train(operand, batch, state.dp.step, state.dp.micro_step)
        step_optimizer = optimizers.make_optimizer(opt_config, state.params,
                                                   trainable=trainable, numbers=numbers)
        params, opt_state, dp_state, sums = updater.update(state.dp, state.params,
                                                           state.opt_state, batch, mask,
                                                           noise_stddev, step_optimizer)
        return TrainState(params, opt_state, dp_state), sums

    announce("compiling the train step ...")
    t0 = time.time()
    compiled = compile_cache.compile_ahead(
        jax.jit(step_fn, donate_argnums=0, out_shardings=(state_sh, rep)),
        checkpointing.abstract_like(state), abstract_batch, abstract_mask, operand,
        noise_stddev, numbers)
    _log_memory("train step", compiled, time.time() - t0)
    train_step = lambda state, batch, mask, operand: compiled(  # noqa: E731
        state, batch, mask, operand, noise_stddev, numbers)
    eval_step = task.eval_step(graphdef, config, data)

    def eval_fn(params, batch, mask, operand, index):
        if transform is not None:
            batch = transform.eval(operand, batch, index)
        return eval_step(params, batch, mask)

    evaluator = Evaluator(task, jax.jit(eval_fn, out_shardings=rep), data, config, mesh,
                          operand)
    return _train(task, config, workdir, ckpt, plan, data, state, train_step, operand, evaluator,
                  start_step, signature, secret, vocab_part, rows, mesh, run_info, task_key,
                  load_rows, lineage, dp, budget)


def _row_loader(plan, dataset) -> Callable:
    """(indices, mask, step) -> (this host's batch, its mask [rows]) for the plan's sampler:
    examples ([rows], mask [rows]) or, per unit, [rows, K] example slots with the example mask
    as a feature and the unit mask [rows] (a row holds a unit when any slot does)."""
    if not plan.per_unit:
        return lambda indices, mask, step: (dataset.get_batch(indices, step=step), mask)

    def load(indices, mask, step):
        return (datasets.get_unit_batch(dataset, indices, mask, step=step), mask.any(axis=-1))

    return load


def _train(task, config, workdir, ckpt, plan, data, state, compiled, operand, evaluate,
           start_step, signature, secret, vocab_part, rows, mesh, run_info, task_key,
           load_rows, lineage, dp, budget) -> dict:
    b = config.batch
    sampler = plan.sampler

    def load(call: int):
        indices, mask = sampler.batch(call)
        return load_rows(indices[rows], mask[rows], call // plan.calls_per_batch)

    def report_at(step_now: int, by_budget: bool = False) -> dict:
        training = None
        if plan.ledger is not None:
            training = report_lib.training_part(
                plan.ledger, step_now - plan.ledger.closed_steps, clip_norm=config.dp.clip_norm,
                privacy_unit=config.dp.privacy_unit, secret=secret,
                target_epsilon=dp.target_epsilon, stopped_by_budget=by_budget,
                units=report_lib.units_part(plan, data.units))
        return {**report_lib.run_report(
            training, vocab_part, privacy_unit=plan.privacy_unit,
            max_seq_length=data.max_seq_length, unit=data.unit_definition,
            multiplicity=data.train.metadata.get("unit_multiplicity"), steps=step_now,
            units=data.units if plan.per_unit else None,
            max_examples_per_unit=plan.max_examples_per_unit, lineage=lineage, budget=budget),
            **run_info.get("report_fields", {})}  # the task's settings a release keeps

    saver = Saver(ckpt, workdir, signature, secret, data_hash=data.train.metadata.get(
        "content_sha256"), run_hash=run_info_hash(run_info), task_key=task_key, plan=plan,
        sampler=sampler, report_at=report_at,
        inherited=[s.to_json() for s in (lineage.segments if lineage else ())])
    writer = metrics_lib.MetricWriter(workdir)
    initial_eval = {}
    if data.eval is not None and start_step == 0 and config.train.eval_every:
        # The untrained model's held-out numbers, so the log shows what training changed.
        initial_eval = evaluate(state.params)
        writer.write(0, initial_eval)
    progress = metrics_lib.Progress(plan.num_steps, start_step)
    step, totals, t_last, steps_since = start_step, None, time.time(), 0
    batches = datasets.prefetch(load, start_step * plan.calls_per_batch,
                                plan.num_steps * plan.calls_per_batch,
                                buffer_size=max(1, config.data.get("prefetch", 2)))

    # Non-finite parameters stop the run before they are saved or exported.  Checked where the
    # loop logs or saves, by a program of its own: a parameter that is NaN or inf stays so at
    # every later step (p + update, elementwise), so the parameters of the last step say
    # whether any step since the last check made one non-finite.  (Inside the train step the
    # check was 133 of the demo's 793 fusions for XLA to compile: issue 32, BENCHMARKS.md.)
    finite = jax.jit(lambda p: trees.all_finite(p, one_device=mesh.devices.size == 1),
                     out_shardings=sharding.replicated(mesh))

    def check_finite():
        if steps_since and not bool(finite(state.params)):
            saver.close()
            newest = ckpt.latest_step()
            kept = (f"The newest checkpoint (step {newest}) is intact." if newest is not None
                    else "No checkpoint was saved before.")
            raise FloatingPointError(
                f"the parameters became non-finite (NaN or inf) between steps {step - steps_since}"
                f" and {step}; stopping without saving or exporting them. {kept} Lower "
                "config.optimizer.learning_rate or check the data and config.")

    with Stop() as stop:
        try:
            while step < plan.num_steps:
                for _ in range(plan.calls_per_batch):
                    local, local_mask = next(batches)
                    batch = sharding.make_global_batch(local, mesh, b.physical_batch_size)
                    mask = sharding.make_global_batch({"m": local_mask}, mesh,
                                                      b.physical_batch_size)["m"]
                    state, sums = compiled(state, batch, mask, operand)
                    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
                sampler.call = (step + 1) * plan.calls_per_batch
                step += 1
                steps_since += 1
                saving = (config.checkpoint.every_steps and
                          step % config.checkpoint.every_steps == 0) or stop.signal
                if step % config.train.log_every == 0 or step == plan.num_steps or saving:
                    totals = jax.device_get(totals)
                    check_finite()
                    dt = time.time() - t_last
                    scalars = {f"train/{k}": v for k, v in task.train_metrics(totals).items()}
                    scalars["train/num_nonfinite"] = float(totals["num_nonfinite"])
                    scalars["perf/step_time"] = dt / steps_since
                    # Per unit the batch sizes count units (the public expected number).
                    per_sec = "units_per_sec" if plan.per_unit else "examples_per_sec"
                    scalars[f"perf/{per_sec}"] = steps_since * b.expected_batch_size / dt
                    if data.max_seq_length and not plan.per_unit:
                        scalars["perf/tokens_per_sec"] = (scalars["perf/examples_per_sec"]
                                                          * data.max_seq_length)
                    if plan.ledger is not None:
                        scalars["privacy/epsilon"] = plan.ledger.progress_epsilon(
                            step - plan.ledger.closed_steps)
                    writer.write(step, scalars)
                    progress.report(step, scalars)
                    totals, t_last, steps_since = None, time.time(), 0
                if data.eval is not None and config.train.eval_every and \
                        step % config.train.eval_every == 0 and step < plan.num_steps:
                    writer.write(step, evaluate(state.params))
                # The flag is read once here: a signal that arrived after `saving` was computed
                # (during the log or eval above) still gets this step saved before it stops.
                stopping = stop.signal
                if saving or stopping:
                    saver.save(step, state)
                if stopping:
                    # "saved" only once it is true: close() waits for the asynchronous save of
                    # THIS step to be committed and flushed to disk (a supervisor's SIGKILL may
                    # follow the message at once), and raises if it is not on disk.
                    saver.close(durable=True)
                    logging.warning("stopped by %s: checkpoint of step %d saved (%s); rerun the "
                                    "same command to resume", signal.Signals(stopping).name,
                                    step, ckpt.directory / str(step))
                    raise SystemExit(143 if stopping == signal.SIGTERM else 130)
        finally:
            del batches  # stops the reader thread
    by_budget = plan.max_steps_by_budget is not None and \
        step == plan.max_steps_by_budget < config.train.num_steps
    if by_budget:
        logging.warning("stopped at step %d of %d: one more step would exceed the training "
                        "epsilon budget %s (%s)", step, config.train.num_steps,
                        dp.target_epsilon, "dp.target_epsilon" if budget is None else
                        "what dp.total_epsilon leaves after the vocabulary")
    final_eval = evaluate(state.params)
    if final_eval:
        writer.write(step, final_eval)
    saver.save(step, state, by_budget)
    report = saver.close()
    writer.close()
    if config.train.export_hf and is_primary():
        task.export(jax.device_get(state.params), run_info, workdir, workdir / "hf", report)
    if is_primary():
        print(summary_line(step, report, initial_eval, final_eval, by_budget), flush=True)
    return report


def _log_memory(name: str, compiled, seconds: float) -> None:
    try:
        mem = compiled.memory_analysis()
    except Exception:  # some backends do not implement it
        mem = None
    if mem is None:
        announce(f"{name} compiled in {seconds:.1f} s")
        return
    mib = lambda x: f"{x / 2**20:.1f} MiB"  # noqa: E731
    announce(f"{name} compiled in {seconds:.1f} s: arguments {mib(mem.argument_size_in_bytes)}, "
              f"temporaries {mib(mem.temp_size_in_bytes)}")
