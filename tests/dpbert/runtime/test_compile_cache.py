"""dpbert.runtime.compile_cache: where the launchers' persistent compilation cache goes, and
`compile_ahead` (the collector paused while the step compiles)."""

import gc

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

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


def test_compile_ahead_pauses_the_collector_while_tracing_and_restores_it():
    seen = []

    def step(x):
        seen.append(gc.isenabled())  # runs once, at trace time
        return jnp.tanh(x) * 2.0

    assert gc.isenabled()
    x = jnp.arange(6.0).reshape(2, 3)
    compiled = compile_cache.compile_ahead(jax.jit(step), jax.ShapeDtypeStruct(x.shape, x.dtype))
    assert seen == [False] and gc.isenabled()
    np.testing.assert_array_equal(np.asarray(compiled(x)), np.asarray(jax.jit(step)(x)))


def test_compile_ahead_restores_the_collector_on_error_and_leaves_it_off_if_it_was():
    def broken(x):
        raise ValueError("bad step")

    with pytest.raises(ValueError, match="bad step"):
        compile_cache.compile_ahead(jax.jit(broken), jax.ShapeDtypeStruct((2,), jnp.float32))
    assert gc.isenabled()
    gc.disable()
    try:
        compile_cache.compile_ahead(jax.jit(jnp.sin), jax.ShapeDtypeStruct((2,), jnp.float32))
        assert not gc.isenabled()
    finally:
        gc.enable()
