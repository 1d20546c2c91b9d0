"""The accountants behind every epsilon (host side, no JAX): one `Accountant` per dp_accounting
method, looked up by its name once (`get`), so that accounting, calibration and the ledger call
its methods instead of branching on the name.

    "pld"  `PldAccountant`: dp_accounting's privacy loss distributions (the default, tight).
           Reported epsilons are what a fresh `PLDAccountant()` answers, bit for bit, computed on
           cached single-step PLDs (`_single_step_pld`); calibration and step budgets search on
           the PLD objects directly (`_fast_pld_epsilon`) from an RDP start, and the caller
           verifies the answer with the exact epsilon.
    "rdp"  `RdpAccountant`: dp_accounting's Renyi DP (a looser cross-check that answers for any
           number of steps); it cannot account truncated Poisson sampling.

An `Accountant` answers, for the mechanism of an `dpbert.dp.accounting.AccountingSpec`:

    supports(spec)                  can it account this mechanism at all?
    epsilon(segments, delta)        epsilon of segments [(spec, steps), ...] run one after the
                                    other: exact, as reported
    progress_epsilon(spec, steps, prior)   a fast estimate for progress logs
    calibrate(spec, steps, target)  the smallest effective sigma within a target (a start that
                                    `dpbert.dp.calibration` verifies)
    max_steps(spec, ok, upper, prior)      the largest number of steps within a budget
    coarse_grid(spec, steps)        the PLD grid used when coarser than the default (None else)

The specs and the ledger's JSON keep the accountant's NAME (`AccountingSpec.accountant`), so
checkpoints stay readable; `AccountingSpec.accounted_by` is the `Accountant` of that name.

Why the fast paths exist.  dp_accounting's sparse PMF ``self_compose(T)`` computes ``size ** T``
as an exact Python integer (about 1.5 s at T = 1e6), and building one step's PLD of truncated
Poisson sampling takes about 1 s; a root search asks dozens of times. So searches compose the
cached single-step PLD in two stages (`_composed_pld`), which differs from the one-stage result
only through the 1e-15 tail truncation per stage, and every answer is re-checked with the exact
epsilon. Grids are bounded by `dpbert.dp.pld_grid` (a tiny sigma gets a coarser pessimistic
grid: still an upper bound).
"""

from __future__ import annotations

import abc
import functools
import contextlib
import logging as std_logging
import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

import dp_accounting
from dp_accounting import mechanism_calibration
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize

from dpbert.core.checks import check_choice, check_int
from dpbert.dp import pld_cache, pld_grid

if TYPE_CHECKING:
    from dpbert.dp.accounting import AccountingSpec

# dp_accounting's own default grid; reported epsilons use it so they agree with a plain
# `PLDAccountant()` computation.
DEFAULT_PLD_DISCRETIZATION = pld_grid.DEFAULT_PLD_DISCRETIZATION
# A ledger segment or any (spec, steps) pair: `.spec` and `.steps`.
Segments = Sequence[Any]


def make_dp_event(effective_sigma: float, q: float, steps: int, *,
                  num_examples: int | None = None,
                  max_batch_size: int | None = None) -> dp_accounting.DpEvent:
    """The dp_accounting event of `steps` DP-SGD updates.

    Args:
      effective_sigma: noise multiplier really added
        (`dpbert.dp.noise_modes.effective_noise_multiplier`).
      q: Poisson sampling probability.
      steps: number of logical steps (noise draws).
      num_examples: dataset size N (needed with `max_batch_size`).
      max_batch_size: if set and < N, batches larger than this are truncated to a
        uniformly random subset of this size (truncated Poisson sampling).

    Returns:
      `SelfComposedDpEvent` of a Poisson-subsampled (or truncated) Gaussian.
    """
    steps = check_int("steps", steps, minimum=0)
    if max_batch_size is not None:
        max_batch_size = check_int("max_batch_size", max_batch_size, minimum=1)
        if num_examples is None:
            raise ValueError("max_batch_size needs num_examples")
        if max_batch_size < num_examples:
            return dp_accounting.SelfComposedDpEvent(
                dp_accounting.TruncatedSubsampledGaussianDpEvent(
                    dataset_size=int(num_examples), sampling_probability=q,
                    truncated_batch_size=max_batch_size,
                    noise_multiplier=effective_sigma),
                steps)
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(
            q, dp_accounting.GaussianDpEvent(effective_sigma)),
        steps)


