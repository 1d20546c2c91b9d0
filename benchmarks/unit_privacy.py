r"""The price of the stronger unit: DP-SGD per training sequence vs per patient, at equal ε.

    PYTHONPATH=. python benchmarks/unit_privacy.py [--notes=6000] [--steps=100] [--epsilon=4]
        [--k=4] [--out=/tmp/dpbert_units] [--write]

Runs of one tiny-BERT config on synthetic clinical notes (`data_pipelines.synthetic_notes`, about
3 notes per patient, so --notes=6000 gives ~2000 patients), each with σ calibrated so that
--steps steps spend exactly --epsilon at δ = 1e-6 (PLD accountant) with respect to ITS unit, the
same fixed word vocabulary, learning rate, clip norm and 64 expected sequences per step:

    example       the per-sequence unit: 64 expected sequences per logical batch
    patient mean  per patient, 64/K expected patients per batch, at most K sequences each, the
                  unit's loss the MEAN of its sequences' (dp.unit_loss="mean", the default)
    patient sum   the same with the SUM of its sequences' losses
    patient K=1   per patient, 64 expected patients per batch, one sequence each

Every run takes one jitted call per step (the physical batch holds the Poisson capacity), so
the per-patient runs with K > 1 carry more (padding) slots per call. Held-out patients (5 %,
whole patients) give the MLM accuracy at the end; step time is the median of the logged
intervals (compilation excluded). For the per-patient runs the script also measures, at the
final parameters, each unit's gradient norm before clipping under the mean and under the sum,
and how many units C clips. The text states what the per-sequence ε means for a whole patient:
group privacy over the most sequences one patient has. --write puts the section
"Privacy unit: per sequence vs per patient" (or --section) into BENCHMARKS.md. Measured on 2
shared CPU cores: the defaults (4 runs of 100 steps) 17 minutes with a test suite beside them,
3 runs of 300 steps 17 minutes; a run costs about 1.5 minutes (data, PLD calibration,
compilation) plus 0.5-0.9 s per step. `--runs=example,patient_mean --steps=40` takes ~5.
"""

from __future__ import annotations

import math
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402

_NOTES = flags.DEFINE_integer("notes", 6000, "Synthetic notes (about 3 per patient).")
_STEPS = flags.DEFINE_integer("steps", 100, "Training steps of every run.")
_EPSILON = flags.DEFINE_float("epsilon", 4.0, "ε of every run (δ = 1e-6), σ calibrated.")
_K = flags.DEFINE_integer("k", 4, "dp.max_examples_per_unit of the patient runs.")
_RUNS = flags.DEFINE_list("runs", ["example", "patient_mean", "patient_sum", "patient_k1"],
                          "Which runs.")
_OUT = flags.DEFINE_string("out", "/tmp/dpbert_units", "Working folder of the runs.")
_WRITE = flags.DEFINE_bool("write", False, "Update BENCHMARKS.md with the result.")
_SECTION = flags.DEFINE_string("section", "Privacy unit: per sequence vs per patient",
                               "The BENCHMARKS.md section (## heading) that --write replaces.")

SEQUENCES = 64  # expected sequences per step: 64 sequences, 64 / K patients


def capacity(expected: int) -> int:
    """Rows of the one jitted call per step: Poisson(expected) exceeds it with probability
    below 1e-3 (the overflow the config allows), rounded up to a multiple of 8."""
    rows = expected + 4 * math.sqrt(expected) + 4
    return int(math.ceil(rows / 8) * 8)


def make_config(vocab_file: str, cache_dir: str, run: str, sigma: float | None = None):
    """The run's config; `sigma` (the σ another run calibrated for the same N, q and
    capacity) skips the calibration, which takes about a minute here."""
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
    c.dp.noise_multiplier = sigma
    c.dp.target_epsilon = None if sigma else _EPSILON.value
    c.dp.overflow_probability = 1e-3
    k = 1 if run == "patient_k1" else _K.value
    expected = SEQUENCES if run == "example" else SEQUENCES // k
    if run != "example":
        c.dp.privacy_unit = "patient"
        c.dp.max_examples_per_unit = k
        c.dp.unit_loss = "sum" if run == "patient_sum" else "mean"
    c.batch.expected_batch_size = expected
    c.batch.physical_batch_size = capacity(expected)  # one jitted call per step in every run
    c.batch.microbatch_size = c.batch.physical_batch_size
    c.train.num_steps = _STEPS.value
    c.train.log_every = max(_STEPS.value // 5, 1)
    c.train.eval_every = 0  # held-out numbers at the end
    c.train.eval_batches = 16
    c.train.eval_batch_size = 128
    c.optimizer.learning_rate = 2e-3
    c.optimizer.warmup_steps = 10
    c.checkpoint.every_steps = 0
    c.train.export_hf = False
    return c


def word_vocab(path, num_notes: int = 600, seed: int = 123, size: int = 2000) -> str:
    """A fixed uncased word vocabulary (vocab.txt) from OTHER synthetic notes (seed 123, not
    the training notes' seed 0, so it is public for these runs): the special tokens, every
    printable ASCII character and its ## form, then the most frequent words (ties
    alphabetical). The same for every run, so the runs differ only in their privacy unit."""
    import collections  # noqa: PLC0415
    import string  # noqa: PLC0415

    from tokenizers import normalizers, pre_tokenizers  # noqa: PLC0415

    from data_pipelines import synthetic_notes  # noqa: PLC0415

    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    counts = collections.Counter()
    for note in synthetic_notes.generate_notes(num_notes, seed=seed):
        counts.update(w for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(note.text)))
    chars = sorted(set(string.ascii_lowercase + string.digits + string.punctuation))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + [f"##{c}" for c in chars]
    taken = set(vocab)
    for word, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(vocab) >= size:
            break
        if word not in taken:
            vocab.append(word)
            taken.add(word)
    path.mkdir(parents=True, exist_ok=True)
    out = path / "vocab.txt"
    out.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return str(out)


