"""train.trainable (issue 31): what trains is a config choice; DP-SGD clips, noises and accounts
exactly the trainable parameters; a frozen parameter never moves; the frozen prefix of head /
top:K is computed once, equals the full forward, and its cache follows data, checkpoint and
prefix."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from dpbert.dp import clipping, trees
from dpbert.errors import ConfigError
from dpbert.models import bert as model_lib
from dpbert.models import heads, hf
from dpbert.models import trainable as trainable_lib
from dpbert.tasks import classification, finetuning, prefix_cache, release, task_losses
from tests.dpbert.tasks import finetune_fixtures as fx
from tests.dpbert.tasks.test_finetune import config, final_params, leaves


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy2")
    train, eval_ = fx.sentiment_tsvs(root / "data")
    return {"ckpt": fx.tiny_checkpoint(root / "ckpt", layers=2), "train": train, "eval": eval_}


def tiny_classifier(layers=2, seed=0):
    cfg = model_lib.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=layers,
                               num_attention_heads=2, intermediate_size=32,
                               max_position_embeddings=16)
    return heads.BertForSequenceClassification(cfg, ("neg", "pos"), rngs=nnx.Rngs(seed))


def trained_paths(spec, model_kind="sequence_classification", layers=2):
    model = tiny_classifier(layers) if model_kind != "pretraining" else model_lib.create_model(
        tiny_classifier(layers).config)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    mask = trees.resolve_trainable_mask(
        params, trainable_lib.parse(spec, layers).predicate(model_kind, layers))
    return {"/".join(trees.path_names(p)) for p, t in
            jax.tree_util.tree_flatten_with_path(mask)[0] if t}


def test_each_choice_trains_the_named_parameters():
    head = {"classifier/kernel", "classifier/bias", "bert/pooler/dense/kernel",
            "bert/pooler/dense/bias"}
    assert trained_paths("head") == head
    top1 = trained_paths("top:1")
    assert head < top1 and all(p.startswith("bert/encoder/layer/1/") for p in top1 - head)
    assert len(top1 - head) == 16  # q, k, v, attention out, LN, intermediate, out, LN
    assert trained_paths("top:2") - trained_paths("top:1") == {
        p.replace("/1/", "/0/") for p in top1 - head}
    bitfit = trained_paths("bitfit")
    assert head < bitfit and all(p.endswith("bias") for p in bitfit - head)
    assert "bert/embeddings/LayerNorm/bias" in bitfit
    assert trained_paths("all") == trained_paths("top:2") | {
        p for p in trained_paths("all") if p.startswith("bert/embeddings")}
    pre_head = trained_paths("head", "pretraining")
    assert pre_head and all(p.startswith("cls/") for p in pre_head)
    assert not any("word_embeddings" in p for p in pre_head)  # the tied decoder stays frozen


@pytest.mark.parametrize("spec, match", [
    ("lora:8", "must be one of all, head, top:K"), ("top:0", "K must be in 1..2"),
    ("top:3", "the model has 2 layers"), ("top:x", "must be one of")])
def test_a_wrong_choice_is_one_error_naming_the_field(spec, match):
    with pytest.raises(ConfigError, match=r"config\.train\.trainable=.*" + match):
        trainable_lib.parse(spec, 2)


def test_the_clipped_sum_over_the_trainable_subset_equals_a_brute_force_loop():
    model = tiny_classifier()
    graphdef, state = nnx.split(model)
    params = nnx.to_pure_dict(state)
    predicate = trainable_lib.parse("top:1", 2).predicate("sequence_classification", 2)
    loss_fn = task_losses.make_classification_loss(graphdef, deterministic=True)
    rng = np.random.default_rng(0)
    n, s = 6, 8
    batch = {"input_ids": jnp.asarray(rng.integers(5, 40, (n, s)), jnp.int32),
             "segment_ids": jnp.zeros((n, s), jnp.int32),
             "input_mask": jnp.ones((n, s), jnp.int32),
             "label": jnp.asarray(rng.integers(0, 2, n), jnp.int32)}
    mask = jnp.ones(n, bool)
    clip = 0.05  # below every per-example norm: every example is clipped
    clipper = clipping.VmapClipper(clip, microbatch_size=3, trainable=predicate)
    got, _, _ = clipper.clipped_sum(loss_fn, params, batch, mask, jax.random.key(0))
    flags = trees.resolve_trainable_mask(params, predicate)
    want = jax.tree.map(lambda x: np.zeros(x.shape, np.float64), params)
    grad = jax.jit(jax.grad(lambda p, example: loss_fn(p, example, jax.random.key(0))[0]))
    for i in range(n):   # one example at a time: no vmap, no clipper code
        g = grad(params, jax.tree.map(lambda x: x[i], batch))
        g = jax.tree.map(lambda x, t: np.asarray(x, np.float64) * t, g, flags)
        norm = np.sqrt(sum(np.sum(x ** 2) for x in jax.tree.leaves(g)))
        assert norm > clip
        want = jax.tree.map(lambda w, x: w + x * min(1.0, clip / norm), want, g)
    for (path, a), b, t in zip(jax.tree_util.tree_flatten_with_path(got)[0],
                               jax.tree.leaves(want), jax.tree.leaves(flags)):
        np.testing.assert_allclose(np.asarray(a), b, rtol=2e-4, atol=1e-7,
                                   err_msg=trees.path_string(path))
        if not t:
            assert not np.any(np.asarray(a)), trees.path_string(path)


def test_the_cached_prefix_continues_exactly_where_the_full_forward_goes():
    model = tiny_classifier()
    rng = np.random.default_rng(1)
    ids = jnp.asarray(rng.integers(5, 40, (4, 10)), jnp.int32)
    seg = jnp.zeros_like(ids)
    mask = jnp.asarray(np.arange(10)[None, :] < np.array([[10], [7], [3], [9]]), jnp.int32)
    full = model(ids, seg, mask)
    for layers in (0, 1, 2):
        hidden = model.bert.prefix(ids, seg, mask, layers)
        np.testing.assert_allclose(model.from_prefix(hidden, mask, layers), full, rtol=1e-5,
                                   atol=1e-6)
        # what the cache stores (float16) moves the logits far less than DP's noise
        np.testing.assert_allclose(
            model.from_prefix(hidden.astype(jnp.float16), mask, layers), full, atol=5e-3)


class _Release:
    def __init__(self, arrays):
        self.arrays, self.vectors = arrays, None

    def batch(self, idx):
        return {k: v[np.asarray(idx)] for k, v in self.arrays.items()}


def _split(ids):
    arrays = {"input_ids": ids, "segment_ids": np.zeros_like(ids),
              "input_mask": np.ones_like(ids), "label": np.zeros(len(ids), np.int32)}
    return release.ReleasedSplit(_Release(arrays), num_examples=len(ids), content="x")


def test_the_prefix_cache_is_reused_and_invalidated_by_data_checkpoint_and_prefix(tmp_path):
    ids = np.random.default_rng(2).integers(5, 40, (5, 10)).astype(np.int32)
    model = tiny_classifier()

    def files():
        return {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("train-*.npy")}

    first = prefix_cache.cached_split(_split(ids), model, 1, tmp_path, "train", own_folder=True)
    before = files()
    batch = first.get_batch(np.array([3, 1]), step=0)
    assert set(batch) == {"prefix_hidden", "input_mask", "label"}
    np.testing.assert_allclose(batch["prefix_hidden"], model.bert.prefix(
        jnp.asarray(ids[[3, 1]]), jnp.zeros((2, 10), jnp.int32), jnp.ones((2, 10), jnp.int32),
        1), atol=5e-3)
    prefix_cache.cached_split(_split(ids), model, 1, tmp_path, "train", own_folder=True)
    assert files() == before  # same data, checkpoint and prefix: reused, not recomputed
    changed_data = ids.copy()
    changed_data[0, 0] = 6 if ids[0, 0] != 6 else 7
    for split, m, layers in ((_split(changed_data), model, 1),        # the data
                             (_split(ids), tiny_classifier(seed=1), 1),  # the checkpoint
                             (_split(ids), model, 2)):                # the prefix
        prefix_cache.cached_split(split, m, layers, tmp_path, "train", own_folder=True)
        now = files()
        assert len(now) == 1 and now.keys() != before.keys()  # a new key; the stale one gone
        before = now
    # Only the prefix's own parameters count: a new head keeps the cache.
    other_head = tiny_classifier()
    other_head.classifier.kernel.set_value(other_head.classifier.kernel[...] + 1.0)
    prefix_cache.cached_split(_split(ids), other_head, 2, tmp_path, "train", own_folder=True)
    assert files() == before


@pytest.mark.slow
def test_dp_top_k_never_moves_a_frozen_parameter_and_names_what_trained(toy, tmp_path):
    results = finetuning.finetune(classification.ClassificationTask(), config(toy, **{
        "model.init_from_hf": str(toy["ckpt"]), "train.trainable": "top:1",
        "dp.enabled": True, "dp.noise_multiplier": 5.0, "dp.target_epsilon": None,
        "dp.delta": 1e-3, "dp.overflow_probability": 1e-3, "train.epochs": 1.0}), tmp_path)
    source = load_file(str(toy["ckpt"] / "model.safetensors"))
    flat = leaves(final_params(tmp_path)[0])
    moved = set()
    for k, v in flat.items():
        if k[0] == "bert" and not (k[:4] == ("bert", "encoder", "layer", "1") or
                                   k[:2] == ("bert", "pooler")):
            np.testing.assert_array_equal(v, hf.from_hf_tensor(k, source[hf.hf_key(k)]),
                                          err_msg=str(k))   # frozen: bitwise, no noise
        elif k[0] == "bert" and not np.array_equal(v, hf.from_hf_tensor(k, source[hf.hf_key(k)])):
            moved.add(k[:4])
    assert ("bert", "encoder", "layer", "1") in moved
    run = json.loads((tmp_path / "run.json").read_text())["trainable"]
    assert results["trainable"] == run and run["spec"] == "top:1"
    assert 0 < run["parameters"] < run["total_parameters"]
    assert set(run["groups"]) == {"bert/encoder/layer/1", "bert/pooler/dense", "classifier"}
    assert sorted((tmp_path / "prefix_cache").glob("*.npy"))  # computed once, kept
    # dp.clipping="auto": the mixed ghost clipper on the cached prefix's output
    assert json.loads((tmp_path / "config.json").read_text())["dp"]["clipping"] == "mixed_ghost"


@pytest.mark.parametrize("name", ["mixed_ghost", "ghost_embedding"])
def test_the_ghost_clippers_on_the_cached_prefix_equal_the_vmap_clipper(name):
    """With the prefix cached, the ghost clippers' inputs are its hidden states (E, P and
    the prefix frozen): their clipped sum over the trainable top equals VmapClipper's."""
    model = tiny_classifier()
    graphdef, state = nnx.split(model)
    params = nnx.to_pure_dict(state)
    predicate = trainable_lib.parse("top:1", 2).predicate("sequence_classification", 2)
    rng = np.random.default_rng(3)
    n, s = 6, 8
    ids = jnp.asarray(rng.integers(5, 40, (n, s)), jnp.int32)
    mask_tokens = jnp.asarray(np.arange(s)[None] < rng.integers(3, s + 1, (n, 1)), jnp.int32)
    batch = {"prefix_hidden": model.bert.prefix(ids, jnp.zeros_like(ids), mask_tokens, 1),
             "input_mask": mask_tokens, "label": jnp.asarray(rng.integers(0, 2, n), jnp.int32)}
    loss = task_losses.FactoredClassificationLoss(graphdef, deterministic=False, start_layer=1)
    mask = jnp.asarray([True] * (n - 1) + [False])
    clipper = clipping.get_clipper(name).make(0.05, 3, 1, predicate)
    got, got_m, _ = clipper.clipped_sum(loss, params, batch, mask, jax.random.key(1))
    want, want_m, _ = clipping.VmapClipper(0.05, 3, 1, predicate).clipped_sum(
        loss, params, batch, mask, jax.random.key(1))   # same dropout masks (same keys)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7, err_msg=trees.path_string(path))
    np.testing.assert_allclose(got_m["loss_sum"], want_m["loss_sum"], rtol=1e-5)


