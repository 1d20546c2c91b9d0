"""Calibration and budgets on top of `dpbert.dp.accounting` (host side, no JAX).

* `calibrate`: the smallest sigma whose epsilon after T steps of a spec's mechanism is <= a
  target (the spec's `Accountant` searches, e.g. RDP start and Brent on the PLD; the answer is
  verified here with the epsilon a report states); `calibrate_noise_multiplier` is the same
  from keyword arguments (the CLI's);
* `max_steps_within_budget`: the largest T whose epsilon is <= a target (optionally after earlier
  segments of a resumed run, `dpbert.dp.ledger`);
* `budget_fixes`: when not even one step fits a budget, the sigma, budget and steps that
  would (the plan's refusal, `dpbert.dp.plan.no_step_fits`);
* `PrivacyBudget`: "may the run take another step?";
* Hoory et al.'s sigma ∝ sqrt(B) rule and its exact recalibration.
"""

from __future__ import annotations

import math
from typing import Any

from scipy import optimize

from dpbert.core.checks import check_int, check_positive
from dpbert.dp import accountants
from dpbert.dp.accounting import (AccountingSpec, CALIBRATION_RTOL, compute_epsilon,
                                  composed_epsilon)
from dpbert.dp.noise_modes import shard_factor
from dpbert.dp.pld_grid import MAX_PLD_STEPS


def _round_up(sigma: float, rtol: float, ok) -> float:
    """Returns sigma * (1 + rtol)^k for the smallest k >= 0 with ok(.) True."""
    for _ in range(1000):
        if ok(sigma):
            return sigma
        sigma *= 1 + rtol
    raise RuntimeError("calibration verification did not converge")


def calibrate(spec: AccountingSpec, steps: int, target_epsilon: float, *,
              rtol: float = CALIBRATION_RTOL, prior: tuple = ()) -> float:
    """Smallest configured sigma (within `rtol`) whose epsilon after `steps` steps of `spec`'s
    mechanism is <= target (the spec's own noise multiplier is ignored).

    The returned sigma is what goes into the training config: in
    ``noise_mode="per_shard"`` it is sigma_eff / sqrt(P).  The result is verified:
    ``spec.replace(noise_multiplier=sigma).epsilon(steps) <= target_epsilon``.

    `prior`: segments (`dpbert.dp.ledger.Segment`, same delta and accountant) composed before
    these steps (an earlier run on the same data, `dpbert.reporting.lineage`): sigma is then the
    smallest whose composition with them stays within the target (verified with
    `composed_epsilon`). ValueError when the prior segments alone spend the target.
    """
    check_positive("target_epsilon", target_epsilon)
    steps = check_int("steps", steps, minimum=1)
    check_positive("rtol", rtol)
    prior = tuple(s for s in prior if s.steps > 0)
    if prior:
        return _calibrate_after(spec, steps, target_epsilon, rtol, prior)
    sigma_eff = spec.accounted_by.calibrate(spec, steps, target_epsilon, rtol)
    sigma = sigma_eff / shard_factor(spec.noise_mode, spec.num_shards)
    # Verified exactly as a report will compute it (a fresh dp_accounting accountant, the
    # configured sigma), nudged up by factors (1 + rtol) if needed.
    return _round_up(sigma, rtol, lambda s: spec.replace(noise_multiplier=s).epsilon(steps)
                     <= target_epsilon)


def calibrate_noise_multiplier(*, target_epsilon: float, expected_batch_size: float,
                               num_examples: int, steps: int, delta: float,
                               accountant: str = "pld", sampling: str = "poisson",
                               noise_mode: str = "global", num_shards: int = 1,
                               max_batch_size: int | None = None,
                               rtol: float = CALIBRATION_RTOL, prior: tuple = ()) -> float:
    """`calibrate` for the mechanism given by keyword arguments (as for `compute_epsilon`):
    `compute_epsilon` with the same arguments and the returned sigma is <= target_epsilon."""
    check_positive("target_epsilon", target_epsilon)
    check_int("steps", steps, minimum=1)
    check_positive("rtol", rtol)
    # noise_multiplier=1 is a placeholder; only the other fields are used.
    spec = AccountingSpec(noise_multiplier=1.0, expected_batch_size=expected_batch_size,
                          num_examples=num_examples, delta=delta, sampling=sampling,
                          noise_mode=noise_mode, num_shards=num_shards,
                          max_batch_size=max_batch_size, accountant=accountant)
    return calibrate(spec, steps, target_epsilon, rtol=rtol, prior=prior)


