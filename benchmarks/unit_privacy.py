r"""The price of the stronger unit: DP-SGD per training sequence vs per patient, at equal ε.

    PYTHONPATH=. python benchmarks/unit_privacy.py [--notes=6000] [--steps=150] [--epsilon=4]
        [--k=4] [--out=/tmp/dpbert_units] [--write]

Runs of one tiny-BERT config on synthetic clinical notes (`data_pipelines.synthetic_notes`, about
3 notes per patient, so --notes=6000 gives ~2000 patients), each with σ calibrated so that
--steps steps spend exactly --epsilon at δ = 1e-6, the same fixed word vocabulary, learning rate,
clip norm and number of sequence slots per step (96):

    example       the per-sequence unit: 64 expected sequences per logical batch
    patient mean  per patient, 16 expected patients per batch, at most K sequences each, the
                  unit's loss the MEAN of its sequences' (dp.unit_loss="mean")
    patient sum   the same with the SUM of its sequences' losses
    patient K=1   per patient, 64 expected patients per batch, one sequence each

Held-out patients (5 %, whole patients) give the MLM accuracy at the end; step time is the
median of the logged intervals (compilation excluded). The table also states what the
per-sequence ε means for a whole patient: group privacy over the most sequences one patient has.
Writes the section "Privacy unit: per sequence vs per patient" of BENCHMARKS.md (--write).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402

_NOTES = flags.DEFINE_integer("notes", 6000, "Synthetic notes (about 3 per patient).")
_STEPS = flags.DEFINE_integer("steps", 150, "Training steps of every run.")
_EPSILON = flags.DEFINE_float("epsilon", 4.0, "ε of every run (δ = 1e-6), σ calibrated.")
_K = flags.DEFINE_integer("k", 4, "dp.max_examples_per_unit of the patient runs.")
_RUNS = flags.DEFINE_list("runs", ["example", "patient_mean", "patient_sum", "patient_k1"],
                          "Which runs.")
_OUT = flags.DEFINE_string("out", "/tmp/dpbert_units", "Working folder of the runs.")
_WRITE = flags.DEFINE_bool("write", False, "Update BENCHMARKS.md with the result.")

SLOTS = 96  # sequence slots per step in every run (one jitted call)


def make_config(vocab_file: str, cache_dir: str, run: str):
    from configs import demo_dp  # noqa: PLC0415

    c = demo_dp.get_config()
    c.vocab.file = vocab_file
    c.data.synthetic_num_notes = _NOTES.value
    c.data.cache_dir = cache_dir
    c.data.eval_fraction = 0.05
    c.data.eval_split_unit = "subject"  # the same held-out patients in every run
    c.data.max_seq_length = 32
    c.data.max_predictions_per_seq = 5
    c.model.max_position_embeddings = 32
    c.dp.delta = 1e-6
    c.dp.noise_multiplier = None
    c.dp.target_epsilon = _EPSILON.value
    c.dp.overflow_probability = 1e-3
    k = 1 if run == "patient_k1" else _K.value
    if run == "example":
        c.batch.expected_batch_size, c.batch.physical_batch_size = 64, SLOTS
    else:
        c.dp.privacy_unit = "patient"
        c.dp.max_examples_per_unit = k
        c.dp.unit_loss = "sum" if run == "patient_sum" else "mean"
        c.batch.expected_batch_size = 64 // k
        c.batch.physical_batch_size = SLOTS // k
    c.batch.microbatch_size = c.batch.physical_batch_size
    c.train.num_steps = _STEPS.value
    c.train.log_every = max(_STEPS.value // 10, 1)
    c.train.eval_every = 0  # held-out numbers at the end
    c.train.eval_batches = 16
    c.train.eval_batch_size = 128
    c.optimizer.learning_rate = 2e-3
    c.optimizer.warmup_steps = 10
    c.checkpoint.every_steps = 0
    c.train.export_hf = False
    return c


def word_vocab(path) -> str:
    """The tests' deterministic word vocabulary of 600 synthetic notes (public: other notes)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.data_pipelines import conftest  # noqa: PLC0415

    class Factory:
        def mktemp(self, name):
            path.mkdir(parents=True, exist_ok=True)
            return path

    return str(conftest.notes_vocab.__wrapped__(Factory()))


