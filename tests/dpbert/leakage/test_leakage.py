"""End to end: train a tiny BERT with exposure canaries (repetitions 0 and 100) and one-run
audit canaries planted, once without DP (launch/audit.py, 500 steps) and once with DP at ε <= 1
(dpbert.leakage.audit.run_audit, 40 steps), then measure exposure (launch/exposure.py, both runs in
one figure) and the audit's lower bounds.

The claims (FINETUNE_SPEC §4, issue 14): without DP the secrets planted 100 times are exposed
well above the floor of never-planted reference canaries, and the audit proves ε well above 0;
with DP the audit's bound does not exceed the claimed ε, and exposure stays within the floor's
noise and below the non-DP run's (here a pipeline check, the DP run being shorter; the
equal-steps comparison is benchmarks/leakage.py).
"""

import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from scipy import stats

from configs import demo_dp
from data_pipelines import canaries as canaries_lib
from data_pipelines import tokenization
from dpbert.leakage import audit
from tests.dpbert.tasks.test_pretraining import DPSGD_ADAMW, REPO, override

# 16 synthetic notes (~250 examples), 3 canaries per (form, repetitions) for repetitions 0 and
# 100, m = 256 audit canaries; no dropout and a high learning rate so that 500 steps memorize
# (3 runs measured: audit bound 1.5-1.8, mean exposure at n = 100 4.0-6.2 bits, floor 1.43).
LEAK = {
    **DPSGD_ADAMW,
    "data.synthetic_num_notes": 16, "data.eval_fraction": 0.0, "data.max_seq_length": 32,
    "data.max_predictions_per_seq": 5, "model.max_position_embeddings": 32,
    "model.size": "tiny", "train.nsp": True, "model.hidden_dropout_prob": 0.0, "model.attention_probs_dropout_prob": 0.0,
    "data.canaries.enabled": True, "data.canaries.repetitions": (0, 100),
    "data.canaries.per_setting": 3, "batch.expected_batch_size": 16,
    "batch.physical_batch_size": 16, "batch.microbatch_size": 16, "dp.delta": 1e-6,
    "train.num_steps": 500, "train.log_every": 250, "optimizer.learning_rate": 5e-3,
    "optimizer.warmup_steps": 10, "checkpoint.every_steps": 0, "checkpoint.async_save": False,
    "train.export_hf": False,
}
NON_DP = {"dp.enabled": False}
# DP with a fixed σ = 2 (ε about 0.6 at δ = 1e-6; no calibration), for 40 steps only: the DP
# step compiles and runs several times slower than the plain one, so this run checks the
# pipeline and the audit's claim; the equal-steps DP vs non-DP comparison of exposure is
# benchmarks/leakage.py.
DP = {"dp.enabled": True, "dp.noise_multiplier": 2.0, "dp.target_epsilon": None,
      "dp.overflow_probability": 1e-3, "batch.physical_batch_size": 32,
      "batch.microbatch_size": 32, "train.num_steps": 40, "train.log_every": 40}
M = 256


def cli_flags(values):
    return [f"--config.{k}=" + (",".join(map(str, v)) if isinstance(v, tuple) else str(v))
            for k, v in values.items()]


def run(args):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def fixed_audit_secrets(out, vocab_file, seed):
    """Writes OUT's private audit file (m canaries and inclusion bits) from a fixed seed before
    the audit runs; the audit reuses it as it does on a rerun.  The audit draws them from OS
    entropy, and about 128 of them become training examples of this ~250-example corpus, so
    every run trains on different data and the 9-vs-9 exposure comparisons below would pass
    or fail by chance (one CI run failed at p = 0.017 against 0.01).  With them fixed, the
    runs are the same every time."""
    private = out / audit.PRIVATE_DIR
    private.mkdir(parents=True)
    tok = tokenization.WordPieceTokenizer(vocab_file)
    rng = np.random.default_rng(seed)
    canaries = audit.make_audit_canaries(tok, M, 8, rng)
    canaries_lib.write_canary_file(private / audit.AUDIT_FILE, canaries, tok, seed=None,
                                   extra={"included": (rng.random(M) < 0.5).tolist()})


@pytest.fixture(scope="module")
def non_dp(tmp_path_factory, notes_vocab):
    """The audit CLI on a non-private run (one device)."""
    out = tmp_path_factory.mktemp("leak") / "non_dp"
    fixed_audit_secrets(out, notes_vocab, seed=1)
    stdout = run([REPO / "launch" / "audit.py", "--config=configs/demo_dp.py", f"--out={out}",
                  f"--m={M}", "--num_devices=1", f"--config.vocab.file={notes_vocab}",
                  *cli_flags({**LEAK, **NON_DP})])
    assert "audit: epsilon >=" in stdout
    return out


