"""One-run privacy audit (Steinke, Nasr & Jagielski 2023, "Privacy auditing with one (1)
training run"): an empirical LOWER bound on the ε of a training run.

The game. m audit examples ("canaries": random word-piece sequences, drawn from OS entropy) are
each put in the training set independently with probability 1/2 (S_i in {include, exclude},
also from OS entropy), the model is trained ONCE, and every canary gets a membership score
computed from the trained model alone. The auditor guesses "included" for the k+ highest scores
and "excluded" for the k- lowest, abstaining on the rest: r = k+ + k- guesses, v of them correct.

The theorem (their main result, stated for the add/remove neighbouring relation per audit
example with everything else fixed). If the training algorithm is (ε, δ)-DP, then for every v

    P[W >= v] <= f(v) + 2 m δ · max_{i = 1..v} (f(v - i) - f(v)) / i,
    f(u)      = P[Binomial(r, q) >= u],   q = e^ε / (1 + e^ε),

where W counts the correct guesses; with δ = 0 (pure ε-DP) the bound is f(v) alone: W is then
stochastically dominated by the number of successes of r independent ε-randomized responses.
``p_value(m, r, v, ε, δ)`` evaluates the right-hand side with EXACT binomial tails (scipy's
regularized incomplete beta, ``binom.sf``; f(v - i) - f(v) = P[v - i <= Binomial(r, q) < v] is
summed from the exact pmf, no normal or Chernoff approximation). Observing v correct guesses
with ``p_value <= 1 - confidence`` rejects "(ε, δ)-DP" at that confidence; since an
(ε', δ)-DP algorithm is (ε, δ)-DP for every ε >= ε', it rejects every ε' <= ε as well.
``epsilon_lower_bound`` returns the largest such ε found by bisection (each returned value is
one whose p-value was computed and is <= 1 - confidence, so the bound holds even where the
p-value is not monotone in ε).

Choosing (k+, k-) after seeing the scores would void the confidence; here the candidate pairs
are fixed beforehand and the confidence is split over them (Bonferroni): each pair is tested at
(1 - confidence) / (number of pairs) and the largest bound is reported.

Beside ours, jax-privacy's auditor (`dpbert.leakage.audit_bounds`): the same theorem with
one-sided guesses over every threshold, and its f-DP bound. ``all_bounds`` computes all three;
the audit's headline is the larger of ours and jax-privacy's one-run bound (each at a
Bonferroni-split confidence, so that the larger holds at the stated one); the f-DP bound, which
assumes a Gaussian trade-off curve, is reported beside it (why: that module's docstring).

What the audit of THIS trainer measures: each included canary is one training example of its
own, appended after instance creation (``data.canaries.file`` with placement "example"), so
including or excluding it changes exactly one example, the DP privacy unit. Caveat: the trainer
computes the Poisson rate q = B/N from the realised N, which moves by one with each canary; the
accountant, like every DP-SGD accountant, treats N as public.

Privacy of the audit itself: the inclusion bits and the scores live only in the audit's private
file (OUT/private/); results.json holds counts and bounds; the training workdir receives only
the included canaries (as training data), never the excluded ones or the bits.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import shutil
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from data_pipelines import canaries as canaries_lib
from data_pipelines import tokenization
from dpbert.leakage import audit_bounds as bounds_lib

FORM = canaries_lib.AUDIT_FORM  # the canaries' form in canary files


# ----------------------------------------------------------------------------- the bound


def _check_counts(m: int, r: int, v: int) -> None:
    if not (0 <= v <= r <= m):
        raise ValueError(f"need 0 <= v <= r <= m, got m={m}, r={r}, v={v}")


def p_value(m: int, r: int, v: int, epsilon: float, delta: float = 0.0) -> float:
    """Upper bound on P[>= v correct of r guesses] for an (ε, δ)-DP algorithm (module doc).

    Args:
      m: audit examples (each included with probability 1/2).
      r: guesses made (abstentions excluded).
      v: correct guesses.
      epsilon, delta: the DP claim under test (ε >= 0, 0 <= δ <= 1).
    """
    _check_counts(m, r, v)
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError(f"need epsilon >= 0 and 0 <= delta <= 1, got {epsilon}, {delta}")
    q = 1.0 / (1.0 + math.exp(-epsilon))  # e^ε / (1 + e^ε), overflow-free
    tail = float(stats.binom.sf(v - 1, r, q))  # f(v) = P[Bin(r, q) >= v]
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    # (f(v - i) - f(v)) / i = P[v - i <= Bin < v] / i for i = 1..v: cumulative pmf sums.
    below = np.cumsum(stats.binom.pmf(np.arange(v - 1, -1, -1), r, q))
    worst = float(np.max(below / np.arange(1, v + 1)))
    return min(tail + 2.0 * m * delta * worst, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, *, delta: float = 0.0,
                        confidence: float = 0.95, tolerance: float = 1e-6) -> float:
    """The largest ε (to ``tolerance``) whose (ε, δ)-DP claim ``v`` correct of ``r`` guesses
    rejects at ``confidence``; 0.0 when not even ε = 0 is rejected."""
    _check_counts(m, r, v)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    beta = 1.0 - confidence
    if p_value(m, r, v, 0.0, delta) > beta:
        return 0.0
    lo, hi = 0.0, 1.0  # invariant: p_value(lo) <= beta
    # p_value -> P[Bin(r, 1) >= v] = 1 > beta as ε -> ∞ (q -> 1), so the doubling ends; the
    # cap only guards against floating-point trouble.
    while p_value(m, r, v, hi, delta) <= beta and hi < 1e4:
        lo, hi = hi, 2.0 * hi
    while hi - lo > tolerance:
        mid = 0.5 * (lo + hi)
        if p_value(m, r, v, mid, delta) <= beta:
            lo = mid
        else:
            hi = mid
    return lo


def guesses(scores: np.ndarray, k_plus: int, k_minus: int) -> np.ndarray:
    """+1 ("included") for the k+ highest scores, -1 for the k- lowest, 0 (abstain) otherwise.

    Ties are broken by position (a fixed rule that does not look at the truth).
    """
    scores = np.asarray(scores, np.float64)
    m = len(scores)
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > m:
        raise ValueError(f"need k+, k- >= 0 and k+ + k- <= m={m}, got {k_plus}, {k_minus}")
    order = np.argsort(-scores, kind="stable")
    out = np.zeros(m, np.int8)
    out[order[:k_plus]] = 1
    if k_minus:
        out[order[m - k_minus:]] = -1
    return out


def count_correct(guess: np.ndarray, included: np.ndarray) -> tuple[int, int]:
    """(r guesses made, v correct) for guesses in {-1, 0, +1} and inclusion bits."""
    guess = np.asarray(guess)
    truth = np.where(np.asarray(included, bool), 1, -1)
    made = guess != 0
    return int(made.sum()), int((guess[made] == truth[made]).sum())


def default_guess_counts(m: int) -> list[tuple[int, int]]:
    """The (k+, k-) pairs tried by default, fixed before any score is seen: symmetric, at
    1/16, 1/8, 1/4 and 1/2 of m in all (k+ = k- = m/32 ... m/4)."""
    return sorted({(max(1, m // d), max(1, m // d)) for d in (32, 16, 8, 4)})


@dataclasses.dataclass(frozen=True)
class AuditBound:
    """The audit's outcome for one run (all aggregate; no inclusion bit)."""

    epsilon_lower_bound: float
    confidence: float
    delta: float
    m: int
    k_plus: int
    k_minus: int
    guesses: int
    correct: int
    pairs_tried: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def audit_bound(scores: np.ndarray, included: np.ndarray, *, delta: float,
                confidence: float = 0.95,
                guess_counts: Sequence[tuple[int, int]] | None = None) -> AuditBound:
    """The best lower bound over the (k+, k-) pairs, each at the Bonferroni-split confidence."""
    scores, included = np.asarray(scores), np.asarray(included, bool)
    m = len(scores)
    if included.shape != (m,):
        raise ValueError(f"scores and inclusion bits differ in shape: {scores.shape}, "
                         f"{included.shape}")
    pairs = list(guess_counts or default_guess_counts(m))
    per_pair = 1.0 - (1.0 - confidence) / len(pairs)
    best = None
    for k_plus, k_minus in pairs:
        r, v = count_correct(guesses(scores, k_plus, k_minus), included)
        eps = epsilon_lower_bound(m, r, v, delta=delta, confidence=per_pair)
        if best is None or eps > best.epsilon_lower_bound:
            best = AuditBound(eps, confidence, delta, m, k_plus, k_minus, r, v, len(pairs))
    return best