def test_the_recipe_fills_only_what_is_unset_and_depends_on_dp_and_n():
    from configs import finetune_classification
    from dpbert.tasks import recipe

    c = finetune_classification.get_config()
    plain = recipe.resolve(c, 8454)
    assert (plain.train.trainable, plain.batch.expected_batch_size, plain.train.epochs,
            plain.optimizer.name, plain.optimizer.learning_rate) == ("all", 32, 2.0, "adamw", 5e-5)
    c.dp.enabled = True
    dp = recipe.resolve(c, 8454)
    assert (dp.train.trainable, dp.batch.expected_batch_size, dp.batch.physical_batch_size,
            dp.batch.microbatch_size, dp.optimizer.weight_decay, dp.train.epochs) == (
        "top:1", 1024, 128, 32, 0.0, 5.0)
    assert (dp.optimizer.name, dp.optimizer.learning_rate) == ("sgd", 2.0)  # not Adam
    assert recipe.resolve(c, 1000).batch.expected_batch_size == 125   # N / 8 for small N
    c.optimizer.learning_rate = 1e-4   # set without the optimizer: AdamW, as documented
    assert recipe.resolve(c, 8454).optimizer.name == "adamw"
    c.optimizer.learning_rate = None
    c.batch.physical_batch_size = 16
    assert recipe.resolve(c, 8454).batch.microbatch_size is None  # 32 would not divide 16
    c.batch.physical_batch_size = None
    c.train.trainable, c.batch.expected_batch_size = "bitfit", 64     # what the user set stays
    mine = recipe.resolve(c, 8454)
    assert (mine.train.trainable, mine.batch.expected_batch_size) == ("bitfit", 64)
    assert set(recipe.report(mine)["filled"]) == {
        "batch.physical_batch_size", "batch.microbatch_size", "optimizer.name",
        "optimizer.learning_rate", "optimizer.weight_decay", "train.epochs"}
    assert c.train.trainable == "bitfit" and c.train.epochs is None  # the input is not changed


