"""Secret-sharer exposure of planted canaries (Carlini et al. 2019; Hoory et al. 2021, Sec. 5.2).

A canary ``H.. S H..`` (``data_pipelines.canaries``) carries one secret word piece S drawn
uniformly from the candidate set R. After training, the model is asked for the secret: the
canary is fed with the secret position replaced by [MASK] and the MLM scores every candidate
r in R at that position. Then

    rank(s)   = 1 + |{r in R \\ {s} : logit_r > logit_s}|      (ties not counted: the
                                                              attacker-optimistic choice)
    exposure  = log2 |R| - log2 rank(s)                        in [0, log2 |R|]

An un-memorized secret ranks uniformly in 1..|R|, so exposure is about Exp(rate ln 2): mean
``null_exposure_mean(|R|)`` = log2|R| - log2(|R|!)/|R| -> 1/ln 2 = 1.4427 bits, sd ~ 1.44.
Never-planted reference canaries (repetitions 0) measure that floor on the trained model.

The exact exposure cannot exceed log2 |R|; Carlini et al. Sec. 4.3 extrapolate beyond it by
fitting a skew-normal to the candidates' losses ``-log p(r)``, r != s, and reading the secret's
loss off the fitted CDF: ``exposure_extrapolated = -log2 F(-log p(s))`` (scipy's MLE fit;
deep in the tail, where scipy's logcdf underflows, F is integrated in log space).
Restricting the softmax to R shifts every loss by the same constant, which changes neither the
ranks nor the extrapolation.

Input layout: a sentence-placed canary (planted as a sentence inside documents) is scored as
``[CLS] canary [SEP]`` (one segment); an example-placed one (a training example of its own) in
its training layout ``[CLS] A [SEP] B [SEP]`` (``canaries.append_canary_examples``).

Library: ``exposure_from_rank``, ``secret_rank``, ``extrapolated_exposure`` (pure),
``masked_log_probs`` (the model, batched and jitted), ``evaluate_workdir`` (a training workdir
-> per-canary rows and per-(form, repetitions) summaries), ``plot``. CLI: launch/exposure.py.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from scipy import special, stats

from data_pipelines import canaries as canaries_lib
from data_pipelines import tokenization
from dpbert.runtime import saved_run
from dpbert.models import bert as model_lib

LN2 = math.log(2.0)
SCORE_BATCH = 64  # canaries per jitted call (one compile, padded)


# ----------------------------------------------------------------------------- the statistic


def secret_rank(candidate_scores: np.ndarray, secret_index: np.ndarray | int) -> np.ndarray:
    """1 + the number of OTHER candidates scored strictly higher than the secret.

    Args:
      candidate_scores: [..., |R|] scores (logits or log-probabilities) of the candidates.
      secret_index: [...] int, the secret's column in R.
    Returns:
      int64 [...] ranks in 1..|R| (ties with the secret do not count against it).
    """
    scores = np.asarray(candidate_scores, np.float64)
    idx = np.asarray(secret_index, np.int64)
    s = np.take_along_axis(scores, idx[..., None], axis=-1)
    return 1 + np.sum(scores > s, axis=-1).astype(np.int64)


def exposure_from_rank(rank: np.ndarray | int, num_candidates: int) -> np.ndarray:
    """log2 |R| - log2 rank (float64)."""
    rank = np.asarray(rank, np.float64)
    if np.any(rank < 1) or np.any(rank > num_candidates):
        raise ValueError(f"ranks must lie in 1..{num_candidates}")
    return math.log2(num_candidates) - np.log2(rank)


def null_exposure_mean(num_candidates: int) -> float:
    """E[exposure] for a rank uniform on 1..|R|: log2|R| - log2(|R|!)/|R| (-> 1/ln 2)."""
    n = num_candidates
    return math.log2(n) - math.lgamma(n + 1) / LN2 / n


def extrapolated_exposure(losses: np.ndarray, secret_index: int) -> float:
    """Carlini et al. Sec. 4.3: -log2 F(loss of s), F the skew-normal fitted (MLE) to the losses
    of the other candidates. Larger than log2|R| when the secret's loss is far in the lower
    tail.

    Args:
      losses: [|R|] per-candidate losses -log p(r) (any common shift is fine).
      secret_index: the secret's position in ``losses``.
    """
    losses = np.asarray(losses, np.float64)
    others = np.delete(losses, secret_index)
    if len(others) < 3 or np.ptp(others) == 0:
        raise ValueError("the skew-normal fit needs at least 3 distinct candidate losses")
    a, loc, scale = stats.skewnorm.fit(others)
    z = (losses[secret_index] - loc) / scale
    log_cdf = float(stats.skewnorm.logcdf(z, a))
    if not math.isfinite(log_cdf) and z < 0:
        log_cdf = skewnorm_log_tail(z, a)
    return -log_cdf / LN2


def skewnorm_log_tail(z: float, a: float, points: int = 2001) -> float:
    """log F(z) of the standard skew-normal deep in its left tail (z << 0), where scipy's
    logcdf underflows to -inf: F(z) = 2 ∫_{-∞}^z φ(t) Φ(a t) dt, integrated in log space
    (trapezoid over the last 60 e-folds of the integrand below z; ~1e-4 absolute accuracy)."""
    if z >= 0:
        raise ValueError(f"the tail formula is for z < 0, got {z}")
    # The integrand decays like exp(-(1 + max(a, 0)^2) |z| u) at t = z - u.
    width = 60.0 / (abs(z) * (1.0 + max(a, 0.0) ** 2))
    t = z - np.linspace(0.0, width, points)
    log_f = stats.norm.logpdf(t) + stats.norm.logcdf(a * t)
    h = width / (points - 1)
    weights = np.full(points, h)
    weights[[0, -1]] = h / 2
    return float(LN2 + special.logsumexp(log_f, b=weights))


def check_candidates(candidate_ids: np.ndarray, special: tokenization.SpecialTokenIds,
                     vocab_size: int) -> None:
    """R must be distinct in-vocabulary ids with no special token."""
    ids = np.asarray(candidate_ids)
    if ids.ndim != 1 or len(ids) < 2:
        raise ValueError(f"the candidate set needs >= 2 ids, got shape {ids.shape}")
    if len(np.unique(ids)) != len(ids):
        raise ValueError("the candidate set has repeated ids")
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(f"candidate ids must lie in [0, {vocab_size})")
    bad = set(ids.tolist()) & set(dataclasses.astuple(special))
    if bad:
        raise ValueError(f"the candidate set contains special token ids {sorted(bad)}")


def secret_columns(canaries: Sequence[canaries_lib.Canary], candidate_ids: np.ndarray,
                   special: tokenization.SpecialTokenIds) -> np.ndarray:
    """Each canary's secret's column in R; an error for a secret outside R or a special token."""
    column = {int(t): j for j, t in enumerate(np.asarray(candidate_ids).tolist())}
    specials = set(dataclasses.astuple(special))
    out = []
    for c in canaries:
        if c.secret_id in specials:
            raise ValueError(f"canary {c.canary_id}: the secret {c.secret_id} is a special token")
        if c.secret_id not in column:
            raise ValueError(f"canary {c.canary_id}: the secret {c.secret!r} (id {c.secret_id}) "
                             f"is not in the candidate set R")
        out.append(column[c.secret_id])
    return np.asarray(out, np.int64)


# ----------------------------------------------------------------------------- the model


def canary_layout(canary: canaries_lib.Canary, special: tokenization.SpecialTokenIds
                  ) -> tuple[list[int], list[int], list[int]]:
    """(ids, segment ids, sequence position of each canary piece) of the canary as the model
    reads it: ``[CLS] canary [SEP]`` (sentence placement) or its training example
    ``[CLS] A [SEP] B [SEP]`` (example placement, A = the first ceil(n/2) pieces)."""
    toks = list(canary.token_ids)
    if canary.placement == "example":
        a = (len(toks) + 1) // 2
        ids = [special.cls, *toks[:a], special.sep, *toks[a:], special.sep]
        seg = [0] * (a + 2) + [1] * (len(toks) - a + 1)
        where = [1 + j + (j >= a) for j in range(len(toks))]
    else:
        ids = [special.cls, *toks, special.sep]
        seg = [0] * len(ids)
        where = [1 + j for j in range(len(toks))]
    return ids, seg, where


def canary_inputs(canaries: Sequence[canaries_lib.Canary], special: tokenization.SpecialTokenIds,
                  seq_len: int, targets: Sequence[int] | None = None,
                  masked: Sequence[Sequence[int]] | None = None) -> dict[str, np.ndarray]:
    """Model inputs, one row per canary, predicting one piece.

    Args:
      targets: per row, the canary piece to predict (default: the secret).
      masked: per row, the canary pieces replaced by [MASK] (default: the target alone).
    Returns: input_ids, segment_ids, input_mask int32 [K, seq_len]; positions int32 [K, 1].
    """
    k = len(canaries)
    ids = np.full([k, seq_len], special.pad, np.int32)
    seg = np.zeros([k, seq_len], np.int32)
    mask = np.zeros([k, seq_len], np.int32)
    pos = np.zeros([k, 1], np.int32)
    for i, c in enumerate(canaries):
        seq, segments, where = canary_layout(c, special)
        if len(seq) > seq_len:
            raise ValueError(f"canary {c.canary_id} needs {len(seq)} positions > {seq_len}")
        target = c.secret_position if targets is None else int(targets[i])
        for j in ([target] if masked is None else masked[i]):
            seq[where[j]] = special.mask
        ids[i, :len(seq)] = seq
        seg[i, :len(seq)] = segments
        mask[i, :len(seq)] = 1
        pos[i, 0] = where[target]
    return {"input_ids": ids, "segment_ids": seg, "input_mask": mask, "positions": pos}


def scoring_length(canaries: Sequence[canaries_lib.Canary], max_positions: int) -> int:
    """A padded sequence length that fits every canary (a power of two, >= 8)."""
    longest = max(len(c.token_ids) for c in canaries) + 3
    if longest > max_positions:
        raise ValueError(f"canaries need {longest} positions; the model has {max_positions}")
    return min(max_positions, max(8, 1 << (longest - 1).bit_length()))


@dataclasses.dataclass
class LoadedModel:
    """A trained model's pure parameters and graph, read from a training workdir."""

    graphdef: Any
    params: Any
    config: model_lib.BertConfig
    step: int
    meta: dict[str, Any]
    run: dict[str, Any]