def all_bounds(scores: np.ndarray, included: np.ndarray, *, delta: float,
               confidence: float = 0.95,
               guess_counts: Sequence[tuple[int, int]] | None = None
               ) -> tuple[AuditBound, dict[str, dict[str, Any]], str]:
    """Ours beside jax-privacy's (`dpbert.leakage.audit_bounds`): (our `AuditBound` at the
    headline's split confidence, {name: {epsilon_lower_bound, confidence, in_headline, method}},
    the headline's name). The headline bounds are computed at
    `audit_bounds.headline_confidence(confidence)` each, so that their maximum holds at
    `confidence`; the f-DP bound at `confidence`."""
    split = bounds_lib.headline_confidence(confidence)
    ours = audit_bound(scores, included, delta=delta, confidence=split,
                       guess_counts=guess_counts)
    values = {bounds_lib.STEINKE: ours.epsilon_lower_bound,
              **bounds_lib.jax_privacy_bounds(scores, included, delta=delta, confidence=split,
                                              fdp_confidence=confidence)}
    table = {name: {"epsilon_lower_bound": value,
                    "confidence": split if name in bounds_lib.HEADLINE_BOUNDS else confidence,
                    "in_headline": name in bounds_lib.HEADLINE_BOUNDS,
                    "method": bounds_lib.METHODS[name]} for name, value in values.items()}
    return ours, table, bounds_lib.headline(values)[0]


