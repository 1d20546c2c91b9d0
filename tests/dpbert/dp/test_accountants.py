"""dpbert.dp.accountants: the Accountant of a spec is looked up by its name; RDP cannot account
truncation; the sqrt(P) rule is one function for the accountant and the noise std."""

import pytest

from dpbert.dp import accountants, accounting, noise_modes


def test_lookup_by_name_and_support():
    assert accountants.get("pld") is accountants.PLD and accountants.get("rdp") is accountants.RDP
    with pytest.raises(ValueError, match=r"accountant='moments' is not one of \['pld', 'rdp'\]"):
        accountants.get("moments")
    spec = accounting.AccountingSpec(1.0, 100, 10_000, 1e-6, max_batch_size=150)
    assert spec.accounted_by is accountants.PLD
    assert accountants.PLD.supports(spec) and not accountants.RDP.supports(spec)
    assert accountants.RDP.supports(spec.replace(max_batch_size=None))


def test_progress_and_exact_epsilon_agree():
    spec = accounting.AccountingSpec(1.0, 100, 10_000, 1e-6, accountant="rdp")
    assert accountants.RDP.progress_epsilon(spec, 50) == spec.epsilon(50)
    assert accountants.RDP.progress_epsilon(spec, 0) == 0.0
    pld = spec.replace(accountant="pld")
    assert accountants.PLD.progress_epsilon(pld, 50) == pytest.approx(pld.epsilon(50), rel=1e-6)
    assert accountants.PLD.coarse_grid(pld, 50) is None
    assert accountants.RDP.coarse_grid(spec, 50) is None


def test_the_sqrt_p_rule_is_shared():
    assert noise_modes.shard_factor("global", 16) == 1.0
    assert noise_modes.shard_factor("per_shard", 16) == 4.0
    assert noise_modes.effective_noise_multiplier(0.5, "per_shard", 16) == 2.0
    assert noise_modes.noise_stddev(0.1, 0.5, "per_shard", 16) == 0.5 * 0.1 * 4.0


def test_a_target_no_noise_multiplier_reaches_is_one_clear_error():
    """dp_accounting's search for sigma starts at 1e-3; a target it cannot bracket (1e9) was a
    NoBracketIntervalFoundError traceback from the launchers."""
    from dpbert.dp import calibration

    with pytest.raises(ValueError, match="target_epsilon=1e\\+09: no noise multiplier"):
        calibration.calibrate_noise_multiplier(target_epsilon=1e9, expected_batch_size=10,
                                               num_examples=1000, steps=100, delta=1e-5)


def test_the_pld_searches_log_no_rdp_warnings():
    """Issue 36: the PLD accountant's calibration starts from an RDP estimate whose probes made
    dp_accounting's RDP code warn of non-converging orders (6 here, dozens per run) although
    RDP was not the accountant. The probe's warnings are dropped; RDP's own stay."""
    import logging as std_logging

    from dpbert.dp import calibration

    seen = []

    class Catch(std_logging.Handler):
        def emit(self, record):
            if record.pathname.endswith("rdp_privacy_accountant.py"):
                seen.append(record.getMessage())

    catch = Catch()
    std_logging.getLogger().addHandler(catch)
    try:
        spec = accounting.AccountingSpec(1.0, 64, 3000, 1e-5)  # PLD, the default
        sigma = calibration.calibrate(spec, 200, 8.0)
        assert spec.replace(noise_multiplier=sigma).epsilon(200) <= 8.0
        assert seen == []
        # The probe's filter is gone afterwards: RDP in use still says what it says.
        accountants._rdp_sigma(spec, 200, 8.0, tol=1e-4)  # noqa: SLF001
        assert seen and "failed to converge" in seen[0]
    finally:
        std_logging.getLogger().removeHandler(catch)
