"""Calibration and budgets on top of `dpbert.dp.accounting` (host side, no JAX).

* `calibrate_noise_multiplier`: the smallest sigma whose epsilon after T steps is <= a target
  (RDP start, Brent on the PLD, verified with a fresh dp_accounting accountant);
* `max_steps_within_budget`: the largest T whose epsilon is <= a target (optionally after earlier
  segments of a resumed run, `dpbert.dp.ledger`);
* `PrivacyBudget`: "may the run take another step?";
* Hoory et al.'s sigma ∝ sqrt(B) rule and its exact recalibration.
"""

from __future__ import annotations

import math
from typing import Any

import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize

from dpbert.dp.pld_grid import MAX_PLD_STEPS
from dpbert.dp.sampling import check_int
from dpbert.dp.accounting import (AccountingSpec, CALIBRATION_RTOL, _check_positive,
                                  _fast_pld_epsilon, compute_epsilon, effective_noise_multiplier,
                                  composed_epsilon, make_dp_event)


def _calibrate_sigma_eff(spec: AccountingSpec, steps: int, target_epsilon: float,
                         rtol: float) -> float:
    """Smallest effective sigma (within rtol) whose reported epsilon is <= target.

    1. RDP calibration (`dp_accounting.calibrate_dp_mechanism`, ~0.01 s per
       evaluation) gives a starting point (RDP is looser, so it over-estimates).
    2. Brent's method on log(epsilon) versus log(sigma) (nearly linear) with the
       PLD on the reporting grid, typically 4-6 evaluations.
    The caller verifies the answer with the real accountant (`_round_up`).
    """
    q, delta = spec.q, spec.delta
    truncated = spec.max_batch_size is not None and spec.max_batch_size < spec.num_examples

    if spec.accountant == "rdp" or not truncated:
        start = float(dp_accounting.calibrate_dp_mechanism(
            rdp_privacy_accountant.RdpAccountant,
            lambda s: make_dp_event(s, q, steps), target_epsilon, delta,
            bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
            tol=1e-6 if spec.accountant == "rdp" else 1e-4))
        if spec.accountant == "rdp":
            return start
    else:  # RDP cannot account truncation: start from plain Poisson via PLD.
        start = _calibrate_sigma_eff(spec.replace(max_batch_size=None), steps,
                                     target_epsilon, rtol)

    cache: dict[float, float] = {}

    def gap(log_sigma: float) -> float:
        if log_sigma not in cache:
            eps = _fast_pld_epsilon(math.exp(log_sigma), spec, steps)
            cache[log_sigma] = math.log(max(eps, 1e-300)) - math.log(target_epsilon)
        return cache[log_sigma]

    # Bracket the root in log(sigma).
    hi = math.log(start)
    while gap(hi) > 0:
        hi += 0.2
    lo = hi - 0.1
    while gap(lo) <= 0:
        lo, hi = lo - 0.2, lo
    root = optimize.brentq(gap, lo, hi, xtol=rtol / 4)
    # brentq's root may sit on either side; take the safe end within tolerance.
    candidates = [x for x in (root, root + rtol / 4, hi) if gap(x) <= 0]
    return math.exp(min(candidates))


def _round_up(sigma: float, rtol: float, ok) -> float:
    """Returns sigma * (1 + rtol)^k for the smallest k >= 0 with ok(.) True."""
    for _ in range(1000):
        if ok(sigma):
            return sigma
        sigma *= 1 + rtol
    raise RuntimeError("calibration verification did not converge")


def calibrate_noise_multiplier(*, target_epsilon: float, expected_batch_size: float,
                               num_examples: int, steps: int, delta: float,
                               accountant: str = "pld", sampling: str = "poisson",
                               noise_mode: str = "global", num_shards: int = 1,
                               max_batch_size: int | None = None,
                               rtol: float = CALIBRATION_RTOL, prior: tuple = ()) -> float:
    """Smallest configured sigma (within `rtol`) whose epsilon is <= target.

    The returned sigma is what goes into the training config: in
    ``noise_mode="per_shard"`` it is sigma_eff / sqrt(P).  The result is verified:
    `compute_epsilon` with the same arguments returns <= target_epsilon.

    `prior`: segments (`dpbert.dp.ledger.Segment`, same delta and accountant) composed before
    these steps (an earlier run on the same data, `dpbert.reporting.lineage`): sigma is then the smallest
    whose composition with them stays within the target (verified with `composed_epsilon`).
    ValueError when the prior segments alone spend the target.
    """
    _check_positive("target_epsilon", target_epsilon)
    steps = check_int("steps", steps, minimum=1)
    _check_positive("rtol", rtol)
    # noise_multiplier=1 is a placeholder; only the other fields are used.
    spec = AccountingSpec(noise_multiplier=1.0, expected_batch_size=expected_batch_size,
                          num_examples=num_examples, delta=delta, sampling=sampling,
                          noise_mode=noise_mode, num_shards=num_shards,
                          max_batch_size=max_batch_size, accountant=accountant)
    prior = tuple(s for s in prior if s.steps > 0)
    if prior:
        return _calibrate_after(spec, steps, target_epsilon, rtol, prior)
    sigma_eff = _calibrate_sigma_eff(spec, steps, target_epsilon, rtol)
    sigma = sigma_eff / effective_noise_multiplier(1.0, noise_mode, num_shards)
    # Verified exactly as `compute_epsilon` will compute it (a fresh dp_accounting
    # accountant, the configured sigma), nudged up by factors (1 + rtol) if needed.
    return _round_up(sigma, rtol, lambda s: spec.replace(noise_multiplier=s).epsilon(steps)
                     <= target_epsilon)


