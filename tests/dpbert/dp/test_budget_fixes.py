"""A budget that not even one step fits is refused with fixes the accountant computes (issue 36):
the sigma that makes the requested steps fit, the budget one / all steps need, the steps that
twice the noise allows; each suggestion checked against the accountant.

The noise multipliers here are 2 and 4 (budgets 0.25 and below), not the 0.5 and 1 of a real
refusal: a single-step PLD at sigma 0.5 takes several times longer to build, and calibration
builds one per sigma it tries. What is checked (the refusal, every fix against the accountant)
does not depend on the scale."""

import re

import ml_collections
import numpy as np
import pytest

from dpbert.dp import calibration, plan as plan_lib
from dpbert.errors import ConfigError


def _config(**dp):
    c = ml_collections.ConfigDict({
        "dp": dict(enabled=True, noise_multiplier=2.0, clip_norm=1.0, clipping="vmap",
                   target_epsilon=0.25, total_epsilon=None, delta=1e-6, accountant="pld",
                   sampling="poisson", noise_mode="global", privacy_unit="patient",
                   max_examples_per_unit=4, unit_loss="mean", insecure_seeded_noise=True,
                   overflow_probability=1e-6),
        "batch": dict(expected_batch_size=16, physical_batch_size=24, microbatch_size=8)})
    c.dp.update(dp)
    return c


def _plan(c, steps=10, units=270):
    return plan_lib.make_plan(c.dp, c.batch, num_steps=steps, num_examples=units, num_shards=1,
                              sampler_seed=0, unit_ids=np.arange(units))


@pytest.mark.slow  # PLD epsilons and a calibration (was ~20 s at sigma 0.5)
def test_no_step_fits_names_sigma_and_budgets_that_fit():
    c = _config()
    with pytest.raises(ConfigError) as e:
        _plan(c)
    msg = str(e.value)
    assert msg.startswith("config.dp.target_epsilon=0.25: not even one step fits")
    sigma = float(re.search(r"dp.noise_multiplier=([\d.]+) \(what train.num_steps=10", msg)[1])
    one, all10 = map(float, re.search(
        r"dp.target_epsilon=([\d.]+) or more for one step at sigma 2, ([\d.]+) for all 10",
        msg).groups())
    spec = _plan(_config(noise_multiplier=4.0, target_epsilon=None)).spec
    # the suggested sigma fits all 10 steps; the budgets fit one / 10 steps at sigma 2
    assert spec.replace(noise_multiplier=sigma).epsilon(10) <= 0.25
    assert spec.replace(noise_multiplier=sigma * 0.98).epsilon(10) > 0.25
    at_two = spec.replace(noise_multiplier=2.0)
    assert at_two.epsilon(1) <= one < 1.01 * at_two.epsilon(1)
    assert at_two.epsilon(10) <= all10
    # and they are what the run then accepts
    assert _plan(_config(noise_multiplier=sigma)).num_steps == 10
    assert _plan(_config(target_epsilon=one)).num_steps >= 1
    assert "dp.noise_multiplier=None calibrates it" in msg


def test_the_total_budget_is_named_when_it_set_the_target():
    c = _config(total_epsilon=8.25)   # the vocabulary's 8 leave the training 0.25
    with pytest.raises(ConfigError, match=r"config.dp.total_epsilon=8.25 leaves the training "
                                          r"epsilon 0.25 \(after the vocabulary's 8\): not even "
                                          r"one step fits.*dp.total_epsilon=(\d[\d.]*) or more"):
        _plan(c)


@pytest.mark.slow  # (was ~20 s at sigma 0.5 and 1)
def test_twice_the_noise_is_offered_with_the_steps_it_fits():
    spec = _plan(_config(noise_multiplier=4.0, target_epsilon=None)).spec
    target = (spec.epsilon(5) + spec.epsilon(6)) / 2
    assert spec.replace(noise_multiplier=2.0).epsilon(1) > target  # nothing fits at 2
    msg = calibration.budget_fixes(spec.replace(noise_multiplier=2.0), 10, target)
    assert "dp.noise_multiplier=4 (twice the noise) fits 5 steps" in msg