def _truncates(spec: AccountingSpec) -> bool:
    return spec.max_batch_size is not None and spec.max_batch_size < spec.group_size


class Accountant(abc.ABC):
    """One dp_accounting method behind every epsilon of a spec (module docstring)."""

    name: str

    @abc.abstractmethod
    def make(self, discretization: float = DEFAULT_PLD_DISCRETIZATION
             ) -> dp_accounting.PrivacyAccountant:
        """A fresh dp_accounting accountant (add-or-remove-one neighbouring)."""

    def supports(self, spec: AccountingSpec) -> bool:
        """Whether this accountant can account the mechanism of `spec`."""
        return True

    def event_epsilon(self, event: dp_accounting.DpEvent, delta: float,
                      discretization: float = DEFAULT_PLD_DISCRETIZATION) -> float:
        """Epsilon of any dp_accounting event by a fresh accountant of this kind."""
        acc = self.make(discretization)
        if not acc.supports(event):
            raise ValueError(
                f"accountant={self.name!r} cannot account {type(event.event).__name__}"
                " (truncated Poisson sampling needs accountant='pld')")
        return float(acc.compose(event).get_epsilon(delta))

    @abc.abstractmethod
    def epsilon(self, segments: Sequence[tuple[AccountingSpec, int]], delta: float,
                discretization: float = DEFAULT_PLD_DISCRETIZATION) -> float:
        """Epsilon at `delta` of `segments` [(spec, steps), ...] run one after the other: what a
        fresh dp_accounting accountant of this kind answers for their event (one segment: its
        `SelfComposedDpEvent`; several: their `ComposedDpEvent`, on the grid `discretization`).
        Callers leave out segments of 0 steps when there are several
        (`dpbert.dp.accounting.composed_epsilon`)."""

    @abc.abstractmethod
    def progress_epsilon(self, spec: AccountingSpec, steps: int, prior: Segments = ()) -> float:
        """Epsilon of `steps` steps of `spec` after the segments `prior` (inherited and earlier
        ones, each with `.spec` and `.steps` > 0), for progress logs: may take a faster path
        than `epsilon`, never a looser bound than it by more than its tail truncation."""

    @abc.abstractmethod
    def calibrate(self, spec: AccountingSpec, steps: int, target_epsilon: float,
                  rtol: float) -> float:
        """The smallest EFFECTIVE sigma (within `rtol`) whose epsilon after `steps` steps of
        `spec`'s mechanism is <= target (spec's own sigma is ignored). Unverified: the caller
        checks it with `epsilon` (`dpbert.dp.calibration`)."""

    @abc.abstractmethod
    def max_steps(self, spec: AccountingSpec, ok: Callable[[int], bool], target_epsilon: float,
                  upper_limit: int, prior: Segments = ()) -> int:
        """Largest T <= upper_limit with ok(T), `ok(T)` being "the exact epsilon of T steps (after
        `prior`) is within `target_epsilon`" (monotone: True then False; ok(0) True). The
        search may use faster estimates, but the answer is decided by `ok`."""

    def coarse_grid(self, spec: AccountingSpec, steps: int) -> float | None:
        """The PLD grid that `steps` steps of `spec` are accounted on when it is coarser than
        dp_accounting's default (None: the default grid, or no grid at all)."""
        return None


# ----------------------------------------------------------------------------------------- RDP

class _DropRdpWarnings(std_logging.Filter):
    def filter(self, record: std_logging.LogRecord) -> bool:
        return not record.pathname.endswith("rdp_privacy_accountant.py")


