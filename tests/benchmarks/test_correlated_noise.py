"""benchmarks/correlated_noise.py: what it runs per mechanism and the figures it reads from a
finished run (its runs take minutes each: the benchmark itself is run by hand, BENCHMARKS.md
"Correlated noise")."""

import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import correlated_noise  # noqa: E402


def test_mechanisms_become_the_product_overrides():
    assert correlated_noise.mechanism_args("dpsgd") == (
        "dpsgd", 1, ["--config.dp.mechanism=dpsgd"])
    assert correlated_noise.mechanism_args("bandmf:4") == (
        "bandmf", 4, ["--config.dp.mechanism=bandmf", "--config.dp.num_bands=4"])
    for bad in ("bandmf", "bandmf:0", "bandmf:x", "dpsgd:2", "blt"):
        with pytest.raises(SystemExit, match="--mechanisms"):
            correlated_noise.mechanism_args(bad)


def test_figures_of_a_finished_run(tmp_path):
    metrics = [{"step": 0, "eval/mlm_accuracy": 0.0},
               {"step": 25, "perf/step_time": 9.0},      # the first interval holds the compile
               {"step": 50, "perf/step_time": 0.5}, {"step": 75, "perf/step_time": 0.7},
               {"step": 75, "eval/mlm_accuracy": 0.25}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in metrics))
    (tmp_path / "privacy_report.json").write_text(json.dumps(
        {"training": {"noise_multiplier": 0.6, "epsilon": 2.9}}))
    (tmp_path / "run.json").write_text(json.dumps({"trainable": {"parameters": 2 ** 18}}))
    log = tmp_path / "run.log"
    log.write_text("train step compiled in 2 s: arguments 3.1 MiB, temporaries 268.7 MiB\n")
    row = correlated_noise.figures(tmp_path, log, bands=4)
    assert row == {"sigma": 0.6, "epsilon": 2.9, "held_out": 0.25, "step_seconds": 0.6,
                   "temp_mib": 268.7, "trainable": 2 ** 18, "buffers_mib": 3.0}
    # A fine-tuning run (--task=rt): the held-out figure is results.json's dev accuracy.
    (tmp_path / "results.json").write_text(json.dumps({"eval_accuracy": 0.7}))
    assert correlated_noise.figures(tmp_path, log, bands=4)["held_out"] == 0.7


def test_rt_runs_are_the_fine_tuning_launcher_with_the_overrides_last(tmp_path, monkeypatch):
    from absl import flags

    monkeypatch.setenv("DPBERT_MINILM", str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    flags.FLAGS(["correlated_noise", "--task=rt", "--steps=500", "--target_epsilon=3"])
    try:
        cmd = correlated_noise.rt_command(tmp_path / "w", tmp_path, [
            "--config.dp.mechanism=bandmf", "--config.optimizer.learning_rate=0.5"])
    finally:
        flags.FLAGS.unparse_flags()
    assert cmd[1] == "launch/finetune.py"
    args = dict(a.partition("=")[::2] for a in cmd[2:])
    assert args["--config.train.trainable"] == "head" and args["--config.dp.enabled"] == "True"
    assert args["--config.optimizer.name"] == "sgd" and args["--config.dp.mechanism"] == "bandmf"
    assert args["--config.optimizer.learning_rate"] == "0.5"            # the override wins
    assert float(args["--config.train.epochs"]) == pytest.approx(500 * 256 / 8454, abs=1e-4)
    assert args["--config.dp.target_epsilon"] == "3.0"
    assert args["--config.train.prefix_cache_dir"] == str(tmp_path / "prefix")
    assert len(cmd) == 2 + len(args)  # each flag once
