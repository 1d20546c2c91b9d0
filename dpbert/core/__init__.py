"""The lowest layer: typed privacy concepts that `dpbert` and `data_pipelines` both use.

    units    `PrivacyUnit` and the registry of units (example, note, patient): what one
             neighbouring record of the training is, in one place
    checks   the value checks of the privacy parameters (`validate_delta`, `check_int`, ...)

No JAX and no dp_accounting; nothing from `dpbert` but `dpbert.errors`
(`tests/dpbert/test_architecture.py` checks it).
"""