@contextlib.contextmanager
def _rdp_probe():
    """The PLD accountant's searches start from an RDP estimate that probes far-off noise
    multipliers; dp_accounting's RDP code warns there of series that do not converge at some
    orders (dozens per run). RDP is then not the accountant in use and every number reported
    is the PLD's, so those warnings are dropped while the probe runs (absl logs to the
    python logger "absl")."""
    quiet = _DropRdpWarnings()
    logger = std_logging.getLogger("absl")
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _rdp_sigma(spec: AccountingSpec, steps: int, target_epsilon: float, tol: float) -> float:
    """RDP calibration of the effective sigma of plain Poisson sampling
    (`dp_accounting.calibrate_dp_mechanism`, ~0.01 s per evaluation)."""
    q = spec.q
    try:
        return float(dp_accounting.calibrate_dp_mechanism(
            rdp_privacy_accountant.RdpAccountant,
            lambda s: make_dp_event(s, q, spec.rounds(steps)), target_epsilon, spec.delta,
            bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-3, 1.0), tol=tol))
    except mechanism_calibration.NoBracketIntervalFoundError:
        # dp_accounting searches sigma >= 1e-3 and found none large enough to go below the
        # target: the target is so large that no noise multiplier the accountant handles is
        # small enough to spend it.
        raise ValueError(
            f"target_epsilon={target_epsilon:g}: no noise multiplier the accountant handles "
            f"(>= 1e-3) spends that much in {steps} steps; such an epsilon means no meaningful "
            "privacy. Give a smaller target epsilon (config.dp.target_epsilon, "
            "--target_epsilon) or a noise multiplier directly") from None


class RdpAccountant(Accountant):
    """dp_accounting's RDP accountant: a looser cross-check, for any number of steps."""

    name = "rdp"

    def make(self, discretization: float = DEFAULT_PLD_DISCRETIZATION
             ) -> dp_accounting.PrivacyAccountant:
        return rdp_privacy_accountant.RdpAccountant()

    def supports(self, spec: AccountingSpec) -> bool:
        return not _truncates(spec)

    def epsilon(self, segments: Sequence[tuple[AccountingSpec, int]], delta: float,
                discretization: float = DEFAULT_PLD_DISCRETIZATION) -> float:
        events = [spec.event(steps) for spec, steps in segments]
        event = events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)
        return self.event_epsilon(event, delta, discretization)

    def progress_epsilon(self, spec: AccountingSpec, steps: int, prior: Segments = ()) -> float:
        segments = [(s.spec, s.steps) for s in prior if s.steps > 0]
        segments += [(spec, steps)] if steps > 0 else []
        return self.epsilon(segments, spec.delta) if segments else 0.0

    def calibrate(self, spec: AccountingSpec, steps: int, target_epsilon: float,
                  rtol: float) -> float:
        return _rdp_sigma(spec, steps, target_epsilon, tol=1e-6)

    def max_steps(self, spec: AccountingSpec, ok: Callable[[int], bool], target_epsilon: float,
                  upper_limit: int, prior: Segments = ()) -> int:
        return last_true(ok, 1, upper_limit, first_step=1)


# ----------------------------------------------------------------------------------------- PLD

@functools.lru_cache(maxsize=32)
def _single_step_pld(sigma_eff: float, q: float, num_examples: int,
                     max_batch_size: int | None, discretization: float
                     ) -> pld_lib.PrivacyLossDistribution:
    """dp_accounting's PLD of one step (cached: building it is the slow part for
    truncated sampling, ~2 s of CPU, while searches over the number of steps reuse it; across
    processes too where DPBERT_PLD_CACHE_DIR is set, `dpbert.dp.pld_cache`)."""
    if max_batch_size is not None and max_batch_size < num_examples:
        return pld_cache.load_or_build(
            "truncated_subsampled_gaussian",
            (sigma_eff, q, num_examples, max_batch_size, discretization),
            lambda: pld_lib.from_truncated_subsampled_gaussian_mechanism(
                dataset_size=num_examples, sampling_probability=q,
                truncated_batch_size=max_batch_size, noise_multiplier=sigma_eff,
                value_discretization_interval=discretization))
    return pld_cache.load_or_build(
        "subsampled_gaussian", (sigma_eff, q, discretization),
        lambda: pld_lib.from_gaussian_mechanism(
            standard_deviation=sigma_eff, sampling_prob=q,
            value_discretization_interval=discretization))