def test_the_recipe_warns_when_its_dp_learning_rate_meets_a_trainable_it_was_not_chosen_for():
    """lr 2.0 was chosen for top:1; with trainable=all it collapsed MiniLM on an H200 (issue 33),
    so all takes its own lr; a run that takes the filled lr with a user-set trainable it was not
    measured with is told."""
    from configs import finetune_classification
    from dpbert.tasks import recipe

    c = finetune_classification.get_config()
    assert recipe.caution(recipe.resolve(c, 8454)) is None          # no DP
    c.dp.enabled = True
    assert recipe.caution(recipe.resolve(c, 8454)) is None          # the recipe's own choice
    for spec in recipe.DP_LR_MEASURED:
        c.train.trainable = spec
        assert recipe.caution(recipe.resolve(c, 8454)) is None, spec
    c.train.trainable = "all"       # its own, smaller step: lr 2.0 collapsed it
    everything = recipe.resolve(c, 8454)
    assert (everything.optimizer.name, everything.optimizer.learning_rate) == (
        "sgd", recipe.DP_LEARNING_RATE_ALL) and recipe.DP_LEARNING_RATE_ALL < 2.0
    assert recipe.caution(everything) is None
    assert f"{recipe.DP_LEARNING_RATE_ALL:g} with train.trainable=all" in recipe.report(
        everything)["rule"]
    c.train.trainable = "bitfit"
    text = recipe.caution(recipe.resolve(c, 8454))
    assert "train.trainable=bitfit" in text and "sgd lr 2" in text and "learning_rate" in text
    c.optimizer.name, c.optimizer.learning_rate = "sgd", 0.2        # the user chose the step
    assert recipe.caution(recipe.resolve(c, 8454)) is None
    c.optimizer.name = None      # an lr alone is taken as AdamW's: under DP the run is told
    adam = recipe.resolve(c, 8454)
    assert adam.optimizer.name == "adamw"
    text = recipe.caution(adam)
    assert "optimizer.learning_rate=0.2" in text and "adamw" in text and "name=sgd" in text
    c.optimizer.name = "adamw"                                       # named: the user's choice
    assert recipe.caution(recipe.resolve(c, 8454)) is None
    c.dp.enabled = False
    c.optimizer.name = None
    assert recipe.caution(recipe.resolve(c, 8454)) is None          # AdamW is the plain recipe


