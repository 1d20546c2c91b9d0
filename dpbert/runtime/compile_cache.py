"""Compiling the train step: JAX's persistent compilation cache, on by default for the
launchers, and `compile_ahead`, which lowers and compiles with Python's garbage collector paused.

A resumed, preempted or swept run compiles the same train step again at every start (BERT-base's
DP step on one H100: about a minute before the noise was drawn in one loop; the demo's on the
2-core CPU: 13 s). With the cache on, the second start loads the compiled programs from disk.

`config.runtime.compilation_cache_dir` (configs/common.py): "auto" (the default) is
$DPBERT_COMPILATION_CACHE_DIR when that is set (empty: off), else JAX's own
$JAX_COMPILATION_CACHE_DIR (tests/conftest.py points both at a fresh temporary folder), else
$XDG_CACHE_HOME/dpbert/jax, else ~/.cache/dpbert/jax; "" turns the cache off; anything else is
the folder.  What the cache holds is compiled programs, so nothing secret may be a constant in
one: the run's keys (noise, sampling, dropout; a task's own, e.g. dχ's and TextHide's, through
the loop's batch-transform operand) are arguments of the jitted functions
(`dpbert.runtime.loop`), never closed over (tests/dpbert/runtime/test_cached_programs.py).
The noise std is an argument of the train step too (`DPAggregator.update`'s `noise_stddev`):
not for secrecy (sigma is public) but so that a program serves every sigma -- the demo's fresh
start builds a new DP vocabulary, so its example count and calibrated sigma change from run to
run, and a sweep over epsilon changes sigma at every point.  So are the optimizer's numbers a
sweep varies (learning rate, warmup and total steps, weight decay, the head's scale:
`dpbert.runtime.optimizers.SWEPT`); what changes the program's structure (the optimizer's name,
the model, the batch shape, the clipper, b1 / b2 / eps) compiles anew.

Tracing a step creates a great many short-lived Python objects (tracers, jaxpr equations, MLIR
operations), and Python's cyclic collector runs again and again meanwhile, each full pass walking
every live object of the process: a DP step, which traces more, paid more of it (issue 32;
BENCHMARKS.md, "Python's garbage collector and the compile").  `compile_ahead` pauses the
collector for the compile only; what it leaves is collected at the next ordinary pass.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pathlib

ENV = "DPBERT_COMPILATION_CACHE_DIR"
JAX_ENV = "JAX_COMPILATION_CACHE_DIR"  # JAX's own variable, honoured next
# Programs that compile faster than this are not written (JAX's default is 1 s; the demo's
# small programs -- init, eval, metrics -- add up to seconds at every start).
MIN_COMPILE_SECS = 0.2


def cache_dir(setting: str | None) -> str:
    """The folder `setting` (config.runtime.compilation_cache_dir) names; "" = no cache."""
    setting = "auto" if setting is None else str(setting).strip()
    if setting != "auto":
        return os.path.expanduser(setting)
    for env in (ENV, JAX_ENV):
        if env in os.environ:
            return os.path.expanduser(os.environ[env].strip())
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dpbert", "jax")


def enable(config) -> str:
    """Turns JAX's persistent compilation cache on for `config` (a launcher's whole config,
    or None: "auto"); returns the folder, or "" when it is off.  Call before the first jit."""
    runtime = config.get("runtime") if config is not None else None
    path = cache_dir(runtime.get("compilation_cache_dir") if runtime else None)
    import jax  # noqa: PLC0415  (launchers import the library lazily: --help stays instant)

    if not path:
        jax.config.update("jax_enable_compilation_cache", False)
        return ""
    if "://" not in path:
        pathlib.Path(path).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", path)
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECS)
    return path


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic garbage collector off inside the block (restored after, also on error)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def compile_ahead(jitted, *args):
    """`jitted.lower(*args).compile()` (args may be ShapeDtypeStructs) with the garbage
    collector paused (module doc): the same program, compiled sooner."""
    with gc_paused():
        return jitted.lower(*args).compile()
