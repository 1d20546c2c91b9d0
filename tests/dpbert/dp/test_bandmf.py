"""BandMF (`dpbert.dp.bandmf`, dp.mechanism="bandmf"): the noise has the strategy's correlation,
one band is DP-SGD bit for bit, the sensitivity of our cyclic sampling is jax-privacy's
min-separation sensitivity, and epsilon / sigma are jax-privacy's BandMF accounting."""

import math

import dp_accounting
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from jax_privacy.experimental import execution_plan
from jax_privacy.matrix_factorization import toeplitz

from dpbert.dp import accounting, accumulation, bandmf, calibration, ledger, noise, plan
from dpbert.dp import sampling
from dpbert.errors import ConfigError
from tests.dpbert.dp import helpers

STRATEGY = bandmf.strategy(12, 3)  # optimized once per session (cached), ~2 s


def test_strategy_is_jax_privacys_optimum_with_unit_norm_and_cached():
    assert len(STRATEGY) == 3 and math.isclose(math.fsum(c * c for c in STRATEGY), 1.0)
    assert bandmf.strategy(12, 3) is STRATEGY  # cached by its parameters
    assert bandmf.strategy(12, 1) == (1.0,)
    # jax-privacy's own loss of our coefficients is no worse than its initial guess.
    start = toeplitz.optimal_max_error_strategy_coefs(3)
    assert toeplitz.loss(jnp.asarray(STRATEGY), 12) <= toeplitz.loss(start / jnp.linalg.norm(
        start), 12) * (1 + 1e-6)
    with pytest.raises(ValueError, match="num_bands=5 exceeds"):
        bandmf.strategy(4, 5)


# ------------------------------------------------------------------------------------- noise

def _noise_stream(strategy, steps: int, size: int = 4000, stddev: float = 1.0,
                  key=(3, 4)) -> np.ndarray:
    """[steps, size]: the noise add_correlated_noise adds to a zero sum, step after step
    (the aggregator's per-step keys: fold_in(noise_key, t))."""
    tree = {"w": jnp.zeros((size,), jnp.float32)}
    buffers = tuple([jnp.zeros((size,), jnp.float32)] for _ in strategy[1:])
    base = jnp.asarray(key, jnp.uint32)
    step = jax.jit(lambda k, b: noise.add_correlated_noise(tree, k, stddev, strategy, b))
    out = []
    for t in range(steps):
        noisy, buffers = step(jax.random.fold_in(base, t), buffers)
        out.append(np.asarray(noisy["w"]))
    return np.stack(out)


def test_noise_covariance_across_steps_is_the_strategys():
    """Empirical covariance of the noise across steps (4000 coordinates as samples) against
    stddev^2 C^-1 C^-T: equal within sampling error (|entry error| < 5 standard errors)."""
    steps, size, std = 8, 20000, 1.5
    draws = _noise_stream(STRATEGY, steps, size, std)
    empirical = draws @ draws.T / size
    c_inv = np.linalg.inv(bandmf.toeplitz_matrix(STRATEGY, steps))
    expected = std ** 2 * c_inv @ c_inv.T
    # Var of a product of two jointly Gaussian coordinates: S_ii S_jj + S_ij^2.
    se = np.sqrt((np.outer(np.diag(expected), np.diag(expected)) + expected ** 2) / size)
    assert np.all(np.abs(empirical - expected) < 5 * se), np.abs(empirical - expected) / se
    # It is correlated at all (not DP-SGD's identity): off-diagonal entries are many errors off 0.
    assert abs(expected[1, 0]) > 20 * se[1, 0]
    # Bit for bit C^-1 of the i.i.d. draws DP-SGD would have added at the same keys.
    iid = _noise_stream((1.0,), steps, size, std)
    np.testing.assert_allclose(draws, (c_inv @ iid.astype(np.float64)), rtol=1e-4, atol=1e-4)


