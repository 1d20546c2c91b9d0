"""dpbert.runtime.compile_cache: where the launchers' persistent compilation cache goes."""

import jax
import ml_collections

from dpbert.runtime import compile_cache


def _config(value):
    c = ml_collections.ConfigDict()
    c.runtime = ml_collections.ConfigDict({"compilation_cache_dir": value})
    return c


def test_the_folder_auto_names(monkeypatch, tmp_path):
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    monkeypatch.delenv(compile_cache.JAX_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.cache_dir("auto") == str(tmp_path / "dpbert" / "jax")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compile_cache.cache_dir(None) == str(tmp_path / "home" / ".cache" / "dpbert" / "jax")
    monkeypatch.setenv(compile_cache.JAX_ENV, str(tmp_path / "jax"))
    assert compile_cache.cache_dir("auto") == str(tmp_path / "jax")
    monkeypatch.setenv(compile_cache.ENV, "")
    assert compile_cache.cache_dir("auto") == ""          # set and empty: off
    assert compile_cache.cache_dir(str(tmp_path / "x")) == str(tmp_path / "x")  # the config wins
    assert compile_cache.cache_dir("") == ""


def test_the_test_suite_never_writes_to_the_users_cache():
    assert compile_cache.cache_dir("auto") == compile_cache.os.environ[compile_cache.JAX_ENV]


def test_enable_sets_jax_and_empty_turns_it_off(tmp_path):
    before = (jax.config.jax_enable_compilation_cache, jax.config.jax_compilation_cache_dir)
    try:
        path = compile_cache.enable(_config(str(tmp_path / "c")))
        assert path == str(tmp_path / "c") and (tmp_path / "c").is_dir()
        assert jax.config.jax_compilation_cache_dir == path
        assert jax.config.jax_enable_compilation_cache
        assert compile_cache.enable(_config("")) == ""
        assert not jax.config.jax_enable_compilation_cache
    finally:
        jax.config.update("jax_enable_compilation_cache", before[0])
        jax.config.update("jax_compilation_cache_dir", before[1])


def test_the_default_config_says_auto():
    from configs import common, finetune_classification

    assert common.get_config().runtime.compilation_cache_dir == "auto"
    assert finetune_classification.get_config().runtime.compilation_cache_dir == "auto"
