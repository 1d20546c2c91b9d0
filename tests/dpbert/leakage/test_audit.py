"""One-run privacy audit (dpbert.leakage.audit): the bound against independent binomial arithmetic,
its validity by simulation, the guessing rule, the canaries and the membership score (end to
end: test_leakage.py)."""

import math

import numpy as np
import pytest

from data_pipelines import canaries, tokenization
from dpbert.leakage import audit
from tests.dpbert.leakage.test_exposure import random_params


def binom_tail(r, q, v):
    """P[Binomial(r, q) >= v] by direct summation of math.comb terms."""
    return sum(math.comb(r, k) * q**k * (1 - q) ** (r - k) for k in range(max(v, 0), r + 1))


def paper_p_value(m, r, v, eps, delta):
    """The theorem's right-hand side, written out term by term (independent of dpbert)."""
    q = math.exp(eps) / (1 + math.exp(eps))
    pmf = [math.comb(r, k) * q**k * (1 - q) ** (r - k) for k in range(r + 1)]
    f = lambda u: sum(pmf[max(u, 0):])  # P[Bin(r, q) >= u]
    extra = max(((f(v - i) - f(v)) / i for i in range(1, v + 1)), default=0.0)
    return min(f(v) + 2 * m * delta * extra, 1.0)


def grid_lower_bound(m, r, v, delta, beta, step=2e-3, top=5.0):
    """The largest ε on a grid whose p-value is <= beta (a scan, not a bisection)."""
    grid = np.arange(0.0, top, step)
    ok = [eps for eps in grid if paper_p_value(m, r, v, eps, delta) <= beta]
    return max(ok, default=0.0)


@pytest.mark.parametrize("m,r,v,eps,delta", [
    (100, 40, 40, 1.0, 0.0), (100, 40, 31, 0.7, 1e-4), (1000, 200, 150, 2.0, 1e-5),
    (50, 50, 20, 0.0, 1e-3), (10, 6, 0, 1.0, 0.01)])
def test_p_value_is_the_papers_formula(m, r, v, eps, delta):
    assert audit.p_value(m, r, v, eps, delta) == pytest.approx(
        paper_p_value(m, r, v, eps, delta), rel=1e-9, abs=1e-15)


def test_perfect_guesser():
    # Pure DP, all r guesses right: P = q^r, so the bound is logit(beta^(1/r)) in closed form.
    for r in (10, 64, 200):
        q = 0.05 ** (1 / r)
        assert audit.epsilon_lower_bound(1000, r, r, confidence=0.95) == pytest.approx(
            math.log(q / (1 - q)), abs=1e-5)
    # (ε, δ): the bisection agrees with a plain scan of the formula.
    for m, r, v, delta in [(200, 64, 64, 1e-5), (200, 64, 60, 1e-4), (64, 32, 30, 1e-3)]:
        got = audit.epsilon_lower_bound(m, r, v, delta=delta, confidence=0.95)
        want = grid_lower_bound(m, r, v, delta, 0.05)
        assert 0.5 < want < 4.5 and got == pytest.approx(want, abs=3e-3)
        assert got <= audit.epsilon_lower_bound(m, r, v, delta=0.0)  # δ only weakens it
    # More (all correct) guesses prove more; a lower confidence proves more.
    assert audit.epsilon_lower_bound(1000, 400, 400) > audit.epsilon_lower_bound(1000, 100, 100)
    assert (audit.epsilon_lower_bound(1000, 100, 100, confidence=0.8)
            > audit.epsilon_lower_bound(1000, 100, 100, confidence=0.99))


def test_coin_flipper():
    # Half right: nothing is proven.
    assert audit.epsilon_lower_bound(1000, 200, 100) == 0.0
    assert audit.epsilon_lower_bound(1000, 200, 110, delta=1e-5) == 0.0
    # The bound's threshold at ε = 0 is the binomial(r, 1/2) test: v is the smallest count
    # with P[Bin(r, 1/2) >= v] <= 5 %.
    r = 100
    v_star = min(v for v in range(r + 1) if binom_tail(r, 0.5, v) <= 0.05)
    assert audit.epsilon_lower_bound(1000, r, v_star - 1) == 0.0
    assert audit.epsilon_lower_bound(1000, r, v_star) > 0.0


def test_bound_is_valid_for_randomized_response():
    """An exactly ε0-DP guesser (each guess right with probability e^ε0 / (1 + e^ε0)): the 95 %
    lower bound may exceed ε0 in at most ~5 % of runs."""
    rng = np.random.default_rng(0)
    trials, r = 400, 100
    for eps0 in (0.0, 1.0):
        q = 1 / (1 + math.exp(-eps0))
        correct = rng.binomial(r, q, size=trials)
        over = sum(audit.epsilon_lower_bound(500, r, int(v), tolerance=1e-3) > eps0
                   for v in correct)
        assert over / trials <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials), (eps0, over)