def _aggregator_run(strategy, steps=3, calls=1, trainable=None):
    params = helpers.mlp_params()
    batch = helpers.mlp_batch(16)
    mask = np.ones(16, bool)
    mask[[2, 7]] = False
    config = accumulation.DPConfig(clip_norm=2.0, noise_multiplier=1.3, expected_batch_size=14.0,
                                   accumulation_steps=calls, strategy=strategy)
    agg = accumulation.DPAggregator(config, helpers.mlp_loss, optax.adam(0.05),
                                    trainable=trainable)
    state = agg.init(params, 0, noise_key=np.asarray([11, 12], np.uint32))
    opt_state = optax.adam(0.05).init(params)
    step = jax.jit(agg.update)
    size = 16 // calls
    for _ in range(steps):
        for c in range(calls):
            sl = slice(c * size, (c + 1) * size)
            params, opt_state, state, _ = step(state, params, opt_state,
                                               jax.tree.map(lambda x: x[sl], batch), mask[sl])
    return params, state


@pytest.mark.parametrize("calls", [1, 2])
def test_one_band_is_dpsgd_bitwise(calls):
    dpsgd, s0 = _aggregator_run(None, calls=calls)
    one_band, s1 = _aggregator_run((1.0,), calls=calls)
    for a, b in zip(jax.tree.leaves(dpsgd), jax.tree.leaves(one_band)):
        np.testing.assert_array_equal(a, b)
    assert s0.buffers is None and s1.buffers == ()


def test_bands_change_the_run_and_buffers_hold_the_last_noise():
    dpsgd, _ = _aggregator_run(None, calls=2)
    banded, state = _aggregator_run(STRATEGY, calls=2)
    assert not np.array_equal(jax.tree.leaves(dpsgd)[0], jax.tree.leaves(banded)[0])
    assert len(state.buffers) == 2 and int(state.step) == 3
    assert all(np.any(np.asarray(x) != 0) for x in jax.tree.leaves(state.buffers))


def test_frozen_leaves_keep_no_buffers_and_do_not_change_the_trained_ones_noise():
    """A frozen leaf gets no noise, so no buffer either (MiniLM with train.trainable=head: 3 x
    91 MB of zeros read and written every step before); the trained leaves' noise is bitwise
    what it is when every leaf trains."""
    tree = {"a": jnp.zeros((5,), jnp.float32), "b": jnp.zeros((7,), jnp.float32),
            "c": jnp.zeros((3, 2), jnp.float32)}
    frozen = {"a": True, "b": False, "c": True}
    assert [x.shape for x in noise.buffer_zeros(tree, frozen)] == [(5,), (3, 2)]
    step = jax.jit(lambda k, b, mask: noise.add_correlated_noise(
        tree, k, 1.5, STRATEGY, b, None if mask is None else dict(mask)), static_argnums=2)
    some = tuple(noise.buffer_zeros(tree, frozen) for _ in STRATEGY[1:])
    every = tuple(noise.buffer_zeros(tree) for _ in STRATEGY[1:])
    for t in range(4):
        key = jax.random.fold_in(jnp.asarray([3, 4], jnp.uint32), t)
        out, some = step(key, some, tuple(sorted(frozen.items())))
        ref, every = step(key, every, None)
        np.testing.assert_array_equal(out["b"], tree["b"])            # frozen: as it was
        for name in ("a", "c"):
            np.testing.assert_array_equal(out[name], ref[name])
            assert np.any(np.asarray(out[name]) != 0)
    with pytest.raises(ValueError, match="holds 3 arrays, the sum has 2 trainable leaves"):
        noise.add_correlated_noise(tree, key, 1.0, STRATEGY, every, frozen)
    # The engine keeps them so: a 2-call run with the first layer frozen.
    params, state = _aggregator_run(STRATEGY, calls=2, trainable={
        "l1": {"kernel": False, "bias": False}, "l2": {"kernel": True, "bias": True}})
    start = helpers.mlp_params()
    assert [[x.shape for x in b] for b in state.buffers] == [[(1,), (helpers.HIDDEN, 1)]] * 2
    np.testing.assert_array_equal(params["l1"]["kernel"], start["l1"]["kernel"])
    assert not np.array_equal(params["l2"]["kernel"], start["l2"]["kernel"])


