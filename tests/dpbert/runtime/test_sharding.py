"""Mesh construction, logical-axis rules and global-batch assembly on 8 fake CPU devices."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from dpbert.models import bert as model_lib
from dpbert.runtime import sharding


def test_eight_fake_devices():
    assert jax.device_count() == 8


@pytest.mark.parametrize("data,fsdp,expected", [(-1, 1, (8, 1)), (2, -1, (2, 4)), (4, 2, (4, 2)),
                                                (1, 8, (1, 8))])
def test_mesh_shape(data, fsdp, expected):
    assert sharding.mesh_shape(data, fsdp, 8) == expected


@pytest.mark.parametrize("data,fsdp,match", [(3, -1, "does not divide"), (-1, -1, "at most one"),
                                             (2, 2, "4 devices, but 8"), (0, 1, "positive")])
def test_mesh_shape_errors(data, fsdp, match):
    with pytest.raises(ValueError, match=match):
        sharding.mesh_shape(data, fsdp, 8)


def test_param_shardings_follow_rules_and_divisibility():
    mesh = sharding.make_mesh(4, 2)
    abstract = nnx.eval_shape(lambda: model_lib.create_model(
        model_lib.BertConfig.preset("tiny", 100)))
    specs = sharding.param_shardings(nnx.state(abstract, nnx.Param), mesh)
    flat = {tuple(map(str, p)): s.spec for p, s in nnx.to_flat_state(specs)}
    assert flat[("bert", "embeddings", "word_embeddings", "embedding")] == P("fsdp", None)
    assert flat[("bert", "encoder", "layer", "0", "intermediate", "dense", "kernel")] == \
        P(None, "fsdp")
    assert flat[("bert", "encoder", "layer", "0", "attention", "self", "query", "kernel")] == \
        P(None, "fsdp")
    assert flat[("bert", "embeddings", "LayerNorm", "scale")] == P(None)
    # 101 is odd: the vocabulary axis cannot be split in two and stays replicated.
    odd = nnx.eval_shape(lambda: model_lib.create_model(model_lib.BertConfig.preset("tiny", 101)))
    specs = sharding.param_shardings(nnx.state(odd, nnx.Param), mesh)
    flat = {tuple(map(str, p)): s.spec for p, s in nnx.to_flat_state(specs)}
    assert flat[("bert", "embeddings", "word_embeddings", "embedding")] == P(None, None)
    assert flat[("cls", "predictions", "bias")] == P(None)


def test_global_batch_round_trip():
    mesh = sharding.make_mesh(4, 2)
    rows = sharding.host_rows(16, sharding.batch_sharding(mesh))
    np.testing.assert_array_equal(rows, np.arange(16))  # one process holds every row
    local = {"x": np.arange(16 * 3).reshape(16, 3), "y": np.arange(16)}
    batch = sharding.make_global_batch(local, mesh, 16)
    assert batch["x"].sharding.spec == P(("data", "fsdp"), None)
    assert len(batch["x"].addressable_shards) == 8
    np.testing.assert_array_equal(np.asarray(batch["x"]), local["x"])
    assert sharding.num_batch_shards(mesh) == 8