def unit_gradient_norms(config, workdir, num_units: int = 64) -> dict:
    """Per-unit gradient norms (before clipping) at the run's final parameters, for
    `num_units` training patients drawn at random, each with at most K of its sequences (as
    the sampler draws them): the norm of the unit's MEAN gradient and of its SUM (= n times
    the mean's, n its sequences in the batch). Says how many units C = dp.clip_norm clips
    under either reduction: when both clip a unit, its clipped gradient is the same."""
    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from data_pipelines import datasets  # noqa: PLC0415
    from dpbert.leakage import exposure  # noqa: PLC0415
    from dpbert.models import losses  # noqa: PLC0415
    from dpbert.dp import clipping, units  # noqa: PLC0415
    from dpbert.tasks import pretraining  # noqa: PLC0415

    model = exposure.load_workdir_model(workdir)
    data = pretraining.PretrainingTask().prepare(config, workdir, np.zeros(2, np.uint32))
    ids, k = np.asarray(data.unit_ids), config.dp.max_examples_per_unit
    rng = np.random.default_rng(0)
    chosen = rng.choice(int(ids.max()) + 1, size=num_units, replace=False)
    rows, mask = np.zeros((num_units, k), np.int64), np.zeros((num_units, k), bool)
    for r, u in enumerate(chosen):
        members = np.flatnonzero(ids == u)
        if members.size > k:
            members = np.sort(rng.choice(members, size=k, replace=False))
        rows[r, :members.size], mask[r, :members.size] = members, True
    batch = datasets.get_unit_batch(data.train, rows, mask, step=0)
    loss = units.unit_loss(losses.make_pretraining_loss(model.graphdef), "mean")

    @jax.jit
    def norms(params, batch, key):
        keys = jax.random.split(key, num_units)
        grad = jax.grad(lambda p, u, r: loss(p, u, r)[0])
        return jax.vmap(lambda u, r: clipping.global_norm(grad(params, u, r)))(batch, keys)

    mean = np.asarray(norms(model.params, batch, jax.random.PRNGKey(0)), np.float64)
    total = mean * mask.sum(axis=1)
    c = float(config.dp.clip_norm)
    return {"mean_median": float(np.median(mean)), "sum_median": float(np.median(total)),
            "mean_clipped": float(np.mean(mean > c)), "sum_clipped": float(np.mean(total > c)),
            "sequences_mean": float(mask.sum(axis=1).mean())}


