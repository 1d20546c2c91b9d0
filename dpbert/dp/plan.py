"""The DP plan: every number of a run's DP-SGD, fixed before its first step.

One frozen object bundles what jax_privacy's execution plan bundles -- batch selection, clipping,
noise and the privacy event -- built from a config's `dp` and `batch` sections:

    plan = make_plan(config.dp, config.batch, num_steps=..., num_examples=N, num_shards=P,
                     sampler_seed=secret_seed, saved_ledger=checkpoint_ledger, start_step=s)
    updater = plan.make_updater(loss_fn, optimizer, trainable=..., noise_layouts=...)

    sampler          Poisson (fixed-capacity padded physical batches, truncation accounted) or
                     shuffled epochs; its seed is the run's SECRET seed. With
                     dp.privacy_unit note / patient: Poisson over UNITS, at most
                     dp.max_examples_per_unit examples each (`sampling.UnitPoissonSampler`);
                     batch sizes then count units and N is the number of units
    calls_per_batch  jitted calls per logical batch (the batch spread in time)
    clipping         a registered clipper (`dpbert.dp.clipping.register_clipper`) and the loss
                     shape it needs from the task; per unit, the task's loss is wrapped into
                     the loss of one unit (`dpbert.dp.units`), so any clipper clips per unit
    mechanism        dp.mechanism: "dpsgd" (i.i.d. noise) or "bandmf" (`dpbert.dp.bandmf`: noise
                     correlated by a banded strategy optimized for train.num_steps, cyclic
                     Poisson sampling of dp.num_bands groups; the strategy is in the spec, so a
                     resume keeps it, and a resume that changes the mechanism is refused)
    noise            sigma (given, or calibrated once from dp.target_epsilon and then read from
                     the ledger on every resume), C, global or per-shard noise. sigma lives in
                     ONE place, the ledger's current `AccountingSpec` (`DPPlan.spec`): the plan
                     reads it from there and `make_updater` hands it to `DPConfig`, which
                     computes the noise std once
    ledger           the privacy event of the whole run (`dpbert.dp.ledger`), None without DP
    num_steps        the global step to stop at: train.num_steps, capped by the budget

A non-private run (dp.enabled=False) is the same plan with no noise and no clipping: shuffled
fixed-size batches, the `none` clipper (the batch gradient) and no ledger, so the training loop
has one path (`DPAggregator`) for both.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import ml_collections
from absl import logging

from dpbert.core import units as privacy_units
from dpbert.dp import accountants, accounting, bandmf, calibration, noise_modes, sampling
from dpbert.dp import ledger as ledger_lib
from dpbert.errors import ConfigError, need

# Units the training loop implements (`dpbert.core.units`): one sequence, one note (document),
# one patient (SUBJECT_ID; a document in corpora without SUBJECT_IDs). See dpbert.dp.units for
# the loss of one unit.
PRIVACY_UNITS = privacy_units.NAMES
UNIT_LOSSES = ("mean", "sum")
# dp.clipping="auto": the task's fastest clipper for the run (`Task.auto_clipping`, resolved
# by `dpbert.runtime.loop.validate` before the plan is made).
AUTO_CLIPPING = "auto"


@dataclasses.dataclass(frozen=True)
class DPPlan:
    """See the module docstring. All fields are public except the sampler's seed."""

    private: bool
    clipping: str
    clip_norm: float
    num_examples: int
    num_shards: int
    expected_batch_size: float
    physical_batch_size: int
    microbatch_size: int | None
    calls_per_batch: int
    num_steps: int
    max_steps_by_budget: int | None
    sampler: Any = dataclasses.field(repr=False)
    ledger: ledger_lib.PrivacyLedger | None = None
    # dp.privacy_unit, and per unit: K and the unit loss ("mean" | "sum"). num_examples,
    # expected_batch_size, physical_batch_size and microbatch_size then count units.
    privacy_unit: str = "example"
    max_examples_per_unit: int | None = None
    unit_loss: str | None = None

    @property
    def unit(self) -> privacy_units.PrivacyUnit:
        """The `dpbert.core.units.PrivacyUnit` of `privacy_unit`."""
        return privacy_units.get(self.privacy_unit)

    @property
    def per_unit(self) -> bool:
        """True when the sampler draws units of several examples ([units, K] batches)."""
        return self.private and self.unit.per_unit

    @property
    def spec(self) -> accounting.AccountingSpec | None:
        """The mechanism of the current segment (None without DP)."""
        return None if self.ledger is None else self.ledger.current

    @property
    def noise_multiplier(self) -> float:
        """sigma as configured or calibrated: the spec's (0 without DP)."""
        return 0.0 if self.spec is None else self.spec.noise_multiplier

    @property
    def noise_mode(self) -> str:
        """The spec's noise mode ("global" without DP)."""
        return "global" if self.spec is None else self.spec.noise_mode

    @property
    def mechanism(self) -> str:
        """"dpsgd" or "bandmf" (the spec's; "dpsgd" without DP)."""
        return "dpsgd" if self.spec is None else self.spec.mechanism

    @property
    def strategy(self) -> tuple[float, ...] | None:
        """BandMF's Toeplitz coefficients (None: i.i.d. noise)."""
        return self.spec.strategy if self.mechanism == "bandmf" else None

    @property
    def loss_shape(self) -> str:
        """What the clipper needs from the task's loss (`clipping.LOSS_SHAPES`)."""
        from dpbert.dp import clipping  # noqa: PLC0415  (JAX; host-only users skip it)

        return clipping.get_clipper(self.clipping).loss_shape

    def epsilon(self, step: int) -> float | None:
        """The whole run's epsilon at global step `step` (None without DP)."""
        if self.ledger is None:
            return None
        return self.ledger.epsilon(step - self.ledger.closed_steps)

    def make_updater(self, loss_fn, optimizer, *, trainable=None, noise_layouts=None,
                     noise_flat=False):
        """The `DPAggregator` running this plan: clip (or not) -> accumulate -> noise (or not)
        -> optimizer. `loss_fn` must have `loss_shape`; `noise_layouts`, `noise_flat`: the
        aggregator's."""
        from dpbert.dp import accumulation, clipping  # noqa: PLC0415

        config = accumulation.DPConfig(
            clip_norm=self.clip_norm, noise_multiplier=self.noise_multiplier,
            expected_batch_size=self.expected_batch_size, microbatch_size=self.microbatch_size,
            accumulation_steps=self.calls_per_batch, noise_mode=self.noise_mode,
            num_shards=self.num_shards, strategy=self.strategy)
        clipper = clipping.get_clipper(self.clipping).make(
            self.clip_norm, self.microbatch_size, self.num_shards, trainable)
        if self.per_unit:
            from dpbert.dp import units  # noqa: PLC0415

            loss_fn = units.unit_loss(loss_fn, self.unit_loss)
        return accumulation.DPAggregator(config, loss_fn, optimizer, trainable=trainable,
                                         clipper=clipper,
                                         noise_layouts=noise_layouts,
                                         noise_flat=noise_flat)


