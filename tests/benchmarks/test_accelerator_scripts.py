"""The prepared device scripts (benchmarks/accelerator/*.sh): they parse, share common.sh, and
collect.py reads what their parts leave. Their --smoke runs take minutes: they are run by hand
(BENCHMARKS.md, "At accelerator scale: prepared runs"), not here."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ACC = ROOT / "benchmarks" / "accelerator"
SCRIPTS = ("speed.sh", "dp_pretraining.sh", "dp_finetune_full.sh", "texthide.sh",
           "privacy_adaptive.sh")

sys.path.insert(0, str(ACC))
import collect  # noqa: E402


@pytest.mark.parametrize("name", SCRIPTS + ("common.sh", "fetch_wheels.sh"))
def test_scripts_parse(name):
    subprocess.run(["bash", "-n", str(ACC / name)], check=True)


@pytest.mark.parametrize("name", SCRIPTS)
def test_scripts_share_common_and_smoke(name):
    text = (ACC / name).read_text()
    assert "source benchmarks/accelerator/common.sh" in text
    assert f"acc_init {name[:-3]} " in text      # $OUT/NAME.json
    assert "--smoke" in text and "acc_done" in text
    assert "Estimated time" in text or name == "speed.sh"


def test_combine_reads_parts(tmp_path):
    (tmp_path / "a.meta.json").write_text('{"rc": 0, "seconds": 3, "limit_s": 60}')
    (tmp_path / "a.out").write_text('progress line\n{"x": 1}\n')
    (tmp_path / "a.log").write_text("log")
    (tmp_path / "b.meta.json").write_text('{"rc": null, "skipped": "budget", "seconds": 0, '
                                          '"limit_s": 0}')
    out = collect.combine(str(tmp_path))
    assert out["a"]["result"] == {"x": 1} and out["a"]["log_tail"] == "log"
    assert out["b"]["skipped"] == "budget" and out["b"]["result"] == []


def test_finetune_reads_results(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({
        "eval_accuracy": 0.8, "wall_seconds": 12.0,
        "privacy": {"dp_sgd": {"training": {"epsilon": 8.0, "noise_multiplier": 1.0}}},
        "schedule": {"expected_batch_size": 1024, "epochs": 5.0},
        "trainable": {"spec": "all", "parameters": 1024 ** 2}}))
    row = collect.finetune(str(tmp_path))
    assert row["eval_accuracy"] == 0.8 and row["epsilon"] == 8.0
    assert row["noise_to_signal"] == pytest.approx(1.0)   # σ √d / B = 1 · 1024 / 1024
