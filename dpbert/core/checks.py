"""Checks of privacy parameters shared by training and the data pipelines (host side).

Each raises ValueError naming the parameter and its value; config checks turn a bad config
field into `dpbert.errors.ConfigError` with `dpbert.errors.need`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def check_int(name: str, value: Any, *, minimum: int) -> int:
    """`value` as an int (ints, NumPy ints and integral floats), ValueError naming `name` if it
    is not one or is below `minimum`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) and not (
            isinstance(value, float) and value.is_integer()):
        raise ValueError(f"{name}={value!r} must be an integer")
    if int(value) < minimum:
        raise ValueError(f"{name}={value!r} must be >= {minimum}")
    return int(value)


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """ValueError unless `value` is one of `choices`."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {list(choices)}")


def check_positive(name: str, value: float, *, allow_inf: bool = False) -> None:
    """ValueError unless `value` is a number > 0 (finite unless `allow_inf`)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be a number")
    if not value > 0 or (math.isinf(value) and not allow_inf) or math.isnan(value):
        raise ValueError(f"{name}={value!r} must be a positive finite number")


def validate_delta(delta: float, num_examples: int | None) -> None:
    """Raises ValueError unless 0 < delta < 1/num_examples (when known): a larger delta allows
    releasing a random record in the clear. Training (N units) and the DP vocabulary (n
    records) apply the same rule."""
    if not isinstance(delta, (int, float)) or isinstance(delta, bool) or not 0 < delta < 1:
        raise ValueError(f"delta={delta!r} must be in (0, 1)")
    if num_examples is not None and delta >= 1.0 / num_examples:
        raise ValueError(
            f"delta={delta!r} must be < 1/num_examples = {1.0 / num_examples:.3g} "
            f"(num_examples={num_examples}); a larger delta allows releasing a "
            "random example in the clear")