def validate(dp: ml_collections.ConfigDict, batch: ml_collections.ConfigDict) -> None:
    """Checks of the dp and batch sections that need no data; one ConfigError per problem."""
    from dpbert.dp import clipping  # noqa: PLC0415

    def b(cond: bool, field: str, why: str) -> None:
        need(cond, f"batch.{field}", batch.get(field), why)

    def d(cond: bool, field: str, why: str) -> None:
        need(cond, f"dp.{field}", dp.get(field), why)

    total = dp.get("total_epsilon")
    if total is not None:
        d(dp.enabled, "total_epsilon", "budgets DP-SGD training (with the vocabulary): set "
          "dp.enabled=True, or unset it (=None)")
        d(total > 0 and math.isfinite(total), "total_epsilon", "must be a positive finite number")
        if dp.target_epsilon is not None:
            d(dp.target_epsilon < total, "total_epsilon",
              f"is the budget of the vocabulary AND the training, so it must exceed the "
              f"training's own dp.target_epsilon={dp.target_epsilon}; set one of them (unset "
              "the other with =None)")
    b(batch.expected_batch_size > 0, "expected_batch_size", "must be > 0")
    b(isinstance(batch.physical_batch_size, int) and batch.physical_batch_size > 0,
      "physical_batch_size", "must be a positive integer")
    if batch.microbatch_size is not None:
        b(batch.microbatch_size > 0 and batch.physical_batch_size % batch.microbatch_size == 0,
          "microbatch_size", f"must divide batch.physical_batch_size "
                             f"({batch.physical_batch_size})")
    if not dp.enabled:
        b(batch.expected_batch_size == batch.physical_batch_size, "expected_batch_size",
          "without DP, batches are fixed: set it equal to batch.physical_batch_size")
        return
    d(dp.privacy_unit in PRIVACY_UNITS, "privacy_unit",
      f"must be one of {PRIVACY_UNITS} (one training sequence, one note, one patient)")
    if privacy_units.get(dp.privacy_unit).per_unit:
        d(dp.sampling == "poisson", "sampling",
          f"privacy_unit={dp.privacy_unit!r} samples units with Poisson sampling: set "
          "dp.sampling='poisson'")
        d(isinstance(dp.get("max_examples_per_unit"), int) and not isinstance(
            dp.get("max_examples_per_unit"), bool) and dp.max_examples_per_unit >= 1,
          "max_examples_per_unit", "must be an integer >= 1 (K: a unit's examples per batch)")
        d(dp.get("unit_loss") in UNIT_LOSSES, "unit_loss", f"must be one of {UNIT_LOSSES}")
    d(dp.clip_norm > 0 and math.isfinite(dp.clip_norm), "clip_norm",
      "must be a positive finite number")
    d(dp.noise_multiplier is not None or dp.target_epsilon is not None or total is not None,
      "noise_multiplier", "give a noise multiplier, or dp.target_epsilon (training) or "
      "dp.total_epsilon (vocabulary + training) to calibrate one")
    if dp.noise_multiplier is not None:
        d(dp.noise_multiplier > 0, "noise_multiplier", "must be > 0 with DP on")
    if dp.target_epsilon is not None:
        d(dp.target_epsilon > 0, "target_epsilon", "must be > 0")
    d(dp.sampling in sampling.SAMPLING_MODES, "sampling",
      f"must be one of {sampling.SAMPLING_MODES}")
    names = clipping.clipper_names()
    d(dp.clipping in names or dp.clipping == AUTO_CLIPPING, "clipping",
      f"must be one of {(AUTO_CLIPPING, *names)}")
    d(dp.noise_mode in noise_modes.NOISE_MODES, "noise_mode",
      f"must be one of {noise_modes.NOISE_MODES}")
    d(dp.accountant in accountants.NAMES, "accountant", f"must be one of {accountants.NAMES}")
    d(0 < dp.overflow_probability < 1, "overflow_probability", "must be in (0, 1)")
    d(isinstance(dp.insecure_seeded_noise, bool), "insecure_seeded_noise",
      "must be True or False")
    mechanism = dp.get("mechanism", "dpsgd")
    d(mechanism in bandmf.MECHANISMS, "mechanism",
      f"must be one of {bandmf.MECHANISMS} (i.i.d. noise; banded matrix factorization)")
    if mechanism == "bandmf":
        bands = dp.get("num_bands")
        d(isinstance(bands, int) and not isinstance(bands, bool) and bands >= 1, "num_bands",
          "must be an integer >= 1 (BandMF's bands b: 1 is DP-SGD)")
        d(dp.sampling == "poisson", "sampling",
          "dp.mechanism='bandmf' samples by cyclic Poisson: set dp.sampling='poisson'")