@pytest.fixture(scope="module")
def dp(tmp_path_factory, notes_vocab):
    """The audit library on a DP run (ε = 1)."""
    out = tmp_path_factory.mktemp("leak") / "dp"
    fixed_audit_secrets(out, notes_vocab, seed=2)
    config = override(demo_dp.get_config(), {**LEAK, **DP, "vocab.file": str(notes_vocab)})
    audit.run_audit(config, out, m=M, devices=jax.devices()[:1])
    return out


@pytest.mark.slow
def test_without_dp_secrets_leak_and_the_audit_proves_it(non_dp):
    res = json.loads((non_dp / "results.json").read_text())
    assert res["dp"] is False and res["claimed_epsilon"] is None and res["consistent"]
    assert res["m"] == M and res["confidence"] == 0.95 and res["delta"] == 1e-6
    assert res["epsilon_lower_bound"] > 1.0, res
    # The headline is the larger of ours and jax-privacy's one-run bound; its f-DP bound beside.
    bounds = res["bounds"]
    assert set(bounds) == {"dpbert_steinke", "jax_privacy_one_run", "jax_privacy_fdp"}
    assert res["epsilon_lower_bound"] == bounds[res["headline_bound"]]["epsilon_lower_bound"] \
        == max(b["epsilon_lower_bound"] for b in bounds.values() if b["in_headline"])
    # The audit's secrets stay in its private folder; the training workdir never sees the
    # excluded canaries or the inclusion bits.
    private = json.loads((non_dp / "private" / audit.AUDIT_FILE).read_text())
    included = np.asarray(private["included"])
    planted = json.loads((non_dp / "private" / audit.PLANT_FILE).read_text())["canaries"]
    audit_ids = [c["canary_id"] for c in planted if c["form"] == "audit"]
    assert len(audit_ids) == included.sum()
    record = next((non_dp / "train" / "data" / "instances").glob("*/canaries.json"))
    excluded = {c["canary_id"] for c, i in zip(private["canaries"], included) if not i}
    assert not excluded & {c["canary_id"] for c in json.loads(record.read_text())["canaries"]}
    assert "included" not in res and "scores" not in res


@pytest.mark.slow
def test_dp_keeps_exposure_at_the_floor_and_the_audit_below_the_claim(non_dp, dp, tmp_path):
    res = json.loads((dp / "results.json").read_text())
    assert res["dp"] and res["claimed_epsilon"] <= 1.0 + 1e-6
    assert 0.0 <= res["epsilon_lower_bound"] <= res["claimed_epsilon"] and res["consistent"]
    assert all(b["epsilon_lower_bound"] <= res["claimed_epsilon"] for b in res["bounds"].values())
    # Exposure of both runs in one figure (the CLI).
    out = tmp_path / "exposure"
    run([REPO / "launch" / "exposure.py", f"--workdir={non_dp / 'train'}",
         f"--compare={dp / 'train'}", "--labels=non_dp,dp", f"--out={out}"])
    assert (out / "exposure.png").stat().st_size > 10_000
    result = json.loads((out / "results.json").read_text())
    runs = {r["label"]: r for r in result["runs"]}
    assert runs["dp"]["dp"] and runs["dp"]["epsilon"] == pytest.approx(res["claimed_epsilon"])
    floor = runs["non_dp"]["floor_theory"]
    assert floor == pytest.approx(1 / math.log(2), abs=0.02)

    def exposures(label, reps):
        return np.asarray([r["exposure"] for r in result["canaries"]
                           if r["run"] == label and r["repetitions"] == reps])

    assert all(r["form"] != "audit" for r in result["canaries"])
    ref, top = exposures("non_dp", 0), exposures("non_dp", 100)
    assert len(ref) == len(top) == 9
    # Without DP: far above the floor and above the reference canaries.
    assert top.mean() > floor + 1.5, top
    assert stats.mannwhitneyu(top, ref, alternative="greater").pvalue < 0.01
    # With DP: within the floor's noise, and below the non-DP run.
    dp_top = exposures("dp", 100)
    assert abs(dp_top.mean() - floor) < 4 * 1.44 / math.sqrt(len(dp_top)), dp_top
    assert stats.mannwhitneyu(dp_top, top, alternative="less").pvalue < 0.05
    summary = [s for s in result["summary"] if s["run"] == "non_dp"]
    assert {(s["form"], s["repetitions"]) for s in summary} == {
        (f, n) for f in ("HS", "HSH", "HHSHH") for n in (0, 100)}


def test_a_refused_audit_config_writes_nothing(tmp_path):
    from dpbert.errors import ConfigError  # noqa: PLC0415

    config = demo_dp.get_config()
    config.train.num_steps = 0
    out = tmp_path / "audit"
    with pytest.raises(ConfigError, match="train.num_steps"):
        audit.run_audit(config, out, m=8)
    assert not out.exists()