def _calibrate_after(spec: AccountingSpec, steps: int, target_epsilon: float, rtol: float,
                     prior: tuple) -> float:
    """`calibrate_noise_multiplier` after `prior` segments: Brent's method on log(epsilon of
    the composition) against log(sigma), started from the sigma without them (a lower bound:
    composing more can only cost more), verified with `composed_epsilon`."""
    def composed(sigma: float) -> float:
        return composed_epsilon([(s.spec, s.steps) for s in prior]
                                + [(spec.replace(noise_multiplier=sigma), steps)])

    floor = composed_epsilon([(s.spec, s.steps) for s in prior])
    if floor >= target_epsilon:
        raise ValueError(f"target_epsilon={target_epsilon} is already spent by the earlier "
                         f"segments (epsilon {floor:.4g} before this run's first step)")
    per_sigma = effective_noise_multiplier(1.0, spec.noise_mode, spec.num_shards)
    start = math.log(_calibrate_sigma_eff(spec, steps, target_epsilon, rtol) / per_sigma)
    gap = lambda log_sigma: math.log(composed(math.exp(log_sigma))) - math.log(  # noqa: E731
        target_epsilon)
    lo, hi = start, start
    while gap(hi) > 0:  # bracket the root from above the prior-free sigma
        lo, hi = hi, hi + 0.3
    root = hi if lo == hi else optimize.brentq(gap, lo, hi, xtol=rtol / 4)
    return _round_up(math.exp(root), rtol, lambda s: composed(s) <= target_epsilon)


def scale_noise_multiplier_sqrt(noise_multiplier: float, old_batch_size: float,
                                new_batch_size: float) -> float:
    """Hoory et al.'s rule: sigma proportional to sqrt(B).

    At a fixed number of *epochs* this keeps epsilon approximately (not exactly)
    constant: epsilon ~ q sqrt(T) / sigma = sqrt(epochs * B / N) / sigma.  Use
    `recalibrate_for_batch_size` for an exact answer.
    """
    _check_positive("noise_multiplier", noise_multiplier)
    _check_positive("old_batch_size", old_batch_size)
    _check_positive("new_batch_size", new_batch_size)
    return noise_multiplier * math.sqrt(new_batch_size / old_batch_size)


def recalibrate_for_batch_size(*, noise_multiplier: float, old_batch_size: float,
                               new_batch_size: float, num_examples: int, steps: int,
                               delta: float, **spec_kwargs) -> tuple[float, int]:
    """Noise multiplier and steps for a new batch size with the same epochs and epsilon.

    Args:
      noise_multiplier, old_batch_size, steps: the current plan.
      new_batch_size: the new expected batch size.
      num_examples, delta, **spec_kwargs: as for `compute_epsilon`.

    Returns:
      (sigma_new, steps_new) with steps_new = round(steps * old / new) (same
      number of epochs) and sigma_new calibrated so that epsilon(sigma_new,
      steps_new) <= epsilon(noise_multiplier, steps) (the old plan's epsilon).
    """
    target = compute_epsilon(noise_multiplier=noise_multiplier,
                             expected_batch_size=old_batch_size, num_examples=num_examples,
                             steps=steps, delta=delta, **spec_kwargs)
    new_steps = max(1, round(steps * old_batch_size / new_batch_size))
    sigma = calibrate_noise_multiplier(target_epsilon=target, expected_batch_size=new_batch_size,
                                       num_examples=num_examples, steps=new_steps, delta=delta,
                                       **spec_kwargs)
    return sigma, new_steps


# ----------------------------------------------------------------------------
# Budget
# ----------------------------------------------------------------------------