@pytest.mark.slow
def test_dp_ner_with_the_head_only_keeps_the_encoder_bitwise(toy, tmp_path):
    """NER under DP (one document = one unit) takes the same options; its documents of several
    windows are not cached (no prefix_cache), the encoder is simply frozen."""
    from tests.dpbert.tasks.test_finetune import ner_config

    results = finetuning.run(ner_config(toy, tmp_path, **{
        "model.init_from_hf": str(toy["ckpt"]), "train.trainable": "head",
        "dp.enabled": True, "dp.noise_multiplier": 2.0, "dp.target_epsilon": None,
        "dp.delta": 1e-3, "dp.overflow_probability": 1e-3, "train.epochs": 1.0}), tmp_path / "w")
    assert results["trainable"]["groups"].keys() == {"classifier"}
    assert results["privacy"]["dp_sgd"]["training"]["privacy_unit"] == "example"
    assert "one document" in results["privacy"]["privacy_unit"]
    source = load_file(str(toy["ckpt"] / "model.safetensors"))
    for k, v in leaves(final_params(tmp_path / "w")[0]).items():
        if k[0] == "bert":
            np.testing.assert_array_equal(v, hf.from_hf_tensor(k, source[hf.hf_key(k)]))
    assert not (tmp_path / "w" / "prefix_cache").exists()