# Optimizers that divide every coordinate's step by a running estimate of its own scale.
ADAPTIVE_OPTIMIZERS = ("adamw", "lamb")


def mechanism_optimizer_warning(dp: ml_collections.ConfigDict,
                                optimizer_name: str | None) -> str | None:
    """What to tell a user who pairs BandMF with Adam or LAMB (None for any other pairing).

    BandMF's noise is larger at every step than DP-SGD's (4 bands over 500 steps: ~3x) and
    smaller only in the SUM of the steps (~0.6x), which an optimizer linear in the gradient
    keeps; an adaptive one divides each step by its own noise and loses the gain (measured:
    BENCHMARKS.md "Correlated noise")."""
    if (not dp.enabled or dp.get("mechanism") != "bandmf" or (dp.get("num_bands") or 1) <= 1
            or optimizer_name not in ADAPTIVE_OPTIMIZERS):
        return None
    return (f"dp.mechanism='bandmf' with optimizer.name={optimizer_name!r}: BandMF's noise is "
            "larger at every step than DP-SGD's (about 3x with 4 bands) and smaller only in the "
            "sum of the steps, which an optimizer linear in the gradient keeps (sgd with "
            "momentum, optimizer.b1); Adam and LAMB divide each step by its own noise and lose "
            "that gain (the demo at 500 steps: held-out MLM 0.13 against DP-SGD's 0.22; "
            "BENCHMARKS.md 'Correlated noise'). Consider optimizer.name='sgd'.")


def counted(privacy_unit: str, per_unit: bool) -> str:
    """What the plan's N counts, in words: "training examples" or "notes (privacy units)"."""
    return f"{privacy_unit}s (privacy units)" if per_unit else "training examples"