def main(argv):
    del argv
    import json  # noqa: PLC0415
    import pathlib  # noqa: PLC0415
    import platform  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import time  # noqa: PLC0415

    import jax  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from dpbert.tasks import pretraining  # noqa: PLC0415

    began = time.time()
    out = pathlib.Path(_OUT.value)
    vocab = word_vocab(out / "vocab")
    results = {}
    for run in _RUNS.value:
        workdir = out / run
        shutil.rmtree(workdir, ignore_errors=True)
        # patient_sum has patient_mean's N, q and capacity: the same σ gives the same ε.
        same = {"patient_sum": "patient_mean", "patient_mean": "patient_sum"}.get(run)
        sigma = (results[same]["report"]["training"]["noise_multiplier"]
                 if same in results else None)
        config = make_config(vocab, str(out / "instances"), run, sigma)
        report = pretraining.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
        lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
        times = [x["perf/step_time"] for x in lines if "perf/step_time" in x]
        evals = [x for x in lines if "eval/mlm_accuracy" in x]
        results[run] = {"report": report, "step_time": float(np.median(times[1:] or times)),
                        "accuracy": evals[-1]["eval/mlm_accuracy"], "config": config}
        if run != "example":
            results[run]["norms"] = unit_gradient_norms(config, workdir)
        print(run, {k: v for k, v in results[run].items() if k not in ("report", "config")},
              flush=True)
    minutes = (time.time() - began) / 60
    k = _K.value
    names = {"example": "per sequence", "patient_mean": f"per patient, K={k}, mean",
             "patient_sum": f"per patient, K={k}, sum", "patient_k1": "per patient, K=1"}
    rows, clip_rows = [], []
    mult = None
    for run, r in results.items():
        t, c = r["report"]["training"], r["config"]
        mult = mult or r["report"].get("unit_multiplicity")
        units = "sequences" if run == "example" else "patients"
        slots = c.batch.physical_batch_size * (1 if run == "example"
                                               else c.dp.max_examples_per_unit)
        rows.append(
            f"| {names[run]} | {t['num_examples']} {units} | {c.batch.expected_batch_size:g} | "
            f"{t['sampling_probability']:.4f} | {t['noise_multiplier']:.3f} | "
            f"{t['epsilon']:.3f} | {slots} | {r['accuracy']:.3f} | {r['step_time']:.2f} |")
        if "norms" in r:
            n = r["norms"]
            clip_rows.append(
                f"| {names[run]} | {n['sequences_mean']:.2f} | {n['mean_median']:.3g} | "
                f"{100 * n['mean_clipped']:.0f} % | {n['sum_median']:.3g} | "
                f"{100 * n['sum_clipped']:.0f} % |")
    per_patient = (mult or {}).get("subject", {})
    most = per_patient.get("max", 0)
    clip_table = ""
    if clip_rows:
        clip_table = f"""
Unit gradient norms before clipping, at each run's final parameters (64 random training
patients, at most K sequences each, as the sampler draws them; C = 1):

| run | sequences per unit | median norm, mean | clipped, mean | median norm, sum | clipped, sum |
|---|---|---|---|---|---|
{chr(10).join(clip_rows)}
"""
    heading = f"## {_SECTION.value}"
    flags_used = "" if _SECTION.value == _SECTION.default else f' --section="{_SECTION.value}"'
    if _RUNS.value != _RUNS.default:
        flags_used += f" --runs={','.join(_RUNS.value)}"
    text = f"""{heading}

`PYTHONPATH=. python benchmarks/unit_privacy.py --notes={_NOTES.value} --steps={_STEPS.value} \
--epsilon={_EPSILON.value:g} --k={k}{flags_used} --write`
({minutes:.0f} minutes) on {platform.machine()}, {os.cpu_count()} CPU cores, JAX {jax.__version__}
on 1 x cpu, load average {os.getloadavg()[0]:.1f} at the end (a shared machine: step times
compare within this table only). Tiny BERT, {_NOTES.value} synthetic notes (seq 32, 5 % of the
patients held out, the same patients in every run), a fixed public word vocabulary,
{_STEPS.value} steps, C = 1, learning rate 2e-3, 64 expected sequences per step (64 / K
patients), one jitted call per step; σ calibrated so that each run spends ε = {_EPSILON.value:g}
at δ = 1e-6 (PLD) with respect to ITS unit. Scaled down from the issue's "thousands of
patients" and real training lengths to what 2 busy CPU cores run in minutes: the accuracies
are early-training numbers, one seed each.

| run | N (the accountant's) | expected batch | q | σ | ε | slots per call | held-out MLM acc. | s / step |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}
{clip_table}
* The per-sequence ε protects one sequence. One patient of this corpus is in up to {most}
  training sequences (mean {per_patient.get('mean', 0):.3g}), so for a whole patient it means
  only group privacy at k = {most} (ε·k = {_EPSILON.value * most:.0f}): no guarantee. The
  per-patient runs give ε = {_EPSILON.value:g} for the whole patient.
* The price: there are far fewer patients than sequences, so q is larger and σ must be larger
  for the same ε; and a step averages fewer independent clipped gradients (64 / K patients
  instead of 64 sequences) against the same noise σC.
* mean vs sum: within a unit the sum is n times the mean (n its sequences in the batch), so
  when C clips a unit under both reductions its clipped gradient is the SAME; they differ only
  for units that the mean leaves unclipped, which the sum then weighs by n. dpbert's default is
  the mean (`dp.unit_loss`): a unit weighs like one sequence and C tuned per sequence still
  fits. The table above shows how many units each reduction clips here.
* K: more sequences per patient per step use more of each sampled patient's data at the cost of
  K-times-wider calls (slots) per patient; K = 1 spends the same compute on 64 patients.
"""
    print(text)
    if _WRITE.value:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bench_report  # noqa: PLC0415

        bench_report.write_section(heading, text)


if __name__ == "__main__":
    app.run(main)
