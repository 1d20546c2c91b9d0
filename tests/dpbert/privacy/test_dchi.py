"""dχ mechanisms: noise law (KS tests), exact chunked nearest neighbour against brute force,
special tokens, the on-device Privatizer's fields, keys and sharding."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec
from safetensors.numpy import save_file
from scipy import stats

from dpbert.privacy import dchi

SPECIALS = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = 0, 3, 4, 5, 6
P_ALPHA = 1e-4   # KS p-value threshold: a correct sampler fails with probability 1e-4.


def toy_vocab(size: int) -> list[str]:
    return SPECIALS + [f"w{i}" for i in range(size - len(SPECIALS))]


def brute_force_nn(z: np.ndarray, table: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """float64 argmin_v ‖z - φ(v)‖ over candidates, ties to the lowest id (numpy.argmin)."""
    z = np.asarray(z, np.float64).reshape(-1, table.shape[1])
    d = ((z[:, None, :] - table.astype(np.float64)[None]) ** 2).sum(-1)
    d[:, ~candidates] = np.inf
    return d.argmin(1)


# ----------------------------------------------------------------------------- M_rep law


@pytest.mark.parametrize("dim,eta", [(16, 3.0), (5, 0.5)])
def test_noise_radius_is_gamma_n_over_eta(dim, eta):
    x = np.random.default_rng(0).normal(size=(20_000, dim)).astype(np.float32)
    out = jax.jit(dchi.m_rep)(jax.random.key(1), x, eta)
    radius = np.linalg.norm(np.asarray(out, np.float64) - x, axis=1)
    law = stats.gamma(a=dim, scale=1.0 / eta)
    assert stats.kstest(radius, law.cdf).pvalue > P_ALPHA
    # Mean n/η within 5 standard errors.
    assert abs(radius.mean() - dim / eta) < 5 * law.std() / np.sqrt(radius.size)
    # Power: the same samples reject the laws of the usual mistakes (shape n-1, scale η).
    assert stats.kstest(radius, stats.gamma(a=dim - 1, scale=1.0 / eta).cdf).pvalue < 1e-6
    assert stats.kstest(radius, stats.gamma(a=dim, scale=eta).cdf).pvalue < 1e-6


def test_noise_mean_norm_matches_n_over_eta_at_bert_width():
    noise = dchi.sample_noise(jax.random.key(2), (4000,), 384, 75.0)
    mean = float(np.linalg.norm(np.asarray(noise, np.float64), axis=1).mean())
    assert abs(mean / (384 / 75.0) - 1) < 0.003     # std error of the mean is 0.08 %


def test_noise_direction_is_uniform_on_the_sphere():
    dim, num = 12, 20_000
    noise = np.asarray(dchi.sample_noise(jax.random.key(3), (num,), dim, 2.0), np.float64)
    u = noise / np.linalg.norm(noise, axis=1, keepdims=True)
    # E‖mean u‖² = 1/num for a uniform direction: allow 3x that norm.
    assert np.linalg.norm(u.mean(0)) < 3 / np.sqrt(num)
    # Projection on any fixed unit vector v: (u·v + 1)/2 ~ Beta((n-1)/2, (n-1)/2).
    beta = stats.beta((dim - 1) / 2, (dim - 1) / 2)
    rng = np.random.default_rng(4)
    for _ in range(3):
        v = rng.normal(size=dim)
        v /= np.linalg.norm(v)
        assert stats.kstest((u @ v + 1) / 2, beta.cdf).pvalue > P_ALPHA
    # Power: a direction drawn uniformly from the cube, normalised, is rejected.
    cube = rng.uniform(-1, 1, size=(num, dim))
    cube /= np.linalg.norm(cube, axis=1, keepdims=True)
    axis = np.eye(dim)[0]
    assert stats.kstest((cube @ axis + 1) / 2, beta.cdf).pvalue < 1e-6


def test_noise_is_independent_across_tokens():
    noise = np.asarray(dchi.sample_noise(jax.random.key(5), (5000, 2), 8, 1.0))
    a, b = noise[:, 0, 0], noise[:, 1, 0]
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / np.sqrt(5000)


# ----------------------------------------------------------------------------- exact NN


@pytest.fixture(scope="module")
def toy_table():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(203, 8)).astype(np.float32)
    candidates = rng.random(203) > 0.1
    return table, candidates


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 203, 500])
def test_nearest_token_equals_brute_force(toy_table, chunk_size):
    table, candidates = toy_table
    rng = np.random.default_rng(chunk_size)
    # Queries near table rows (the realistic case) and far from everything.
    z = np.concatenate([table[rng.integers(0, 203, 300)] + 0.3 * rng.normal(size=(300, 8)),
                        5.0 * rng.normal(size=(100, 8))]).astype(np.float32)
    index = dchi.build_search_index(table, candidates, chunk_size)
    got = np.asarray(jax.jit(dchi.nearest_token)(z.reshape(4, 100, 8), index))
    assert got.shape == (4, 100) and got.dtype == np.int32
    np.testing.assert_array_equal(got.reshape(-1), brute_force_nn(z, table, candidates))
    assert candidates[got].all()


@pytest.mark.parametrize("chunk_size", [16, 1000])
def test_nearest_token_ties_go_to_the_lowest_id(toy_table, chunk_size):
    table, _ = toy_table
    table = table.copy()
    candidates = np.ones(203, bool)
    table[150] = table[10]            # different chunks (chunk 16)
    table[21] = table[20]             # same chunk
    table[40] = table[5]
    candidates[5] = False             # a non-candidate twin never wins the tie
    index = dchi.build_search_index(table, candidates, chunk_size)
    z = np.stack([table[150], table[21], table[40]])
    np.testing.assert_array_equal(np.asarray(dchi.nearest_token(z, index)), [10, 20, 40])


def test_m_txt_equals_brute_force_on_the_noisy_embeddings(toy_table):
    table, _ = toy_table
    vocab = toy_vocab(203)
    special = dchi.special_token_mask(vocab)
    index = dchi.build_search_index(table, ~special, 37)
    ids = np.random.default_rng(1).integers(0, 203, size=(6, 50)).astype(np.int32)
    key, eta = jax.random.key(7), 4.0
    # One program for both: every gamma-sampler compile costs seconds on a small CPU.
    got, noise = map(np.asarray, jax.jit(lambda k: (
        dchi.m_txt(k, ids, index, jnp.asarray(special), eta),
        dchi.sample_noise(k, ids.shape, 8, eta)))(key))
    z = table[ids] + noise
    want = np.where(special[ids], ids, brute_force_nn(z, table, ~special).reshape(ids.shape))
    np.testing.assert_array_equal(got, want)
    assert (got != ids).any() and (got == ids).any()


def test_build_search_index_rejects_bad_input():
    table = np.zeros((10, 4), np.float32)
    with pytest.raises(ValueError, match="no candidate"):
        dchi.build_search_index(table, np.zeros(10, bool))
    with pytest.raises(ValueError, match="candidate mask has shape"):
        dchi.build_search_index(table, np.ones(9, bool))
    with pytest.raises(ValueError, match="chunk_size"):
        dchi.build_search_index(table, np.ones(10, bool), 0)
    with pytest.raises(ValueError, match="non-finite"):
        dchi.build_search_index(np.full((10, 4), np.nan, np.float32), np.ones(10, bool))


# ----------------------------------------------------------------------------- special tokens


def test_special_token_mask():
    vocab = ["[PAD]", "[unused0]", "[unused993]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the",
             "##s", "[unused]", "unused1", "[unk]", "!"]
    np.testing.assert_array_equal(dchi.special_token_mask(vocab),
                                  [True] * 7 + [False] * 6)


def test_special_token_mask_of_the_real_bert_vocab(minilm_dir):
    mask = dchi.special_token_mask_from_file(minilm_dir / "vocab.txt")
    assert mask.shape == (30522,)
    assert int(mask.sum()) == 999     # [PAD] [UNK] [CLS] [SEP] [MASK] + [unused0..993]


def make_batch(num: int, seq_len: int = 24, num_pred: int = 4, seed: int = 0):
    """Host-masked examples: [CLS] a.. [SEP] b.. [SEP] [PAD]..; slot 0 masked with [MASK],
    slot 1 kept (unchanged), slot 2 randomly replaced, slot 3 padding."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((num, seq_len), np.int32)
    length = seq_len - 4
    ids[:, 0], ids[:, length // 2], ids[:, length - 1] = CLS, SEP, SEP
    body = [i for i in range(1, length - 1) if i != length // 2]
    ids[:, body] = rng.integers(len(SPECIALS), 203, size=(num, len(body)))
    positions = np.zeros((num, num_pred), np.int32)
    originals = np.zeros((num, num_pred), np.int32)
    for b in range(num):
        pos = rng.choice(body, 3, replace=False)
        positions[b, :3] = pos
        originals[b, :3] = ids[b, pos]
        ids[b, pos[0]] = MASK
        ids[b, pos[2]] = len(SPECIALS) + (ids[b, pos[2]] - len(SPECIALS) + 1) % (203 - 7)
    weights = np.tile(np.array([1, 1, 1, 0], np.float32), (num, 1))
    return {"input_ids": ids, "input_mask": (ids != PAD).astype(np.int32),
            "segment_ids": np.zeros_like(ids), "masked_lm_positions": positions,
            "masked_lm_ids": originals, "masked_lm_weights": weights,
            "next_sentence_labels": np.zeros((num,), np.int32)}


@pytest.fixture(scope="module")
def clustered_table():
    """Specials are exact copies of regular rows but at lower ids, so a search that did not
    exclude them would pick them on every tie (ties go to the lowest id)."""
    rng = np.random.default_rng(3)
    table = rng.normal(size=(203, 8)).astype(np.float32)
    table[:len(SPECIALS)] = table[len(SPECIALS):2 * len(SPECIALS)]
    return table


# One jitted function and one batch shape for every test, so compilations are shared.
PRIVATIZE = jax.jit(dchi.privatize_batch)
BATCH = 64


def privatize(table, mechanism, batch, key=0, eta=3.0, **kw):
    priv = dchi.Privatizer.create(table, dchi.special_token_mask(toy_vocab(203)), eta=eta,
                                  mechanism=mechanism, chunk_size=50, **kw)
    out = PRIVATIZE(priv, batch, jax.random.key(key))
    return priv, {k: np.asarray(v) for k, v in out.items()}


def test_text_to_text_keeps_specials_and_never_emits_them(clustered_table):
    batch = make_batch(BATCH)
    for eta in (0.3, 3.0, 30.0):
        _, out = privatize(clustered_table, "text_to_text", batch, eta=eta)
        ids, new = batch["input_ids"], out["input_ids"]
        is_special = ids < len(SPECIALS)
        np.testing.assert_array_equal(new[is_special], ids[is_special])
        assert (new[~is_special] >= len(SPECIALS)).all(), eta
        assert (out["prob_masked_lm_ids"] >= len(SPECIALS))[:, :3].all()
    # At large η most tokens survive: the mechanism is not just random replacement.
    assert (new[~is_special] == ids[~is_special]).mean() > 0.8


def test_text_to_text_fields_follow_privatize_then_mask(clustered_table):
    batch = make_batch(BATCH, seed=1)
    _, out = privatize(clustered_table, "text_to_text", batch, eta=3.0, mlm_target="prob",
                       prob_samples=5)
    rows = np.arange(BATCH)
    pos = batch["masked_lm_positions"]
    np.testing.assert_array_equal(out["original_masked_lm_ids"], batch["masked_lm_ids"])
    assert out["prob_masked_lm_ids"].shape == (BATCH, 4, 5)
    np.testing.assert_array_equal(out["prob_masked_lm_ids"][..., 0], out["masked_lm_ids"])
    # [MASK] stays [MASK]; the kept slot shows exactly the privatized label; padding stays [PAD].
    np.testing.assert_array_equal(out["input_ids"][rows, pos[:, 0]], MASK)
    np.testing.assert_array_equal(out["input_ids"][rows, pos[:, 1]], out["masked_lm_ids"][:, 1])
    np.testing.assert_array_equal(out["masked_lm_ids"][:, 3], PAD)
    np.testing.assert_array_equal(out["prob_masked_lm_ids"][:, 3], PAD)
    assert (out["masked_lm_ids"][:, :3] != batch["masked_lm_ids"][:, :3]).any()
    # The random replacement (a different token) uses its own noise, so it agrees with the
    # label only when both draws land on the same token by chance.
    agree = (out["input_ids"][rows, pos[:, 2]] == out["masked_lm_ids"][:, 2]).mean()
    assert agree < 0.2
    # Untouched fields pass through.
    for k in ("input_mask", "segment_ids", "masked_lm_positions", "masked_lm_weights",
              "next_sentence_labels"):
        np.testing.assert_array_equal(out[k], batch[k])


def test_random_replacement_noise_is_independent_of_the_label_at_huge_noise(clustered_table):
    """Shared noise would make the replaced input give the label away when noise dominates."""
    batch = make_batch(BATCH, seed=2)
    _, out = privatize(clustered_table, "text_to_text", batch, eta=0.05)
    rows, pos = np.arange(BATCH), batch["masked_lm_positions"]
    agree = (out["input_ids"][rows, pos[:, 2]] == out["masked_lm_ids"][:, 2]).mean()
    kept = (out["input_ids"][rows, pos[:, 1]] == out["masked_lm_ids"][:, 1]).mean()
    assert kept == 1.0 and agree < 0.3


def test_token_rep_embeddings(clustered_table):
    batch = make_batch(BATCH)
    priv, out = privatize(clustered_table, "token_rep", batch, eta=3.0)
    emb, ids = out["word_embeddings"], batch["input_ids"]
    assert emb.shape == (BATCH, 24, 8) and emb.dtype == np.float32
    np.testing.assert_array_equal(out["input_ids"], ids)
    is_special = ids < len(SPECIALS)
    np.testing.assert_array_equal(emb[is_special], clustered_table[ids[is_special]])
    assert (np.abs(emb[~is_special] - clustered_table[ids[~is_special]]).max(-1) > 0).all()
    # Noise radius of the regular positions: mean n/η (8/3) within 5 standard errors.
    radius = np.linalg.norm(emb[~is_special] - clustered_table[ids[~is_special]], axis=-1)
    assert abs(radius.mean() - 8 / 3) < 5 * np.sqrt(8) / 3 / np.sqrt(radius.size)
    # Vanilla label = nearest regular token of the very vector the model sees at kept slots.
    rows, pos = np.arange(BATCH), batch["masked_lm_positions"]
    regular = ~dchi.special_token_mask(toy_vocab(203))
    np.testing.assert_array_equal(
        out["masked_lm_ids"][:, 1], brute_force_nn(emb[rows, pos[:, 1]], clustered_table, regular))
    np.testing.assert_array_equal(emb[rows, pos[:, 0]], np.tile(clustered_table[MASK], (BATCH, 1)))
    np.testing.assert_array_equal(out["original_masked_lm_ids"], batch["masked_lm_ids"])


def test_none_mechanism_is_the_identity(clustered_table):
    batch = make_batch(BATCH)
    _, out = privatize(clustered_table, "none", batch, mlm_target="prob", prob_samples=3)
    for k, v in batch.items():
        np.testing.assert_array_equal(out[k], v)
    np.testing.assert_array_equal(out["original_masked_lm_ids"], batch["masked_lm_ids"])
    np.testing.assert_array_equal(out["prob_masked_lm_ids"],
                                  np.repeat(batch["masked_lm_ids"][..., None], 3, -1))
    assert "word_embeddings" not in out


def test_each_example_is_privatized_afresh(clustered_table):
    twice = make_batch(BATCH)
    for v in twice.values():
        v[1] = v[0]
    _, a = privatize(clustered_table, "text_to_text", twice, key=0, eta=1.0)
    _, b = privatize(clustered_table, "text_to_text", twice, key=1, eta=1.0)
    _, a_again = privatize(clustered_table, "text_to_text", twice, key=0, eta=1.0)
    assert (a["input_ids"][0] != a["input_ids"][1]).any()       # position in the batch
    assert (a["input_ids"] != b["input_ids"]).any()             # step / microbatch key
    np.testing.assert_array_equal(a["input_ids"], a_again["input_ids"])  # reproducible
    k = dchi.batch_key(jax.random.key(0), 3)
    assert not np.array_equal(jax.random.key_data(k),
                              jax.random.key_data(dchi.batch_key(jax.random.key(0), 3, 1)))


def test_noise_and_example_keys_are_jax_random_bit_for_bit(monkeypatch):
    """The Gaussian of `sample_noise` and the per-example keys of `privatize_batch` come from
    `dpbert.prng` (less compile on the CPU): the same bits as jax.random's, jitted and vmapped
    as the train step runs them."""
    def reference(key):
        k_dir, k_rad = jax.random.split(key)
        direction = jax.random.normal(k_dir, (24, 8), jnp.float32)
        direction = direction / jnp.linalg.norm(direction, axis=-1, keepdims=True)
        return (jax.random.gamma(k_rad, 8.0, (24,), jnp.float32) / jnp.float32(3.0)
                )[:, None] * direction

    keys = jax.random.split(jax.random.key(11), 5)
    got = jax.jit(jax.vmap(lambda k: dchi.sample_noise(k, (24,), 8, 3.0)))(keys)
    np.testing.assert_array_equal(got, jax.jit(jax.vmap(reference))(keys))
    # The per-example keys: fold_in(key, position in the batch).
    monkeypatch.setattr(dchi, "privatize_example",
                        lambda privatizer, example, key: {"key": jax.random.key_data(key)})
    batch = {"input_ids": jnp.zeros((BATCH, 3), jnp.int32)}
    key = dchi.batch_key(jax.random.key(5), 7, 2)
    got = jax.jit(dchi.privatize_batch)(None, batch, key)["key"]
    want = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(BATCH))
    np.testing.assert_array_equal(got, jax.random.key_data(want))


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
def test_privatizer_shards_along_the_batch(clustered_table, axis_type):
    """With the batch split over a (data, fsdp) mesh of 8 devices (auto axes as in
    dpbert.runtime.sharding, or jax's default explicit axes), the result is sharded along the batch
    and equal to the single-device result."""
    batch = make_batch(BATCH)
    priv, want = privatize(clustered_table, "text_to_text", batch, key=5)
    mesh = jax.make_mesh((4, 2), ("data", "fsdp"), axis_types=(axis_type,) * 2)
    sharded = {k: jax.device_put(v, NamedSharding(mesh, PartitionSpec(("data", "fsdp"))))
               for k, v in batch.items()}
    priv = jax.device_put(priv, NamedSharding(mesh, PartitionSpec()))
    with jax.set_mesh(mesh):
        got = PRIVATIZE(priv, sharded, jax.random.key(5))
    assert got["input_ids"].sharding.spec[0] == ("data", "fsdp")
    for k, v in want.items():
        np.testing.assert_array_equal(np.asarray(got[k]), v, err_msg=k)


def test_privatizer_create_rejects_bad_config(clustered_table):
    special = dchi.special_token_mask(toy_vocab(203))
    create = dchi.Privatizer.create
    with pytest.raises(ValueError, match="dchi.mechanism must be one of"):
        create(clustered_table, special, eta=1.0, mechanism="text2text")
    for eta in (0, -1.0, float("nan"), float("inf"), "50"):
        with pytest.raises(ValueError, match="dchi.eta"):
            create(clustered_table, special, eta=eta, mechanism="token_rep")
    with pytest.raises(ValueError, match="needs the embedding table"):
        create(None, special, eta=1.0, mechanism="text_to_text")
    with pytest.raises(ValueError, match="unknown MLM target 'probability'"):
        create(clustered_table, special, eta=1.0, mechanism="token_rep", mlm_target="probability")
    with pytest.raises(ValueError, match="special-token mask has shape"):
        create(clustered_table, special[:-1], eta=1.0, mechanism="token_rep")
    with pytest.raises(ValueError, match="prob_samples"):
        create(clustered_table, special, eta=1.0, mechanism="token_rep", mlm_target="prob",
               prob_samples=0)
    assert create(None, special, eta=np.float32(2.0), mechanism="none").label_draws == 1


# ----------------------------------------------------------------------------- loading φ


def write_fake_hf(folder: pathlib.Path, table: np.ndarray, vocab: list[str], prefix: str = ""):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "bert",
                                                    "vocab_size": table.shape[0],
                                                    "hidden_size": table.shape[1]}))
    save_file({f"{prefix}embeddings.word_embeddings.weight": table,
               f"{prefix}embeddings.position_embeddings.weight": np.zeros((4, table.shape[1]),
                                                                          np.float32)},
              str(folder / "model.safetensors"))
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return folder