def _mechanism(spec: AccountingSpec) -> tuple:
    """The arguments of `_single_step_pld` that describe one step of `spec` (hashable): one
    round of BandMF is a step of DP-SGD on its group (`dpbert.dp.bandmf`)."""
    return (spec.effective_noise_multiplier, spec.q, spec.group_size, spec.max_batch_size)


@functools.lru_cache(maxsize=256)
def _accountant_composed_epsilon(parts: tuple, delta: float, discretization: float) -> float:
    """What a fresh `PLDAccountant(discretization)` answers for the composition, in order,
    of `SelfComposedDpEvent(e_i, steps_i)` for `parts` = ((mechanism of e_i, steps_i), ...)
    (`_mechanism`): the same calls in the same order (identity, then composing each
    `steps_i`-fold self-composition of the single-step PLD, then the epsilon query), so the
    same float, but on the cached single-step PLDs instead of rebuilt ones (seconds each time
    for truncated Poisson, and a run asks at every checkpoint; cached too, as the last
    checkpoint and the final report ask for the same step).
    `tests/dpbert/dp/test_accounting.py` checks the equality with the accountant bit for bit.
    The float is also kept where DPBERT_PLD_CACHE_DIR is set (`dpbert.dp.pld_cache`): the
    composition costs a new process ~1.3 s even for a few steps.
    """
    def build() -> float:
        composed = pld_lib.identity(value_discretization_interval=discretization)
        for mechanism, steps in parts:
            single = _single_step_pld(*mechanism, discretization)
            composed = composed.compose(single.self_compose(steps))
        return float(composed.get_epsilon_for_delta(delta))

    return pld_cache.load_or_build("composed_epsilon", (parts, delta, discretization), build)


def _fast_pld_epsilon(sigma_eff: float, spec: AccountingSpec, steps: int,
                      discretization: float = DEFAULT_PLD_DISCRETIZATION,
                      prior: tuple = ()) -> float:
    """PLD epsilon of `steps` steps of `spec`'s mechanism at the effective noise `sigma_eff`,
    after the segments `prior`, computed with dp_accounting's PLD objects.

    Mathematically the same as the PLD accountant's epsilon; it exists only for speed inside
    root searches (module docstring): a sparse single-step PLD is composed in two stages (64
    copies, then T // 64 copies of that, then the remainder). Dense single-step PLDs are
    composed exactly as the accountant does. Every calibrated value is re-checked with the real
    accountant.
    """
    # One grid for every segment (PLDs compose only on the same grid): the coarsest needed.
    discretization = max([pld_grid.bounded_discretization(
        s.spec.effective_noise_multiplier, s.spec.q, s.spec.group_size,
        s.spec.max_batch_size, max(s.spec.rounds(s.steps), 1), discretization)
        for s in prior] + [
        pld_grid.bounded_discretization(sigma_eff, spec.q, spec.group_size, spec.max_batch_size,
                                        max(spec.rounds(steps), 1), discretization)])
    composed = _composed_pld(sigma_eff, spec, steps, discretization)
    for segment in prior:  # earlier segments of a resumed run (`dpbert.dp.ledger`)
        earlier = _composed_pld(segment.spec.effective_noise_multiplier, segment.spec,
                                segment.steps, discretization)
        if earlier is not None:
            composed = earlier if composed is None else earlier.compose(composed)
    if composed is None:
        return 0.0
    return float(composed.get_epsilon_for_delta(spec.delta))


def _composed_pld(sigma_eff: float, spec: AccountingSpec, steps: int,
                  discretization: float) -> pld_lib.PrivacyLossDistribution | None:
    """The PLD of `steps` steps of `spec` (None for 0 steps; BandMF: of its rounds)."""
    steps = spec.rounds(steps)
    if steps <= 0:
        return None
    single = _single_step_pld(sigma_eff, spec.q, spec.group_size, spec.max_batch_size,
                              discretization)
    # Private attribute, used only to pick the faster of two equivalent paths.
    sparse = isinstance(getattr(single, "_pmf_remove", None), pld_pmf.SparsePLDPmf)
    if sparse and steps > 64:
        blocks, rest = divmod(steps, 64)
        composed = single.self_compose(64).self_compose(blocks)
        if rest:
            composed = composed.compose(single.self_compose(rest))
        return composed
    return single.self_compose(steps)


