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


def test_part_keeps_the_launchers_logs_of_a_failed_part(tmp_path):
    """common.sh: a part that fails (or times out) leaves the tail of the logs its launchers wrote in
    $WORK (removed by acc_done) in its own log, hence in NAME.json."""
    script = tmp_path / "t.sh"
    script.write_text(
        f"set -u; cd {ROOT}\nsource benchmarks/accelerator/common.sh\n"
        "acc_init tcommon '' 60 60\n"
        "part slow 15 bash -c 'mkdir -p $WORK/runs; echo launcher-said-this > $WORK/runs/x.log;"
        " exit 3'\nacc_done\n")
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "PYTHON": sys.executable,
           "HOME": str(tmp_path)}
    subprocess.run(["bash", str(script)], check=True, env=env, capture_output=True)
    part = json.loads((tmp_path / "out" / "tcommon.json").read_text())["slow"]
    assert part["rc"] == 3
    assert "runs/x.log" in part["log_tail"] and "launcher-said-this" in part["log_tail"]


def test_the_end_names_the_failed_parts_and_a_python_without_jax_stops_at_once(tmp_path):
    """common.sh: acc_done says which parts failed (a smoke run from a shell without the
    project's environment failed every part with rc 1 and ended "done"); acc_init refuses an
    interpreter that cannot import jax, with one line saying what to do, before any part."""
    script = tmp_path / "t.sh"
    script.write_text(
        f"set -u; cd {ROOT}\nsource benchmarks/accelerator/common.sh\n"
        "acc_init tcommon '' 60 60\n"
        "part good 15 true\npart bad 15 bash -c 'exit 4'\nacc_done\n")
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "PYTHON": sys.executable,
           "HOME": str(tmp_path)}
    out = subprocess.run(["bash", str(script)], check=True, env=env, capture_output=True,
                         text=True).stdout
    assert "parts that failed: bad (rc 4)" in out, out
    env["OUT"] = str(tmp_path / "out2")
    no_jax = subprocess.run(["bash", str(script)], check=False, capture_output=True, text=True,
                            env=dict(env, PYTHON="false"))
    assert no_jax.returncode == 1
    assert "false cannot import jax and absl" in no_jax.stdout, no_jax.stdout
    assert "start good" not in no_jax.stdout


def test_run_logged_keeps_the_callers_pythonpath(tmp_path, monkeypatch):
    """Packages installed beside the environment (the device scripts' /tmp/site) reach the
    launchers that the benchmarks start (a device run lost ml_collections without it)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_report  # noqa: PLC0415

    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    log = tmp_path / "run.log"
    bench_report.run_logged([sys.executable, "-c", "import os; print(os.environ['PYTHONPATH'])"],
                            log)
    paths = log.read_text().strip().split(":")
    assert paths == [str(ROOT), str(tmp_path / "site")]


@pytest.mark.parametrize("name", ("dp_pretraining.sh", "dp_finetune_full.sh", "texthide.sh",
                                  "privacy_adaptive.sh"))
def test_minilm_scripts_smoke_a_tiny_stand_in(name):
    """Their --smoke trains a tiny stand-in (collect.py tiny_minilm): with MiniLM itself the DP
    cells never ran in a CPU smoke's budget."""
    lines = (ACC / name).read_text().splitlines()
    assert lines[lines.index(next(x for x in lines if x.startswith("acc_init "))) + 1] \
        == "acc_smoke_model"


def test_the_stand_in_is_what_the_benchmarks_load(tmp_path, monkeypatch, minilm_dir):
    """collect.py tiny_minilm writes a HF folder with MiniLM's vocabulary that dpbert loads as a
    starting model, and bench_report.minilm() returns it under DPBERT_MINILM (and refuses a
    folder that is not one)."""
    from dpbert.models import hf  # noqa: PLC0415

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_report  # noqa: PLC0415

    folder = tmp_path / "tiny"
    collect.tiny_minilm(str(folder))
    assert (folder / "vocab.txt").read_bytes() == (minilm_dir / "vocab.txt").read_bytes()
    _, config = hf.load_pretrained(folder)
    assert config.vocab_size == 30522 and config.hidden_size == 64
    monkeypatch.setenv("DPBERT_MINILM", str(folder))
    assert bench_report.minilm() == folder
    monkeypatch.setenv("DPBERT_MINILM", str(tmp_path))
    with pytest.raises(SystemExit, match="no config.json"):
        bench_report.minilm()
