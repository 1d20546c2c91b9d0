"""OME and unary-encoding randomizers (dpbert.privacy.ome): FINETUNE_SPEC §3.6 and the true-ε checks."""

import itertools
import math

import jax
import numpy as np
import pytest

from dpbert.privacy import ome

# ----------------------------------------------------------------------------- encoding


def test_round_trip_within_one_fraction_step():
    rng = np.random.default_rng(0)
    v = np.concatenate([rng.normal(0, 3, size=(200, 50)).ravel(),
                        [0.0, -0.0, 1e-9, -1e-9, 15.96875, -15.96875, 16.0, -40.0, 7.99]])
    v = v[None]
    for m, n in [(4, 5), (2, 3), (1, 1)]:
        bits = ome.encode(v, m, n)
        assert bits.shape == (1, v.shape[1] * (1 + m + n)) and bits.dtype == np.uint8
        back = ome.decode(bits, m, n)
        assert (np.abs(back - ome.clip(v, m, n)) < 2.0 ** -n).all()


def test_bit_layout_sign_integer_fraction_msb_first():
    assert ome.bit_length() == 10 and ome.max_magnitude() == 16 - 1 / 32
    # -5.40625 = -(4 + 1 + 0.25 + 0.125 + 0.03125): s=1, I=0101, F=01101.
    np.testing.assert_array_equal(ome.encode(np.array([[-5.40625]])),
                                  [[1, 0, 1, 0, 1, 0, 1, 1, 0, 1]])
    # Clipping: |v| ≥ 2^m − 2^−n → all magnitude bits set; truncation of the fraction.
    np.testing.assert_array_equal(ome.encode(np.array([[100.0, 0.999]])),
                                  [[0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1]])
    # Coordinates are laid out one after another.
    two = ome.encode(np.array([[1.0, -2.0]]), 2, 1)
    np.testing.assert_array_equal(two, [[0, 0, 1, 0, 1, 1, 0, 0]])


def test_zscore_modes():
    rng = np.random.default_rng(1)
    v = rng.normal(3, 2, size=(20, 50))
    z = ome.zscore(v)
    np.testing.assert_allclose(z.mean(1), 0, atol=1e-12)
    np.testing.assert_allclose(z.std(1), 1, atol=1e-12)
    mean, std = ome.feature_stats(v)
    zf = ome.zscore(v, "per_feature", mean=mean, std=std)
    np.testing.assert_allclose(zf.mean(0), 0, atol=1e-12)
    with pytest.raises(ValueError, match="public mean"):
        ome.zscore(v, "per_feature")


# ----------------------------------------------------------------------------- sampling


def _flip_rate_check(rand, bits, n_draws, key):
    out = rand.perturb(key, np.tile(bits, (n_draws, 1)))
    p, q = rand.p, rand.q
    checked = 0
    for b in (0, 1):
        for parity in (0, 1):
            cols = [i for i in range(bits.size) if bits[i] == b and (i + 1) % 2 == parity]
            probs = (p if b else q)[cols]
            assert np.ptp(probs) == 0
            prob = probs[0]
            n = len(cols) * n_draws
            freq = out[:, cols].mean()
            assert abs(freq - prob) <= 5 * math.sqrt(prob * (1 - prob) / n) + 1e-12, (
                b, parity, freq, prob, n)
            checked += n
    return checked