def _calibrate_after(spec: AccountingSpec, steps: int, target_epsilon: float, rtol: float,
                     prior: tuple) -> float:
    """`calibrate` after `prior` segments: Brent's method on log(epsilon of
    the composition) against log(sigma), started from the sigma without them (a lower bound:
    composing more can only cost more), verified with `composed_epsilon`."""
    def composed(sigma: float) -> float:
        return composed_epsilon([(s.spec, s.steps) for s in prior]
                                + [(spec.replace(noise_multiplier=sigma), steps)])

    floor = composed_epsilon([(s.spec, s.steps) for s in prior])
    if floor >= target_epsilon:
        raise ValueError(f"target_epsilon={target_epsilon} is already spent by the earlier "
                         f"segments (epsilon {floor:.4g} before this run's first step)")
    per_sigma = shard_factor(spec.noise_mode, spec.num_shards)
    start = math.log(spec.accounted_by.calibrate(spec, steps, target_epsilon, rtol) / per_sigma)
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
    check_positive("noise_multiplier", noise_multiplier)
    check_positive("old_batch_size", old_batch_size)
    check_positive("new_batch_size", new_batch_size)
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
    epsilon(T + 1), unless T == upper_limit.  The spec's `Accountant` searches
    (`max_steps`; PLD: RDP first, fast and looser so its T is a lower estimate, then
    the fast PLD path) and ends with the exact epsilon on the final candidates.
    One-off cost at the start of a run: a few seconds for T ~ 1e6.

    `prior`: segments (`dpbert.dp.ledger.Segment`) that ran before this spec's steps; T is
    then the largest count whose composition with them stays within the target (0 if the
    prior segments alone exceed it).
    """
    check_positive("target_epsilon", target_epsilon)
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
    return spec.accounted_by.max_steps(spec, ok, target_epsilon, upper_limit, prior)


def budget_fixes(spec: AccountingSpec, steps: int, target_epsilon: float, *,
                 prior: tuple = (), target_field: str = "dp.target_epsilon",
                 other_parts: float = 0.0) -> str:
    """When not even one step of `spec` fits `target_epsilon` (after `prior` segments): the
    fixes, computed by the spec's accountant, as one sentence naming the config fields: the
    sigma that makes `steps` steps fit, the budget one step and all `steps` steps need at the
    configured sigma, the steps that fit with twice the noise. `target_field` is the budget
    the user set: dp.target_epsilon, or dp.total_epsilon whose share the target is, after
    `other_parts` (the vocabulary's epsilon) of it."""
    steps = check_int("steps", steps, minimum=1)
    prior = tuple(s for s in prior if s.steps > 0)

    def epsilon(s: AccountingSpec, t: int) -> float:
        return (composed_epsilon([(p.spec, p.steps) for p in prior] + [(s, t)]) if prior
                else s.epsilon(t))

    fixes = []
    try:
        sigma = calibrate(spec, steps, target_epsilon, prior=prior)
        fixes.append(f"dp.noise_multiplier={_up(sigma)} (what train.num_steps={steps} "
                     "steps need; dp.noise_multiplier=None calibrates it)")
    except ValueError:
        pass  # the prior segments alone spend the target: only a larger budget helps
    fixes.append(f"{target_field}={_up(other_parts + epsilon(spec, 1))} or more for one step "
                 f"at sigma {spec.noise_multiplier:g}, "
                 f"{_up(other_parts + epsilon(spec, steps))} for all {steps}")
    doubled = spec.replace(noise_multiplier=2 * spec.noise_multiplier)
    fit = max_steps_within_budget(doubled, target_epsilon, upper_limit=steps, prior=prior)
    if fit:
        fixes.append(f"dp.noise_multiplier={_up(2 * spec.noise_multiplier)} (twice the noise) "
                     f"fits {fit} step{'s' if fit > 1 else ''}")
    return "; ".join(fixes)


def _up(x: float) -> str:
    """x rounded UP to 3 significant digits (a sigma or a budget that then still fits)."""
    if x <= 0 or not math.isfinite(x):
        return f"{x:g}"
    scale = 10 ** (2 - math.floor(math.log10(x)))
    return f"{math.ceil(x * scale - 1e-9) / scale:g}"


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
        check_positive("target_epsilon", target_epsilon)
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
            # 1 for the PLD accountant (the key predates the other accountants).
            "pld": int(s.accounted_by is accountants.PLD),
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
