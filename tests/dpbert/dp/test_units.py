"""Privacy units of several examples (issue 15): per-unit clipping against a brute-force loop
over units, the bound C per unit, the unit sampler, accounting over units, the plan's checks."""

import functools
import math

import dp_accounting
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from configs import common
from dpbert.models import losses
from dpbert.models import bert as model_lib
from dpbert.dp import clipping, ghost, sampling, units
from dpbert.dp import plan as plan_lib
from dpbert.errors import ConfigError
from tests.dpbert.dp import helpers

K = 3


def as_units(batch: dict, rows: np.ndarray, mask: np.ndarray) -> dict:
    """A [U, K] unit batch from an example batch: rows int [U, K] index the examples."""
    out = {k: np.asarray(v)[rows] for k, v in batch.items()}
    out[units.EXAMPLE_MASK] = mask
    return out


def brute_force_unit_grads(base_loss, params, batch, rows, mask, key, reduction):
    """A Python loop over units, one backward per EXAMPLE: each unit's gradient is the mean (or
    sum) of its real examples' gradients (the example in slot k of the unit in row u uses the
    key fold_in(fold_in(key, u), k)); float64 pytrees, one per non-empty unit."""
    grad_fn = jax.jit(jax.grad(lambda p, e, r: base_loss(p, e, r)[0]))
    out = []
    for u in range(rows.shape[0]):
        real = np.flatnonzero(mask[u])
        if not real.size:
            continue
        acc = jax.tree.map(lambda x: np.zeros(x.shape, np.float64), params)
        for k in real:
            example = {name: np.asarray(v)[rows[u, k]] for name, v in batch.items()}
            g = grad_fn(params, example, jax.random.fold_in(jax.random.fold_in(key, u), k))
            acc = jax.tree.map(lambda a, b: a + np.asarray(b, np.float64), acc, g)
        out.append(jax.tree.map(lambda a: a / real.size, acc) if reduction == "mean" else acc)
    return out


def norm(tree) -> float:
    return math.sqrt(sum(float(np.sum(np.square(a))) for a in jax.tree.leaves(tree)))


def clip_and_sum(unit_grads, clip_norm):
    """sum_u g_u / max(1, ||g_u|| / C)."""
    scaled = [jax.tree.map(lambda a, s=1.0 / max(1.0, norm(g) / clip_norm): s * a, g)
              for g in unit_grads]
    return jax.tree.map(lambda *a: sum(a), *scaled)


# Units of 1, 2, 3 examples, an empty (padding) row and a unit using slot 0 and 2 only.
ROWS = np.array([[0, 1, 2], [3, 0, 0], [4, 5, 0], [0, 0, 0], [6, 0, 7], [8, 9, 10]])
MASK = np.array([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0], [1, 0, 1], [1, 1, 1]], bool)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_vmap_unit_clipped_sum_equals_brute_force_loop_over_units(reduction):
    """2 microbatches of 3 units; C at the median unit norm, so both clip branches run."""
    params = helpers.mlp_params()
    batch = helpers.mlp_batch(11)
    key = jax.random.PRNGKey(3)
    grads = brute_force_unit_grads(helpers.mlp_loss, params, batch, ROWS, MASK, key, reduction)
    c = float(np.median([norm(g) for g in grads]))
    ref = clip_and_sum(grads, c)
    loss = units.unit_loss(helpers.mlp_loss, reduction)
    unit_mask = MASK.any(1)
    got, metrics, nonfinite = jax.jit(lambda p, b, m: clipping.VmapClipper(c, 3).clipped_sum(
        loss, p, b, m, key))(params, as_units(batch, ROWS, MASK), unit_mask)
    helpers.assert_trees_close(got, ref, rtol=1e-5, atol_frac=1e-6)
    assert int(nonfinite) == 0
    assert float(metrics["count"]) == MASK.sum()  # metrics stay sums over examples


def test_a_unit_with_k_examples_contributes_at_most_c():
    """One patient's three copies of a note (aligned gradients): clipped per example they add
    3 C; as one unit (mean or sum) at most C."""
    params = helpers.mlp_params()
    batch = jax.tree.map(lambda x: jnp.repeat(x[:1], 3, axis=0), helpers.mlp_batch(1))
    loss = functools.partial(helpers.mlp_loss, dropout=0.0)
    key = jax.random.PRNGKey(0)
    c = 0.5
    per_example, _, _ = clipping.VmapClipper(c).clipped_sum(
        loss, params, batch, np.ones(3, bool), key)
    assert float(clipping.global_norm(per_example)) == pytest.approx(3 * c, rel=1e-5)
    unit = as_units(batch, np.array([[0, 1, 2]]), np.ones((1, 3), bool))
    for reduction in units.REDUCTIONS:
        got, _, _ = clipping.VmapClipper(c).clipped_sum(
            units.unit_loss(loss, reduction), params, unit, np.ones(1, bool), key)
        assert c * 0.99 < float(clipping.global_norm(got)) <= c * (1 + 1e-6)


