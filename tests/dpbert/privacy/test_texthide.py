"""TextHide (dpbert.privacy.texthide): the acceptance checks of FINETUNE_SPEC §2.6 on a tiny BERT."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from scipy import stats

from dpbert.models import bert as model_lib
from dpbert.privacy import texthide

D = 16
C = 3


class _BagOfWords(nnx.Module):
    """A cheap stand-in encoder: tanh(Dense(mean of the real tokens' embeddings))."""

    def __init__(self, rngs):
        self.embed = nnx.Embed(40, D, rngs=rngs)
        self.dense = nnx.Linear(D, D, rngs=rngs)

    def __call__(self, ids, segments, mask, *, deterministic=True, rngs=None):
        del segments, deterministic, rngs
        m = mask[..., None].astype(jnp.float32)
        mean = jnp.sum(self.embed(ids) * m, 1) / jnp.maximum(jnp.sum(m, 1), 1.0)
        return None, jnp.tanh(self.dense(mean))


class _Classifier(nnx.Module):
    def __init__(self, encoder, **head_kwargs):
        rngs = nnx.Rngs(params=0)
        if encoder == "bert":
            cfg = model_lib.BertConfig(vocab_size=40, hidden_size=D, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=32,
                                       max_position_embeddings=16, hidden_dropout_prob=0.0,
                                       attention_probs_dropout_prob=0.0)
            self.bert = model_lib.BertModel(cfg, rngs=rngs)
        else:
            self.bert = _BagOfWords(rngs)
        self.head = texthide.TextHideHead(D, C, rngs=rngs, **head_kwargs)


@functools.cache
def _setup(encoder="bow"):
    """(params, encoder_apply, head_apply): a tiny encoder ("bert": a 1-layer dpbert BertModel,
    its own dropout off because its RNG triples the compile time; "bow": a bag-of-words stand-in
    that compiles fast) + a TextHide head with input dropout 0.1, so the dropout-key contract is
    exercised. Built once; deterministic when the dropout key is None."""
    graphdef, params = nnx.split(_Classifier(encoder, dropout=0.1))

    def encoder_apply(p, inputs, key):
        m = nnx.merge(graphdef, p)
        rngs = None if key is None else nnx.Rngs(dropout=key)
        return m.bert(inputs["input_ids"], inputs["segment_ids"], inputs["input_mask"],
                      deterministic=key is None, rngs=rngs)[1]

    def head_apply(p, reps, key):
        m = nnx.merge(graphdef, p)
        rngs = None if key is None else nnx.Rngs(dropout=key)
        return m.head(reps, deterministic=key is None, rngs=rngs)

    return params, encoder_apply, head_apply


_encrypt = jax.jit(texthide.encrypt, static_argnums=(4,), static_argnames=("label_mode",))


def _batch(b=8, seq=6, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 40, size=(b, seq)).astype(np.int32)
    ids[:, 0] = 2
    mask = np.ones((b, seq), np.int32)
    mask[:, seq - 2:] = rng.integers(0, 2, size=(b, 2))
    return {"input_ids": jnp.asarray(ids), "segment_ids": jnp.zeros((b, seq), jnp.int32),
            "input_mask": jnp.asarray(mask),
            "labels": jnp.asarray(rng.integers(0, C, size=b).astype(np.int32))}


# ----------------------------------------------------------------------------- (m,k) = (0,1)


@functools.cache
def _bert_gradients():
    """All BERT-based quantities in ONE compiled program (compiles dominate these tests):
    plain fine-tuning vs (m, k) = (0, 1) with dropout on, and intra / inter (16, 4) gradients."""
    params, enc, head = _setup("bert")
    batch = _batch()
    public = {k_: v for k_, v in _batch(seed=2).items() if k_ != "labels"}
    no_mask = texthide.make_mask_pool(None, 0, D)
    pool = texthide.make_mask_pool(jax.random.key(0), 16, D)
    dropout_key = jax.random.key(3)

    def plain(p):
        k_enc, _, k_head = texthide.dropout_keys(dropout_key)
        logits = head(p, enc(p, batch, k_enc), k_head)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]))

    def hidden(p, m_pool, k, pub, key):
        return texthide.texthide_batch_loss(enc, head, p, batch, jax.random.key(7), pool=m_pool,
                                            k=k, num_classes=C, public_inputs=pub,
                                            dropout_key=key)[0]

    def everything(p):
        return {"plain": jax.value_and_grad(plain)(p),
                "m0k1": jax.value_and_grad(hidden)(p, no_mask, 1, None, dropout_key),
                "intra": jax.grad(hidden)(p, pool, 4, None, None),
                "inter": jax.grad(hidden)(p, pool, 4, public, None)}

    return jax.jit(everything)(params)


