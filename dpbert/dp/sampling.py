"""Host-side batch sampling for DP-SGD (NumPy, no JAX).

A *logical batch* is what one noise draw / optimizer update covers.  It is laid
out in ``calls_per_batch`` fixed-size *physical batches* of
``physical_batch_size`` slots each (one jitted call each), so jitted shapes never
change.  Every call gets

    indices: int64 [physical_batch_size]   example indices into the dataset
    mask:    bool  [physical_batch_size]   False = padding slot (index 0, ignored)

Samplers are stateless functions of (seed, call index): ``batch(call)`` is
random access, so every host can run the same sampler with the same seed and
load only its slice, and resuming from ``state_dict()`` reproduces the exact
sequence.

`PoissonSampler` (the default, and the one with a proven epsilon): each example
enters a logical batch independently with probability
q = expected_batch_size / num_examples.  A logical batch can hold at most
``max_batch_size = calls_per_batch * physical_batch_size`` examples; a larger
Poisson sample is cut to a uniformly random subset of that size.  This is
exactly dp_accounting's `TruncatedSubsampledGaussianDpEvent`, which the report
uses (build the spec with `accounting.AccountingSpec.from_sampler(sampler, ...)`
so the truncation is never forgotten); pick the capacity with
`capacity_for_overflow_probability` so that truncation practically never
happens and the epsilon equals the untruncated one.

`UnitPoissonSampler` (``dp.privacy_unit`` note or patient, issue 15): the same Poisson
sampling with truncation over privacy UNITS instead of examples (N = the number of units,
q = expected units per logical batch / N).  Each sampled unit occupies one row of
``max_examples_per_unit`` (K) slots: all its examples when it has at most K, else K of them
chosen uniformly at random without replacement from the run's secret seed.  A unit is never
split across rows, calls or logical batches.  ``batch(call)`` then returns
``indices`` int64 [physical_batch_size, K] and ``mask`` bool [physical_batch_size, K]
(physical_batch_size counts units).

`ShuffleSampler` (``sampling="shuffle"``): fixed-size batches from a fresh
permutation each epoch.  Provided for comparison; its epsilon is NOT a proven
bound (see `dpbert.reporting.report.SHUFFLE_NOTE`).
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np
from scipy import stats

from dpbert.core.checks import check_int  # noqa: F401 - sampling.check_int is public


SAMPLING_MODES = ("poisson", "shuffle")


def capacity_for_overflow_probability(num_examples: int, expected_batch_size: float,
                                      overflow_probability: float = 1e-12) -> int:
    """Smallest capacity M with P[Binomial(N, q) > M] <= overflow_probability.

    With this maximum logical batch size, truncation happens in a given step with
    probability at most `overflow_probability` (and is accounted for anyway).
    """
    num_examples = check_int("num_examples", num_examples, minimum=1)
    q = expected_batch_size / num_examples
    if not 0 < q <= 1:
        raise ValueError(f"expected_batch_size / num_examples = {q} must be in (0, 1]")
    if not 0 < overflow_probability < 1:
        raise ValueError(f"overflow_probability={overflow_probability} must be in (0, 1)")
    m = int(stats.binom.isf(overflow_probability, num_examples, q))
    while stats.binom.sf(m, num_examples, q) > overflow_probability:
        m += 1
    return min(m, num_examples)


class _Sampler:
    """Shared layout logic: logical batch -> `calls_per_batch` padded physical batches."""

    sampling: str = ""

    def __init__(self, num_examples: int, physical_batch_size: int, calls_per_batch: int,
                 seed: int):
        self.num_examples = check_int("num_examples", num_examples, minimum=1)
        self.physical_batch_size = check_int("physical_batch_size", physical_batch_size, minimum=1)
        self.calls_per_batch = check_int("calls_per_batch", calls_per_batch, minimum=1)
        self.seed = check_int("seed", seed, minimum=0)
        self.call = 0  # Next physical call to serve.
        self._cache: tuple[int, np.ndarray] | None = None

    @property
    def max_batch_size(self) -> int:
        return self.physical_batch_size * self.calls_per_batch

    def logical_batch(self, step: int) -> np.ndarray:
        """int64 [n] example indices of logical batch `step`, n <= max_batch_size."""
        raise NotImplementedError

    def batch(self, call: int) -> tuple[np.ndarray, np.ndarray]:
        """(indices int64 [physical_batch_size], mask bool [physical_batch_size]) of a call.

        Call c belongs to logical step c // calls_per_batch.  Real examples fill
        the first slots of the logical batch; padding slots have index 0 and mask
        False.
        """
        call = check_int("call", call, minimum=0)
        step, part = divmod(call, self.calls_per_batch)
        if self._cache is None or self._cache[0] != step:
            members = self.logical_batch(step)
            padded = np.zeros(self.max_batch_size, np.int64)
            padded[:members.size] = members
            mask = np.zeros(self.max_batch_size, bool)
            mask[:members.size] = True
            self._cache = (step, (padded, mask))
        padded, mask = self._cache[1]
        sl = slice(part * self.physical_batch_size, (part + 1) * self.physical_batch_size)
        return padded[sl].copy(), mask[sl].copy()

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return self

    def __next__(self) -> tuple[np.ndarray, np.ndarray]:
        out = self.batch(self.call)
        self.call += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"call": self.call, "seed": self.seed, "num_examples": self.num_examples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("seed", "num_examples"):
            if int(state[key]) != getattr(self, key):
                raise ValueError(f"sampler checkpoint has {key}={state[key]} but this "
                                 f"sampler has {key}={getattr(self, key)}")
        self.call = check_int("call", int(state["call"]), minimum=0)


class PoissonSampler(_Sampler):
    """Poisson sampling with fixed-size padded physical batches (see module docstring).

    Args:
      num_examples: N, dataset size in privacy units.
      expected_batch_size: q * N (the public expected logical batch size).
      physical_batch_size: slots per jitted call (global, all devices).
      calls_per_batch: jitted calls per logical batch (gradient accumulation).
      seed: sampler seed; logical batch t uses np.random.default_rng([seed, t]).
      num_bands: b > 1: CYCLIC Poisson sampling (BandMF, `dpbert.dp.bandmf`): the units are
        split once into b groups of floor(N / b) (a permutation from default_rng([seed,
        "groups"]); the N mod b left over are never sampled), and logical batch t is Poisson
        sampled from group t mod b with q = expected_batch_size / floor(N / b), so a unit takes
        part at most once in any b consecutive steps (b-min-separation). This is jax-privacy's
        `CyclicPoissonSampling` with `PartitionType.EQUAL_SPLIT`, random access. b = 1 is the
        plain Poisson sampling above, bit for bit.
    """

    sampling = "poisson"
    _GROUP_STREAM = 0x6772  # "gr": the partition's own stream of the secret seed

    def __init__(self, num_examples: int, expected_batch_size: float,
                 physical_batch_size: int, calls_per_batch: int = 1, seed: int = 0,
                 num_bands: int = 1):
        super().__init__(num_examples, physical_batch_size, calls_per_batch, seed)
        self.num_bands = check_int("num_bands", num_bands, minimum=1)
        self.group_size = self.num_examples // self.num_bands
        q = float(expected_batch_size) / self.group_size if self.group_size else math.inf
        if not 0 < q <= 1:
            raise ValueError(f"expected_batch_size={expected_batch_size} must be in "
                             f"(0, num_examples={num_examples}"
                             + (f" // num_bands={num_bands}]" if num_bands > 1 else "]"))
        self.expected_batch_size = float(expected_batch_size)
        self.q = q
        self._groups: np.ndarray | None = None
        if self.max_batch_size < expected_batch_size:
            raise ValueError(
                f"calls_per_batch * physical_batch_size = {self.max_batch_size} is below "
                f"expected_batch_size={expected_batch_size}; most batches would be truncated")

    @property
    def truncation_probability(self) -> float:
        """P[a logical batch is truncated] = P[Binomial(N // b, q) > max_batch_size]."""
        return float(stats.binom.sf(self.max_batch_size, self.group_size, self.q))

    def group(self, step: int) -> np.ndarray | None:
        """int64 [N // b]: the units step `step` samples from (None: all N, b = 1)."""
        if self.num_bands == 1:
            return None
        if self._groups is None:
            perm = np.random.default_rng([self.seed, self._GROUP_STREAM]).permutation(
                self.num_examples).astype(np.int64)
            self._groups = perm[:self.group_size * self.num_bands].reshape(
                self.num_bands, self.group_size)
        return self._groups[step % self.num_bands]

    def logical_batch(self, step: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, check_int("step", step, minimum=0)])
        size = rng.binomial(self.group_size, self.q)
        # Given its size, a Poisson sample is a uniform subset; a uniform subset of
        # min(size, max) elements is exactly "Poisson, then keep a uniformly random
        # subset of max_batch_size" (the accounted truncation).
        size = min(size, self.max_batch_size)
        chosen = rng.choice(self.group_size, size=size, replace=False).astype(np.int64)
        group = self.group(step)
        return chosen if group is None else group[chosen]


class UnitPoissonSampler(PoissonSampler):
    """Poisson sampling of privacy units, at most K examples each (see module docstring).

    Args:
      unit_ids: int [num_rows], the unit (0..U-1, every unit present) of each dataset row.
      expected_batch_size: expected UNITS per logical batch (q * U).
      physical_batch_size: units per jitted call (global, all devices).
      calls_per_batch: jitted calls per logical batch.
      max_examples_per_unit: K, the public bound on a unit's examples per logical batch.
      seed: the run's SECRET sampler seed; logical batch t draws its units from
        default_rng([seed, t]) (as `PoissonSampler`) and the examples of its units from
        default_rng([seed, t, 1]).
    """

    _EXAMPLE_STREAM = 1

    def __init__(self, unit_ids: np.ndarray, expected_batch_size: float,
                 physical_batch_size: int, calls_per_batch: int = 1,
                 max_examples_per_unit: int = 1, seed: int = 0, num_bands: int = 1):
        unit_ids = np.asarray(unit_ids)
        if unit_ids.ndim != 1 or not unit_ids.size or not np.issubdtype(unit_ids.dtype,
                                                                         np.integer):
            raise ValueError(f"unit_ids must be a non-empty 1-D integer array, got shape "
                             f"{unit_ids.shape} and dtype {unit_ids.dtype}")
        if unit_ids.min() < 0:
            raise ValueError("unit_ids must be >= 0")
        counts = np.bincount(unit_ids)
        if not counts.all():
            raise ValueError(f"unit_ids must number the units 0..U-1 without gaps; unit "
                             f"{int(np.flatnonzero(counts == 0)[0])} has no example")
        super().__init__(len(counts), expected_batch_size, physical_batch_size,
                         calls_per_batch, seed, num_bands)
        self.max_examples_per_unit = check_int("max_examples_per_unit", max_examples_per_unit,
                                               minimum=1)
        self.num_units = self.num_examples  # what the accountant counts
        self.num_rows = int(unit_ids.size)
        self.unit_sizes = counts
        self._members = np.argsort(unit_ids, kind="stable").astype(np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def unit_members(self, unit: int) -> np.ndarray:
        """int64 [n_u]: the dataset rows of `unit`, ascending."""
        return self._members[self._starts[unit]:self._starts[unit + 1]]

    def batch(self, call: int) -> tuple[np.ndarray, np.ndarray]:
        """(indices int64 [physical_batch_size, K], mask bool [physical_batch_size, K]).

        Row r of call c holds one sampled unit (units fill the first rows of the logical
        batch); padding slots and rows have index 0 and mask False.
        """
        call = check_int("call", call, minimum=0)
        step, part = divmod(call, self.calls_per_batch)
        if self._cache is None or self._cache[0] != step:
            k = self.max_examples_per_unit
            units = self.logical_batch(step)
            rng = np.random.default_rng([self.seed, step, self._EXAMPLE_STREAM])
            padded = np.zeros((self.max_batch_size, k), np.int64)
            mask = np.zeros((self.max_batch_size, k), bool)
            for row, unit in enumerate(units.tolist()):
                members = self.unit_members(unit)
                if members.size > k:  # K of them, uniformly at random
                    members = np.sort(rng.choice(members, size=k, replace=False))
                padded[row, :members.size] = members
                mask[row, :members.size] = True
            self._cache = (step, (padded, mask))
        padded, mask = self._cache[1]
        sl = slice(part * self.physical_batch_size, (part + 1) * self.physical_batch_size)
        return padded[sl].copy(), mask[sl].copy()


class ShuffleSampler(_Sampler):
    """Fixed-size batches from shuffled epochs (NOT a proven DP sampling; see module doc).

    Every logical batch has exactly calls_per_batch * physical_batch_size examples;
    the last incomplete batch of each epoch is dropped.
    """

    sampling = "shuffle"

    def __init__(self, num_examples: int, physical_batch_size: int,
                 calls_per_batch: int = 1, seed: int = 0):
        super().__init__(num_examples, physical_batch_size, calls_per_batch, seed)
        if self.max_batch_size > self.num_examples:
            raise ValueError(f"batch size {self.max_batch_size} exceeds num_examples="
                             f"{self.num_examples}")
        self.expected_batch_size = float(self.max_batch_size)
        self.steps_per_epoch = self.num_examples // self.max_batch_size
        self._perm: tuple[int, np.ndarray] | None = None

    def logical_batch(self, step: int) -> np.ndarray:
        epoch, index = divmod(check_int("step", step, minimum=0), self.steps_per_epoch)
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(
                self.num_examples).astype(np.int64))
        b = self.max_batch_size
        return self._perm[1][index * b:(index + 1) * b]


def make_sampler(sampling: str, *, num_examples: int, expected_batch_size: float,
                 physical_batch_size: int, calls_per_batch: int = 1,
                 seed: int = 0, num_bands: int = 1) -> _Sampler:
    """Builds the sampler named by `sampling` ("poisson" | "shuffle"); `num_bands` > 1: cyclic
    Poisson (`PoissonSampler`)."""
    if sampling == "poisson":
        return PoissonSampler(num_examples, expected_batch_size, physical_batch_size,
                              calls_per_batch, seed, num_bands)
    if num_bands != 1:
        raise ValueError(f"num_bands={num_bands} needs sampling='poisson' (cyclic Poisson)")
    if sampling == "shuffle":
        if not math.isclose(expected_batch_size, physical_batch_size * calls_per_batch):
            raise ValueError(
                f"sampling='shuffle' needs expected_batch_size ({expected_batch_size}) == "
                f"physical_batch_size * calls_per_batch ({physical_batch_size * calls_per_batch})")
        return ShuffleSampler(num_examples, physical_batch_size, calls_per_batch, seed)
    raise ValueError(f"sampling={sampling!r} is not one of {list(SAMPLING_MODES)}")
