"""Faults around the DP loop: non-finite parameters, a second process, damaged checkpoints, a
report that would run ahead of its checkpoint, signals, a moved workdir, a tampered run.json."""

import json
import math
import os
import pathlib
import re
import shutil
import signal
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dpbert.runtime import checkpointing

from dpbert.runtime import guards, loop, run_privacy, saved_run

from dpbert.runtime import optimizers
from dpbert.errors import ConfigError
from dpbert.tasks import export, pretraining
from tests.dpbert.tasks.test_pretraining import assert_trees, final_params, small_config


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("loop_cache")


def _nan_after(steps: int):
    """An optimizer that moves the parameters a little, then makes them NaN."""
    def make(config, params=None, trainable=None, numbers=None):
        lr = lambda count: jnp.where(count >= steps, jnp.nan, 1e-3)  # noqa: E731
        return optax.chain(optax.scale_by_adam(), optax.scale_by_learning_rate(lr))
    return make


def test_optimizer_config_refuses_non_finite_numbers():
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="learning_rate=.*must be a finite number"):
            optimizers.make_optimizer(dict(name="adamw", learning_rate=bad, warmup_steps=1,
                                           total_steps=10), {"w": jnp.zeros(3)})



def test_auto_clipping_is_resolved_by_the_task_before_the_plan(cache_dir):
    from configs import finetune_classification
    from dpbert.tasks import classification

    config = small_config(cache_dir)
    assert config.dp.clipping == "auto"              # the default
    loop.validate(pretraining.TASK, config)
    assert config.dp.clipping == "mixed_ghost"      # one sequence per unit: the fastest
    loop.validate(pretraining.TASK, config)          # idempotent
    assert config.dp.clipping == "mixed_ghost"
    per_patient = small_config(cache_dir, **{"dp.privacy_unit": "patient",
                                             "data.eval_split_unit": "subject"})
    loop.validate(pretraining.TASK, per_patient)
    assert per_patient.dp.clipping == "ghost_embedding"   # a unit's loss has no dense taps
    ft = finetune_classification.get_config()
    assert ft.dp.clipping == "auto"                  # the fine-tuning default too
    assert classification.ClassificationTask().auto_clipping(ft) == "mixed_ghost"
    ft.privacy.mode = "seq_rep"                      # the head alone: no encoder input
    assert classification.ClassificationTask().auto_clipping(ft) == "vmap"
    with pytest.raises(ConfigError, match="clipping='mixed_ghst': must be one of .'auto'"):
        loop.validate(pretraining.TASK, small_config(cache_dir, **{"dp.clipping": "mixed_ghst"}))


def test_the_loop_checks_the_optimizer_before_any_data_is_built(cache_dir, tmp_path):
    config = small_config(cache_dir, **{"optimizer.learning_rate": math.nan})
    with pytest.raises(ValueError, match="learning_rate=nan must be a finite number"):
        pretraining.train_and_evaluate(config, tmp_path / "run")
    assert not (tmp_path / "run" / "data").exists()
    assert not (tmp_path / "run" / "vocab").exists()


@pytest.mark.slow
def test_non_finite_parameters_stop_the_run_before_saving_or_exporting(cache_dir, tmp_path,
                                                                       monkeypatch):
    workdir = tmp_path / "run"
    monkeypatch.setattr(optimizers, "make_optimizer", _nan_after(2))
    with pytest.raises(FloatingPointError, match="non-finite .* between steps 2 and 4.*step 2"):
        pretraining.train_and_evaluate(small_config(cache_dir, **{"train.eval_every": 0}),
                                       workdir)
    params, step = final_params(workdir)
    assert step == 2 and all(np.isfinite(x).all() for x in jax.tree.leaves(params))
    assert not (workdir / "hf").exists()
    assert json.loads((workdir / "privacy_report.json").read_text())["steps"] == 2


class _ReachedTheModel(Exception):
    """Raised where the run would build (then compile) the model: the checks before it ran."""