def test_m0_k1_reproduces_plain_finetuning_loss_and_grads():
    out = _bert_gradients()
    (l_plain, g_plain), (l_hide, g_hide) = out["plain"], out["m0k1"]
    np.testing.assert_allclose(l_hide, l_plain, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g_hide), jax.tree.leaves(g_plain), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_k1_m0_encrypt_is_the_identity_exactly():
    e = jax.random.normal(jax.random.key(0), (10, D))
    y = jax.nn.one_hot(jnp.arange(10) % C, C)
    hid = _encrypt(jax.random.key(1), e, y, texthide.make_mask_pool(None, 0, D), 1)
    np.testing.assert_array_equal(hid.reps, e)
    np.testing.assert_array_equal(hid.labels, y)


def test_soft_label_ce_with_one_hot_is_ce():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(50, 7)) * 3, jnp.float32)
    labels = jnp.asarray(rng.integers(0, 7, size=50))
    soft, hard = jax.jit(lambda x, y: (
        texthide.soft_cross_entropy(x, jax.nn.one_hot(y, 7)),
        optax.softmax_cross_entropy_with_integer_labels(x, y)))(logits, labels)
    np.testing.assert_allclose(soft, hard, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- Λ and π


def test_coefficients_on_the_simplex_and_k2_law():
    lam = np.asarray(texthide.mixing_coefficients(jax.random.key(0), 20000, 2), np.float64)
    assert (lam >= 0).all()
    np.testing.assert_allclose(lam.sum(1), 1.0, atol=1e-6)
    # |g1| / (|g1| + |g2|) has CDF (2/π) arctan(t / (1 − t)) on [0, 1].
    cdf = lambda t: (2 / np.pi) * np.arctan(t / (1 - t))
    assert stats.kstest(lam[:, 0], cdf).pvalue > 1e-3
    # A wrong law (uniform on [0, 1]) is rejected: the test can fail.
    assert stats.kstest(lam[:, 0], "uniform").pvalue < 1e-3


@pytest.mark.parametrize("k", [3, 4, 8])
def test_coefficient_column_means(k):
    n = 20000
    lam = np.asarray(texthide.mixing_coefficients(jax.random.key(k), n, k), np.float64)
    np.testing.assert_allclose(lam.sum(1), 1.0, atol=1e-6)
    sd = lam.std(0)
    assert (np.abs(lam.mean(0) - 1 / k) <= 4 * sd / np.sqrt(n)).all(), lam.mean(0)


def test_permutations_first_is_identity_others_are_permutations():
    perms = np.asarray(texthide.mixing_permutations(jax.random.key(0), 32, 4))
    assert perms.shape == (4, 32)
    np.testing.assert_array_equal(perms[0], np.arange(32))
    for row in perms[1:]:
        np.testing.assert_array_equal(np.sort(row), np.arange(32))
    assert not (perms[1] == perms[2]).all()


# ----------------------------------------------------------------------------- masks


def test_mask_pool_is_pm1_reproducible_and_balanced():
    m, d = 4096, 32
    pool = texthide.make_mask_pool(jax.random.key(11), m, d)
    masks = np.asarray(pool.masks)
    assert masks.shape == (m, d)
    assert set(np.unique(masks)) == {-1.0, 1.0}
    np.testing.assert_array_equal(masks, texthide.make_mask_pool(jax.random.key(11), m, d).masks)
    assert (masks != np.asarray(texthide.make_mask_pool(jax.random.key(12), m, d).masks)).any()
    assert (np.abs(masks.mean(0)) <= 4 / np.sqrt(m)).all()


def test_mask_pool_needs_a_key_and_a_valid_m():
    with pytest.raises(ValueError, match="secret key"):
        texthide.make_mask_pool(None, 4, D)
    with pytest.raises(ValueError, match="pool size"):
        texthide.make_mask_pool(jax.random.key(0), -3, D)


def test_mask_choice_is_uniform_over_the_pool():
    m, b = 16, 32000
    idx = np.asarray(texthide.choose_mask_indices(jax.random.key(5), b, m))
    counts = np.bincount(idx, minlength=m)
    assert stats.chisquare(counts).pvalue > 1e-3
    # A biased choice would be caught: pool entry 0 never chosen (its draws go to entry 1).
    biased = np.bincount(np.where(idx == 0, 1, idx), minlength=m)
    assert stats.chisquare(biased).pvalue < 1e-3


def test_masks_are_involutions_and_m_variants():
    e = jax.random.normal(jax.random.key(0), (64, D))
    pool = texthide.make_mask_pool(jax.random.key(1), 8, D)
    sig = texthide.draw_masks(jax.random.key(2), pool, 64)
    np.testing.assert_array_equal(texthide.apply_masks(sig, texthide.apply_masks(sig, e)), e)
    # Every drawn mask is a pool row.
    rows = {tuple(r) for r in np.asarray(pool.masks)}
    assert all(tuple(r) in rows for r in np.asarray(sig))
    none = texthide.draw_masks(jax.random.key(2), texthide.make_mask_pool(None, 0, D), 64)
    np.testing.assert_array_equal(none, 1.0)
    inf = texthide.make_mask_pool(None, texthide.INFINITE_POOL, D)
    s1 = np.asarray(texthide.draw_masks(jax.random.key(3), inf, 64))
    s2 = np.asarray(texthide.draw_masks(jax.random.key(4), inf, 64))
    assert set(np.unique(s1)) == {-1.0, 1.0}
    assert len({tuple(r) for r in s1}) == 64 and (s1 != s2).any()


# ----------------------------------------------------------------------------- Algorithm 1


def test_intra_encrypt_matches_algorithm_1():
    b, k = 12, 4
    e = jax.random.normal(jax.random.key(0), (b, D))
    y = jax.nn.one_hot(jnp.arange(b) % C, C)
    pool = texthide.make_mask_pool(jax.random.key(1), 16, D)
    hid = _encrypt(jax.random.key(2), e, y, pool, k)
    lam, perms, sig = map(np.asarray, (hid.coefficients, hid.permutations, hid.masks))
    e_np, y_np = np.asarray(e), np.asarray(y)
    want_e = sig * sum(lam[:, j:j + 1] * e_np[perms[j]] for j in range(k))
    want_y = sum(lam[:, j:j + 1] * y_np[perms[j]] for j in range(k))
    np.testing.assert_allclose(hid.reps, want_e, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hid.labels, want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(hid.labels).sum(1), 1.0, atol=1e-6)


@pytest.mark.parametrize("k", [5])
def test_inter_public_slots_carry_no_label(k):
    b = 10
    e = jax.random.normal(jax.random.key(0), (b, D))
    pub = 100.0 + jax.random.normal(jax.random.key(9), (b + 6, D))
    y = jax.nn.one_hot(jnp.arange(b) % C, C)
    pool = texthide.make_mask_pool(None, 0, D)
    hid = _encrypt(jax.random.key(2), e, y, pool, k, public_reps=pub)
    lam, perms, pperm = map(np.asarray, (hid.coefficients, hid.permutations,
                                         hid.public_permutations))
    private = [j for j in range(k) if j % 2 == 0]
    public = [j for j in range(k) if j % 2 == 1]
    assert public == list(texthide.public_slots(k))
    e_np, p_np, y_np = map(np.asarray, (e, pub, y))
    want_e = (sum(lam[:, j:j + 1] * e_np[perms[j]] for j in private)
              + sum(lam[:, j:j + 1] * p_np[pperm[j]] for j in public))
    mass = lam[:, private].sum(1, keepdims=True)
    want_y = sum(lam[:, j:j + 1] * y_np[perms[j]] for j in private) / mass
    np.testing.assert_allclose(hid.reps, want_e, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(hid.labels, want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(hid.labels).sum(1), 1.0, atol=1e-6)
    for j in public:  # each public slot draws distinct public examples
        assert len(set(pperm[j])) == b


def test_inter_code_label_mode_uses_private_labels_unnormalised():
    b, k = 10, 4
    e = jax.random.normal(jax.random.key(0), (b, D))
    pub = jax.random.normal(jax.random.key(9), (b, D))
    y = jax.nn.one_hot(jnp.arange(b) % C, C)
    hid = _encrypt(jax.random.key(2), e, y, texthide.make_mask_pool(None, 0, D), k,
                           public_reps=pub, label_mode="code")
    lam, perms, pperm = map(np.asarray, (hid.coefficients, hid.permutations,
                                         hid.public_permutations))
    np.testing.assert_array_equal(pperm[1], perms[1])
    want_y = sum(lam[:, j:j + 1] * np.asarray(y)[perms[j]] for j in range(k))
    np.testing.assert_allclose(hid.labels, want_y, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="b_pub == b"):
        texthide.encrypt(jax.random.key(2), e, y, texthide.make_mask_pool(None, 0, D), k,
                         public_reps=jnp.concatenate([pub, pub]), label_mode="code")


def test_encoder_receives_nonzero_gradients_intra_and_inter():
    out = _bert_gradients()
    for grads in (out["intra"], out["inter"]):
        for name in ("bert", "head"):
            norms = [float(jnp.linalg.norm(g)) for g in jax.tree.leaves(grads[name])]
            assert all(np.isfinite(norms))
            assert all(n > 0 for n in norms), (name, norms)


def test_eval_path_has_no_mixing_and_applies_a_pool_mask():
    params, enc, head = _setup()
    batch = _batch(seed=3)
    pool1 = texthide.make_mask_pool(jax.random.key(0), 1, D)

    @jax.jit
    def run(p):
        reps = enc(p, batch, None)
        ev = lambda key: texthide.texthide_eval_logits(enc, head, p, batch, key, pool=pool1)
        return (reps, ev(jax.random.key(5)), ev(jax.random.key(6)),
                head(p, reps * pool1.masks[0], None), head(p, reps, None))

    reps, got, again, want, unmasked = run(params)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got, again)  # m = 1: deterministic
    assert not np.allclose(got, unmasked)  # the mask is really applied
    pool8 = texthide.make_mask_pool(jax.random.key(0), 8, D)
    hidden = texthide.texthide_eval_representations(jax.random.key(7), reps, pool8)
    ratio = np.asarray(hidden / reps)  # exactly ±1 per coordinate: no mixing, a pool row
    rows = {tuple(r) for r in np.asarray(pool8.masks)}
    assert all(tuple(np.round(r)) in rows for r in ratio)


def test_refuses_per_example_dp_and_vmapped_use():
    with pytest.raises(texthide.IncompatiblePrivacyModes, match="per-example DP-SGD"):
        texthide.check_privacy_combination(per_example_dp=True)
    texthide.check_privacy_combination(per_example_dp=False)
    params, enc, head = _setup()
    batch = _batch()
    pool = texthide.make_mask_pool(jax.random.key(0), 4, D)

    def per_example(p, ex):
        one = {k_: v[None] if k_ != "labels" else v for k_, v in ex.items()}
        return texthide.texthide_batch_loss(enc, head, p, one, jax.random.key(0), pool=pool,
                                            k=4, num_classes=C)[0]

    with pytest.raises(ValueError, match="BATCH-level"):
        jax.vmap(per_example, in_axes=(None, 0))(params, batch)


def test_regression_k1_is_mse_and_head_options():
    params, enc, head = _setup()
    batch = dict(_batch())
    batch["labels"] = jnp.linspace(-1.0, 1.0, 8)
    pool = texthide.make_mask_pool(None, 0, D)
    loss, pred = jax.jit(lambda p: (
        texthide.texthide_batch_loss(enc, head, p, batch, jax.random.key(0), pool=pool, k=1,
                                     task="regression")[0],
        head(p, enc(p, batch, None), None)[:, 0]))(params)
    np.testing.assert_allclose(loss, jnp.mean((pred - batch["labels"]) ** 2), rtol=1e-6)

    count = lambda mod: sum(x.size for x in jax.tree.leaves(nnx.state(mod, nnx.Param)))
    full = texthide.TextHideHead(D, C, rngs=nnx.Rngs(0))
    tied = texthide.TextHideHead(D, C, tie_hidden=True, rngs=nnx.Rngs(0))
    small = texthide.TextHideHead(D, C, small_cls=True, rngs=nnx.Rngs(0))
    assert count(full) == 3 * (D * D + D) + D * C + C
    assert count(tied) == (D * D + D) + D * C + C
    assert count(small) == 2 * (D * D + D) + D * C + C
    x = jax.random.normal(jax.random.key(0), (4, D))
    t = tied.hidden[0]
    want = tied.out_proj(jnp.tanh(t(jnp.tanh(t(jnp.tanh(t(x)))))))
    np.testing.assert_allclose(tied(x), want, rtol=1e-6)


def test_head_rms_input_norm_reads_only_the_row_scale_free():
    """input_norm="rms": h(x) = h_paper(x / rms(x)), so scaling a row changes nothing, and a sign
    mask changes the normaliser of no row (|σ ∘ e| = |e|)."""
    normed = texthide.TextHideHead(D, C, input_norm="rms", rngs=nnx.Rngs(0))
    paper = texthide.TextHideHead(D, C, rngs=nnx.Rngs(0))
    x = 0.06 * jax.random.normal(jax.random.key(1), (5, D))
    rms = jnp.sqrt(jnp.mean(x ** 2, -1, keepdims=True))
    np.testing.assert_allclose(normed(x), paper(x / rms), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(normed(x), normed(40.0 * x), rtol=1e-5, atol=1e-6)
    masks = texthide.draw_masks(jax.random.key(2), texthide.make_mask_pool(jax.random.key(3), 4, D), 5)
    masked = texthide.apply_masks(masks, x)
    np.testing.assert_allclose(normed(masked), paper(masked / rms), rtol=1e-5, atol=1e-6)
    assert not np.allclose(normed(x), paper(x))
    with pytest.raises(ValueError, match="input_norm"):
        texthide.TextHideHead(D, C, input_norm="layer", rngs=nnx.Rngs(0))


def test_spec_validates_and_reports_no_epsilon():
    spec = texthide.TextHideSpec(m=256, k=4, variant="inter")
    assert spec.report()["epsilon"] is None and "not differential privacy" in spec.report()["note"]
    assert "(∞, 4)" in texthide.TextHideSpec(m=texthide.INFINITE_POOL).report()["note"]
    for bad, match in ((dict(k=0), "positive"), (dict(variant="cross"), "variant"),
                       (dict(variant="inter", k=1), "k ≥ 2"), (dict(m=-5), "pool size"),
                       (dict(label_mode="x"), "label_mode")):
        with pytest.raises(ValueError, match=match):
            texthide.TextHideSpec(**bad)
