"""dp.mechanism="bandmf" end to end on the demo config (cut down): a run killed with -9 and
resumed ends bitwise equal to its uninterrupted twin (the correlated noise's buffers come back
from the checkpoint), reports jax-privacy's BandMF epsilon, and exports with the mechanism on the
model card and no buffers in the export."""

import json

import dp_accounting
import numpy as np
import pytest
from jax_privacy.experimental import execution_plan

from dpbert.runtime import checkpointing
from dpbert.tasks import pretraining as train
from tests.dpbert.tasks.test_pretraining import (  # noqa: F401  (cache_dir: the fixture)
    assert_trees, cache_dir, cli_train_args, final_params, run_cli, small_config)
from tests.dpbert.tasks.test_pretraining_processes import _wait_for_checkpoint

BANDMF = {"dp.mechanism": "bandmf", "dp.num_bands": 2, "train.num_steps": 6,
          "checkpoint.every_steps": 2, "checkpoint.max_to_keep": 5, "train.eval_every": 0,
          # Seeded noise and sampling (NOT private), so that a run that never stopped is the
          # reference: a resume that lost or zeroed the buffers would differ from it. (Two
          # copies of one checkpoint would agree even then.) The secret path is the same code
          # with another key source (test_pretraining's test_secret_*).
          "dp.insecure_seeded_noise": True, "vocab.seed": 0}


def _buffers(workdir, step):
    ckpt = checkpointing.Checkpointer(workdir / "checkpoints", async_save=False)
    tree = ckpt._manager.item_metadata(step)["state"]  # noqa: SLF001
    ckpt.close()
    return getattr(tree, "tree", tree)["dp"]["buffers"]


@pytest.mark.slow
def test_bandmf_run_resumes_after_kill_9_bitwise_and_exports_the_mechanism(cache_dir, tmp_path):
    flags = [f"--config.{k}={v}" for k, v in BANDMF.items()]
    resumed, twin = tmp_path / "resumed", tmp_path / "twin"
    proc = run_cli(*cli_train_args(resumed, cache_dir, flags))
    _wait_for_checkpoint(resumed, proc, 2)
    proc.kill()  # kill -9
    proc.wait()
    # The buffers (correlated noise of the last b - 1 = 1 step) are in the private checkpoint.
    killed_at = checkpointing.Checkpointer(resumed / "checkpoints", async_save=False).latest_step()
    assert 2 <= killed_at < 6 and len(_buffers(resumed, killed_at)) == 1
    # The twin never stops; the killed run resumes (in this process: the launcher's flags were
    # exercised by the killed run, and a second launcher re-imports JAX, ~30 s).
    train.train_and_evaluate(small_config(cache_dir, **BANDMF), twin)
    train.train_and_evaluate(small_config(cache_dir, **BANDMF), resumed)
    a, step_a = final_params(twin)
    b, step_b = final_params(resumed)
    assert step_a == step_b == 6
    assert_trees(a, b, exact=True)

    report = json.loads((resumed / "privacy_report.json").read_text())
    t = report["training"]
    assert t["mechanism"] == "bandmf" and t["num_bands"] == 2 and len(t["strategy"]) == 2
    assert t["secret_randomness"] is False and t["rounds"] == 3
    assert len(t["segments"]) == 1  # one mechanism across the kill: nothing to compose
    # Epsilon is jax-privacy's BandMF plan's (its event, its accountant) for these numbers.
    plan = execution_plan.BandMFExecutionPlanConfig(
        iterations=6, strategy=np.asarray(t["strategy"]), epsilon=None, delta=None,
        noise_multiplier=t["noise_multiplier"], sampling_prob=t["sampling_probability"],
        truncated_batch_size=t["max_batch_size"],
        num_examples=t["group_size"] * 2 if t["max_batch_size"] else None)
    event = plan._get_dp_event(t["noise_multiplier"])  # noqa: SLF001
    assert plan.accountant.neighboring_relation == \
        dp_accounting.NeighboringRelation.REPLACE_SPECIAL
    assert t["epsilon"] == pytest.approx(
        plan.accountant.compose(event).get_epsilon(t["delta"]), rel=1e-9)

    card = (resumed / "hf" / "README.md").read_text()
    assert "Training (BandMF, 2 band(s)" in card and "jax-privacy's amplified BandMF" in card
    assert "cyclic poisson (2 groups of" in card
    shipped = json.loads((resumed / "hf" / "privacy_report.json").read_text())
    assert shipped["training"]["mechanism"] == "bandmf"
    assert not any("buffer" in p.name for p in (resumed / "hf").iterdir())