def _stop_at_the_model(self, config, data):
    raise _ReachedTheModel


def test_a_vocabulary_that_takes_the_total_delta_past_1_over_n_is_refused(cache_dir, tmp_path,
                                                                          monkeypatch):
    """Issue 35: a vocabulary built at epsilon 8 per note, trained per sequence (the replace-2
    relation, group privacy), has delta 0.225; with dp.delta the headline's total is far above
    1/N, yet the run trained and called it a guarantee. Refused before the model is built,
    naming the three fixes, and config.json is not written."""
    monkeypatch.setattr(pretraining.PretrainingTask, "build_model", _stop_at_the_model)
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError) as e:
        pretraining.train_and_evaluate(small_config(cache_dir, **{"vocab.epsilon": 8.0}),
                                       workdir)
    message = str(e.value)
    assert message.startswith("config.vocab.epsilon=8.0: the vocabulary built here")
    assert "has delta 0.225 under dp.privacy_unit='example'" in message
    assert "total delta 0.225 (vocabulary 0.225 + training dp.delta 0.0001)" in message
    assert "is not < 1/N = " in message and "training examples" in message
    for fix in ("a smaller vocab.epsilon", "dp.privacy_unit='note'", "a public vocabulary"):
        assert fix in message
    assert not (workdir / "config.json").exists()
    # The demo's vocabulary (epsilon 2) stays below 1/N: the same run reaches the model.
    with pytest.raises(_ReachedTheModel):
        pretraining.train_and_evaluate(small_config(cache_dir), tmp_path / "fine")


def test_the_total_delta_counts_the_starting_models_vocabularies():
    """A vocabulary of the starting model's total counts (once) in the total delta; the message
    then names model.init_from_hf and, per note, the vocabulary unit to build."""
    from dpbert.core import units as privacy_units

    plan = types.SimpleNamespace(ledger=object(), num_examples=1000, per_unit=True,
                                 unit=privacy_units.get("note"), privacy_unit="note")
    config = small_config(pathlib.Path("/unused"), **{"dp.delta": 1e-4, "dp.privacy_unit": "note",
                                        "model.init_from_hf": "/models/base"})
    own = {"stage": "vocabulary", "read_private_data": False, "epsilon": 0.0, "delta": 0.0,
           "vocab_sha256": "a"}
    theirs = {"stage": "vocabulary", "read_private_data": True, "epsilon": 9.0, "delta": 2e-3,
              "vocabulary_epsilon": 8.0, "vocabulary_delta": 1e-6, "unit": "patient",
              "relation": "replace", "records": 1, "vocab_sha256": "b"}
    lineage = types.SimpleNamespace(vocabularies=(theirs,), voids=None)
    with pytest.raises(ConfigError) as e:
        run_privacy.check_total_delta(config, plan, own, lineage, pathlib.Path("/unused"))
    message = str(e.value)
    assert message.startswith("config.model.init_from_hf='/models/base': the vocabulary of the "
                              "starting model's total (DP per patient")
    assert "total delta 0.0021 (vocabulary of the starting model 0.002 + training dp.delta" \
        in message
    assert "not < 1/N = 0.001 for the N=1000 notes (privacy units)" in message
    assert "--unit=document for dp.privacy_unit='note'" in message
    # Below 1/N, or the starting model's vocabulary is the one this run uses: no refusal.
    run_privacy.check_total_delta(config, plan, own, types.SimpleNamespace(
        vocabularies=({**theirs, "delta": 5e-4},), voids=None), None)
    run_privacy.check_total_delta(config, types.SimpleNamespace(**{**vars(plan), "ledger": None}),
                            own, lineage, None)


