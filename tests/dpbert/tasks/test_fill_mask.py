"""The run's closing fill-in (config.fill_mask): what the demo shows a newcomer at the end."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import common
from data_pipelines import tokenization
from dpbert.errors import ConfigError
from dpbert.models import bert as model_lib
from dpbert.tasks import pretraining


@pytest.fixture(scope="module")
def tokenizer(notes_vocab):
    return tokenization.WordPieceTokenizer(notes_vocab)


@pytest.fixture(scope="module")
def model(tokenizer):
    cfg = model_lib.BertConfig.preset("tiny", tokenizer.vocab_size, max_position_embeddings=32)
    return model_lib.create_model(cfg, seed=0)


def test_fill_mask_is_the_mlm_head_at_the_mask(model, tokenizer):
    text = "the patient was admitted with [MASK] pain ."
    guesses = pretraining.fill_mask(model, tokenizer, text, top_k=5)
    # The same numbers by hand: [CLS] text [SEP], logits over all positions, softmax at [MASK].
    ids = tokenizer.encode(text)
    pos = int(np.flatnonzero(ids == tokenizer.special.mask)[0]) + 1
    ids = np.concatenate([[tokenizer.special.cls], ids, [tokenizer.special.sep]])[None]
    out = model(jnp.asarray(ids), jnp.zeros_like(ids), jnp.ones_like(ids), deterministic=True)
    probs = np.asarray(jax.nn.softmax(out.mlm_logits[0, pos]))
    want = np.argsort(-probs, kind="stable")[:5]
    assert [t for t, _ in guesses] == [tokenizer.vocab[i] for i in want]
    np.testing.assert_allclose([p for _, p in guesses], probs[want], rtol=1e-5)
    assert all(a >= b for (_, a), (_, b) in zip(guesses, guesses[1:]))


@pytest.mark.parametrize("text", ["no mask here .", "[MASK] and [MASK] ."])
def test_fill_mask_needs_exactly_one_mask(model, tokenizer, text):
    with pytest.raises(ConfigError, match="exactly one"):
        pretraining.fill_mask(model, tokenizer, text)


def test_fill_mask_longer_than_the_positions_is_refused(model, tokenizer):
    with pytest.raises(ConfigError, match="longer than the 32"):
        pretraining.fill_mask(model, tokenizer, "pain " * 40 + "[MASK] .")


def test_config_checks_fill_mask():
    c = common.get_config()
    c.fill_mask = "two [MASK] [MASK]"
    with pytest.raises(ConfigError, match="fill_mask"):
        pretraining.PretrainingTask().validate(c)
