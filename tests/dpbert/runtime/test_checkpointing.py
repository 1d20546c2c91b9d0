"""dpbert/runtime/checkpointing.py: the config-compatibility check of a resumed run."""

import json

import pytest

from dpbert.runtime import checkpointing


def test_a_workdir_of_another_task_is_one_line_not_a_diff(tmp_path):
    """Issue 35: a fine-tuning workdir given to train.py (a pretraining workdir to
    finetune.py) printed an 84-line diff of every config field."""
    pretraining = {"dp.delta": 1e-6, "data.corpus": "synthetic"}
    finetuning = {"task": "classification", "dp.delta": 1e-5, "data.train": "t.tsv"}
    with pytest.raises(checkpointing.IncompatibleCheckpointError) as e:
        checkpointing.check_compatible(finetuning, pretraining, "W")
    assert str(e.value) == "W holds a classification run, not pretraining; use another --workdir"
    with pytest.raises(checkpointing.IncompatibleCheckpointError,
                       match="^W holds a pretraining run, not ner; use another --workdir$"):
        checkpointing.check_compatible(pretraining, {**finetuning, "task": "ner"}, "W")
    with pytest.raises(checkpointing.IncompatibleCheckpointError, match="Differences:"):
        checkpointing.check_compatible(pretraining, {**pretraining, "dp.delta": 1e-5}, "W")
    checkpointing.check_compatible(finetuning, dict(finetuning), "W")
    # Before the checkpoint is opened: the workdir's run.json names its task.
    assert checkpointing.workdir_task_problem(tmp_path, "pretraining") is None   # no run.json
    (tmp_path / "run.json").write_text(json.dumps({"task": "ner"}))
    assert checkpointing.workdir_task_problem(tmp_path, "ner") is None
    assert checkpointing.workdir_task_problem(tmp_path, "pretraining") == (
        f"{tmp_path} holds a ner run, not pretraining; use another --workdir")
    (tmp_path / "run.json").write_text("{not json")
    assert checkpointing.workdir_task_problem(tmp_path, "pretraining") is None


def test_train_nsp_may_not_change_on_resume_and_old_checkpoints_still_resume():
    """train.nsp changes the loss and what trains (the NSP head and the pooler): a resume that
    changes it is refused; a checkpoint written before the field existed (NSP on, the default)
    resumes under a config that has it at its default."""
    def sig(nsp=None):
        train = {"num_steps": 10} if nsp is None else {"num_steps": 10, "nsp": nsp}
        return checkpointing.run_signature({"dp": {"delta": 1e-6}, "train": train})

    checkpointing.check_compatible(sig(), sig(True), "W")
    checkpointing.check_compatible(sig(False), sig(False), "W")
    for saved, current in ((sig(True), sig(False)), (sig(), sig(False)), (sig(False), sig())):
        with pytest.raises(checkpointing.IncompatibleCheckpointError, match="train.nsp"):
            checkpointing.check_compatible(saved, current, "W")


def test_texthide_fields_matter_only_to_texthide_runs():
    """TextHide's head defaults changed (issue 33): a fine-tuning run of another mode, whose
    checkpoint holds the old defaults in its signature, still resumes; a TextHide run whose
    head changed is refused, naming the field."""
    def sig(mode, norm):
        return checkpointing.run_signature({"task": "classification", "privacy": {
            "mode": mode, "m": 256, "texthide_head_input_norm": norm}})

    assert "privacy.texthide_head_input_norm" not in sig("none", "rms")
    assert sig("none", "rms")["privacy.m"] == 256             # only the prefix's fields
    checkpointing.check_compatible(sig("none", "none"), sig("none", "rms"), "W")
    old = {"task": "classification", "privacy.mode": "none", "privacy.m": 256,
           "privacy.texthide_head_input_norm": "none"}          # written before: still in it
    checkpointing.check_compatible(old, sig("none", "rms"), "W")
    checkpointing.check_compatible(sig("texthide", "rms"), sig("texthide", "rms"), "W")
    for saved, current in ((sig("texthide", "none"), sig("texthide", "rms")),
                           ({**old, "privacy.mode": "texthide"}, sig("texthide", "rms"))):
        with pytest.raises(checkpointing.IncompatibleCheckpointError,
                           match="privacy.texthide_head_input_norm: checkpoint='none' "
                                 "config='rms'"):
            checkpointing.check_compatible(saved, current, "W")
    with pytest.raises(checkpointing.IncompatibleCheckpointError, match="privacy.mode"):
        checkpointing.check_compatible(sig("none", "rms"), sig("texthide", "rms"), "W")