# ---------------------------------------------------------------------------------- sampling

def test_one_band_samples_as_poisson_bitwise():
    a = sampling.PoissonSampler(500, 20, 32, seed=9)
    b = sampling.PoissonSampler(500, 20, 32, seed=9, num_bands=1)
    for call in range(30):
        for x, y in zip(a.batch(call), b.batch(call)):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("units", [False, True])
def test_cyclic_sampling_keeps_units_b_steps_apart_in_equal_groups(units):
    n, b, steps = 301, 3, 60
    if units:
        s = sampling.UnitPoissonSampler(np.repeat(np.arange(n), 2), 30, 64,
                                        max_examples_per_unit=2, seed=5, num_bands=b)
    else:
        s = sampling.PoissonSampler(n, 30, 64, seed=5, num_bands=b)
    assert s.group_size == 100 and s.q == pytest.approx(0.3)
    seen: dict[int, list[int]] = {}
    sizes = []
    for t in range(steps):
        members = s.logical_batch(t)
        sizes.append(members.size)
        assert set(members.tolist()) <= set(s.group(t).tolist())
        for m in members.tolist():
            seen.setdefault(m, []).append(t)
    gaps = [y - x for ts in seen.values() for x, y in zip(ts, ts[1:])]
    assert min(gaps) >= b and all(g % b == 0 for g in gaps)
    assert len(seen) <= b * s.group_size  # the N mod b left over are never sampled
    assert np.mean(sizes) == pytest.approx(30, rel=0.15)


def test_sensitivity_under_min_separation_is_jax_privacys():
    """Our cyclic schedule's worst-case participation gives ||C u||^2 equal to jax-privacy's
    minsep_sensitivity_squared (b-min-separation, ceil(T / b) participations): the columns a
    unit touches do not overlap, so the sensitivity is sqrt(k) * ||c|| and sigma is per
    participation, as the accounting's rounds assume."""
    for steps, coef in ((12, STRATEGY), (13, STRATEGY), (9, (1.0,))):
        b = len(coef)
        ours = bandmf.sensitivity_squared(coef, b, steps)
        with jax.enable_x64():
            theirs = float(toeplitz.minsep_sensitivity_squared(
                jnp.asarray(coef, jnp.float64), min_sep=b, n=steps))
        assert ours == pytest.approx(theirs, rel=1e-12)
        # The accountant's ceil(T / b) rounds of sensitivity 1 each: equal when b divides T, an
        # upper bound otherwise (the last column is cut off at step T).
        rounds = bandmf.rounds(steps, b)
        assert ours <= rounds + 1e-12
        assert ours == pytest.approx(rounds, rel=1e-12) or steps % b


# -------------------------------------------------------------------------------- accounting

def _spec(bands, strategy, sigma=1.0, n=3000, batch=30, max_batch=None, **kw):
    return accounting.AccountingSpec(noise_multiplier=sigma, expected_batch_size=batch,
                                     num_examples=n, delta=1e-5, max_batch_size=max_batch,
                                     mechanism="bandmf", num_bands=bands, strategy=strategy, **kw)


def test_one_band_epsilon_equals_dpsgds():
    for max_batch in (None, 45):
        dpsgd = accounting.AccountingSpec(1.0, 30, 3000, 1e-5, max_batch_size=max_batch)
        one = _spec(1, (1.0,), max_batch=max_batch)
        assert one.epsilon(50) == dpsgd.epsilon(50)
        assert one.epsilon(50) == dpsgd.accounted_by.event_epsilon(one.event(50), 1e-5)


