"""Fixtures shared by the ghost clipper tests (test_ghost.py, test_mixed_ghost.py)."""

import jax
import numpy as np
import pytest
from flax import nnx

from dpbert.models import losses
from dpbert.models import bert as model_lib
from tests.dpbert.dp import helpers


@pytest.fixture(scope="session")
def tiny():
    """Tiny BERT (dropout on), a batch with padding slots, and brute-force gradients."""
    config = model_lib.BertConfig.preset("tiny", helpers.GHOST_VOCAB, max_position_embeddings=32)
    graphdef, params = nnx.split(model_lib.create_model(config, seed=0))
    batch = helpers.ghost_batch(16)
    mask = np.ones(16, bool)
    mask[[3, 10]] = False
    key = jax.random.PRNGKey(7)
    loss_fn = losses.make_pretraining_loss(graphdef)
    per_example = helpers.per_example_grads(loss_fn, params, batch, mask, key)
    return graphdef, params, batch, mask, key, per_example


@pytest.fixture(scope="session")
def small():
    """A 1-layer BERT (fast compiles) for the loss variants."""
    config = model_lib.BertConfig(vocab_size=helpers.GHOST_VOCAB, hidden_size=32,
                                  num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=32)
    graphdef, params = nnx.split(model_lib.create_model(config, seed=1))
    return graphdef, params, helpers.ghost_batch(8, seed=2)
