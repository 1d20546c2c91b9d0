"""Own corpus, one command (issue 36): configs/own_corpus.py's preconditions are checked before
anything is built (dpbert.tasks.preflight), each refusal names the flag to change, and the
command runs first time on the NOTEEVENTS sample per patient."""

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from configs import own_corpus
from data_pipelines import synthetic_notes
from dpbert.errors import ConfigError
from dpbert.runtime import loop
from dpbert.tasks import preflight, pretraining

REPO = pathlib.Path(__file__).resolve().parents[3]


def _notes(tmp_path, n, name="notes.csv.gz"):
    path = tmp_path / name
    synthetic_notes.write_noteevents_csv(path, synthetic_notes.generate_synthetic(n, seed=3))
    return path


def _check(config, workdir):
    loop.validate(pretraining.TASK, config)   # what the launcher runs first
    preflight.check(config, config.data, workdir)


def test_too_few_patients_for_a_dp_vocabulary_is_refused_before_it_is_built(tmp_path):
    c = own_corpus.get_config(f"path={_notes(tmp_path, 60)},unit=patient")
    with pytest.raises(ConfigError, match=r"^--config.vocab.epsilon=8.0: too few patients "
                                          r"\(SUBJECT_IDs\) for a useful DP vocabulary: .* has "
                                          r"\d+; a word survives only if about 91 of them") as e:
        _check(c, tmp_path / "w")
    assert "--config.vocab.file=PATH/vocab.txt" in str(e.value)
    assert not (tmp_path / "w").exists()   # nothing written, nothing spent
    # per note the same file has three times the records, but still too few
    c = own_corpus.get_config(f"path={_notes(tmp_path, 60)},unit=note")
    with pytest.raises(ConfigError, match=r"too few notes \(rows\) for a useful DP vocabulary"):
        _check(c, tmp_path / "w")


def test_a_public_vocabulary_skips_the_vocabulary_check_and_the_batch_is_checked(tmp_path):
    c = own_corpus.get_config(f"path={_notes(tmp_path, 60)},unit=patient")
    c.vocab.file = str(tmp_path / "public_vocab.txt")   # read later, by prepare_vocab
    c.batch.expected_batch_size = c.batch.physical_batch_size = 64
    c.batch.microbatch_size = 8
    with pytest.raises(ConfigError, match=r"config.batch.expected_batch_size=64: exceeds the "
                                          r"\d+ patients of the corpus .* use "
                                          r"--config.batch.expected_batch_size=\d+ or less"):
        _check(c, tmp_path / "w")
    c.batch.expected_batch_size = 8
    _check(c, tmp_path / "w")   # fits: sigma is calibrated, so no budget can refuse


def test_a_malformed_file_is_refused_before_anything_is_built(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("ROW_ID,SUBJECT_ID,TEXT\n1,2\n")
    c = own_corpus.get_config(f"path={bad},unit=patient")
    with pytest.raises(ConfigError, match=r"config.data.paths=.*bad.csv"):
        _check(c, tmp_path / "w")


def test_a_resumed_run_is_not_checked_again(tmp_path):
    c = own_corpus.get_config(f"path={_notes(tmp_path, 60)},unit=patient")
    (tmp_path / "w" / "vocab").mkdir(parents=True)
    (tmp_path / "w" / "vocab" / "vocab.txt").write_text("[PAD]\n")
    _check(c, tmp_path / "w")   # the vocabulary exists: nothing to refuse any more


@pytest.mark.slow  # the plan's PLD accounting (sigma 2, not 0.5: several times cheaper)
def test_a_budget_no_step_fits_is_refused_with_the_fixes_before_anything_is_built(tmp_path):
    c = own_corpus.get_config(f"path={_notes(tmp_path, 300)},unit=patient")
    c.vocab.file = str(tmp_path / "public_vocab.txt")
    c.dp.noise_multiplier, c.dp.target_epsilon, c.train.num_steps = 2.0, 0.25, 10
    with pytest.raises(ConfigError, match=r"config.dp.target_epsilon=0.25: not even one step "
                                          r"fits .* dp.noise_multiplier=[\d.]+ \(what "
                                          r"train.num_steps=10 steps need.*checked before "
                                          r"anything is built, with N = the \d+ patients"):
        _check(c, tmp_path / "w")


def _train(*args, timeout=900):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "launch/train.py", *args], cwd=REPO,
                         env=dict(env, PYTHONPATH=str(REPO)), capture_output=True, text=True,
                         timeout=timeout)
    return out, time.perf_counter() - start


@pytest.mark.slow
def test_the_launcher_refuses_a_small_corpus_in_one_line(tmp_path):
    out, _ = _train(f"--config=configs/own_corpus.py:path={_notes(tmp_path, 60)},unit=patient",
                    f"--workdir={tmp_path / 'w'}", timeout=300)
    assert out.returncode == 1, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("train: --config.vocab.epsilon=8.0: too few patients"), last
    assert not (tmp_path / "w" / "vocab").exists()


@pytest.mark.slow
@pytest.mark.shared_data
def test_own_corpus_runs_first_time_on_the_noteevents_sample_per_patient(shared_data, tmp_path):
    """The issue's acceptance command, shortened to 4 steps: the defaults, nothing else."""
    path = shared_data / "clinical" / "NOTEEVENTS_sample.csv.gz"
    workdir = tmp_path / "w"
    out, seconds = _train(f"--config=configs/own_corpus.py:path={path},unit=patient",
                          f"--workdir={workdir}", "--config.train.num_steps=4",
                          "--config.train.log_every=2")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "preflight: counting the patients (SUBJECT_IDs)" in out.stdout
    assert "282 patients (SUBJECT_IDs), 3.1 x the DP vocabulary's threshold" in out.stdout
    report = json.loads((workdir / "privacy_report.json").read_text())
    assert report["privacy_unit"] == "patient"
    assert report["vocabulary"]["unit"] == "patient"
    assert report["training"]["epsilon"] <= 8.0 + 1e-9   # sigma calibrated to the target
    assert report["epsilon"] == pytest.approx(report["training"]["epsilon"] + 8.0)
    config = json.loads((workdir / "config.json").read_text())
    assert config["data"]["eval_split_unit"] == "subject"
    assert (workdir / "hf" / "README.md").is_file()
    print(f"own corpus, 4 steps: {seconds:.0f} s")