def main(argv):
    del argv
    import json  # noqa: PLC0415
    import pathlib  # noqa: PLC0415
    import platform  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from dpbert.tasks import pretraining  # noqa: PLC0415

    out = pathlib.Path(_OUT.value)
    vocab = word_vocab(out / "vocab")
    results = {}
    for run in _RUNS.value:
        workdir = out / run
        shutil.rmtree(workdir, ignore_errors=True)
        config = make_config(vocab, str(out / "instances"), run)
        report = pretraining.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
        lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
        times = [x["perf/step_time"] for x in lines if "perf/step_time" in x]
        evals = [x for x in lines if "eval/mlm_accuracy" in x]
        results[run] = {"report": report, "step_time": float(np.median(times[1:] or times)),
                        "accuracy": evals[-1]["eval/mlm_accuracy"], "config": config}
        print(run, results[run]["step_time"], results[run]["accuracy"], flush=True)
    names = {"example": "per sequence", "patient_mean": f"per patient, K={_K.value}, mean",
             "patient_sum": f"per patient, K={_K.value}, sum", "patient_k1": "per patient, K=1"}
    rows = []
    mult = None
    for run, r in results.items():
        t, c = r["report"]["training"], r["config"]
        mult = mult or r["report"].get("unit_multiplicity")
        units = "sequences" if run == "example" else "patients"
        rows.append(
            f"| {names[run]} | {t['num_examples']} {units} | {c.batch.expected_batch_size:g} | "
            f"{t['noise_multiplier']:.3f} | {t['epsilon']:.3f} | {r['accuracy']:.3f} | "
            f"{r['step_time']:.2f} |")
    per_patient = (mult or {}).get("subject", {})
    text = f"""## Privacy unit: per sequence vs per patient

`PYTHONPATH=. python benchmarks/unit_privacy.py --notes={_NOTES.value} --steps={_STEPS.value} \
--epsilon={_EPSILON.value} --k={_K.value} --write`
on {platform.machine()}, {os.cpu_count()} CPU cores, JAX {jax.__version__} on 1 x cpu, load
average {os.getloadavg()[0]:.1f} at the end (shared machine: step times are comparable within
the table only). Tiny BERT, {_NOTES.value} synthetic notes (seq 32, 5 % of the patients held
out), a fixed word vocabulary, {_STEPS.value} steps, C = 1, learning rate 2e-3, {SLOTS} sequence
slots per step in every run; σ calibrated so that each run spends ε = {_EPSILON.value} at
δ = 1e-6 with respect to ITS unit. Scaled down from the issue's "thousands of patients" to what
2 busy CPU cores run in minutes.

| run | N (the accountant's) | expected batch | σ | ε | held-out MLM acc. | s / step |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

* The per-sequence ε protects one sequence. One patient of this corpus is in up to
  {per_patient.get('max', '?')} training sequences (mean {per_patient.get('mean', 0):.3g}), so
  for a whole patient it means only group privacy at k = {per_patient.get('max', '?')}
  (ε·k = {_EPSILON.value * per_patient.get('max', 0):.0f}): no guarantee. The per-patient runs
  give ε = {_EPSILON.value} for the whole patient.
* mean vs sum: with the mean a patient's gradient is the average of its (at most K) sequences'
  and is clipped like one sequence's; with the sum it is K times larger before clipping, so
  nearly every patient is clipped to C and patients with more sequences get no more weight
  than the clip allows. dpbert's default is the mean (dp.unit_loss).
"""
    print(text)
    if _WRITE.value:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bench_report  # noqa: PLC0415

        bench_report.write_section("## Privacy unit: per sequence vs per patient", text)


if __name__ == "__main__":
    app.run(main)