@pytest.mark.parametrize("prefix", ["", "bert."])
def test_load_embedding_table_and_from_hf(tmp_path, clustered_table, prefix):
    folder = write_fake_hf(tmp_path / "m", clustered_table, toy_vocab(203), prefix)
    table, vocab = dchi.load_embedding_table(folder)
    np.testing.assert_array_equal(table, clustered_table)
    assert vocab == toy_vocab(203)
    priv = dchi.Privatizer.from_hf(folder, eta=2.0, mechanism="text_to_text")
    np.testing.assert_array_equal(np.asarray(priv.index.table), clustered_table)
    assert int(np.asarray(priv.special).sum()) == len(SPECIALS)


def test_load_embedding_table_from_a_sharded_checkpoint(tmp_path, clustered_table):
    folder = write_fake_hf(tmp_path / "m", clustered_table, toy_vocab(203), "bert.")
    (folder / "model.safetensors").rename(folder / "model-00002-of-00002.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "bert.embeddings.word_embeddings.weight": "model-00002-of-00002.safetensors",
        "bert.pooler.dense.weight": "model-00001-of-00002.safetensors"}}))
    np.testing.assert_array_equal(dchi.load_embedding_table(folder)[0], clustered_table)


def test_load_embedding_table_errors(tmp_path, clustered_table):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        dchi.load_embedding_table(tmp_path / "absent")
    folder = write_fake_hf(tmp_path / "short", clustered_table, toy_vocab(100))
    with pytest.raises(ValueError, match=r"shape \(203, 8\) but .*vocab.txt has 100 tokens"):
        dchi.load_embedding_table(folder)
    folder = write_fake_hf(tmp_path / "novocab", clustered_table, toy_vocab(203))
    (folder / "vocab.txt").unlink()
    with pytest.raises(FileNotFoundError, match="vocab.txt"):
        dchi.load_embedding_table(folder)
    folder = tmp_path / "noweights"
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(toy_vocab(20)) + "\n")  # a valid vocab, no weights
    with pytest.raises(FileNotFoundError, match="no weights found"):
        dchi.load_embedding_table(folder)