@pytest.mark.parametrize("max_batch", [None, 45])
def test_epsilon_is_jax_privacys_bandmf_plan(max_batch):
    """Our epsilon (our accountant on the rounds) is what jax-privacy's BandMF execution plan's
    event gives with its own accountant (PLD, zero-out relation), and what ours gives for the
    same event: the same number under add-or-remove."""
    spec = _spec(3, STRATEGY, max_batch=max_batch)
    steps = 60
    config = execution_plan.BandMFExecutionPlanConfig(
        iterations=steps, strategy=np.asarray(STRATEGY), epsilon=None, delta=None,
        noise_multiplier=spec.noise_multiplier, sampling_prob=spec.q,
        truncated_batch_size=max_batch, num_examples=3000 if max_batch else None)
    theirs_event = config._get_dp_event(spec.noise_multiplier)  # noqa: SLF001
    theirs = config.accountant.compose(theirs_event).get_epsilon(1e-5)
    assert config.accountant.neighboring_relation == \
        dp_accounting.NeighboringRelation.REPLACE_SPECIAL
    assert spec.event(steps) == theirs_event
    assert spec.epsilon(steps) == pytest.approx(theirs, rel=1e-12)
    # Fewer rounds than DP-SGD with the same B: rounds = ceil(60 / 3) at q = 3 B / N.
    assert spec.rounds(steps) == 20 and spec.q == pytest.approx(0.03)


def test_calibrated_sigma_meets_the_target_under_jax_privacys_accounting():
    spec = _spec(3, STRATEGY)
    sigma = calibration.calibrate(spec, 60, 2.0)
    pld = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    eps = pld.compose(spec.replace(noise_multiplier=sigma).event(60)).get_epsilon(1e-5)
    assert eps <= 2.0 and eps == pytest.approx(2.0, rel=5e-3)
    # The smallest such sigma within the calibration's tolerance (0.1 %): a bit less spends more.
    below = spec.replace(noise_multiplier=sigma / (1 + 2 * accounting.CALIBRATION_RTOL))
    assert pld.compose(below.event(60)).get_epsilon(1e-5) > 2.0


def test_ledger_round_trips_the_strategy_and_dpsgd_json_is_unchanged():
    spec = _spec(3, STRATEGY)
    assert ledger.spec_from_dict(ledger.spec_to_dict(spec)) == spec
    dpsgd = accounting.AccountingSpec(1.0, 30, 3000, 1e-5)
    assert "mechanism" not in ledger.spec_to_dict(dpsgd)
    assert ledger.spec_from_dict(ledger.spec_to_dict(dpsgd)) == dpsgd


def test_spec_errors():
    with pytest.raises(ValueError, match="norm 1"):
        _spec(2, (1.0, 1.0))
    with pytest.raises(ValueError, match="2-band strategy has 2"):
        _spec(2, (1.0,))
    with pytest.raises(ValueError, match="sampling='poisson'"):
        _spec(1, (1.0,), sampling="shuffle")


# ---------------------------------------------------------------------------------- the plan

def _config(**dp):
    from configs import common

    c = common.get_config()
    c.dp.update(dict(noise_multiplier=1.0, delta=1e-5, clipping="vmap", **dp))
    c.batch.update(dict(expected_batch_size=20, physical_batch_size=32, microbatch_size=None))
    c.train.num_steps = 12
    return c


def test_plan_runs_bandmf_on_cyclic_groups_with_a_resumable_strategy():
    c = _config(mechanism="bandmf", num_bands=3)
    p = plan.from_config(c, num_examples=600, num_shards=1, sampler_seed=4)
    assert p.mechanism == "bandmf" and p.strategy == STRATEGY
    assert p.sampler.num_bands == 3 and p.spec.group_size == 200
    assert p.spec.q == pytest.approx(0.1)
    saved = p.ledger.to_json(5)
    resumed = plan.from_config(c, num_examples=600, num_shards=1, sampler_seed=4,
                               saved_ledger=saved, start_step=5)
    assert resumed.spec == p.spec and resumed.epsilon(12) == p.epsilon(12)
    # train.num_steps raised on resume: the checkpoint's strategy is kept.
    c.train.num_steps = 30
    longer = plan.from_config(c, num_examples=600, num_shards=1, sampler_seed=4,
                              saved_ledger=saved, start_step=5)
    assert longer.strategy == STRATEGY
    # A changed mechanism (here sigma) is refused, not composed.
    c.dp.noise_multiplier = 2.0
    with pytest.raises(ConfigError, match="resumes only under the same mechanism"):
        plan.from_config(c, num_examples=600, num_shards=1, sampler_seed=4,
                         saved_ledger=saved, start_step=5)