# ----------------------------------------------------------------------------- the canaries


def make_audit_canaries(tokenizer: tokenization.WordPieceTokenizer, m: int, length: int,
                        rng: np.random.Generator) -> list[canaries_lib.Canary]:
    """m canaries of ``length`` word pieces each drawn uniformly (with replacement) from the
    secret candidates R (``canaries.secret_candidates``); the middle piece is "the" secret.
    Placement "example": an included canary becomes exactly one training example."""
    if m < 2 or length < 2:
        raise ValueError(f"need m >= 2 canaries of length >= 2, got m={m}, length={length}")
    candidates = canaries_lib.secret_candidates(tokenizer)
    if len(candidates) < 2:
        raise ValueError(f"{tokenizer.vocab_file}: too few secret candidates ({len(candidates)})")
    out = []
    for i in range(m):
        ids = [int(t) for t in rng.choice(candidates, size=length)]
        pos = length // 2
        out.append(canaries_lib.Canary(
            canary_id=f"{FORM}-{i}", form=FORM, tokens=[tokenizer.vocab[t] for t in ids],
            token_ids=ids, secret=tokenizer.vocab[ids[pos]], secret_id=ids[pos],
            secret_position=pos, repetitions=1, placement="example"))
    return out


SCORES = ("pll", "secret")