def test_a_state_of_another_layout_is_named_not_taken_for_damage(tmp_path):
    """A checkpoint whose state has other leaves, shapes or dtypes (another version of dpbert
    wrote it: BandMF's frozen-leaf buffers were full-size before) is refused with the leaves
    that differ; the loop raises it instead of deleting the step as damaged."""
    import jax.numpy as jnp

    ckpt = checkpointing.Checkpointer(tmp_path / "ckpt", async_save=False)
    saved = {"params": {"w": jnp.ones(3)}, "dp": {"buffers": [{"w": jnp.zeros(3)}]}}
    ckpt.save(2, saved, {"step": 2})
    ckpt.wait()
    same = checkpointing.abstract_like(saved)
    assert ckpt.layout_problem(2, same) is None
    now = checkpointing.abstract_like({"params": {"w": jnp.ones(3)},
                                       "dp": {"buffers": [{"w": jnp.zeros(())}]}})
    problem = ckpt.layout_problem(2, now)
    assert problem.startswith("the training state saved at step 2 is laid out differently")
    assert "(1 leaves differ: dp/buffers/0/w: checkpoint=float32[3] now=float32[])" in problem
    extra = checkpointing.abstract_like({**saved, "opt": jnp.zeros(2, jnp.int32)})
    assert "opt: checkpoint=<absent> now=int32[2]" in ckpt.layout_problem(2, extra)
    assert ckpt.all_steps() == [2]  # nothing deleted
    ckpt.close()


def test_small_replicated_arrays_are_saved_whole_and_large_ones_replica_parallel(
        tmp_path, monkeypatch):
    """orbax's replica-parallel save cut every replicated array into one eager slice per device
    (a program each, 1,440 slices per save of the tiny model on 8 devices); below
    MIN_REPLICA_SLICE_BYTES per slice an array is now written whole by its first replica, above
    it still in parallel; both read back bitwise."""
    import jax
    import numpy as np
    from orbax.checkpoint._src.serialization import replica_slices

    sliced = []
    data = replica_slices.ReplicaSlice.data

    def counting(self):
        if self.slice_args is not None:
            sliced.append(self.unsliced_data.shape)
        return data(self)

    monkeypatch.setattr(replica_slices.ReplicaSlice, "data", counting)
    devices = jax.devices()
    assert len(devices) == 8
    replicated = jax.sharding.NamedSharding(
        jax.sharding.Mesh(np.array(devices), ("data",)), jax.sharding.PartitionSpec())
    rng = np.random.default_rng(0)
    big_rows = 8 * checkpointing.MIN_REPLICA_SLICE_BYTES // (4 * 64)  # one MiB per replica
    state = {"small": jax.device_put(rng.normal(size=(1000, 128)).astype(np.float32),
                                     replicated),
             "bias": jax.device_put(np.arange(7, dtype=np.int32), replicated),
             "big": jax.device_put(rng.normal(size=(big_rows, 64)).astype(np.float32),
                                   replicated)}
    ckpt = checkpointing.Checkpointer(tmp_path / "ckpt", async_save=False)
    ckpt.save(1, state, {"step": 1})
    ckpt.wait()
    assert sliced == [(big_rows, 64)] * 8  # only the large array, one slice per replica
    restored, _ = ckpt.restore(1, checkpointing.abstract_like(state))
    for name, x in state.items():
        np.testing.assert_array_equal(np.asarray(restored[name]), np.asarray(x))
    # A checkpoint written by orbax's own handler (every array sliced: dpbert before this
    # change) reads back the same.
    sliced.clear()
    checkpointing.register_array_handler(None)
    try:
        ckpt.save(2, state, {"step": 2})
        ckpt.wait()
    finally:
        checkpointing.register_array_handler()
    assert len(sliced) == 2 * 8  # "bias" (7 rows) has no axis that 8 replicas divide
    restored, _ = ckpt.restore(2, checkpointing.abstract_like(state))
    for name, x in state.items():
        np.testing.assert_array_equal(np.asarray(restored[name]), np.asarray(x))
    ckpt.close()
