"""configs/: the one config-arg idiom (common.parse_arg) in every config file."""

import importlib
import pathlib

import pytest

from configs import common

CONFIGS = sorted(p.stem for p in (pathlib.Path(__file__).resolve().parents[2] / "configs")
                 .glob("*.py") if p.stem not in ("__init__", "common"))


def _get(name, arg=None):
    return importlib.import_module(f"configs.{name}").get_config(arg)


def test_every_config_loads_without_arg():
    assert CONFIGS == ["demo_dp", "finetune_classification", "finetune_ner", "mimic_dp",
                       "own_corpus", "privacy_adaptive", "wiki_books"]
    for name in CONFIGS:
        _get(name)


@pytest.mark.parametrize("name", CONFIGS)
def test_an_arg_the_config_ignores_is_an_error(name):
    """`configs/demo_dp.py:ARG` was silently ignored."""
    with pytest.raises(ValueError, match=rf"configs/{name}.py") as e:
        _get(name, "ARG=1")
    assert "\n" not in str(e.value)


def test_args_that_configs_take():
    assert _get("mimic_dp", "size=tiny").model.size == "tiny"
    assert _get("mimic_dp", "tiny").model.size == "tiny"
    assert _get("mimic_dp").model.size == "base"
    assert _get("wiki_books", "size=mini").model.size == "mini"
    assert _get("wiki_books", "tiny").model.size == "tiny"   # bare value = size
    assert _get("privacy_adaptive", "token_rep").dchi.mechanism == "token_rep"
    assert _get("privacy_adaptive", "mechanism=token_rep").dchi.mechanism == "token_rep"
    assert _get("privacy_adaptive").dchi.mechanism == "text_to_text"
    assert _get("demo_dp", "").model.size == "micro"
    long, short = _get("demo_dp", "long"), _get("demo_dp")
    assert (long.train.num_steps, short.train.num_steps) == (1500, 550)
    assert long.dp.noise_multiplier is short.dp.noise_multiplier is None  # calibrated: same target
    assert long.dp.target_epsilon == short.dp.target_epsilon
    assert _get("demo_dp", "length=long").train.num_steps == 1500


@pytest.mark.parametrize("name, arg, match", [
    ("demo_dp", "ARG", r"configs/demo_dp.py: config arg length='ARG' must be one of long"),
    ("mimic_dp", "sise=tiny", r"unknown config arg 'sise'; did you mean 'size'\? "
                              r"\(accepted: size=micro\|tiny\|mini\|small\|medium\|base\|large\)"),
    ("mimic_dp", "size=huge", r"config arg size='huge' must be one of micro, tiny, mini"),
    ("mimic_dp", "size=", r"config arg size='' must be one of"),
    ("mimic_dp", "size=tiny,size=base", r"'size' given twice"),
    ("wiki_books", "base,tiny", r"config arg 'tiny' is not key=value"),
    ("wiki_books", "size=base=x", r"size='base=x' must be one of"),
    ("privacy_adaptive", "none", r"mechanism='none' must be one of text_to_text, token_rep"),
    ("privacy_adaptive", "eta=5", r"unknown config arg 'eta'"),
])
def test_bad_args_name_the_config_and_what_is_accepted(name, arg, match):
    with pytest.raises(ValueError, match=match):
        _get(name, arg)


def test_model_sizes_match_the_model_presets():
    from dpbert.privacy import dchi
    from dpbert.models import bert as model

    assert common.MODEL_SIZES == tuple(model.PRESETS)
    assert {"text_to_text", "token_rep"} <= set(dchi.MECHANISMS)