def membership_scores(graphdef: Any, params: Any, canaries: Sequence[canaries_lib.Canary],
                      special: tokenization.SpecialTokenIds, max_positions: int,
                      score: str = "calibrated_pll") -> np.ndarray:
    """A membership score per canary from the trained model alone (higher = "included").

    "pll" (default): the pseudo-log-likelihood, the mean over the canary's pieces of
    log p(piece) with that piece alone masked. "secret": log p(secret) with the secret masked
    (the exposure statistic; less power: one piece instead of all). (Subtracting the model's
    context-free prior of the pieces, everything masked, was tried and hurts: memorization
    raises that prior too.)
    """
    from dpbert.leakage import exposure  # noqa: PLC0415

    if score not in SCORES:
        raise ValueError(f"unknown score {score!r}; choose from {SCORES}")
    seq_len = exposure.scoring_length(canaries, max_positions)
    if score == "secret":
        lp = exposure.masked_log_probs(graphdef, params,
                                       exposure.canary_inputs(canaries, special, seq_len),
                                       batch_size=256)
        return lp[np.arange(len(canaries)), [c.secret_id for c in canaries]].astype(np.float64)
    rows = [c for c in canaries for _ in c.token_ids]
    targets = [j for c in canaries for j in range(len(c.token_ids))]
    owner = np.repeat(np.arange(len(canaries)), [len(c.token_ids) for c in canaries])
    lp = exposure.masked_log_probs(graphdef, params,
                                   exposure.canary_inputs(rows, special, seq_len, targets),
                                   batch_size=256)
    picked = lp[np.arange(len(rows)), [c.token_ids[t] for c, t in zip(rows, targets)]]
    total = np.bincount(owner, weights=picked.astype(np.float64), minlength=len(canaries))
    return total / np.bincount(owner, minlength=len(canaries))


# ----------------------------------------------------------------------------- one audit run

# At most this many audit canaries: each is a training example of its own and costs `length`
# forward passes to score, so a mistyped m (1e9) would run out of memory drawing them rather
# than fail; 100,000 is far beyond any audit that fits a training set.
MAX_CANARIES = 100_000


def check_arguments(m: Any, length: Any, score: Any, confidence: Any, *,
                    max_seq_length: int | None = None, prefix: str = "") -> None:
    """Raises ValueError naming the argument (`prefix` + its name: "--m" in the launcher) unless
    2 <= m <= MAX_CANARIES, 2 <= length <= max_seq_length - 3 (a canary is one example
    [CLS] A [SEP] B [SEP]), score in SCORES and 0 < confidence < 1. Checked before any work."""
    def is_int(v):
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

    if not (is_int(m) and 2 <= m <= MAX_CANARIES):
        raise ValueError(f"{prefix}m={m!r}: the number of audit canaries must be an integer in "
                         f"[2, {MAX_CANARIES}]")
    top = max_seq_length - 3 if max_seq_length else None
    if not (is_int(length) and length >= 2 and (top is None or length <= top)):
        where = (f"[2, {top}] (data.max_seq_length={max_seq_length} minus [CLS] and two [SEP])"
                 if top is not None else ">= 2")
        raise ValueError(f"{prefix}length={length!r}: an audit canary's word pieces must be an "
                         f"integer in {where}")
    if score not in SCORES:
        raise ValueError(f"{prefix}score={score!r}: must be one of {SCORES}")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not (
            0 < confidence < 1):
        raise ValueError(f"{prefix}confidence={confidence!r}: must be a number in (0, 1), e.g. "
                         "0.95")


def check_out_dir(out_dir: str | os.PathLike, config: Any, *, flag: str = "out") -> None:
    """Raises ValueError unless `out_dir` can hold an audit: not empty, not the current directory
    (or a folder holding it), not a file, writable, not the starting model's folder."""
    from data_pipelines import fileio  # noqa: PLC0415

    init_from = config.get("model", {}).get("init_from_hf") or ""
    problem = fileio.output_folder_problem(out_dir, sources=[
        (f"config.model.init_from_hf={init_from}", init_from)])
    if problem:
        raise ValueError(f"{flag}={out_dir}: {problem}")


def _few_candidates_message(vocab_file: str, n: int, config: Any) -> str:
    v = config.get("vocab", {})
    how = ("use a public vocabulary with whole words (config.vocab.file=.../vocab.txt, e.g. "
           "MiniLM's)")
    if not v.get("file"):
        more = ("more text (config.data.synthetic_num_notes="
                f"{config.data.get('synthetic_num_notes')} notes now)"
                if config.data.get("corpus") == "synthetic" else "more text (config.data.paths)")
        eps = (f", a larger config.vocab.epsilon (now {v.get('epsilon')})" if v.get("dp", True)
               else "")
        how = f"train on {more}{eps}, or {how}"
    return (f"{vocab_file}: {n} secret candidate(s) (whole lower-case words of >= 3 letters that "
            f"are one piece of the vocabulary); the audit needs at least 2 to draw its canaries "
            f"from. A DP vocabulary built from a small corpus learns few whole words: {how}")


