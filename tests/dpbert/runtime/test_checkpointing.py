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
