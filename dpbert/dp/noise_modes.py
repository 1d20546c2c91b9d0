"""How much Gaussian noise one logical batch gets, and the sigma the accountant sees (host side).

    "global"     one draw of std sigma * C per logical batch, however many shards split it
    "per_shard"  each of the P shards adds its own draw of std sigma * C (TF's
                 CrossShardOptimizer): their sum is one draw of std sigma * C * sqrt(P), and
                 the accountant must be given sigma * sqrt(P) (Hoory et al. 2021, Eq. 3)

`shard_factor` is that sqrt(P) rule, the one place it is written. Both numbers derived from
sigma go through it: the effective noise multiplier the accountant composes
(`effective_noise_multiplier`, `dpbert.dp.accounting.AccountingSpec`) and the std the train
step adds (`noise_stddev`, computed once by `dpbert.dp.accumulation.DPConfig` from the plan's
sigma and used by `dpbert.dp.noise.add_noise`).
"""

from __future__ import annotations

import math

from dpbert.core.checks import check_choice, check_int, check_positive

NOISE_MODES = ("global", "per_shard")
# Largest effective noise multiplier accounted (dp_accounting overflows beyond ~1e150 and its
# RDP series stop converging near 1e10; epsilon is already ~1e-10 at 1e6).
MAX_NOISE_MULTIPLIER = 1e6


def shard_factor(noise_mode: str, num_shards: int) -> float:
    """sqrt(P) for "per_shard" (P independent draws of std sigma * C), 1 for "global"."""
    return math.sqrt(num_shards) if noise_mode == "per_shard" else 1.0


def effective_noise_multiplier(noise_multiplier: float, noise_mode: str = "global",
                               num_shards: int = 1) -> float:
    """The noise multiplier the accountant must see (Hoory et al. Eq. 3).

    Args:
      noise_multiplier: sigma as configured (noise std per draw / clip norm), > 0.
      noise_mode: "global" or "per_shard" (module docstring).
      num_shards: P, the number of data shards (only used for "per_shard").

    Returns:
      sigma for "global", sigma * sqrt(P) for "per_shard".
    """
    check_choice("noise_mode", noise_mode, NOISE_MODES)
    check_positive("noise_multiplier", noise_multiplier)
    num_shards = check_int("num_shards", num_shards, minimum=1)
    sigma = noise_multiplier * shard_factor(noise_mode, num_shards)
    if sigma > MAX_NOISE_MULTIPLIER:
        raise ValueError(
            f"noise_multiplier={noise_multiplier!r} (effective {sigma:g}) is above "
            f"{MAX_NOISE_MULTIPLIER:g}: dp_accounting's arithmetic overflows there (its "
            "epsilon would be ~0, and such noise drowns every gradient)")
    return sigma


def noise_stddev(clip_norm: float, noise_multiplier: float, noise_mode: str = "global",
                 num_shards: int = 1) -> float:
    """Total std of the noise added to the clipped sum (Python float).

    sigma * C * `shard_factor` (multiplied in that order: the std is bit for bit what it has
    always been).  sigma = 0 gives 0 even for C = inf (the non-private test configuration).
    """
    if noise_mode not in NOISE_MODES:
        raise ValueError(f"noise_mode={noise_mode!r} is not one of {list(NOISE_MODES)}")
    if not noise_multiplier >= 0 or math.isinf(noise_multiplier):
        raise ValueError(f"noise_multiplier={noise_multiplier!r} must be finite and >= 0")
    if not clip_norm > 0:
        raise ValueError(f"clip_norm={clip_norm!r} must be > 0")
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards={num_shards!r} must be a positive int")
    if noise_multiplier == 0:
        return 0.0
    std = noise_multiplier * clip_norm * shard_factor(noise_mode, num_shards)
    if math.isinf(std):
        raise ValueError(f"noise std sigma*C is infinite (sigma={noise_multiplier}, "
                         f"C={clip_norm}); a finite clip norm is required with noise")
    return std