def load_workdir_model(workdir: str | os.PathLike, step: int | None = None) -> LoadedModel:
    """The parameters of a saved step (default: the newest) of a dpbert training workdir."""
    run, params, meta, step = saved_run.load_saved_step(workdir, step)
    config = model_lib.BertConfig(**run["model_config"])
    abstract = nnx.eval_shape(lambda: model_lib.BertForPreTraining(config, rngs=nnx.Rngs(0)))
    graphdef, _ = nnx.split(abstract)
    return LoadedModel(graphdef, params, config, int(step), meta, run)


@functools.lru_cache(maxsize=8)
def _scorer(graphdef: Any):
    """The jitted scoring function of one model architecture (compiled once per shape)."""
    @jax.jit
    def score(p, ids, seg, mask, pos):
        model = nnx.merge(graphdef, p)
        out = model(ids, seg, mask, pos, deterministic=True)
        return jax.nn.log_softmax(out.mlm_logits[:, 0].astype(jnp.float32), axis=-1)
    return score


def masked_log_probs(graphdef: Any, params: Any, inputs: dict[str, np.ndarray], *,
                     batch_size: int = SCORE_BATCH) -> np.ndarray:
    """log softmax of the MLM logits at each row's position (no dropout).

    Args:
      inputs: from ``canary_inputs`` (K rows).
    Returns:
      float32 [K, V].
    """
    score = _scorer(graphdef)
    k = len(inputs["input_ids"])
    out = []
    for start in range(0, k, batch_size):
        rows = {n: v[start:start + batch_size] for n, v in inputs.items()}
        pad = batch_size - len(rows["input_ids"])
        if pad:  # a fixed shape: one compile for every batch
            rows = {n: np.concatenate([v, np.repeat(v[-1:], pad, axis=0)]) for n, v in rows.items()}
        lp = score(params, rows["input_ids"], rows["segment_ids"], rows["input_mask"],
                   rows["positions"])
        out.append(np.asarray(lp)[:batch_size - pad])
    return np.concatenate(out) if out else np.zeros([0, 0], np.float32)


