"""The privacy ledger of a run that may span several segments (host side, no JAX).

A run is resumed from its checkpoints any number of times. Most resumes continue the same
mechanism, but some change what one logical step costs: ``noise_mode="per_shard"`` adds
sigma * C per batch shard, so resuming on another device count changes the effective noise
multiplier sigma * sqrt(P). The ledger keeps every *segment* (a mechanism, `AccountingSpec`,
and how many logical steps ran under it) and accounts their composition with dp_accounting:

    epsilon = accountant.compose(ComposedDpEvent([segment_1 event, ..., segment_k event]))

so the reported epsilon is the one really spent, however the run was interrupted. The ledger is
written into every checkpoint (`to_json`) and read back on resume (`PrivacyLedger.resume`).
With a single segment its event is exactly `AccountingSpec.event`, so a run that was never
resumed (or resumed without change) reports what `compute_epsilon` reports.

A run that starts from a model trained earlier on data that may overlap (`dpbert.reporting.lineage`)
brings that model's segments as `inherited`: they are composed into every epsilon, budget and
progress figure exactly like the run's own earlier segments, but they are not this run's steps
(`closed_steps` and `to_json` cover this run only).

Rules that keep the ledger honest (enforced by the training loop):
  * a noise multiplier calibrated from ``dp.target_epsilon`` is calibrated once, at the start of
    the run, and then read from the ledger on every resume, never recalibrated;
  * delta and the accountant are the same in every segment (they are part of the run's
    signature);
  * a budget (``dp.target_epsilon``) caps the steps of the current segment so that the
    composition of all segments stays within it (`max_steps_within_budget`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import dp_accounting

from dpbert.dp import accounting, calibration

_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(accounting.AccountingSpec))


# Fields a DP-SGD spec leaves out of its JSON (at their defaults): its ledger reads as it always
# has, and an older checkpoint's ledger resumes as the same spec.
_BANDMF_FIELDS = ("mechanism", "num_bands", "strategy")


def spec_to_dict(spec: accounting.AccountingSpec) -> dict[str, Any]:
    """JSON-safe fields of a spec (floats round-trip exactly through json)."""
    out = dataclasses.asdict(spec)
    if spec.mechanism == "dpsgd":
        for field in _BANDMF_FIELDS:
            del out[field]
    else:
        out["strategy"] = list(spec.strategy)
    return out


def spec_from_dict(fields: dict[str, Any]) -> accounting.AccountingSpec:
    unknown = set(fields) - set(_SPEC_FIELDS)
    if unknown:
        raise ValueError(f"privacy ledger entry has unknown fields {sorted(unknown)}")
    if "strategy" in fields:
        fields = {**fields, "strategy": tuple(fields["strategy"])}
    return accounting.AccountingSpec(**fields)


@dataclasses.dataclass(frozen=True)
class Segment:
    """`steps` logical steps (noise draws) run under the mechanism `spec`."""

    spec: accounting.AccountingSpec
    steps: int

    def event(self) -> dp_accounting.DpEvent:
        return self.spec.event(self.steps)

    def to_json(self) -> dict[str, Any]:
        return {"spec": spec_to_dict(self.spec), "steps": int(self.steps),
                "effective_noise_multiplier": self.spec.effective_noise_multiplier}


@dataclasses.dataclass(frozen=True)
class PrivacyLedger:
    """Earlier segments of a run (`closed`) and the mechanism of the current one (`current`).

    Every method that takes `steps` means the number of logical steps of the CURRENT segment;
    the run's global step is ``closed_steps + steps``.
    """

    closed: tuple[Segment, ...]
    current: accounting.AccountingSpec
    # Segments of earlier runs on data that may overlap (their delta and accountant set to this
    # run's: only their mechanism and steps matter), composed before this run's.
    inherited: tuple[Segment, ...] = ()

    def __post_init__(self):
        for seg in self.closed + self.inherited:
            if seg.spec.delta != self.current.delta or seg.spec.accountant != \
                    self.current.accountant:
                raise ValueError(
                    "privacy ledger: every segment of a run must have the same delta and "
                    f"accountant (a segment has delta={seg.spec.delta}, "
                    f"accountant={seg.spec.accountant!r}; the current run delta="
                    f"{self.current.delta}, accountant={self.current.accountant!r})")

    @classmethod
    def fresh(cls, spec: accounting.AccountingSpec,
              inherited: Sequence[Segment] = ()) -> "PrivacyLedger":
        return cls((), spec, tuple(inherited))

    @classmethod
    def resume(cls, saved: Sequence[dict[str, Any]], current: accounting.AccountingSpec,
               inherited: Sequence[Segment] = ()) -> tuple["PrivacyLedger", int]:
        """The ledger of a resumed run and the steps already taken in its current segment.

        `saved` is `to_json` of the checkpoint. If `current` is the mechanism of the last saved
        segment, that segment continues (its steps carry over); otherwise it is closed and a
        new segment starts at 0 steps.
        """
        segments = [Segment(spec_from_dict(s["spec"]), int(s["steps"])) for s in saved]
        inherited = tuple(inherited)
        if segments and segments[-1].spec == current:
            return cls(tuple(segments[:-1]), current, inherited), segments[-1].steps
        return cls(tuple(s for s in segments if s.steps > 0), current, inherited), 0

    @property
    def closed_steps(self) -> int:
        return sum(s.steps for s in self.closed)

    def segments(self, steps: int) -> list[Segment]:
        """This run's segments (the current one with `steps` steps)."""
        return [*self.closed, Segment(self.current, steps)]

    @property
    def prior(self) -> tuple[Segment, ...]:
        """Everything composed before the current segment: inherited, then this run's closed."""
        return tuple(s for s in self.inherited + self.closed if s.steps > 0)

    def to_json(self, steps: int) -> list[dict[str, Any]]:
        """This run's segments (what a checkpoint keeps; inherited ones are not this run's)."""
        return [s.to_json() for s in self.segments(steps)]

    def inherited_json(self) -> list[dict[str, Any]]:
        return [s.to_json() for s in self.inherited]

    def event(self, steps: int) -> dp_accounting.DpEvent:
        """The dp_accounting event of everything composed: inherited segments and this run."""
        if not self.prior:
            return self.current.event(steps)
        return dp_accounting.ComposedDpEvent([s.event() for s in (*self.inherited,
                                                                  *self.segments(steps))
                                              if s.steps > 0])

    def epsilon(self, steps: int) -> float:
        """Epsilon of the run and what it inherited (what a fresh dp_accounting accountant
        answers for `event`)."""
        if steps == 0 and not self.prior:
            return 0.0
        if not self.prior:
            return self.current.epsilon(steps)
        return accounting.composed_epsilon([(s.spec, s.steps) for s in self.prior]
                                           + [(self.current, steps)])

    def own_epsilon(self, steps: int) -> float:
        """Epsilon of this run's own segments alone (without what it inherited)."""
        if not self.inherited:
            return self.epsilon(steps)
        return PrivacyLedger(self.closed, self.current).epsilon(steps)

    def progress_epsilon(self, steps: int) -> float:
        """`epsilon` for progress logs (`Accountant.progress_epsilon`; PLD: cached single-step
        distributions)."""
        return self.current.accounted_by.progress_epsilon(self.current, steps, self.prior)

    def max_steps_within_budget(self, target_epsilon: float, upper_limit: int) -> int:
        """Largest number of current-segment steps T <= upper_limit whose epsilon (with the
        inherited and closed segments) is <= target_epsilon (0 if not even one fits)."""
        return calibration.max_steps_within_budget(self.current, target_epsilon,
                                                  upper_limit=upper_limit, prior=self.prior)