def test_ner_takes_its_own_values_without_dp_and_the_dp_recipe_with_it():
    from configs import finetune_ner
    from dpbert.tasks import recipe

    c = finetune_ner.get_config()
    plain = recipe.resolve(c, 136)
    assert (plain.train.trainable, plain.batch.expected_batch_size,
            plain.batch.physical_batch_size, plain.train.epochs) == ("all", 8, 8, 4.0)
    assert "B = 8" in recipe.report(plain)["rule"]
    c.dp.enabled = True
    dp = recipe.resolve(c, 2000)   # one document = one unit: B from the documents
    assert (dp.train.trainable, dp.batch.expected_batch_size, dp.optimizer.name) == (
        "top:1", 250, "sgd")


def test_the_prefix_computation_reports_progress(tmp_path, monkeypatch, capsys):
    """Computing a large split's prefix takes minutes on a CPU: it says how far it got."""
    ids = np.random.default_rng(3).integers(5, 40, (5, 10)).astype(np.int32)
    monkeypatch.setattr(prefix_cache, "EXAMPLES_PER_CALL", 2)
    monkeypatch.setattr(prefix_cache, "PROGRESS_SECONDS", 0.0)
    prefix_cache.cached_split(_split(ids), tiny_classifier(), 1, tmp_path, "train",
                              own_folder=True)
    out = capsys.readouterr().out
    assert "frozen prefix of the train split: 2 of 5 examples" in out
    assert "4 of 5 examples" in out and "5 of 5" not in out  # the end has its own line
    assert "5 examples computed once" in out
