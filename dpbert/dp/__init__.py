"""The DP-SGD engine: sample -> clip -> accumulate -> noise -> optimizer.

Host side (NumPy, no JAX): `sampling` (Poisson / shuffle samplers producing
fixed-size padded physical batches) and `accounting` (dp_accounting events,
epsilon, calibration, budget, privacy report).  Device side (JAX, inside one
jitted step): `clipping` (per-example clipped gradient sums; `ghost` for the tied word
embedding, `mixed_ghost` for dense layers and embeddings too), `noise`, and
`accumulation` (`DPAggregator`, the composition the training loop calls).

Names are imported lazily so that host-only users (launch/privacy.py) do not
import JAX.
"""

import importlib

_EXPORTS = {
    "accounting": ("ACCOUNTANTS", "AccountingSpec", "PrivacyBudget",
                   "calibrate_noise_multiplier", "compute_epsilon",
                   "effective_noise_multiplier", "make_dp_event", "max_steps_within_budget",
                   "privacy_report", "progress_epsilon", "recalibrate_for_batch_size",
                   "scale_noise_multiplier_sqrt"),
    "accumulation": ("DPAggregator", "DPConfig", "DPState"),
    "clipping": ("GradientClipper", "LossFn", "VmapClipper"),
    "ghost": ("FactoredLoss", "TiedEmbeddingClipper"),
    "mixed_ghost": ("MixedGhostClipper", "TappedLoss"),
    "noise": ("add_noise", "noise_stddev"),
    "sampling": ("PoissonSampler", "ShuffleSampler", "capacity_for_overflow_probability",
                 "make_sampler"),
    "trees": ("freeze_paths_containing", "resolve_trainable_mask"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"dpbert.dp.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'dpbert.dp' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