def test_a_k_above_every_units_count_is_said_without_the_count(cache_dir, tmp_path, monkeypatch,
                                                              capsys):
    """dp.max_examples_per_unit above every unit's sequence count: a warning before the
    compile (run_privacy.say_unused_unit_slots says why it is not refused), no count printed; the
    default K (8 here, below the largest note's count) says nothing."""
    monkeypatch.setattr(pretraining.PretrainingTask, "build_model", _stop_at_the_model)
    said = {}
    for k in (1000, 8):
        with pytest.raises(_ReachedTheModel):
            pretraining.train_and_evaluate(small_config(cache_dir, **{
                "dp.privacy_unit": "note", "dp.max_examples_per_unit": k}), tmp_path / str(k))
        said[k] = [ln for ln in capsys.readouterr().out.splitlines()
                   if "max_examples_per_unit" in ln]
    assert said[8] == []
    [line] = said[1000]
    assert line.startswith("WARNING: config.dp.max_examples_per_unit=1000 is larger than the "
                           "number of training sequences of every note of this corpus")
    assert "is not printed" in line
    # No number but K itself: the largest note's count is private.
    assert re.findall(r"\d+", line) == ["1000"]


def test_a_second_process_in_the_same_workdir_is_refused(cache_dir, tmp_path):
    tmp_path.mkdir(exist_ok=True)
    with guards.Lock(tmp_path):
        with pytest.raises(ConfigError, match="another dpbert process is running"):
            pretraining.train_and_evaluate(small_config(cache_dir), tmp_path)
    assert not (tmp_path / "config.json").exists()


def test_sigterm_and_ctrl_c_ask_the_loop_to_save_and_stop():
    # The handlers in place before (default_int_handler in a terminal; SIG_IGN for SIGINT in a
    # job started in the background) come back afterwards.
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in (signal.SIGTERM, signal.SIGINT):
        with guards.Stop() as stop:
            os.kill(os.getpid(), sig)
            assert stop.signal == sig
    assert {sig: signal.getsignal(sig) for sig in before} == before


class _FailingCheckpointer:
    """Saves that never land (a full disk): latest_step stays where it was."""

    def __init__(self):
        self.saved = [2]

    def all_steps(self):
        return list(self.saved)

    def latest_step(self):
        return max(self.saved)

    def save(self, step, state, meta):
        pass

    def wait(self):
        pass

    def close(self):
        pass


def test_the_report_never_runs_ahead_of_the_newest_checkpoint(tmp_path):
    saver = saved_run.Saver(_FailingCheckpointer(), tmp_path, {}, True, data_hash="h", run_hash="r",
                        task_key=[0, 0], plan=type("P", (), {"ledger": None})(),
                        sampler=type("S", (), {"state_dict": lambda self: {}})(),
                        report_at=lambda step, by_budget=False: {"steps": step})
    saver.save(2, state=None)  # step 2 exists already: its report may be written
    saver.save(4, state=None)
    assert json.loads((tmp_path / "privacy_report.json").read_text())["steps"] == 2
    with pytest.raises(OSError, match="step 4 was not written.*stays at .*step 2"):
        saver.close()
    assert json.loads((tmp_path / "privacy_report.json").read_text())["steps"] == 2


