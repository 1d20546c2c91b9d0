"""No secret is compiled into a program: JAX's persistent compilation cache (on by default for
the launchers, `dpbert.runtime.compile_cache`) writes every compiled program to disk, where it
outlives the run and may be shared (a team's cache folder, a bucket). A key the DP noise,
sampling, dropout or dχ release depends on that is a CONSTANT of a program (closed over instead
of passed as an argument) would be readable there, and with it the noise.

Two checks over a cache folder of the test's own, empty at the start (every program compiled is
written; those this process compiled before are in memory and not compiled again, but a
program holding this run's secrets is new by construction):
- a second run with OTHER secrets writes no new program: a program whose text depends on a
  secret, or on anything derived from one (a folded key), differs between the two runs;
- no program compiled since the secrets exist holds both 32-bit words of a secret key (or of a
  key the code derives from one on the host); a positive control shows the scan finds a
  closed-over key.
"""

import dataclasses
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpbert.dp import randomness
from dpbert.tasks import pretraining as train
from tests.dpbert.tasks.test_pretraining import cache_dir  # noqa: F401  (the fixture)
from tests.dpbert.tasks.test_pretraining_inputs import (  # noqa: F401  (hf_start: fixture)
    hf_start, small_privacy_adaptive_config)

# Drawn once at random (not well-known constants: the SHA-256 words, e.g., are Philox's and
# appear in XLA's own random-number programs).
FIRST = randomness.RunSecrets((0xA347E91A, 0x986DFF01), (0xBEE81142 << 32) | 0xB74528F7,
                              True, (0xF90B4D7E, 0xFEC48145))
SECOND = randomness.RunSecrets((0x01AFCCB1, 0xC0AE32B9), (0xF857855F << 32) | 0xF36DDC0D,
                               True, (0x307C98EE, 0xA600E18C))


@pytest.fixture
def own_cache(tmp_path):
    """This test's own persistent cache folder, empty (the session's is shared with the other
    pytest-xdist worker, whose programs would look new); every program compiled is written.
    Nothing the session compiled could be reused here anyway: JAX puts the cache folder's path
    into the compile options it hashes (its GPU autotuning cache,
    `jax_persistent_cache_enable_xla_caches`), so the same program has another key in another
    folder (checked: one module, two folders, two keys)."""
    from jax._src import compilation_cache  # noqa: PLC0415

    assert os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS") == "0"  # all written
    previous = jax.config.jax_compilation_cache_dir
    folder = tmp_path / "xla_cache"
    folder.mkdir()
    jax.config.update("jax_compilation_cache_dir", str(folder))
    compilation_cache.reset_cache()
    yield folder
    jax.config.update("jax_compilation_cache_dir", previous)
    compilation_cache.reset_cache()


def _programs(folder: pathlib.Path) -> dict[str, bytes]:
    from jax._src import compilation_cache  # noqa: PLC0415  (its own on-disk format)

    return {p.name: compilation_cache.decompress_executable(p.read_bytes())
            for p in folder.iterdir() if p.name.endswith("-cache")}


def _keys(secrets: randomness.RunSecrets) -> list[tuple[int, int]]:
    """The secrets as pairs of 32-bit words (the sampler seed's two halves among them), and the
    keys the code derives from them on the host."""
    task = np.asarray(secrets.task_key, np.uint32)
    dchi = train._DCHI_STREAM  # noqa: SLF001
    derived = [randomness.dropout_key(task),
               np.asarray(jax.random.fold_in(jnp.asarray(task), dchi))]
    return [secrets.noise_key, (secrets.sampler_seed >> 32, secrets.sampler_seed & 0xFFFFFFFF),
            secrets.task_key, *(tuple(int(w) for w in np.ravel(k)) for k in derived)]


def _found(programs: dict[str, bytes], keys: list[tuple[int, int]]) -> list[str]:
    """The programs holding both words of a key (a compiled-in constant is not always one
    literal: its words may be separate immediates of the machine code)."""
    return sorted(f"{name[:60]}: {a:08x} {b:08x}" for name, raw in programs.items()
                  for a, b in keys
                  if a.to_bytes(4, "little") in raw and b.to_bytes(4, "little") in raw)


def _run_with(secrets, monkeypatch, run, workdir):
    """`run(workdir)` with `secrets` as the secrets a fresh run draws."""
    drawn = []
    monkeypatch.setattr(randomness.RunSecrets, "draw",
                        classmethod(lambda cls: drawn.append(1) or secrets))
    run(workdir)
    assert drawn  # the run drew (these) secrets


def _dchi_config(hf_start, cache_dir):
    """DP pretraining on dχ-privatized inputs (secret noise, sampling, dropout and dχ keys)."""
    c = small_privacy_adaptive_config(hf_start, cache_dir)
    c.dp.enabled = True
    c.dp.insecure_seeded_noise = False
    c.dp.noise_multiplier = 1.0
    c.dp.target_epsilon = 100.0
    c.dp.delta = 1e-4
    c.model.hidden_dropout_prob = 0.1
    c.train.eval_every = 2  # the eval program too
    c.train.export_hf = False
    return c


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    from tests.dpbert.tasks import finetune_fixtures as fx  # noqa: PLC0415

    root = tmp_path_factory.mktemp("toy")
    train_tsv, eval_tsv = fx.sentiment_tsvs(root / "data")
    return {"ckpt": fx.tiny_checkpoint(root / "ckpt"), "train": train_tsv, "eval": eval_tsv}