def test_guesses_and_counts():
    scores = np.asarray([0.9, 0.1, 0.5, 0.8, 0.2, 0.3])
    g = audit.guesses(scores, 2, 1)
    assert g.tolist() == [1, -1, 0, 1, 0, 0]
    assert audit.count_correct(g, [True, False, False, False, True, True]) == (3, 2)
    assert audit.guesses(scores, 0, 0).tolist() == [0] * 6
    with pytest.raises(ValueError, match="k\\+ \\+ k- <= m"):
        audit.guesses(scores, 4, 3)
    with pytest.raises(ValueError, match="0 <= v <= r <= m"):
        audit.epsilon_lower_bound(10, 5, 6)


def test_audit_bound_on_separable_and_random_scores():
    rng = np.random.default_rng(1)
    m = 256
    included = rng.random(m) < 0.5
    # Perfectly separated scores: the largest pair wins with every guess right, tested at the
    # Bonferroni-split confidence.
    best = audit.audit_bound(included + rng.random(m) * 0.5, included, delta=1e-6)
    pairs = audit.default_guess_counts(m)
    assert best.pairs_tried == len(pairs) == 4
    assert (best.k_plus, best.k_minus) == max(pairs) and best.correct == best.guesses == m // 2
    assert best.epsilon_lower_bound == pytest.approx(audit.epsilon_lower_bound(
        m, m // 2, m // 2, delta=1e-6, confidence=1 - 0.05 / 4), abs=1e-5)
    # Scores independent of the truth prove nothing (here, and in 95 % of such draws).
    assert audit.audit_bound(rng.random(m), included, delta=1e-6).epsilon_lower_bound == 0.0


def test_audit_canaries_and_membership_score(notes_vocab):
    tok = tokenization.WordPieceTokenizer(notes_vocab)
    r = set(canaries.secret_candidates(tok).tolist())
    cs = audit.make_audit_canaries(tok, 40, 6, np.random.default_rng())
    assert len(cs) == 40 and len({tuple(c.token_ids) for c in cs}) == 40
    for c in cs:
        assert c.form == canaries.AUDIT_FORM and c.placement == "example"
        assert len(c.token_ids) == 6 and set(c.token_ids) <= r
        assert c.secret_id == c.token_ids[3] and c.tokens == tok.convert_ids_to_tokens(
            c.token_ids)
    # The pseudo-log-likelihood is the mean, over pieces, of log p(piece | it alone masked).
    from dpbert.leakage import exposure  # noqa: PLC0415
    from dpbert.models import bert as model_lib  # noqa: PLC0415
    config = model_lib.BertConfig.preset("tiny", tok.vocab_size, max_position_embeddings=16)
    graphdef, params = random_params(config, seed=5)
    few = cs[:3]
    pll = audit.membership_scores(graphdef, params, few, tok.special, 16, "pll")
    for i, c in enumerate(few):
        rows = [c] * 6
        lp = exposure.masked_log_probs(
            graphdef, params, exposure.canary_inputs(rows, tok.special, 16, range(6)),
            batch_size=256)
        assert pll[i] == pytest.approx(np.mean(lp[np.arange(6), c.token_ids]), abs=1e-5)
    secret = audit.membership_scores(graphdef, params, few, tok.special, 16, "secret")
    lp = exposure.masked_log_probs(graphdef, params, exposure.canary_inputs(few, tok.special, 16),
                                   batch_size=256)
    np.testing.assert_allclose(secret, lp[np.arange(3), [c.secret_id for c in few]], atol=1e-6)


# ----------------------------------------------------------------------------- issue 35


def test_arguments_and_out_are_checked_before_any_work(tmp_path):
    """A confidence <= 0 hung until after training; --out= a file failed after 28 s of work;
    an unbounded m would never finish drawing canaries. Now each is one error naming it, and
    OUT stays as it was."""
    from configs import demo_dp

    config = demo_dp.get_config()
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    out = tmp_path / "out"
    cases = [(dict(confidence=0.0), r"^confidence=0\.0: must be a number in \(0, 1\)"),
             (dict(confidence=1.5), r"^confidence=1\.5"),
             (dict(m=10**9), r"^m=1000000000: the number of audit canaries must be an integer "
                             r"in \[2, 100000\]"),
             (dict(length=100), r"^length=100: .* \[2, 13\] \(data\.max_seq_length=16"),
             (dict(score="loss"), r"^score='loss': must be one of")]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            audit.run_audit(config, out, **kwargs)
    with pytest.raises(ValueError, match=r"^out=.*a_file: is a file, not a folder"):
        audit.run_audit(config, a_file)
    with pytest.raises(ValueError, match=r"^out=: is empty"):
        audit.run_audit(config, "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_too_few_secret_candidates_says_what_to_change(tmp_path):
    """The small settings (48 notes, DP vocabulary) learn no whole word: the message names the
    fields to change, and the useless vocabulary is removed so that the rerun builds anew."""
    from tests.dpbert.tasks.test_pretraining import small_config

    config = small_config(tmp_path / "cache", **{"vocab.seed": None})
    with pytest.raises(ValueError, match=r"0 secret candidate\(s\) .* train on more text "
                                         r"\(config\.data\.synthetic_num_notes=48 notes now\), "
                                         r"a larger config\.vocab\.epsilon \(now 2\.0\)"):
        audit.run_audit(config, tmp_path / "out", m=16)
    assert not (tmp_path / "out" / "train" / "vocab").exists()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["train"]  # no private/