# The calibration searches on a grid this many times coarser than the reporting grid first
# (`PldAccountant.calibrate`): a power of two, so the grids are nested.
_SEARCH_GRID_FACTOR = 16


class _Search:
    """gap(log sigma) = log(epsilon) - log(target) of `steps` steps of `spec`'s mechanism at
    the effective sigma exp(log sigma), by the fast PLD on one grid (memoized), and its root."""

    def __init__(self, spec: AccountingSpec, steps: int, target_epsilon: float, grid: float):
        self.spec, self.steps, self.target, self.grid = spec, steps, target_epsilon, grid
        self.values: dict[float, float] = {}

    def gap(self, log_sigma: float) -> float:
        if log_sigma not in self.values:
            eps = _fast_pld_epsilon(math.exp(log_sigma), self.spec, self.steps, self.grid)
            self.values[log_sigma] = math.log(max(eps, 1e-300)) - math.log(self.target)
        return self.values[log_sigma]

    def root(self, start: float, rtol: float, step: float) -> float:
        """The smallest x (within rtol / 4) with gap(x) <= 0, searched from `start`."""
        hi = start
        while self.gap(hi) > 0:  # bracket the root in log(sigma)
            hi += step
        lo = hi - step / 2
        while self.gap(lo) <= 0:
            lo, hi = lo - step, lo
        root = optimize.brentq(self.gap, lo, hi, xtol=rtol / 4)
        # brentq's root may sit on either side; take the safe end within tolerance.
        return min(x for x in (root, root + rtol / 4, hi) if self.gap(x) <= 0)

    def slope_near(self, x: float) -> float:
        """-d gap / d x from the two evaluated points nearest `x` on either side (0 if none)."""
        above = [p for p in self.values if p > x]
        below = [p for p in self.values if p < x]
        if not above or not below:
            return 0.0
        a, b = min(above), max(below)
        return (self.values[b] - self.values[a]) / (a - b)