VOCAB, SEQ, PREDS = 60, 12, 3


@pytest.mark.slow  # ~25 s on 2 busy cores (compiling the ghost clipper and the loop)
def test_ghost_unit_clipped_sum_equals_brute_force_loop_over_units():
    """The tied-embedding ghost clipper on UnitFactoredLoss (a unit's factors concatenated:
    repeated rows across its examples collide in the norm) equals the loop over units; C below
    most unit norms; dropout on."""
    config = model_lib.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=SEQ)
    graphdef, params = nnx.split(model_lib.create_model(config, seed=0))
    batch = helpers.bert_batch(11, VOCAB, seq=SEQ, preds=PREDS, seed=4)
    batch["input_ids"][:, 1] = 7  # one row of E looked up by every example of a unit
    key = jax.random.PRNGKey(5)
    base = losses.make_pretraining_loss(graphdef)
    grads = brute_force_unit_grads(base, params, batch, ROWS, MASK, key, "mean")
    c = float(np.percentile([norm(g) for g in grads], 30))
    ref = clip_and_sum(grads, c)
    loss = units.unit_loss(losses.make_factored_pretraining_loss(graphdef), "mean")
    assert isinstance(loss, units.UnitFactoredLoss) and isinstance(loss, ghost.FactoredLoss)
    clipper = ghost.TiedEmbeddingClipper(c, 3)
    got, metrics, nonfinite = jax.jit(lambda p, b, m: clipper.clipped_sum(loss, p, b, m, key))(
        params, as_units(batch, ROWS, MASK), MASK.any(1))
    helpers.assert_trees_close(got, ref, rtol=2e-5, atol_frac=1e-6)
    assert int(nonfinite) == 0 and float(metrics["count"]) == MASK.sum()
    table = np.asarray(got["bert"]["embeddings"]["word_embeddings"]["embedding"][...])
    assert np.any(table != 0)


# ------------------------------------------------------------------------------- sampler

def unit_ids_of(sizes) -> np.ndarray:
    """Rows of units of the given sizes, interleaved (unit of row r is not r's neighbour's)."""
    ids = np.concatenate([np.full(n, u) for u, n in enumerate(sizes)])
    return np.random.default_rng(0).permutation(ids)


def test_unit_sampler_never_splits_a_unit_and_respects_k():
    sizes = [1, 2, 3, 4, 9, 1, 5, 2] * 10
    ids = unit_ids_of(sizes)
    s = sampling.UnitPoissonSampler(ids, 20.0, physical_batch_size=8, calls_per_batch=4,
                                    max_examples_per_unit=K, seed=11)
    assert s.num_units == s.num_examples == len(sizes) and s.num_rows == ids.size
    picked = np.zeros(ids.size)
    for step in range(60):
        rows, masks = zip(*(s.batch(step * 4 + c) for c in range(4)))
        idx, mask = np.concatenate(rows), np.concatenate(masks)
        assert idx.shape == mask.shape == (32, K)
        seen = []
        for r in range(32):
            members = idx[r][mask[r]]
            if not members.size:
                assert not mask[r:].any()  # units fill the first rows, padding after
                break
            unit = ids[members[0]]
            assert np.all(ids[members] == unit)  # one unit per row
            assert members.size == min(sizes[unit], K) == len(set(members.tolist()))
            seen.append(unit)
            picked[members] += 1
        assert len(seen) == len(set(seen))  # a unit in one row of one call, once per batch
        np.testing.assert_array_equal(np.sort(seen), np.sort(s.logical_batch(step)))
    # A unit larger than K: its examples are chosen uniformly (each ~K/9 of its draws).
    big = np.flatnonzero(ids == 4)
    frac = picked[big] / picked[big].sum()
    assert np.all(np.abs(frac - 1 / 9) < 0.06), frac
    # The sampler resumes from its state like the example sampler.
    s2 = sampling.UnitPoissonSampler(ids, 20.0, 8, 4, K, seed=11)
    s2.load_state_dict(s.state_dict())
    np.testing.assert_array_equal(s2.batch(5)[0], s.batch(5)[0])