PRIVATE_DIR = "private"      # OUT/private: the canaries, inclusion bits and scores
TRAIN_DIR = "train"          # OUT/train: the training workdir
AUDIT_FILE = "audit_canaries.json"
PLANT_FILE = "planted.json"


def run_audit(config: Any, out_dir: str | os.PathLike, *, m: int = 256, length: int = 8,
              score: str = "pll", confidence: float = 0.95,
              guess_counts: Sequence[tuple[int, int]] | None = None,
              devices: list | None = None) -> dict[str, Any]:
    """Draws m audit canaries and their inclusion bits (OS entropy), trains once with the
    included ones planted as examples of their own, scores all m, and writes OUT/results.json.

    The config's own exposure canaries (``data.canaries.enabled`` with generated canaries or a
    ``data.canaries.file``) are planted too, so one run gives both exposure and the audit.
    Rerunning with the same OUT reuses the drawn canaries (the private file) and resumes the
    training from its checkpoint.

    Args:
      config: an experiment config (``configs/*.py``); not modified.
      out_dir: OUT. OUT/train is the training workdir; OUT/private holds the audit's secrets.
      m, length: audit canaries and their length in word pieces.
      score: ``membership_scores`` kind.
      confidence: of the lower bound (Bonferroni-split over ``guess_counts``).
      devices: restricts the training mesh (default: all devices).

    Returns:
      The results.json content.
    """
    import ml_collections  # noqa: PLC0415

    from dpbert.leakage import exposure  # noqa: PLC0415

    from dpbert.runtime import loop  # noqa: PLC0415
    from dpbert.tasks import pretraining  # noqa: PLC0415

    # Validate before anything is written: a refused argument, folder or config leaves OUT as
    # it was, and nothing is trained for an audit that would fail at the end.
    check_arguments(m, length, score, confidence,
                    max_seq_length=config.get("data", {}).get("max_seq_length"))
    check_out_dir(out_dir, config)
    out = pathlib.Path(out_dir).absolute()
    private, workdir = out / PRIVATE_DIR, out / TRAIN_DIR
    config = ml_collections.ConfigDict(config.to_dict())
    loop.validate(pretraining.TASK, config)
    workdir.mkdir(parents=True, exist_ok=True)
    data = pretraining.prepare_corpus(config, workdir)
    vocab_file, _, vocab_origin = pretraining.prepare_vocab(config, data, workdir)
    tok = tokenization.WordPieceTokenizer(vocab_file, do_lower_case=data.do_lower_case)

    audit_file = private / AUDIT_FILE
    if audit_file.is_file():
        audit_canaries, record = canaries_lib.load_canary_file(audit_file)
        included = np.asarray(record["included"], bool)
        if (len(audit_canaries) != m or any(len(a.token_ids) != length for a in audit_canaries)
                or record["vocab_fingerprint"] != tokenization.vocab_fingerprint(vocab_file)):
            raise ValueError(f"{audit_file} holds an audit with other canaries (m, length or "
                             f"vocabulary differ); use a fresh output folder")
    else:
        num_candidates = len(canaries_lib.secret_candidates(tok))
        if num_candidates < 2:
            message = _few_candidates_message(vocab_file, num_candidates, config)
            if vocab_origin == "built" and not (workdir / "checkpoints").exists():
                # Built by this audit for nothing yet trained: removed, so that a rerun with
                # the advised settings builds a new one instead of reusing this one.
                shutil.rmtree(pathlib.Path(vocab_file).parent, ignore_errors=True)
                message += " (the vocabulary built here was removed: a rerun builds a new one)"
            raise ValueError(message)
        private.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(np.random.SeedSequence())  # OS entropy, never recorded
        audit_canaries = make_audit_canaries(tok, m, length, rng)
        included = rng.random(m) < 0.5
        canaries_lib.write_canary_file(audit_file, audit_canaries, tok, seed=None, extra={
            "included": included.tolist(),
            "note": "PRIVATE to the audit: which audit canaries were trained on. Never ship "
                    "this file with the model."})

    others: list[canaries_lib.Canary] = []
    c = config.data.canaries
    if c.enabled:
        if c.file:
            others, _ = canaries_lib.load_canary_file(c.file)
        else:
            others = canaries_lib.make_canaries(
                tok, forms=c.forms, repetitions=c.repetitions,
                canaries_per_setting=c.per_setting, seed=c.seed)
    planted = others + [a for a, inc in zip(audit_canaries, included) if inc]
    plant_file = private / PLANT_FILE
    canaries_lib.write_canary_file(plant_file, planted, tok, seed=c.seed)
    c.enabled = True
    c.file = str(plant_file)
    c.output_file = ""

    report = pretraining.train_and_evaluate(config, workdir, devices=devices)
    # The audit tests the training mechanism: its claim is the training's own (epsilon, delta).
    training = report.get("training") or {}

    model = exposure.load_workdir_model(workdir)
    scores = membership_scores(model.graphdef, model.params, audit_canaries, tok.special,
                               model.config.max_position_embeddings, score)
    delta = float(training["delta"]) if report.get("dp") else float(config.dp.delta)
    bound, bounds, best = all_bounds(scores, included, delta=delta, confidence=confidence,
                                     guess_counts=guess_counts)
    lower = bounds[best]["epsilon_lower_bound"]
    claimed = training.get("epsilon") if report.get("dp") else None
    (private / "scores.json").write_text(json.dumps({
        "note": "PRIVATE to the audit (membership scores and inclusion bits)",
        "canary_ids": [a.canary_id for a in audit_canaries], "included": included.tolist(),
        "scores": scores.tolist(),
        "guesses": guesses(scores, bound.k_plus, bound.k_minus).tolist()}) + "\n")
    split = bounds_lib.headline_confidence(confidence)
    results = {
        "what": "one-run privacy audit (Steinke, Nasr & Jagielski 2023; and jax-privacy's "
                "auditor): an empirical lower bound on epsilon",
        "meaning": (
            f"With probability >= {confidence} over the audit's own randomness (which "
            f"canaries were included), the training run is NOT (epsilon, delta)-DP for any "
            f"epsilon below epsilon_lower_bound, delta = {delta:g}: the larger of "
            f"{' and '.join(bounds_lib.HEADLINE_BOUNDS)} (here {best}), each at confidence "
            f"{split:g} so that the larger holds at {confidence}. Of m = {m} audit "
            f"canaries, each included with probability 1/2 as one training example, our "
            f"auditor guessed 'included' for the {bound.k_plus} highest scores and 'excluded' "
            f"for the {bound.k_minus} lowest: {bound.correct} of {bound.guesses} guesses "
            f"correct (best of {bound.pairs_tried} (k+, k-) pairs fixed in advance, each "
            f"tested at confidence 1 - {1 - split:g}/{bound.pairs_tried}); jax-privacy's "
            f"one-sided auditor tries every threshold. {bounds_lib.FDP} (f-DP) is beside it, "
            f"not in it: it assumes a Gaussian trade-off curve. A lower bound above the "
            f"claimed epsilon would show a privacy bug; one far below it says only that this "
            f"attack could not prove more."),
        "claimed_epsilon": claimed,
        "claimed_delta": training.get("delta") if report.get("dp") else None,
        # The claim tested is the training's (the audit canaries are training examples); the
        # run's headline total (vocabulary + training) beside it, not to be mistaken for it.
        "claimed_is": "the training's (DP-SGD) epsilon",
        "total_epsilon": report.get("epsilon") if report.get("dp") else None,
        "dp": bool(report.get("dp")),
        "consistent": claimed is None or lower <= claimed,
        **bound.to_json(),  # our bound's guesses (k+, k-, r, v)
        "epsilon_lower_bound": lower, "confidence": confidence, "headline_bound": best,
        "bounds": bounds,
        "score": score, "canary_length": length,
        "training_workdir": str(workdir),
        "steps": report.get("steps"),
    }
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return results