def max_steps_within_budget(spec: AccountingSpec, target_epsilon: float,
                            upper_limit: int = MAX_PLD_STEPS, prior: tuple = ()) -> int:
    """Largest T <= upper_limit with spec.epsilon(T) <= target_epsilon (0 if none).

    Exact for `spec.epsilon` (the reported epsilon): epsilon(T) <= target <
    epsilon(T + 1), unless T == upper_limit.  The search runs RDP first (fast,
    looser, so its T is a lower estimate), then the fast PLD path, and ends with
    dp_accounting's accountant on the final candidates.  One-off cost at the
    start of a run: a few seconds for T ~ 1e6.

    `prior`: segments (`dpbert.dp.ledger.Segment`) that ran before this spec's steps; T is
    then the largest count whose composition with them stays within the target (0 if the
    prior segments alone exceed it).
    """
    _check_positive("target_epsilon", target_epsilon)
    upper_limit = check_int("upper_limit", upper_limit, minimum=1)
    prior = tuple(s for s in prior if s.steps > 0)

    def epsilon(steps: int) -> float:
        if not prior:
            return spec.epsilon(steps)
        return composed_epsilon([(s.spec, s.steps) for s in prior] + [(spec, steps)])

    def ok(steps: int) -> bool:
        return (steps == 0 and not prior) or epsilon(steps) <= target_epsilon

    if prior and not ok(0):
        return 0
    # The common case in a run: the budget covers every configured step (one accountant
    # call instead of a search). Not for the open-ended default limit, which no run reaches.
    if upper_limit < MAX_PLD_STEPS and ok(upper_limit):
        return upper_limit
    if spec.accountant == "rdp":
        return _last_true(ok, 1, upper_limit, first_step=1)
    start = 1
    if not prior and (spec.max_batch_size is None or spec.max_batch_size >= spec.num_examples):
        rdp_spec = spec.replace(accountant="rdp")
        start = max(1, _last_true(
            lambda t: t == 0 or rdp_spec.epsilon(t) <= target_epsilon, 1, upper_limit,
            first_step=1))
    sigma_eff = spec.effective_noise_multiplier
    fast = _last_true(
        lambda t: (t == 0 and not prior) or _fast_pld_epsilon(
            sigma_eff, spec, t, prior=prior) <= target_epsilon,
        start, upper_limit, first_step=max(1, start // 100))
    return _last_true(ok, max(fast, 1), upper_limit, first_step=1)


def _last_true(pred, start: int, upper_limit: int, first_step: int) -> int:
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


class PrivacyBudget:
    """Answers "may the run take another DP-SGD step?" so epsilon never exceeds the target.

    One step = one noise draw (one optimizer update), not one physical batch.
    Usage in the training loop::

        budget = PrivacyBudget(spec, target_epsilon=8.0)
        budget.load_state_dict(ckpt["privacy_budget"])   # on resume
        while budget.may_take_step():
            ... one logical step ...
            budget.record_step()
        ckpt["privacy_budget"] = budget.state_dict()

    `state_dict()` is a plain dict of ints and floats; loading checks that it was
    produced under the same privacy parameters and raises otherwise.
    """

    def __init__(self, spec: AccountingSpec, target_epsilon: float,
                 max_steps: int | None = None):
        """Args:
          spec: the run's accounting parameters.
          target_epsilon: epsilon never to exceed.
          max_steps: optional precomputed `max_steps_within_budget(spec, target)`
            (computing it takes a few seconds at ~1M steps).
        """
        _check_positive("target_epsilon", target_epsilon)
        self.spec = spec
        self.target_epsilon = float(target_epsilon)
        self.max_steps = (max_steps_within_budget(spec, target_epsilon)
                          if max_steps is None else int(max_steps))
        self.steps_taken = 0

    def may_take_step(self) -> bool:
        return self.steps_taken < self.max_steps

    def record_step(self) -> None:
        if not self.may_take_step():
            raise RuntimeError(
                f"privacy budget exhausted: {self.steps_taken} steps taken, "
                f"epsilon target {self.target_epsilon} allows {self.max_steps}")
        self.steps_taken += 1

    @property
    def remaining_steps(self) -> int:
        return self.max_steps - self.steps_taken

    def epsilon_spent(self) -> float:
        return self.spec.epsilon(self.steps_taken) if self.steps_taken else 0.0

    def _fingerprint(self) -> dict[str, int | float]:
        s = self.spec
        return {
            "target_epsilon": self.target_epsilon,
            "delta": float(s.delta),
            "effective_noise_multiplier": float(s.effective_noise_multiplier),
            "expected_batch_size": float(s.expected_batch_size),
            "num_examples": int(s.num_examples),
            "max_batch_size": int(s.max_batch_size or 0),
            "poisson": int(s.sampling == "poisson"),
            "pld": int(s.accountant == "pld"),
        }

    def state_dict(self) -> dict[str, int | float]:
        return {"steps_taken": self.steps_taken, "max_steps": self.max_steps,
                **self._fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in self._fingerprint().items():
            if key not in state:
                raise ValueError(f"privacy budget checkpoint lacks key {key!r}")
            saved = state[key]
            if (float(saved) != float(value) if isinstance(value, float)
                    else int(saved) != value):
                raise ValueError(
                    f"privacy budget checkpoint has {key}={saved!r} but this run has "
                    f"{key}={value!r}; changing privacy parameters mid-run is not supported")
        # Keep the smaller limit if this run computes a different one (e.g. after a
        # dp_accounting upgrade): a resumed run never goes beyond either.
        self.max_steps = min(self.max_steps, int(state["max_steps"]))
        steps = int(state["steps_taken"])
        if steps > self.max_steps:
            raise ValueError(f"checkpoint steps_taken={steps} exceeds max_steps={self.max_steps}")
        self.steps_taken = steps