@pytest.mark.slow
def test_damaged_newest_checkpoint_falls_back_to_the_one_before(cache_dir, tmp_path, caplog):
    c = small_config(cache_dir, **{"train.eval_every": 0, "train.export_hf": False})
    straight = tmp_path / "straight"
    pretraining.train_and_evaluate(c, straight)
    # A copy whose step-4 checkpoint lost the end of every array file.
    damaged = tmp_path / "damaged"
    shutil.copytree(straight, damaged)
    for f in (damaged / "checkpoints" / "4" / "state").rglob("*"):
        if f.is_file() and f.stat().st_size > 64 and "metadata" not in f.name:
            with open(f, "r+b") as fh:
                fh.truncate(f.stat().st_size // 2)
    pretraining.train_and_evaluate(c, damaged)
    assert "checkpoint step 4 is damaged" in caplog.text
    a, step_a = final_params(straight)
    b, step_b = final_params(damaged)
    assert step_a == step_b == 4
    assert_trees(a, b, exact=True)  # steps 3 and 4 retrained from step 2: the same run


@pytest.mark.slow
def test_a_moved_workdir_exports_and_a_tampered_run_json_is_refused(cache_dir, tmp_path):
    c = small_config(cache_dir, **{"train.num_steps": 3, "train.eval_every": 0,
                                   "train.export_hf": False, "vocab.file": ""})
    pretraining.train_and_evaluate(c, tmp_path / "run")
    moved = tmp_path / "moved"
    shutil.move(tmp_path / "run", moved)
    out = export.export_from_workdir(moved, tmp_path / "hf")
    assert (out / "vocab.txt").read_text() == (moved / "vocab" / "vocab.txt").read_text()
    run = json.loads((moved / "run.json").read_text())
    run["max_seq_length"] = 512
    (moved / "run.json").write_text(json.dumps(run))
    with pytest.raises(ConfigError, match="run.json does not match the checkpoint"):
        export.export_from_workdir(moved, tmp_path / "hf2")


def test_a_damaged_checkpoint_is_reported_once(monkeypatch):
    """orbax's coroutine echoes of a failed read (TensorStore dumps of thousands of lines) are
    dropped while the loop runs; any other unraisable exception still reaches the hook."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    echo = types.SimpleNamespace(exc_value=Exception(
        "Encountered error while reading array index: (slice(0, 128, 1),). " + "x\n" * 5000))
    other = types.SimpleNamespace(exc_value=RuntimeError("something else"))
    with checkpointing.quiet_failed_reads():
        sys.unraisablehook(echo)
        sys.unraisablehook(other)
    assert seen == [other] and sys.unraisablehook == seen.append
    assert checkpointing.first_line(echo.exc_value) == str(echo.exc_value).splitlines()[0]


def test_a_stopping_run_says_saved_only_once_the_save_is_on_disk(tmp_path, monkeypatch):
    """Issue 35: 'stopped by SIGTERM: checkpoint saved' was logged before the asynchronous save
    finished, so a kill right after it left only N.orbax-checkpoint-tmp and the rerun started
    from step 0. close(durable=True), which the stop path calls before it logs, returns only
    once the step is committed and every one of its files fsynced."""
    synced, real_fsync = [], os.fsync

    def fsync(fd):  # records which file or folder was flushed
        if os.path.exists("/proc/self/fd"):
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    ckpt = checkpointing.Checkpointer(tmp_path / "checkpoints", async_save=True)
    saver = saved_run.Saver(ckpt, tmp_path, {}, True, data_hash="h", run_hash="r", task_key=[0, 0],
                        plan=type("P", (), {"ledger": None})(),
                        sampler=type("S", (), {"state_dict": lambda self: {}})(),
                        report_at=lambda step, by_budget=False: {"steps": step})
    saver.save(3, {"w": jnp.arange(1000.0)})
    saver.close(durable=True)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["3"]
    files = [str(p) for p in (tmp_path / "checkpoints" / "3").rglob("*") if p.is_file()]
    if os.path.exists("/proc/self/fd"):
        assert files and set(files) <= set(synced)
        assert str(tmp_path / "checkpoints") in synced
    assert json.loads((tmp_path / "privacy_report.json").read_text())["steps"] == 3
    # A run killed while saving leaves a temporary folder: the next run says it starts fresh.
    (tmp_path / "checkpoints" / "5.orbax-checkpoint-tmp").mkdir()
    (tmp_path / "checkpoints" / "3").rename(tmp_path / "old")
    fresh = checkpointing.Checkpointer(tmp_path / "checkpoints", async_save=False)
    assert saved_run.fresh_start_message(fresh, set()) == (
        f"no checkpoint in {tmp_path / 'checkpoints'} (unfinished save(s) "
        "5.orbax-checkpoint-tmp of a run killed while saving are ignored): starting fresh at "
        "step 0")
    fresh.close()