class PldAccountant(Accountant):
    """dp_accounting's PLD accountant (the default): tight, pessimistic grids (upper bounds)."""

    name = "pld"

    def make(self, discretization: float = DEFAULT_PLD_DISCRETIZATION
             ) -> dp_accounting.PrivacyAccountant:
        return pld_privacy_accountant.PLDAccountant(value_discretization_interval=discretization)

    def epsilon(self, segments: Sequence[tuple[AccountingSpec, int]], delta: float,
                discretization: float = DEFAULT_PLD_DISCRETIZATION) -> float:
        if len(segments) > 1:
            parts = tuple((_mechanism(spec), spec.rounds(steps)) for spec, steps in segments)
            return _accountant_composed_epsilon(parts, delta, discretization)
        (spec, steps), = segments
        steps = spec.rounds(steps)  # BandMF: one unit's rounds; DP-SGD: the steps
        # On the grid of `pld_discretization_for`: coarser only where the default explodes.
        discretization = pld_grid.pld_discretization_for(spec, steps, discretization)
        mechanism = _mechanism(spec)
        single = _single_step_pld(*mechanism, discretization)
        if steps > 1 and pld_grid.sparse_self_compose_is_slow(single, steps):
            return pld_grid.accountant_equivalent_epsilon(single, steps, delta, discretization)
        if steps > 0:
            return _accountant_composed_epsilon(((mechanism, steps),), delta, discretization)
        return self.event_epsilon(spec.event(steps), delta, discretization)

    def progress_epsilon(self, spec: AccountingSpec, steps: int, prior: Segments = ()) -> float:
        if steps <= 0 and not prior:
            return 0.0
        # Kept where DPBERT_PLD_CACHE_DIR is set (the float, as `_accountant_composed_epsilon`;
        # keyed by the grid too, which `_fast_pld_epsilon` starts from).
        return pld_cache.load_or_build(
            "progress_epsilon", (spec, steps, tuple(prior), DEFAULT_PLD_DISCRETIZATION),
            lambda: _fast_pld_epsilon(spec.effective_noise_multiplier, spec, steps,
                                      prior=tuple(prior)))

    def calibrate(self, spec: AccountingSpec, steps: int, target_epsilon: float,
                  rtol: float) -> float:
        """1. A start: RDP calibration of plain Poisson sampling (RDP is looser, so it
        over-estimates; truncated sampling, which RDP cannot account, starts there too).
        2. Brent's method on log(epsilon) versus log(sigma) (nearly linear) with the fast PLD
        on a grid `_SEARCH_GRID_FACTOR` times coarser than the reporting grid (one step's PLD
        builds that much faster: ~2 s -> ~0.1 s for truncated sampling), then
        3. on the reporting grid: one Newton step from the coarse root with the coarse slope,
        and the answer's bracket [x - rtol/2, x] checked (two more evaluations); where the
        check fails, Brent's method again on the reporting grid (what step 2 did before)."""
        with _rdp_probe():  # of plain Poisson sampling (`_rdp_sigma`), also for truncated
            start = _rdp_sigma(spec, steps, target_epsilon, tol=1e-4)
        coarse = _Search(spec, steps, target_epsilon,
                         _SEARCH_GRID_FACTOR * DEFAULT_PLD_DISCRETIZATION)
        x0 = coarse.root(math.log(start), rtol, step=0.2)
        fine = _Search(spec, steps, target_epsilon, DEFAULT_PLD_DISCRETIZATION)
        g0, slope = fine.gap(x0), coarse.slope_near(x0)
        if slope > 0:  # epsilon falls as sigma grows: gap decreasing, slope is -d(gap)/dx
            x = x0 + g0 / slope + rtol / 8
            if fine.gap(x) <= 0 < fine.gap(x - rtol / 2):
                return math.exp(x)
        return math.exp(fine.root(x0, rtol, step=0.01))

    def max_steps(self, spec: AccountingSpec, ok: Callable[[int], bool], target_epsilon: float,
                  upper_limit: int, prior: Segments = ()) -> int:
        """RDP first (fast, looser, so its T is a lower estimate), then the fast PLD path, and
        `ok` (the exact epsilon) on the final candidates."""
        start = 1
        if not prior and not _truncates(spec):
            rdp_spec = spec.replace(accountant=RDP.name)
            with _rdp_probe():
                start = max(1, last_true(
                    lambda t: t == 0 or rdp_spec.epsilon(t) <= target_epsilon, 1,
                    upper_limit, first_step=1))
        sigma_eff = spec.effective_noise_multiplier
        fast = last_true(
            lambda t: (t == 0 and not prior) or _fast_pld_epsilon(
                sigma_eff, spec, t, prior=tuple(prior)) <= target_epsilon,
            start, upper_limit, first_step=max(1, start // 100))
        return last_true(ok, max(fast, 1), upper_limit, first_step=1)

    def coarse_grid(self, spec: AccountingSpec, steps: int) -> float | None:
        if not steps:
            return None
        grid = pld_grid.pld_discretization_for(spec, spec.rounds(steps))
        return grid if grid > DEFAULT_PLD_DISCRETIZATION else None


# ------------------------------------------------------------------------------------ registry

PLD = PldAccountant()
RDP = RdpAccountant()
_BY_NAME: dict[str, Accountant] = {a.name: a for a in (PLD, RDP)}
NAMES = tuple(_BY_NAME)


def get(name: str) -> Accountant:
    """The accountant named `name` ("pld" or "rdp"); ValueError naming the choices."""
    check_choice("accountant", name, NAMES)
    return _BY_NAME[name]


def last_true(pred: Callable[[int], bool], start: int, upper_limit: int,
              first_step: int) -> int:
    """Last t in [0, upper_limit] with pred(t), for pred monotone (True then False).

    pred(0) must be True.  Gallops from `start` (steps doubling from
    `first_step`) to a bracket, then bisects.
    """
    step = first_step
    if pred(start):
        lo, hi = start, None
        while hi is None:
            if lo == upper_limit:
                return lo
            cand = min(lo + step, upper_limit)
            if pred(cand):
                lo, step = cand, step * 2
            else:
                hi = cand
    else:
        lo, hi = None, start
        while lo is None:
            cand = max(hi - step, 0)
            if cand == 0 or pred(cand):
                lo = cand
            else:
                hi, step = cand, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pred(mid):
            lo = mid
        else:
            hi = mid
    return lo
