"""Issue 36 on the pretraining loop: dp.total_epsilon (one budget for the DP vocabulary and the
training), a finished run rerun exits at once with its summary, and a privacy-adaptive export
keeps its dχ settings on its card and report."""

import json

import pytest

from dpbert.errors import ConfigError
from dpbert.reporting import report as report_lib
from dpbert.runtime import saved_run
from dpbert.tasks import pretraining as train
from tests.dpbert.tasks.test_pretraining import small_config

BUDGET = {"dp.noise_multiplier": None, "dp.target_epsilon": None, "dp.total_epsilon": 9.0,
          "train.num_steps": 4}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("budget_cache")


@pytest.fixture(scope="module")
def budget_run(cache_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("budget") / "run"
    return workdir, train.train_and_evaluate(small_config(cache_dir, **BUDGET), workdir)


@pytest.mark.slow
def test_the_total_budget_covers_vocabulary_and_training(budget_run):
    """The headline total (vocabulary under the training's unit + training, by the project's
    accountant) is at most dp.total_epsilon and close to it: sigma was calibrated to what the
    vocabulary leaves."""
    workdir, report = budget_run
    vocab, training, budget = report["vocabulary"], report["training"], report["budget"]
    assert vocab["relation"] == "replace" and vocab["epsilon"] > vocab["vocabulary_epsilon"]
    assert budget["total_epsilon"] == 9.0 and budget["other_parts_epsilon"] == vocab["epsilon"]
    assert training["target_epsilon"] == budget["training_target_epsilon"]
    assert budget["training_target_epsilon"] == pytest.approx(9.0 - vocab["epsilon"])
    assert report["epsilon"] == pytest.approx(vocab["epsilon"] + training["epsilon"])
    assert 9.0 * (1 - 2e-3) <= report["epsilon"] <= 9.0
    # The shipped report keeps the budget and its rule.
    shipped = json.loads((workdir / "hf" / "privacy_report.json").read_text())
    assert shipped["budget"] == json.loads(json.dumps(budget))
    assert "dp.total_epsilon" in shipped["budget"]["rule"]
    assert "- Budget (dp.total_epsilon): total epsilon <= 9;" in (
        workdir / "hf" / "README.md").read_text()


@pytest.mark.slow
def test_a_finished_run_rerun_exits_at_once_with_its_summary(budget_run, cache_dir, capsys,
                                                            monkeypatch):
    workdir, report = budget_run
    capsys.readouterr()

    def no_data(*args, **kwargs):
        raise AssertionError("a finished run prepared its data again")

    monkeypatch.setattr(train.TASK, "prepare", no_data)
    again = train.train_and_evaluate(small_config(cache_dir, **BUDGET), workdir)
    assert again == json.loads((workdir / "privacy_report.json").read_text())
    assert again["epsilon"] == report["epsilon"]
    out = capsys.readouterr().out
    assert "finished at step 4" in out and "nothing to train" in out
    (summary,) = [line for line in out.splitlines() if line.startswith("done: 4 steps")]
    assert "held-out mlm accuracy" in summary and "training epsilon" in summary
    # More steps, or another budget, is not finished: that run goes on (and prepares its data).
    meta = {"step": 4, "privacy_report": report}
    more = small_config(cache_dir, **{**BUDGET, "train.num_steps": 8})
    assert saved_run.finished(workdir, more, meta) is None
    assert saved_run.finished(workdir, small_config(cache_dir, **BUDGET), meta) is not None
    stopped = {**report, "training": {**report["training"], "stopped_by_budget": True}}
    other = small_config(cache_dir, **{**BUDGET, "train.num_steps": 8, "dp.total_epsilon": 10.0})
    assert saved_run.finished(workdir, other, {"step": 4, "privacy_report": stopped}) is None


@pytest.mark.parametrize("overrides,match", [
    # The vocabulary (epsilon 2 per note) costs about 6 under replace-2 (one sequence).
    ({"dp.total_epsilon": 3.0}, r"total_epsilon=3.0: the vocabulary alone spends it"),
    ({"dp.total_epsilon": 9.0, "dp.target_epsilon": 5.0},
     r"total_epsilon=9.0 and config.dp.target_epsilon=5.0 disagree.* Set only one"),
])
def test_a_budget_the_vocabulary_does_not_leave_is_one_clear_error(cache_dir, tmp_path,
                                                                  overrides, match):
    with pytest.raises(ConfigError, match=match):
        train.train_and_evaluate(small_config(cache_dir, **{**BUDGET, **overrides}),
                                 tmp_path / "bad")
    assert not (tmp_path / "bad" / "checkpoints").exists() or not any(
        (tmp_path / "bad" / "checkpoints").iterdir())


@pytest.mark.parametrize("overrides,match", [
    ({"dp.total_epsilon": 2.0, "dp.target_epsilon": 3.0},
     r"dp.total_epsilon=2.0: is the budget of the vocabulary AND the training"),
    ({"dp.total_epsilon": 0.0}, r"dp.total_epsilon=0.0: must be a positive"),
    ({"dp.enabled": False, "batch.expected_batch_size": 16},
     r"dp.total_epsilon=9.0: budgets DP-SGD training"),
])
def test_inconsistent_budgets_are_refused_before_any_data(cache_dir, tmp_path, overrides,
                                                         match):
    with pytest.raises(ConfigError, match=match):
        train.train_and_evaluate(small_config(cache_dir, **{**BUDGET, **overrides}),
                                 tmp_path / "bad")
    assert not (tmp_path / "bad" / "vocab").exists()


def test_the_budget_rule_on_the_reports_parts():
    """`training_budget` is the total minus every other part of the report's total: this run's
    vocabulary (under the training's unit), not a vocabulary read from public data."""
    vocab = {"stage": "vocabulary", "read_private_data": True, "epsilon": 2.5, "delta": 1e-6,
             "private": True}
    target, budget = report_lib.training_budget(4.0, None, vocab)
    assert target == pytest.approx(1.5) and 2.5 + target <= 4.0
    assert report_lib.training_budget(4.0, 1.0, vocab)[0] == 1.0
    public = {"stage": "vocabulary", "read_private_data": False, "epsilon": 0.0, "delta": 0.0}
    assert report_lib.training_budget(4.0, None, public)[0] == 4.0
    with pytest.raises(ConfigError, match="no total can be guaranteed"):
        report_lib.training_budget(4.0, None, {**vocab, "epsilon": None, "why": "no DP"})


def test_a_folder_whose_model_is_in_hf_gets_the_hint(cache_dir, tmp_path):
    """`init_from_hf=runs/demo` (a folder holding the export in hf/) said only "no vocab.txt"."""
    (tmp_path / "demo" / "hf").mkdir(parents=True)
    (tmp_path / "demo" / "hf" / "vocab.txt").write_text("[PAD]\n")
    c = small_config(cache_dir, **{"model.init_from_hf": str(tmp_path / "demo")})
    with pytest.raises(ConfigError, match=r"has no vocab.txt; its model is probably .*demo/hf "
                                          r"\(--config.model.init_from_hf=.*demo/hf\)"):
        train.prepare_vocab(c, c.data, tmp_path / "work")


def test_the_small_vocabulary_warning_names_the_runs_config_fields():
    """A vocabulary the run builds is tuned by --config.vocab.epsilon / --config.vocab.size,
    not by launch/build_vocab.py's --epsilon (which the warning used to name)."""
    import inspect

    from data_pipelines import dp_vocab

    (msg,) = dp_vocab._check_learned(1, 1, 200, 50, None, 0,  # noqa: SLF001
                                     ("--config.vocab.epsilon", "--config.vocab.size"))
    assert "a larger --config.vocab.epsilon or a smaller --config.vocab.size" in msg
    assert 'knobs=("--config.vocab.epsilon", "--config.vocab.size")' in inspect.getsource(
        train.prepare_vocab)


def test_the_held_out_split_of_a_patient_run_is_checked_before_the_vocabulary(cache_dir,
                                                                              tmp_path):
    c = small_config(cache_dir, **{"dp.privacy_unit": "patient", "dp.clipping": "vmap",
                                   "data.eval_split_unit": "document"})
    with pytest.raises(ConfigError, match=r"config.data.eval_split_unit='document': "
                                          r"privacy_unit='patient' holds out whole patients"):
        train.train_and_evaluate(c, tmp_path / "run")
    assert not (tmp_path / "run" / "vocab").exists()
