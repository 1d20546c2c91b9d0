"""BandMF: DP-SGD with noise correlated across steps by a banded matrix (host side).

    dp.mechanism="bandmf", dp.num_bands=b        (dp.mechanism="dpsgd": the i.i.d. noise)

The banded matrix factorization mechanism (Choquette-Choo et al. 2023, arXiv 2306.08153;
McKenna 2024, arXiv 2405.15913) as jax-privacy 2.0 defines it
(`jax_privacy.experimental.execution_plan.BandMFExecutionPlanConfig`), run by our engine:

    strategy   C: lower-triangular banded Toeplitz, first column (c_0, ..., c_{b-1}), ||c|| = 1,
               optimized for the run's train.num_steps by jax-privacy
               (`matrix_factorization.toeplitz.optimize_banded_toeplitz`, cached by its
               parameters, `strategy`), kept in the ledger's spec, so a resumed run keeps it
    noise      step t adds sigma * C_clip * y_t with y = C^-1 z: y_t = (z_t - sum_j c_j y_{t-j})
               / c_0, z_t the i.i.d. N(0, I) draw of DP-SGD's step t from OUR secret key and
               generator (`dpbert.dp.noise.add_correlated_noise`); the last b - 1 y's (the
               BUFFERS) are engine state (`DPState.buffers`), saved in the private orbax
               checkpoint like the noise key, never in anything shipped
    sampling   cyclic Poisson over privacy units (`dpbert.dp.sampling.PoissonSampler` with
               num_bands=b): b equal groups, step t samples group t mod b, so a unit takes part
               at most once in any b consecutive steps (b-min-separation)
    accounting jax-privacy's event: `truncated_amplified_bandmf_event` (or
               `amplified_bandmf_event` without truncation): DP-SGD of the group (N // b units,
               q = B / (N // b), truncation at M) over ceil(T / b) rounds, composed by our
               `Accountant`; sigma calibrated from dp.target_epsilon on that event

Why it is private: each unit's rows of C are at least b apart, and C has b bands, so the columns
a unit touches are orthogonal and each has norm ||c|| = 1: one participation is a Gaussian
mechanism of sensitivity C_clip and noise multiplier sigma, and the rounds compose as DP-SGD's
steps do (`sensitivity_squared` checks this against jax-privacy's `minsep_sensitivity_squared`
in tests). The neighbouring relation of jax-privacy's BandMF with equal groups is zero-out (one
unit replaced by a null unit that adds no gradient); dp_accounting's numbers for these events
are the same under add-or-remove (tests/dpbert/dp/test_bandmf.py).

b = 1 is DP-SGD: C = [1], the same sampling, noise and epsilon, bit for bit.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dpbert.core.checks import check_int

MECHANISMS = ("dpsgd", "bandmf")
# L-BFGS steps of the strategy optimization (jax-privacy's default for its BandMF plan).
OPTIMIZER_STEPS = 500


def strategy(num_steps: int, num_bands: int) -> tuple[float, ...]:
    """The b Toeplitz coefficients of C optimized for `num_steps` steps (mean squared error of
    the prefix sums, single participation, as jax-privacy's `BandMFExecutionPlanConfig.default`),
    float64, ||c|| = 1; (1.0,) for one band. Cached by (num_steps, num_bands)."""
    num_steps = check_int("num_steps", num_steps, minimum=1)
    num_bands = check_int("num_bands", num_bands, minimum=1)
    if num_bands > num_steps:
        raise ValueError(f"num_bands={num_bands} exceeds the {num_steps} steps")
    return _optimized(num_steps, num_bands)


@functools.lru_cache(maxsize=16)
def _optimized(num_steps: int, num_bands: int) -> tuple[float, ...]:
    if num_bands == 1:
        return (1.0,)
    import jax  # noqa: PLC0415  (host-only users of the plan skip JAX)
    from jax_privacy.matrix_factorization import toeplitz  # noqa: PLC0415

    with jax.enable_x64():
        start = toeplitz.optimal_max_error_strategy_coefs(num_bands)
        coef = np.asarray(toeplitz.optimize_banded_toeplitz(
            n=num_steps, bands=num_bands, strategy_coef=start,
            max_optimizer_steps=OPTIMIZER_STEPS), np.float64)
    coef = coef / np.linalg.norm(coef)
    if not (np.all(np.isfinite(coef)) and coef[0] > 0):
        raise ValueError(f"the optimized BandMF strategy is degenerate: {coef}")
    return tuple(float(c) for c in coef)


def check_strategy(coef) -> tuple[float, ...]:
    """A strategy read back (from a checkpoint's ledger): a non-empty tuple of finite floats,
    c_0 > 0, ||c|| = 1 within float rounding (the noise multiplier assumes column norm 1)."""
    coef = tuple(float(c) for c in coef)
    if not coef or not all(math.isfinite(c) for c in coef) or coef[0] <= 0:
        raise ValueError(f"BandMF strategy {coef} must be finite with c_0 > 0")
    if abs(math.fsum(c * c for c in coef) - 1.0) > 1e-9:
        raise ValueError(f"BandMF strategy {coef} must have L2 norm 1")
    return coef


def rounds(steps: int, num_bands: int) -> int:
    """ceil(T / b): the participations of one unit in T steps of cyclic sampling, what the
    accountant composes (jax-privacy's `amplified_bandmf_event`)."""
    return -(-check_int("steps", steps, minimum=0) // check_int("num_bands", num_bands,
                                                                minimum=1))


def toeplitz_matrix(coef, n: int) -> np.ndarray:
    """C as a dense float64 [n, n] lower-triangular banded Toeplitz matrix (tests, small n)."""
    c = np.zeros(n)
    c[:min(n, len(coef))] = np.asarray(coef, np.float64)[:n]
    return np.array([[c[i - j] if i >= j else 0.0 for j in range(n)] for i in range(n)])


def sensitivity_squared(coef, num_bands: int, steps: int) -> float:
    """max over the units of ||C u||^2, u the unit's participations under cyclic sampling with b
    = num_bands groups (steps g, g + b, g + 2b, ... for its group g; every participation with
    gradient norm 1, the worst case): the squared sensitivity of the whole run's noisy sums."""
    c = toeplitz_matrix(coef, steps)
    out = 0.0
    for g in range(min(num_bands, steps)):
        u = np.zeros(steps)
        u[g::num_bands] = 1.0
        out = max(out, float(np.sum((c @ u) ** 2)))
    return out


def dp_event(noise_multiplier: float, steps: int, *, num_bands: int, sampling_prob: float,
             group_size: int, max_batch_size: int | None):
    """jax-privacy's dp_accounting event of `steps` steps of BandMF with cyclic Poisson
    sampling (truncated at `max_batch_size` when it is below the group's size)."""
    from jax_privacy.experimental import accounting as jp_accounting  # noqa: PLC0415

    if max_batch_size is not None and max_batch_size < group_size:
        return jp_accounting.truncated_amplified_bandmf_event(
            noise_multiplier, steps, num_bands=num_bands, sampling_prob=sampling_prob,
            largest_group_size=group_size, truncated_batch_size=max_batch_size)
    return jp_accounting.amplified_bandmf_event(noise_multiplier, steps, num_bands=num_bands,
                                                sampling_prob=sampling_prob)