# ----------------------------------------------------------------------------- analyses


def test_plausible_deniability_and_inversion_match_brute_force(toy_table):
    table, _ = toy_table
    special = dchi.special_token_mask(toy_vocab(203))
    index = dchi.build_search_index(table, ~special, 64)
    ids = np.array([10, 50, 100], np.int32)
    key, eta, samples = jax.random.key(9), 2.0, 40

    @jax.jit
    def run(key):   # one program: every gamma-sampler compile costs seconds on a small CPU
        n_w, s_w = dchi.plausible_deniability(key, ids, index, eta, samples)
        return (n_w, s_w, dchi.sample_noise(key, (3, samples), 8, eta),
                dchi.inversion_hits(key, ids, index, eta), dchi.sample_noise(key, (3,), 8, eta))

    n_w, s_w, noise, hits, noise1 = map(np.asarray, run(key))
    nn = brute_force_nn(table[ids][:, None, :] + noise, table, ~special).reshape(3, samples)
    np.testing.assert_array_equal(n_w, (nn == ids[:, None]).sum(1))
    np.testing.assert_array_equal(s_w, [len(set(r)) for r in nn])
    np.testing.assert_array_equal(hits, brute_force_nn(table[ids] + noise1, table, ~special) == ids)
    assert 0 < n_w.sum() < 3 * samples and (s_w > 1).any()
