"""dpbert/runtime/config_checks.py: config values that used to fail late, hang, or fail without naming
their field are refused by loop.validate, before any data is built (issue 35)."""

import pytest

from configs import demo_dp, finetune_classification, privacy_adaptive
from dpbert.runtime import config_checks
from dpbert.runtime import loop
from dpbert.errors import ConfigError
from dpbert.tasks import pretraining


@pytest.mark.parametrize("field,value", [
    ("vocab.seed", -1), ("seed", -5), ("seed", 2**32), ("data.canaries.seed", -1),
    ("seed", None), ("data.synthetic_seed", True)])
def test_seeds_are_integers_in_the_32_bit_range(field, value):
    config = demo_dp.get_config()
    node = config
    *parents, leaf = field.split(".")
    for part in parents:
        node = node[part]
    node[leaf] = value
    with pytest.raises(ConfigError, match=rf"^config\.{field}={value!r}: a seed must be an "
                                          r"integer in \[0, 4294967295\]"):
        config_checks.check(config)


def test_defaults_pass_and_unset_seeds_are_fine():
    for module in (demo_dp, finetune_classification, privacy_adaptive):
        config_checks.check(module.get_config())
    config = demo_dp.get_config()
    config.vocab.seed = None  # OS entropy
    config.seed = 2**32 - 1
    config_checks.check(config)


def test_canary_repetitions_are_bounded():
    config = demo_dp.get_config()
    config.data.canaries.repetitions = (0, 1, 10**9)
    config_checks.check(config)  # canaries off: not read
    config.data.canaries.enabled = True
    with pytest.raises(ConfigError, match=r"config\.data\.canaries\.repetitions=\(0, 1, "
                                          r"1000000000\): each count must be an integer in "
                                          r"\[0, 100000\]"):
        config_checks.check(config)


def test_a_tiny_eta_is_refused_before_it_overflows():
    config = finetune_classification.get_config()
    config.privacy.eta = 1e-30
    config_checks.check(config)  # privacy.mode none: η unused
    config.privacy.mode = "token_rep"
    with pytest.raises(ConfigError, match=r"config\.privacy\.eta=1e-30: below 1e-06"):
        config_checks.check(config)
    config = privacy_adaptive.get_config()
    config.dchi.eta = 1e-9
    with pytest.raises(ConfigError, match=r"config\.dchi\.eta=1e-09: below 1e-06"):
        loop.validate(pretraining.TASK, config)


@pytest.mark.parametrize("value", [0, -1, None])
def test_max_sentence_chars_is_a_positive_integer(value):
    """At 0 or below every word was silently cut into a sentence of its own (issue 35)."""
    config = demo_dp.get_config()
    config.data.max_sentence_chars = value
    with pytest.raises(ConfigError, match=rf"^config\.data\.max_sentence_chars={value!r}: "
                                          r"must be an integer > 0 \(sentences longer"):
        loop.validate(pretraining.TASK, config)