def score_canaries(model: LoadedModel, canaries: Sequence[canaries_lib.Canary],
                   candidate_ids: np.ndarray, special: tokenization.SpecialTokenIds,
                   ) -> np.ndarray:
    """log p(r) for every candidate r in R at each canary's masked secret: float64 [K, |R|]."""
    seq_len = scoring_length(canaries, model.config.max_position_embeddings)
    inputs = canary_inputs(canaries, special, seq_len)
    lp = masked_log_probs(model.graphdef, model.params, inputs)
    return lp[:, np.asarray(candidate_ids)].astype(np.float64)


# ----------------------------------------------------------------------------- a workdir


def find_canary_file(workdir: str | os.PathLike, data_fingerprint: str | None = None
                     ) -> pathlib.Path:
    """The canary record of a training run, from its config.json.

    Looked for, in order: WORKDIR/canaries.json (the copy the trainer keeps with the run);
    ``data.canaries.output_file``; a record in the run's instance cache (``data.cache_dir`` or
    the trainer's default WORKDIR/data/instances) whose examples' content hash is the
    checkpoint's; the only ``*/canaries.json`` in that cache. The caller checks the record's
    content hash against the checkpoint's.
    """
    workdir = pathlib.Path(workdir)
    if (workdir / "canaries.json").is_file():
        return workdir / "canaries.json"
    cfg_file = workdir / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{cfg_file}: missing; is {workdir} a dpbert training workdir?")
    data = json.loads(cfg_file.read_text())["data"]
    if not data.get("canaries", {}).get("enabled"):
        raise ValueError(f"{workdir}: the run planted no canaries (data.canaries.enabled is "
                         f"False); train with --config.data.canaries.enabled=True")
    output_file = data["canaries"].get("output_file")
    if output_file and os.path.isfile(output_file):
        return pathlib.Path(output_file)
    cache = pathlib.Path(os.path.expanduser(data.get("cache_dir") or workdir / "data" /
                                            "instances"))
    found = sorted(cache.glob("*/canaries.json"))
    for path in found:
        if data_fingerprint and json.loads(path.read_text()).get("content_sha256") == \
                data_fingerprint:
            return path
    if len(found) == 1:
        return found[0]
    raise FileNotFoundError(
        f"{workdir}: cannot find the canary record (looked for data.canaries.output_file="
        f"{output_file!r} and {cache}/<fingerprint>/canaries.json, found {len(found)}); pass "
        f"its path explicitly")