def _finetune_run(toy, overrides):
    from dpbert.tasks import classification, finetuning  # noqa: PLC0415
    from tests.dpbert.tasks.test_finetune import config  # noqa: PLC0415

    c = config(toy, **{"train.epochs": 1.0, "train.export_hf": False, **overrides})
    return lambda workdir: finetuning.finetune(classification.ClassificationTask(), c, workdir)


# Every kind of run that holds a secret key: DP pretraining on dχ inputs (DP-SGD's noise,
# sampling and dropout keys, and the dχ privatization keyed by batch position: plain DP
# pretraining is the same loop without the last), DP fine-tuning (the loop's task side) on the
# users' token_rep release, and the other input modes' keys (OME's release, TextHide's masks
# and mixing).
KINDS = ["privacy_adaptive", "finetune_token_rep_dp", "finetune_ome", "finetune_texthide"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_no_secret_is_compiled_into_a_cached_program(kind, hf_start, toy, cache_dir, tmp_path,
                                                     monkeypatch, own_cache):
    if kind == "privacy_adaptive":
        config = _dchi_config(hf_start, cache_dir)
        run = lambda workdir: train.train_and_evaluate(config, workdir)  # noqa: E731
    elif kind == "finetune_token_rep_dp":
        run = _finetune_run(toy, {"privacy.mode": "token_rep", "dp.enabled": True,
                                  "dp.noise_multiplier": 1.0, "dp.target_epsilon": None,
                                  "model.hidden_dropout_prob": 0.1})
    elif kind == "finetune_ome":
        run = _finetune_run(toy, {"privacy.mode": "ome"})
    else:
        run = _finetune_run(toy, {"privacy.mode": "texthide", "privacy.k": 2,
                                  "privacy.m": 4})
    before = set(_programs(own_cache))  # empty: the folder is new
    _run_with(FIRST, monkeypatch, run, tmp_path / "a")
    after_first = _programs(own_cache)
    assert set(after_first) - before  # the cache is on and holds this run's new programs
    _run_with(SECOND, monkeypatch, run, tmp_path / "b")
    after_second = _programs(own_cache)
    new = sorted(set(after_second) - set(after_first))
    assert not new, f"programs compiled again for other secrets (a secret is a constant): {new}"
    # The programs compiled since the secrets exist (the others cannot hold them).
    assert not _found({n: raw for n, raw in after_second.items() if n not in before},
                      _keys(FIRST) + _keys(SECOND))


def test_both_checks_find_a_key_compiled_in_as_a_constant(own_cache):
    """The positive control: a program that closes over a key holds its words, and another
    key makes another program."""
    def leaky_run(noise_key):
        key = jnp.asarray(np.asarray(noise_key, np.uint32))
        jax.jit(lambda x: x + jax.random.normal(jax.random.wrap_key_data(key), x.shape))(
            jnp.zeros(3)).block_until_ready()

    before = set(_programs(own_cache))
    secrets = dataclasses.replace(FIRST, noise_key=(0x5D2C71E3, 0x1B8F0A64))
    leaky_run(secrets.noise_key)
    first = _programs(own_cache)
    assert _found({n: raw for n, raw in first.items() if n not in before}, _keys(secrets))
    leaky_run((0x5D2C71E4, 0x1B8F0A65))
    assert set(_programs(own_cache)) - set(first)
    # ... and passed as an argument, it is not compiled in.
    safe = jax.jit(lambda k, x: x + jax.random.normal(jax.random.wrap_key_data(k), x.shape))
    safe(jnp.asarray(np.asarray([0x6E93A2D7, 0x2C40F5B8], np.uint32)), jnp.zeros(4))
    assert not _found(_programs(own_cache), [(0x6E93A2D7, 0x2C40F5B8)])


@pytest.mark.slow
def test_a_run_with_another_sigma_or_learning_rate_compiles_no_new_program(cache_dir, tmp_path,
                                                                           own_cache):
    """The noise std and the optimizer's numbers are arguments of the train step, not
    constants: a fresh start whose sigma was calibrated again (the demo rebuilds its DP
    vocabulary, and with it its example count and sigma), a sweep over epsilon, or over the
    learning rate, warmup or weight decay loads every program from the persistent cache."""
    from tests.dpbert.tasks.test_pretraining import small_config  # noqa: PLC0415

    def run(workdir, **overrides):
        config = small_config(cache_dir, **{"train.num_steps": 2, "train.eval_every": 0,
                                            "train.export_hf": False, **overrides})
        train.train_and_evaluate(config, workdir)

    before = set(_programs(own_cache))
    run(tmp_path / "a", **{"dp.noise_multiplier": 1.0})
    after_first = set(_programs(own_cache))
    assert any("step_fn" in name for name in after_first - before)  # compiled and written
    run(tmp_path / "b", **{"dp.noise_multiplier": 1.37, "optimizer.learning_rate": 3.3e-4,
                           "optimizer.warmup_steps": 1, "optimizer.weight_decay": 0.05})
    new = sorted(set(_programs(own_cache)) - after_first)
    assert not new, ("programs compiled again for another sigma or optimizer number (one is a "
                     f"constant): {new}")
