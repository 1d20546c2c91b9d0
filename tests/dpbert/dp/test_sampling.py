"""Host-side samplers: Poisson statistics, truncation, layout, determinism, resume."""

import numpy as np
import pytest
from scipy import stats

from dpbert.dp import sampling


def _logical(sampler, step):
    """Concatenate the calls of one logical batch -> (indices of real examples)."""
    parts = [sampler.batch(step * sampler.calls_per_batch + c)
             for c in range(sampler.calls_per_batch)]
    idx = np.concatenate([p[0] for p in parts])
    mask = np.concatenate([p[1] for p in parts])
    return idx[mask], idx, mask


def test_poisson_shapes_padding_and_layout():
    s = sampling.PoissonSampler(1000, 50.0, physical_batch_size=32, calls_per_batch=3, seed=1)
    assert s.max_batch_size == 96
    for call in range(6):
        idx, mask = s.batch(call)
        assert idx.dtype == np.int64 and idx.shape == (32,)
        assert mask.dtype == bool and mask.shape == (32,)
        assert np.all(idx[~mask] == 0)  # padding slots: valid index 0
        assert np.all((idx >= 0) & (idx < 1000))
    real, idx, mask = _logical(s, 0)
    assert len(set(real.tolist())) == real.size  # no example twice in a batch
    np.testing.assert_array_equal(np.sort(real), np.sort(s.logical_batch(0)))
    assert mask[:real.size].all() and not mask[real.size:].any()  # real slots first


def test_poisson_inclusion_frequencies():
    """Each example in each step independently with probability q."""
    n, b, steps = 400, 20.0, 3000
    s = sampling.PoissonSampler(n, b, physical_batch_size=64, seed=0)
    assert s.truncation_probability < 1e-12
    counts = np.zeros(n)
    sizes, prev, both = [], None, 0
    for t in range(steps):
        members = s.logical_batch(t)
        sizes.append(members.size)
        counts[members] += 1
        current = np.zeros(n, bool)
        current[members] = True
        if prev is not None:
            both += np.sum(prev & current)
        prev = current
    q = b / n
    # Batch size ~ Binomial(n, q): mean and variance.
    assert abs(np.mean(sizes) - b) < 5 * np.sqrt(n * q * (1 - q) / steps)
    assert np.var(sizes) == pytest.approx(n * q * (1 - q), rel=0.1)
    # Per-example inclusion counts ~ Binomial(steps, q): chi-square over examples.
    expected = steps * q
    chi2 = np.sum((counts - expected) ** 2 / (expected * (1 - q)))
    assert stats.chi2.sf(chi2, n - 1) > 1e-4
    # Independence across consecutive steps: P[in t and t+1] = q^2.
    pairs = (steps - 1) * n
    assert abs(both / pairs - q * q) < 5 * np.sqrt(q * q / pairs)


def test_truncation_keeps_a_uniform_subset_of_max_size():
    n = 200
    s = sampling.PoissonSampler(n, 48.0, physical_batch_size=25, calls_per_batch=2, seed=3)
    assert 0.3 < s.truncation_probability < 0.5
    counts = np.zeros(n)
    sizes = []
    for t in range(2000):
        members = s.logical_batch(t)
        sizes.append(members.size)
        counts[members] += 1
    assert max(sizes) == 50
    # Sizes are min(Binomial(n, q), 50).
    k = np.arange(n + 1)
    expected_size = np.sum(np.minimum(k, 50) * stats.binom.pmf(k, n, 48 / n))
    assert np.mean(sizes) == pytest.approx(expected_size, rel=0.01)
    chi2 = np.sum((counts - counts.mean()) ** 2 / counts.mean())
    assert stats.chi2.sf(chi2, n - 1) > 1e-4  # no example favoured


def test_deterministic_random_access_and_resume():
    a = sampling.PoissonSampler(10_000, 100.0, physical_batch_size=64, calls_per_batch=2, seed=7)
    first = [next(a) for _ in range(5)]
    state = a.state_dict()
    rest = [next(a) for _ in range(5)]
    b = sampling.PoissonSampler(10_000, 100.0, physical_batch_size=64, calls_per_batch=2, seed=7)
    b.load_state_dict(state)
    for x, y in zip(rest, [next(b) for _ in range(5)]):
        np.testing.assert_array_equal(x[0], y[0])
        np.testing.assert_array_equal(x[1], y[1])
    for c, x in enumerate(first):  # random access agrees with iteration
        np.testing.assert_array_equal(a.batch(c)[0], x[0])
    other = sampling.PoissonSampler(10_000, 100.0, physical_batch_size=64, calls_per_batch=2,
                                    seed=8)
    assert not np.array_equal(other.batch(0)[0], first[0][0])
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(state)


def test_shuffle_sampler_epochs():
    s = sampling.ShuffleSampler(100, physical_batch_size=10, calls_per_batch=3, seed=0)
    assert s.steps_per_epoch == 3
    seen = np.concatenate([_logical(s, t)[0] for t in range(3)])
    assert seen.size == 90 and len(set(seen.tolist())) == 90  # no repeats within an epoch
    assert all(_logical(s, t)[2].all() for t in range(4))  # always full batches
    assert not np.array_equal(_logical(s, 3)[0], _logical(s, 0)[0])  # reshuffled


def test_capacity_for_overflow_probability():
    m = sampling.capacity_for_overflow_probability(83_000_000, 131072, 1e-12)
    q = 131072 / 83_000_000
    assert stats.binom.sf(m, 83_000_000, q) <= 1e-12 < stats.binom.sf(m - 1, 83_000_000, q)
    assert 131072 < m < 131072 + 8 * np.sqrt(131072)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_examples=0), "num_examples"),
    (dict(expected_batch_size=0.0), "expected_batch_size"),
    (dict(expected_batch_size=2000.0), "expected_batch_size"),
    (dict(physical_batch_size=0), "physical_batch_size"),
    (dict(calls_per_batch=0), "calls_per_batch"),
    (dict(physical_batch_size=10, calls_per_batch=2), "below expected_batch_size"),
])
def test_poisson_errors(kwargs, match):
    base = dict(num_examples=1000, expected_batch_size=50.0, physical_batch_size=64,
                calls_per_batch=1, seed=0)
    with pytest.raises(ValueError, match=match):
        sampling.PoissonSampler(**{**base, **kwargs})


def test_make_sampler():
    assert isinstance(sampling.make_sampler("poisson", num_examples=100, expected_batch_size=10,
                                            physical_batch_size=16), sampling.PoissonSampler)
    assert isinstance(sampling.make_sampler("shuffle", num_examples=100, expected_batch_size=16,
                                            physical_batch_size=8, calls_per_batch=2),
                      sampling.ShuffleSampler)
    with pytest.raises(ValueError, match="physical_batch_size"):
        sampling.make_sampler("shuffle", num_examples=100, expected_batch_size=10,
                              physical_batch_size=16)
    with pytest.raises(ValueError, match="sampling"):
        sampling.make_sampler("fixed", num_examples=100, expected_batch_size=10,
                              physical_batch_size=16)