def evaluate_workdir(workdir: str | os.PathLike, *, step: int | None = None,
                     canary_file: str | os.PathLike | None = None,
                     extrapolate: bool = True) -> dict[str, Any]:
    """Exposure of every canary of a finished training run.

    Returns:
      {"run": facts about the run (dp, epsilon, delta, step, |R|, the floor), "canaries": one
      row per canary, "summary": one row per (placement, form, repetitions)}.
    """
    workdir = pathlib.Path(workdir)
    model = load_workdir_model(workdir, step)
    fingerprint = model.meta.get("data_fingerprint")
    path = pathlib.Path(canary_file) if canary_file else find_canary_file(workdir, fingerprint)
    canary_list, record = canaries_lib.load_canary_file(path)
    # A privacy audit's canaries are its own business (their presence is its secret).
    canary_list = [c for c in canary_list if c.form != canaries_lib.AUDIT_FORM]
    if fingerprint and record.get("content_sha256") not in (None, fingerprint):
        raise ValueError(f"{path} belongs to other training examples (content sha256 "
                         f"{str(record.get('content_sha256'))[:12]}...) than the checkpoint's "
                         f"({fingerprint[:12]}...)")
    vocab_file = workdir / model.run["vocab_file"]  # relative to the workdir (or absolute)
    if record["vocab_fingerprint"] != tokenization.vocab_fingerprint(vocab_file):
        raise ValueError(f"{path} was made for another vocabulary than the run's {vocab_file}")
    if not canary_list:
        raise ValueError(f"{path} lists no canary")
    special = tokenization.special_token_ids(vocab_file)
    candidates = np.asarray(record["candidate_ids"], np.int64)
    check_candidates(candidates, special, model.config.vocab_size)
    columns = secret_columns(canary_list, candidates, special)
    log_p = score_canaries(model, canary_list, candidates, special)
    ranks = secret_rank(log_p, columns)
    n_r = len(candidates)
    exposures = exposure_from_rank(ranks, n_r)
    rows = []
    for i, c in enumerate(canary_list):
        ext = extrapolated_exposure(-log_p[i], int(columns[i])) if extrapolate else None
        rows.append({
            "canary_id": c.canary_id, "form": c.form, "repetitions": c.repetitions,
            "placement": c.placement, "secret": c.secret, "rank": int(ranks[i]),
            "exposure": float(exposures[i]),
            "exposure_extrapolated": (None if ext is None or not math.isfinite(ext) else ext),
            "secret_log_prob": float(log_p[i, columns[i]]),
        })
    report_file = workdir / "privacy_report.json"
    report = json.loads(report_file.read_text()) if report_file.is_file() else {}
    run = {
        "workdir": str(workdir.absolute()), "step": model.step, "canary_file": str(path),
        # The canaries entered the training examples only (not the vocabulary): the
        # training's own (epsilon, delta) is the claim they test; the run's total beside it.
        "dp": bool(report.get("dp", False)),
        "epsilon": (report.get("training") or report).get("epsilon"),
        "delta": (report.get("training") or report).get("delta"),
        "epsilon_is": "the training's (DP-SGD) alone: the claim the canaries test",
        "total_epsilon": report.get("epsilon"),
        "privacy_unit": report.get("privacy_unit"),
        "num_candidates": n_r, "max_exposure": math.log2(n_r),
        "floor_theory": null_exposure_mean(n_r),
    }
    return {"run": run, "canaries": rows, "summary": summarize(rows)}