@pytest.mark.parametrize("dp, match", [
    ({"mechanism": "blt"}, "config.dp.mechanism"),
    ({"mechanism": "bandmf", "num_bands": 0}, "config.dp.num_bands"),
    ({"mechanism": "bandmf", "num_bands": True}, "config.dp.num_bands"),
    ({"mechanism": "bandmf", "sampling": "shuffle"}, "config.dp.sampling"),
])
def test_config_errors_name_the_field(dp, match):
    c = _config(**dp)
    with pytest.raises(ConfigError, match=match):
        plan.validate(c.dp, c.batch)


def test_too_many_bands_for_the_batch_or_the_steps_is_a_config_error():
    c = _config(mechanism="bandmf", num_bands=40)
    with pytest.raises(ConfigError, match="config.dp.num_bands=40: each of the 40 groups"):
        plan.from_config(c, num_examples=600, num_shards=1, sampler_seed=0)
    c = _config(mechanism="bandmf", num_bands=20)
    with pytest.raises(ConfigError, match="exceeds train.num_steps=12"):
        plan.from_config(c, num_examples=600, num_shards=1, sampler_seed=0)


def test_dpsgd_default_leaves_the_plan_as_it_was():
    c = _config()
    assert c.dp.mechanism == "dpsgd"
    p = plan.from_config(c, num_examples=600, num_shards=1, sampler_seed=4)
    assert p.strategy is None and p.sampler.num_bands == 1
    assert p.make_updater(helpers.mlp_loss, optax.sgd(0.1)).config.strategy is None
    assert isinstance(c.dp, ml_collections.ConfigDict)


def test_adam_or_lamb_with_bandmf_is_warned_and_nothing_else():
    """BandMF with an adaptive optimizer loses its gain (BENCHMARKS.md "Correlated noise"): the
    loop warns before anything is built; every other pairing is silent."""
    warn = plan.mechanism_optimizer_warning
    for name in ("adamw", "lamb"):
        text = warn(_config(mechanism="bandmf", num_bands=4).dp, name)
        assert f"optimizer.name={name!r}" in text and "optimizer.name='sgd'" in text
    assert warn(_config(mechanism="bandmf", num_bands=4).dp, "sgd") is None
    assert warn(_config(mechanism="bandmf", num_bands=1).dp, "adamw") is None   # DP-SGD
    assert warn(_config().dp, "adamw") is None
    off = _config(mechanism="bandmf", num_bands=4)
    off.dp.enabled = False
    assert warn(off.dp, "adamw") is None


def test_bandmf_noise_is_larger_per_step_and_smaller_in_the_sum():
    """The figures the warning and BENCHMARKS.md give: 4 bands over 500 steps at the demo's
    calibrated sigmas (BandMF 0.646, DP-SGD 0.561 for training epsilon 2.95): each step's noise
    about 3x DP-SGD's, the noise of the sum of all steps about 0.6x."""
    steps, c = 500, np.asarray(bandmf.strategy(500, 4))
    matrix = sum(np.diag(np.full(steps - j, cj), -j) for j, cj in enumerate(c))
    inverse = np.linalg.inv(matrix)                  # y = C^-1 z: the noise each step adds
    per_step = np.median(np.linalg.norm(inverse, axis=1))
    in_sum = np.linalg.norm(inverse.sum(axis=0))     # the noise of y_1 + ... + y_T
    assert 0.646 * per_step / 0.561 == pytest.approx(3.0, abs=0.1)
    assert 0.646 * in_sum / (0.561 * math.sqrt(steps)) == pytest.approx(0.59, abs=0.02)
