"""The DP-SGD engine: sample -> clip -> accumulate -> noise -> optimizer.

Host side (NumPy, no JAX): `sampling` (Poisson / shuffle samplers producing
fixed-size padded physical batches), `accounting` (`AccountingSpec`: the mechanism,
its dp_accounting event and epsilon, the numbers of its report), `accountants` (the
`Accountant` interface, PLD and RDP behind it), `calibration` (sigma for a target,
steps within a budget), `noise_modes` (the sqrt(P) rule of per-shard noise),
`ledger` (the accounting of a run across resumes), `randomness` (the run's secret
noise key and sampler seed) and `plan` (`DPPlan`: all of the above for one run, plus
the clipper's name). The privacy unit is `dpbert.core.units`'.  Device
side (JAX, inside one jitted step): `clipping` (per-example clipped gradient sums and
the clipper registry; `ghost` for the tied word embedding, `mixed_ghost` for dense layers
and embeddings too; `BatchGradient` for non-private runs), `noise`, and `accumulation`
(`DPAggregator`, the composition the training loop calls).

Names are imported lazily so that host-only users (launch/privacy.py) do not
import JAX.
"""

import importlib

_EXPORTS = {
    "accounting": ("ACCOUNTANTS", "AccountingSpec", "compute_epsilon",
                   "effective_noise_multiplier", "make_dp_event", "privacy_report",
                   "progress_epsilon"),
    "accountants": ("Accountant", "PldAccountant", "RdpAccountant"),
    "calibration": ("PrivacyBudget", "calibrate", "calibrate_noise_multiplier",
                    "max_steps_within_budget",
                    "recalibrate_for_batch_size", "scale_noise_multiplier_sqrt"),
    "accumulation": ("DPAggregator", "DPConfig", "DPState"),
    "clipping": ("BatchGradient", "GradientClipper", "LossFn", "VmapClipper", "batch_loss",
                 "clipper_names", "get_clipper", "register_clipper"),
    "ledger": ("PrivacyLedger", "Segment"),
    "plan": ("DPPlan", "make_plan"),
    "randomness": ("RunSecrets",),
    "ghost": ("FactoredLoss", "TiedEmbeddingClipper"),
    "mixed_ghost": ("MixedGhostClipper", "TappedLoss"),
    "noise": ("add_noise", "noise_stddev"),
    "noise_modes": ("NOISE_MODES", "shard_factor"),
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