def _mean_sd(values: Sequence[float]) -> tuple[float | None, float | None]:
    v = np.asarray([x for x in values if x is not None], np.float64)
    if not len(v):
        return None, None
    return float(v.mean()), (float(v.std(ddof=1)) if len(v) > 1 else None)  # one: no sd


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and sd of the exposures per (placement, form, repetitions)."""
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r["placement"], r["form"], r["repetitions"]), []).append(r)
    out = []
    for (placement, form, reps), rs in sorted(groups.items()):
        mean, sd = _mean_sd([r["exposure"] for r in rs])
        mean_x, sd_x = _mean_sd([r["exposure_extrapolated"] for r in rs])
        out.append({"placement": placement, "form": form, "repetitions": reps, "n": len(rs),
                    "exposure_mean": mean, "exposure_sd": sd,
                    "exposure_extrapolated_mean": mean_x, "exposure_extrapolated_sd": sd_x})
    return out


def plot(runs: Sequence[dict[str, Any]], path: str | os.PathLike) -> pathlib.Path:
    """Exposure vs repetitions (Hoory et al. Fig. 2's shape): one line per (run, form), DP runs
    black, non-DP red; the null floor dashed; repetitions 0 drawn at x = 0 (symlog axis)."""
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D"]
    all_reps: set[int] = set()
    for j, res in enumerate(runs):
        run = res["run"]
        color = "black" if run["dp"] else "tab:red"
        eps = (f"training ε = {run['epsilon']:.3g}" if run["dp"] and run["epsilon"] is not None
               else "ε = ∞ (no DP)")
        forms = sorted({s["form"] for s in res["summary"]})
        for k, form in enumerate(forms):
            pts = sorted((s["repetitions"], s["exposure_mean"], s["exposure_sd"])
                         for s in res["summary"] if s["form"] == form)
            x, y, e = (np.asarray(v, np.float64) for v in zip(*pts))
            e = np.nan_to_num(e)  # one canary: no sd, no bar
            all_reps.update(int(r) for r in x)
            shift = 0.04 * (k + len(forms) * j)  # side by side, not on top of each other
            ax.errorbar(np.where(x > 0, x * (1 + shift), shift), y, yerr=e, color=color,
                        ls=styles[j % 4], marker=markers[k % 4], capsize=3,
                        label=f"{res.get('label', run['workdir'])}: {form}, {eps}")
        ax.axhline(run["floor_theory"], color="grey", lw=0.8, ls="--")
    ax.set_xscale("symlog", linthresh=1)
    ticks = sorted(all_reps)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlim(-0.3, max(ticks + [1]) * 2)
    ax.set_xlabel("number of secret occurrences (0 = never-planted reference canaries)")
    ax.set_ylabel("exposure (bits), mean ± sd")
    floors = sorted({f"{r['run']['floor_theory']:.2f}" for r in runs})
    ax.set_title(f"Secret-sharer exposure (grey: un-memorized floor, {' / '.join(floors)} bits "
                 "for |R| candidates)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = pathlib.Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
