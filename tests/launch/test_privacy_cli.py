"""launch/privacy.py: one JSON object, agreement with dp_accounting, clear errors."""

import json
import os
import pathlib
import subprocess
import sys

import dp_accounting
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

REPO = pathlib.Path(__file__).resolve().parents[2]


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, str(REPO / "launch" / "privacy.py"), *args],
                          capture_output=True, text=True, env=env, timeout=120)


def _direct(sigma, q, steps, delta, accountant=pld_privacy_accountant.PLDAccountant):
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return accountant().compose(event).get_epsilon(delta)


def test_epsilon_json_matches_dp_accounting():
    out = _cli("epsilon", "--num_examples=5000", "--batch_size=500", "--noise_multiplier=3",
               "--steps=512", "--delta=1e-6", "--json")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    report = json.loads(lines[0])
    assert report["epsilon"] == pytest.approx(_direct(3.0, 0.1, 512, 1e-6), rel=1e-9)
    assert report["epsilon"] == pytest.approx(3.77, abs=0.005)
    assert report["delta"] == 1e-6 and report["accountant"] == "pld"
    assert report["sampling"] == "poisson" and report["proven_bound"] is True
    assert report["effective_noise_multiplier"] == 3.0


def test_epsilon_rdp_per_shard_json():
    out = _cli("epsilon", "--num_examples=83000000", "--batch_size=131072",
               "--noise_multiplier=0.5", "--steps=1000", "--delta=1e-8", "--accountant=rdp",
               "--noise_mode=per_shard", "--num_shards=16", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["effective_noise_multiplier"] == pytest.approx(2.0)
    assert report["epsilon"] == pytest.approx(
        _direct(2.0, 131072 / 83_000_000, 1000, 1e-8, rdp_privacy_accountant.RdpAccountant),
        rel=1e-9)


def test_shuffle_text_output_warns():
    out = _cli("epsilon", "--num_examples=5000", "--batch_size=500", "--noise_multiplier=3",
               "--steps=512", "--delta=1e-6", "--sampling=shuffle")
    assert out.returncode == 0, out.stderr
    assert "epsilon = 3.7" in out.stdout and "NOT a proven" in out.stdout


def test_calibrate_json_round_trip():
    out = _cli("calibrate", "--target_epsilon=2", "--num_examples=100000", "--batch_size=1000",
               "--steps=3000", "--delta=1e-6", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    sigma = report["noise_multiplier"]
    eps = _direct(sigma, 0.01, 3000, 1e-6)
    assert eps == pytest.approx(report["epsilon"], rel=1e-9)
    assert 2.0 * 0.99 < eps <= 2.0


@pytest.mark.parametrize("args, match", [
    (["--noise_multiplier=1", "--delta=1e-3"], "delta"),
    (["--noise_multiplier=1", "--delta=1e-6", "--batch_size=9000"], "sampling probability"),
    (["--noise_multiplier=-1", "--delta=1e-6"], "noise_multiplier"),
    (["--delta=1e-6"], "--noise_multiplier"),
    # A flag of the other command is refused, not ignored.
    (["--noise_multiplier=1", "--delta=1e-6", "--target_epsilon=5"],
     "--target_epsilon does not apply to the epsilon command"),
])
def test_errors_are_one_clear_line(args, match):
    base = {"--num_examples": "5000", "--batch_size": "500", "--steps": "10"}
    for a in args:
        base[a.split("=")[0]] = a.split("=")[1]
    out = _cli("epsilon", *[f"{k}={v}" for k, v in base.items()])
    assert out.returncode != 0
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and match in lines[0], out.stderr


def test_every_missing_flag_is_named_at_once():
    out = _cli("calibrate")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == ("privacy.py: error: missing required flag(s): --num_examples, "
                                  "--batch_size, --steps, --delta, --target_epsilon")


def test_bandmf_epsilon_and_calibrate_are_jax_privacys_bandmf_accounting():
    """--mechanism=bandmf --num_bands=b: the epsilon of jax-privacy's BandMF execution plan
    (cyclic Poisson over b groups, q = b B / N, ceil(T / b) rounds) with its own accountant,
    and calibrate's sigma meets the target under it; one command also refuses a band count
    without the mechanism."""
    import numpy as np  # noqa: PLC0415
    from jax_privacy.experimental import execution_plan  # noqa: PLC0415

    args = ("--num_examples=3000", "--batch_size=30", "--steps=60", "--delta=1e-5",
            "--mechanism=bandmf", "--num_bands=3", "--json")
    out = _cli("epsilon", "--noise_multiplier=1.2", *args)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["mechanism"] == "bandmf" and report["num_bands"] == 3
    assert len(report["strategy"]) == 3

    def theirs(sigma):
        config = execution_plan.BandMFExecutionPlanConfig(
            iterations=60, strategy=np.asarray(report["strategy"]), epsilon=None, delta=None,
            noise_multiplier=sigma, sampling_prob=3 * 30 / 3000)
        return config.accountant.compose(
            config._get_dp_event(sigma)).get_epsilon(1e-5)  # noqa: SLF001

    assert report["epsilon"] == pytest.approx(theirs(1.2), rel=1e-9)
    cal = _cli("calibrate", "--target_epsilon=2", *args)
    assert cal.returncode == 0, cal.stderr
    sigma = json.loads(cal.stdout)["noise_multiplier"]
    assert theirs(sigma) <= 2.0 and theirs(sigma) == pytest.approx(2.0, rel=5e-3)
    text = _cli("epsilon", "--noise_multiplier=1.2", *args[:-1]).stdout
    assert "mechanism=bandmf num_bands=3" in text and "20 rounds accounted" in text
    bad = _cli("epsilon", "--noise_multiplier=1.2", *args[:4], "--num_bands=3")
    assert bad.returncode == 2 and "--mechanism=bandmf" in bad.stderr