def test_unit_sampler_rejects_bad_unit_ids():
    with pytest.raises(ValueError, match="without gaps"):
        sampling.UnitPoissonSampler(np.array([0, 2, 2]), 1.0, 2, max_examples_per_unit=2)
    with pytest.raises(ValueError, match="max_examples_per_unit"):
        sampling.UnitPoissonSampler(np.array([0, 1]), 1.0, 2, max_examples_per_unit=0)


# ------------------------------------------------------------------------------- plan

def unit_config(**dp) -> ml_collections.ConfigDict:
    c = common.get_config()
    c.dp.privacy_unit = "patient"
    c.dp.max_examples_per_unit = K
    c.dp.noise_multiplier = 1.1
    c.dp.delta = 1e-4
    c.batch.expected_batch_size = 30
    c.batch.physical_batch_size = 16
    c.train.num_steps = 50
    for key, value in dp.items():
        c.dp[key] = value
    return c


@pytest.mark.parametrize("num_units", [600, 40])
def test_accounting_over_units_equals_dp_accounting(num_units):
    """N = units, q = expected units / N, the sampler's capacity (in units) as truncation
    (600 units: a capacity below N, the truncated event; 40: no truncation possible)."""
    ids = unit_ids_of(np.random.default_rng(1).integers(1, 7, size=num_units))
    c = unit_config()
    plan = plan_lib.from_config(c, ids.size, 1, unit_ids=ids)
    assert plan.per_unit and plan.num_examples == num_units
    assert isinstance(plan.sampler, sampling.UnitPoissonSampler)
    q, capacity = 30 / num_units, plan.sampler.max_batch_size
    if capacity < num_units:
        event = dp_accounting.TruncatedSubsampledGaussianDpEvent(num_units, q, capacity, 1.1)
    else:
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.1))
    assert (capacity < num_units) == (num_units == 600)
    accountant = dp_accounting.pld.PLDAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, 50))
    assert plan.epsilon(50) == pytest.approx(accountant.get_epsilon(1e-4), rel=1e-12)
    assert plan.spec.num_examples == num_units and plan.spec.q == pytest.approx(q)


def test_plan_refuses_what_units_cannot_do():
    ids = unit_ids_of([2] * 500)
    with pytest.raises(ConfigError, match=r"delta=0.01 must be < 1/N = 0.002 for the N=500 "
                                          r"patients"):
        plan_lib.from_config(unit_config(delta=0.01), ids.size, 1, unit_ids=ids)
    with pytest.raises(ConfigError, match="gives no unit"):
        plan_lib.from_config(unit_config(), ids.size, 1)
    for dp, match in (({"sampling": "shuffle"}, "Poisson sampling"),
                      ({"max_examples_per_unit": 0}, "max_examples_per_unit"),
                      ({"unit_loss": "max"}, "unit_loss"),
                      ({"privacy_unit": "sentence"}, "privacy_unit")):
        c = unit_config(**dp)
        with pytest.raises(ConfigError, match=match):
            plan_lib.validate(c.dp, c.batch)


def test_unit_loss_keys_and_metrics():
    """Slot k of a unit uses fold_in(unit key, k); padding slots add exactly nothing, even
    when their example's loss is not finite."""
    params = helpers.mlp_params()
    batch = helpers.mlp_batch(3)
    batch["y"] = batch["y"].at[2].set(jnp.nan)
    unit = as_units(batch, np.array([[0, 1, 2]]), np.array([[True, True, False]]))
    unit = jax.tree.map(lambda x: x[0], unit)
    rng = jax.random.PRNGKey(9)
    loss, metrics = units.unit_loss(helpers.mlp_loss, "sum")(params, unit, rng)
    expected = sum(float(helpers.mlp_loss(params, {k: v[i] for k, v in batch.items()},
                                          jax.random.fold_in(rng, i))[0]) for i in (0, 1))
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert float(metrics["count"]) == 2.0 and np.isfinite(float(metrics["loss_sum"]))
    mean, _ = units.unit_loss(helpers.mlp_loss, "mean")(params, unit, rng)
    assert float(mean) == pytest.approx(expected / 2, rel=1e-6)
    with pytest.raises(ValueError, match="reduction"):
        units.unit_loss(helpers.mlp_loss, "max")