def test_ome_flip_rates_within_binomial_bounds():
    r, l = 4, 10
    bits = np.tile([0, 0, 1, 1], r * l // 4).astype(np.uint8)   # half ones on each parity
    rand = ome.ome_randomizer(1.0, 10.0, r, l)
    assert _flip_rate_check(rand, bits, 10_000, jax.random.key(0)) == 4 * 10 * 10_000
    calibrated = ome.CalibratedOME(eps=20.0, r=r).randomizer
    _flip_rate_check(calibrated, bits, 10_000, jax.random.key(1))


def test_perturb_is_reproducible_per_row_and_key_dependent():
    rand = ome.ome_randomizer(1.0, 2.0, 3, 10)
    bits = (np.arange(90).reshape(3, 30) % 3 == 0).astype(np.uint8)
    a = rand.perturb(jax.random.key(5), bits, row_ids=np.array([7, 8, 9]))
    b = rand.perturb(jax.random.key(5), bits[1:], row_ids=np.array([8, 9]), chunk_rows=1)
    np.testing.assert_array_equal(a[1:], b)
    c = rand.perturb(jax.random.key(6), bits, row_ids=np.array([7, 8, 9]))
    assert (a != c).any()


def test_large_lambda_copies_high_bits_and_zeroes_low_bits():
    r, l = 5, 10
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2, size=(400, r * l)).astype(np.uint8)
    out = ome.OME(eps=1.0, lam=1e6, r=r).randomizer.perturb(jax.random.key(0), bits)
    even = np.arange(1, r * l + 1) % 2 == 0
    np.testing.assert_array_equal(out[:, even], bits[:, even])
    assert out[:, ~even].sum() == 0
    odd_first = ome.OME(eps=1.0, lam=1e6, r=r, high_p_parity="odd").randomizer
    out = odd_first.perturb(jax.random.key(0), bits)
    np.testing.assert_array_equal(out[:, ~even], bits[:, ~even])


# ----------------------------------------------------------------------------- ε


@pytest.mark.parametrize("eps,lam,r", [(1.0, 100.0, 50), (0.5, 10.0, 768), (10.0, 1.0, 50),
                                       (5.0, 50.0, 384)])
def test_theorem1_identity_holds_numerically(eps, lam, r):
    rand = ome.ome_randomizer(eps, lam, r, 10)
    assert math.isclose(ome.ome_theorem1_log_ratio(rand), eps, rel_tol=1e-6)


@pytest.mark.parametrize("eps", [0.5, 1.0, 5.0, 10.0])
@pytest.mark.parametrize("r", [50, 768])
def test_true_epsilon_at_lambda_1_is_at_most_eps(eps, r):
    true = ome.ome_worst_case_epsilon(eps, 1.0, r, 10)
    assert true <= eps
    t = eps / (r * 10)   # exact: rl · ln((1 + e^t) / 2)
    assert math.isclose(true, r * 10 * math.log((1 + math.exp(t)) / 2), rel_tol=1e-6)


def test_true_epsilon_at_the_papers_lambda_is_huge_and_flat_in_eps():
    values = [ome.ome_worst_case_epsilon(eps, 100.0, 50, 10) for eps in (0.5, 1, 5, 10)]
    assert all(3.40e3 < x < 3.50e3 for x in values), values
    assert max(values) - min(values) < 10
    assert 5.2e4 < ome.ome_worst_case_epsilon(1.0, 100.0, 768, 10) < 5.4e4


def _brute_force_epsilon(log_p_out_given_in):
    """max over input pairs and outputs of |ln P(o|x) − ln P(o|x')|; input [X, O] log-probs."""
    a = log_p_out_given_in
    return float(np.max(np.abs(a[:, None, :] - a[None, :, :])))


def _bit_channel_logprobs(rand, inputs):
    """[X, O] log P(output | input bits) for all 2^L outputs, via the realized probabilities."""
    lp1, lp0, lq1, lq0 = rand.log_probs()
    outputs = np.array(list(itertools.product((0, 1), repeat=rand.size)))
    rows = []
    for x in inputs:
        l1 = np.where(x == 1, lp1, lq1)   # log P(out bit = 1 | x)
        l0 = np.where(x == 1, lp0, lq0)
        rows.append(np.where(outputs == 1, l1, l0).sum(1))
    return np.array(rows)


@pytest.mark.parametrize("eps,lam", [(1.0, 1.0), (1.0, 10.0), (0.3, 100.0), (5.0, 3.0)])
def test_worst_case_epsilon_matches_brute_force_over_encoded_inputs(eps, lam):
    m, n, r = 1, 1, 2                       # l = 3, r·l = 6: 64 inputs × 64 outputs
    l = ome.bit_length(m, n)
    magnitudes = [0.1, 0.6, 1.1, 1.6]       # I, F ∈ {0, 1}² all reached
    values = magnitudes + [-x for x in magnitudes]
    inputs = ome.encode(np.array(list(itertools.product(values, repeat=r))), m, n)
    assert len({tuple(x) for x in inputs}) == 2 ** (r * l)      # the encoder covers the cube
    for parity in ome.PARITIES:
        rand = ome.ome_randomizer(eps, lam, r, l, parity)
        brute = _brute_force_epsilon(_bit_channel_logprobs(rand, inputs))
        assert math.isclose(ome.worst_case_epsilon(rand), brute, rel_tol=1e-9)
        assert math.isclose(ome.ome_worst_case_epsilon(eps, lam, r, l, parity), brute,
                            rel_tol=1e-9)


