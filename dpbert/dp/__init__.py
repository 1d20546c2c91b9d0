"""The DP-SGD engine: sample -> clip -> accumulate -> noise -> optimizer.

Host side (NumPy): `sampling` (Poisson / shuffle samplers, fixed-size padded
physical batches) and `accounting` (dp_accounting events, epsilon, calibration,
budget, report).  Device side (JAX, inside one jitted step): `clipping`
(per-example clipped gradient sums), `noise`, `accumulation` (`DPAggregator`,
the composition the training loop calls).
"""

from dpbert.dp.accounting import (AccountingSpec, PrivacyBudget, calibrate_noise_multiplier,
                                  compute_epsilon, effective_noise_multiplier, make_dp_event,
                                  max_steps_within_budget, privacy_report,
                                  recalibrate_for_batch_size, scale_noise_multiplier_sqrt)
from dpbert.dp.accumulation import DPAggregator, DPConfig, DPState
from dpbert.dp.clipping import GradientClipper, LossFn, VmapClipper
from dpbert.dp.noise import add_noise, noise_stddev
from dpbert.dp.sampling import (PoissonSampler, ShuffleSampler,
                                capacity_for_overflow_probability, make_sampler)
from dpbert.dp.trees import freeze_paths_containing, resolve_trainable_mask

__all__ = [
    "AccountingSpec", "PrivacyBudget", "calibrate_noise_multiplier", "compute_epsilon",
    "effective_noise_multiplier", "make_dp_event", "max_steps_within_budget",
    "privacy_report", "recalibrate_for_batch_size", "scale_noise_multiplier_sqrt",
    "DPAggregator", "DPConfig", "DPState", "GradientClipper", "LossFn", "VmapClipper",
    "add_noise", "noise_stddev", "PoissonSampler", "ShuffleSampler",
    "capacity_for_overflow_probability", "make_sampler", "freeze_paths_containing",
    "resolve_trainable_mask",
]