def delta_bound(num_examples: int, what: str) -> str:
    """The bound every delta a run claims must stay under, in words ("< 1/N = 0.00133 for the
    N=754 training examples"): a larger delta allows releasing a random record in the clear.
    dp.delta alone is checked against it here, the run's total (vocabularies + dp.delta) by
    `dpbert.runtime.loop`."""
    return f"< 1/N = {1.0 / num_examples:.3g} for the N={num_examples} {what}"


def make_plan(dp: ml_collections.ConfigDict, batch: ml_collections.ConfigDict, *,
              num_steps: int, num_examples: int, num_shards: int, sampler_seed: int,
              saved_ledger: list | None = None, start_step: int = 0,
              unit_ids: Any = None, inherited: tuple = ()) -> DPPlan:
    """The plan of a fresh run, or of a resumed one (`saved_ledger` and `start_step` from its
    checkpoint). `sampler_seed` is the run's secret seed (`dpbert.dp.randomness`). With
    dp.privacy_unit note / patient, `unit_ids` (int [num_examples], the unit 0..U-1 of every
    training example) is required and N = U. `inherited`: DP-SGD segments of the starting
    model's training on data that may overlap (`dpbert.reporting.lineage.Lineage.segments`), composed
    into every epsilon and into the budget of dp.target_epsilon."""
    b = batch
    per_unit = dp.enabled and privacy_units.get(dp.privacy_unit).per_unit
    what = counted(dp.privacy_unit, per_unit)
    if per_unit:
        if unit_ids is None:
            raise ConfigError(f"config.dp.privacy_unit={dp.privacy_unit!r}: the task gives no "
                              "unit of its training examples; use privacy_unit='example'")
        if len(unit_ids) != num_examples:
            raise ValueError(f"unit_ids has {len(unit_ids)} entries for {num_examples} "
                             "training examples")
        num_examples = int(max(unit_ids)) + 1
    if b.physical_batch_size % num_shards:
        raise ConfigError(
            f"config.batch.physical_batch_size={b.physical_batch_size} is not divisible by the "
            f"{num_shards} devices that split the batch")
    if b.microbatch_size is not None and b.microbatch_size % num_shards:
        raise ConfigError(f"config.batch.microbatch_size={b.microbatch_size} is not divisible by "
                          f"the {num_shards} devices that split the batch")
    if b.expected_batch_size > num_examples:
        raise ConfigError(f"config.batch.expected_batch_size={b.expected_batch_size} exceeds the "
                          f"{num_examples} {what}")
    if not dp.enabled:
        sampler = sampling.make_sampler("shuffle", num_examples=num_examples,
                                        expected_batch_size=b.physical_batch_size,
                                        physical_batch_size=b.physical_batch_size,
                                        seed=sampler_seed)
        return DPPlan(False, "none", math.inf, num_examples, num_shards,
                      float(b.physical_batch_size), b.physical_batch_size, b.microbatch_size, 1,
                      num_steps, None, sampler, None)
    if dp.delta >= 1.0 / num_examples:
        raise ConfigError(f"config.dp.delta={dp.delta} must be {delta_bound(num_examples, what)}")
    mechanism = dp.get("mechanism", "dpsgd")
    bands = dp.num_bands if mechanism == "bandmf" else 1
    if bands > 1 and num_examples // bands < b.expected_batch_size:
        raise ConfigError(
            f"config.dp.num_bands={bands}: each of the {bands} groups of BandMF's cyclic "
            f"sampling holds {num_examples // bands} of the {num_examples} {what}, fewer than "
            f"batch.expected_batch_size={b.expected_batch_size}; use fewer bands or a smaller "
            "batch")
    calls = _calls_per_batch(dp, b, num_examples // bands)
    if per_unit:
        sampler = sampling.UnitPoissonSampler(
            unit_ids, b.expected_batch_size, b.physical_batch_size, calls,
            dp.max_examples_per_unit, seed=sampler_seed, num_bands=bands)
    else:
        sampler = sampling.make_sampler(dp.sampling, num_examples=num_examples,
                                        expected_batch_size=b.expected_batch_size,
                                        physical_batch_size=b.physical_batch_size,
                                        calls_per_batch=calls, seed=sampler_seed,
                                        num_bands=bands)
    # The accounted mechanism is read off the sampler (sampling, N, q, truncation size, groups).
    spec = accounting.AccountingSpec.from_sampler(
        sampler, noise_multiplier=dp.noise_multiplier or 1.0, delta=dp.delta,
        noise_mode=dp.noise_mode, num_shards=num_shards, accountant=dp.accountant,
        mechanism=mechanism,
        strategy=_strategy(bands, num_steps, saved_ledger) if mechanism == "bandmf" else ())
    inherited = tuple(inherited)
    if dp.noise_multiplier is None:
        spec = spec.replace(noise_multiplier=_noise_multiplier(dp, spec, num_steps,
                                                               saved_ledger, inherited))
    ledger = _ledger(spec, saved_ledger, start_step, inherited)
    num_steps, by_budget = _budget(dp, ledger, num_steps, start_step)

    return DPPlan(True, dp.clipping, float(dp.clip_norm),
                  num_examples, num_shards, float(b.expected_batch_size), b.physical_batch_size,
                  b.microbatch_size, calls, num_steps, by_budget, sampler, ledger,
                  dp.privacy_unit, dp.max_examples_per_unit if per_unit else None,
                  dp.unit_loss if per_unit else None)


def from_config(config: ml_collections.ConfigDict, num_examples: int, num_shards: int, *,
                sampler_seed: int | None = None, **kwargs) -> DPPlan:
    """`make_plan` from a whole experiment config (sampler seed default config.seed: tests)."""
    seed = config.seed if sampler_seed is None else sampler_seed
    return make_plan(config.dp, config.batch, num_steps=config.train.num_steps,
                     num_examples=num_examples, num_shards=num_shards, sampler_seed=seed,
                     **kwargs)


def _strategy(bands: int, num_steps: int, saved_ledger: list | None) -> tuple[float, ...]:
    """BandMF's strategy: the checkpoint's (a resumed run keeps its noise's correlation even if
    train.num_steps changed), else optimized for train.num_steps (`bandmf.strategy`)."""
    saved = saved_ledger[-1]["spec"] if saved_ledger else {}
    if saved.get("mechanism") == "bandmf" and saved.get("num_bands") == bands:
        return tuple(saved["strategy"])
    if bands > num_steps:
        raise ConfigError(f"config.dp.num_bands={bands} exceeds train.num_steps={num_steps} "
                          "(BandMF's strategy is optimized for the run's steps)")
    logging.info("optimizing the %d-band BandMF strategy for %d steps (jax-privacy)", bands,
                 num_steps)
    return bandmf.strategy(num_steps, bands)


def _calls_per_batch(dp, b, num_examples: int) -> int:
    if dp.sampling == "poisson":
        # Enough calls that a Poisson batch overflows (and is truncated, which is accounted)
        # with probability <= overflow_probability per step.
        capacity = sampling.capacity_for_overflow_probability(
            num_examples, b.expected_batch_size, dp.overflow_probability)
        return max(1, math.ceil(capacity / b.physical_batch_size))
    calls = round(b.expected_batch_size / b.physical_batch_size)
    if calls * b.physical_batch_size != b.expected_batch_size:
        raise ConfigError(f"config.batch.expected_batch_size={b.expected_batch_size} must be a "
                          f"multiple of batch.physical_batch_size with sampling='shuffle'")
    return calls


def _noise_multiplier(dp, spec: accounting.AccountingSpec, num_steps: int,
                      saved_ledger: list | None, inherited: tuple = ()) -> float:
    """sigma from dp.target_epsilon: calibrated at the start of the run, read back after."""
    if saved_ledger:
        # Recalibrating on resume (say, for more steps) would claim the target while the steps
        # already taken spent more.
        sigma = float(saved_ledger[-1]["spec"]["noise_multiplier"])
        logging.info("noise multiplier %.4f: calibrated at the start of this run (read from "
                     "the checkpoint, not recalibrated)", sigma)
        return sigma
    try:
        sigma = calibration.calibrate(spec, num_steps, dp.target_epsilon, prior=inherited)
    except ValueError as e:
        if not inherited:
            raise
        raise ConfigError(f"config.dp.target_epsilon={dp.target_epsilon}: the starting model's "
                          f"training on this data (model.init_data='same') already spends it: "
                          f"{e}") from None
    logging.info("calibrated noise multiplier %.4f for training epsilon %.3f at %d steps%s",
                 sigma, dp.target_epsilon, num_steps,
                 " (after the starting model's training)" if inherited else "")
    return sigma


def _ledger(spec: accounting.AccountingSpec, saved_ledger: list | None,
            start_step: int, inherited: tuple = ()) -> ledger_lib.PrivacyLedger:
    if not saved_ledger:
        return ledger_lib.PrivacyLedger.fresh(spec, inherited)
    ledger, in_segment = ledger_lib.PrivacyLedger.resume(saved_ledger, spec, inherited)
    if ledger.closed and "bandmf" in {
            spec.mechanism, *(s.spec.mechanism for s in ledger.closed)}:
        # BandMF's noise is one correlated stream with one sigma and strategy, and its rounds
        # are counted from the run's first step: a second segment is not BandMF's event.
        saved = ledger_lib.spec_from_dict(saved_ledger[-1]["spec"])
        raise ConfigError(
            f"the checkpoint's privacy mechanism ({saved.mechanism}, {saved.num_bands} band(s), "
            f"noise multiplier {saved.noise_multiplier:.6g}, noise mode {saved.noise_mode} on "
            f"{saved.num_shards} shard(s)) differs from this run's ({spec.mechanism}, "
            f"{spec.num_bands} band(s), {spec.noise_multiplier:.6g}, {spec.noise_mode} on "
            f"{spec.num_shards}): a BandMF run resumes only under the same mechanism (its "
            "correlated noise cannot be split into segments). Restore the config (and device "
            "count), or use a fresh --workdir")
    if ledger.closed_steps + in_segment != start_step:
        raise ConfigError(f"the checkpoint's privacy ledger covers "
                          f"{ledger.closed_steps + in_segment} steps but the checkpoint is at "
                          f"step {start_step}: refusing to resume an inconsistent checkpoint")
    if ledger.closed:
        logging.warning("the privacy mechanism changed on resume (e.g. per-shard noise on "
                        "another device count): epsilon composes %d segments",
                        len(ledger.closed) + 1)
    return ledger


def _budget(dp, ledger: ledger_lib.PrivacyLedger, num_steps: int,
            start_step: int) -> tuple[int, int | None]:
    """(global step to stop at, global step the budget allows or None)."""
    if dp.target_epsilon is None:
        return num_steps, None
    requested = num_steps
    allowed = ledger.max_steps_within_budget(
        dp.target_epsilon, upper_limit=max(num_steps - ledger.closed_steps, 1))
    by_budget = ledger.closed_steps + allowed
    num_steps = min(num_steps, by_budget)
    if num_steps == 0:
        raise ConfigError(no_step_fits(dp, ledger, requested - ledger.closed_steps))
    if num_steps < start_step:
        raise ConfigError(
            f"config.dp.target_epsilon={dp.target_epsilon}: the checkpoint at step "
            f"{start_step} already exceeds it (the budget allows {num_steps} steps)")
    if 0 < start_step == num_steps < requested:
        logging.warning(
            "config.dp.target_epsilon=%s is spent: the checkpoint at step %d has epsilon "
            "%.4g and one more step would exceed the target, so train.num_steps=%d cannot be "
            "reached; finishing at step %d (raise dp.target_epsilon to train on)",
            dp.target_epsilon, start_step, ledger.epsilon(start_step - ledger.closed_steps),
            requested, start_step)
    return num_steps, by_budget


def no_step_fits(dp, ledger: ledger_lib.PrivacyLedger, steps: int) -> str:
    """The refusal of a budget that not even one step fits, with the fixes the accountant
    computes (`calibration.budget_fixes`: the sigma that fits `steps` steps, the budget one
    and all steps need, the steps twice the noise allows)."""
    spent = (f" after the starting model's training on this data (epsilon "
             f"{ledger.epsilon(0):.4g} before the first step; model.init_data='same')"
             if ledger.inherited else "")
    total = dp.get("total_epsilon")
    if total is not None:
        field, other = "dp.total_epsilon", float(total) - float(dp.target_epsilon)
        what = (f"config.dp.total_epsilon={total} leaves the training epsilon "
                f"{dp.target_epsilon:.4g} (after the vocabulary's {other:.4g}):")
    else:
        field, other = "dp.target_epsilon", 0.0
        what = f"config.dp.target_epsilon={dp.target_epsilon}:"
    fixes = calibration.budget_fixes(ledger.current, max(1, steps), dp.target_epsilon,
                                     prior=ledger.prior, target_field=field, other_parts=other)
    return (f"{what} not even one step fits the training's budget with noise multiplier "
            f"{ledger.current.noise_multiplier}{spent}. Fixes the accountant computes: {fixes}; "
            "or a smaller batch.expected_batch_size (q = B/N)")