@pytest.mark.parametrize("eps", [0.5, 1.0, 10.0])
def test_calibrated_variant_true_epsilon_equals_request(eps):
    mech = ome.CalibratedOME(eps=eps, r=50)
    report = mech.privacy_report()
    assert math.isclose(report["epsilon_true"], eps, rel_tol=1e-9)
    assert report["epsilon_claimed"] == eps
    weighted = ome.CalibratedOME(eps=eps, r=3, bit_weights=(5, 1, 1, 0, 0, 0, 0, 0, 0, 0))
    assert math.isclose(weighted.privacy_report()["epsilon_true"], eps, rel_tol=1e-9)
    # A zero-weight bit is pure noise (p = q = 1/2).
    assert weighted.randomizer.p[5] == weighted.randomizer.q[5] == 0.5
    small = ome.CalibratedOME(eps=eps, r=1, m=1, n=1)
    inputs = ome.encode(np.array([[x] for x in (0.1, 0.6, 1.1, 1.6, -0.1, -0.6, -1.1, -1.6)]),
                        1, 1)
    brute = _brute_force_epsilon(_bit_channel_logprobs(small.randomizer, inputs))
    assert math.isclose(brute, eps, rel_tol=1e-9)
    assert not report["saturated"]


def test_calibrated_variant_saturates_honestly():
    # 60 nats per bit: p = 1 − 9e−27 is below the sampler's 2^−64 resolution.
    report = ome.CalibratedOME(eps=30000.0, r=50).privacy_report()
    assert report["saturated"] and math.isfinite(report["epsilon_true"])
    assert report["epsilon_true"] == pytest.approx(500 * math.log(2.0 ** 64 - 1), rel=1e-9)


@pytest.mark.parametrize("kind", ome.UE_KINDS)
def test_unary_encoding_epsilon_matches_brute_force(kind):
    r, levels, eps = 2, 3, 2.0
    rand = ome.ue_randomizer(kind, eps, r, levels)
    one_hots = [np.eye(levels, dtype=np.uint8)[i] for i in range(levels)]
    inputs = np.array([np.concatenate(c) for c in itertools.product(one_hots, repeat=r)])
    brute = _brute_force_epsilon(_bit_channel_logprobs(rand, inputs))
    assert math.isclose(ome.ue_worst_case_epsilon(rand, r, levels), brute, rel_tol=1e-9)
    # SUE spends exactly ε; the paper's OUE with Δf = 2r only ε/2.
    assert math.isclose(brute, eps if kind == "sue" else eps / 2, rel_tol=1e-9)


def test_unary_encode_and_report_fields():
    v = np.array([[-5.0, -0.1, 0.1, 3.99, 9.0]])
    bits = ome.unary_encode(v, 4, (-4.0, 4.0))
    np.testing.assert_array_equal(bits.reshape(5, 4).argmax(1), [0, 1, 2, 3, 3])
    assert bits.sum() == 5
    mech = ome.UnaryEncoding("oue", 1.0, r=5, levels=4)
    out = mech.privatize(jax.random.key(0), v)
    assert out.shape == (1, 20) and set(np.unique(out)) <= {0, 1}
    for m in (ome.OME(1.0, 100.0, 5), ome.CalibratedOME(1.0, 5), mech):
        report = m.privacy_report()
        assert {"epsilon_claimed", "epsilon_true", "mechanism"} <= set(report)
    assert ome.OME(1.0, 100.0, 5).privatize(jax.random.key(0), v).shape == (1, 50)
    with pytest.raises(ValueError, match="expected representations"):
        ome.OME(1.0, 100.0, 4).privatize(jax.random.key(0), v)
