"""The DP engine against a reference nobody here wrote: PyTorch on `transformers`.

A tiny random dpbert model is exported to Hugging Face format and loaded as
`transformers.BertForPreTraining` in float64. Its per-example gradients come from a plain
one-backward-per-example loop on BERT's pretraining loss written here in PyTorch (MLM
cross-entropy averaged over the example's real predictions + NSP cross-entropy). The engine's
per-example gradient norms (fp32) and its clipped sums, for both clippers, must agree, with C
below the typical norm so that clipping really happens.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from dpbert.models import hf_export

from dpbert.models import losses
from dpbert.models import bert as model_lib
from dpbert.dp import clipping, ghost
from tests.dpbert.dp import helpers

VOCAB, N = 89, 8


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("torch_ref")
    config = model_lib.BertConfig.preset("tiny", VOCAB, max_position_embeddings=32,
                                         hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0)
    model = model_lib.create_model(config, seed=7)
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (folder / "vocab.txt").write_text(
        "\n".join(special + [f"w{i}" for i in range(VOCAB - len(special))]) + "\n")
    hf_export.save_pretrained(model, folder / "hf", folder / "vocab.txt")
    torch_model = transformers.BertForPreTraining.from_pretrained(folder / "hf").double().eval()
    graphdef, params = nnx.split(model)
    batch = helpers.bert_batch(N, VOCAB, seed=3)
    return graphdef, params, batch, torch_model, _torch_per_example_grads(torch_model, batch)


def _torch_per_example_grads(model, batch) -> list[dict[str, np.ndarray]]:
    """One backward per example, float64: {HF parameter name: gradient}."""
    named = dict(model.named_parameters())  # tied tensors appear once
    out = []
    for i in range(N):
        ids = torch.as_tensor(batch["input_ids"][i:i + 1], dtype=torch.long)
        out_ = model(input_ids=ids,
                     attention_mask=torch.as_tensor(batch["input_mask"][i:i + 1]),
                     token_type_ids=torch.as_tensor(batch["segment_ids"][i:i + 1],
                                                    dtype=torch.long))
        positions = torch.as_tensor(batch["masked_lm_positions"][i], dtype=torch.long)
        logits = out_.prediction_logits[0, positions]  # [P, V]
        labels = torch.as_tensor(batch["masked_lm_ids"][i], dtype=torch.long)
        weights = torch.as_tensor(batch["masked_lm_weights"][i], dtype=torch.float64)
        per_position = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
        mlm = (weights * per_position).sum() / torch.clamp(weights.sum(), min=1.0)
        nsp = torch.nn.functional.cross_entropy(
            out_.seq_relationship_logits,
            torch.as_tensor(batch["next_sentence_labels"][i:i + 1], dtype=torch.long))
        grads = torch.autograd.grad(mlm + nsp, list(named.values()))
        out.append({k: g.numpy() for k, g in zip(named, grads)})
    return out


def _to_hf(graphdef, tree) -> dict[str, np.ndarray]:
    """dpbert gradient tree -> {HF name: array in PyTorch layout} (the export's own mapping)."""
    return {k: v.astype(np.float64)
            for k, v in hf_export.state_dict(nnx.merge(graphdef, tree)).items()}


def _clipped_sum_torch(per_example, clip_norm):
    total = {k: np.zeros_like(v) for k, v in per_example[0].items()}
    for grads in per_example:
        norm = math.sqrt(sum(np.sum(g ** 2) for g in grads.values()))
        scale = 1.0 / max(1.0, norm / clip_norm)
        for k, g in grads.items():
            total[k] += scale * g
    return total


def _assert_close(ours: dict, ref: dict, rtol: float):
    assert set(ours) == set(ref), set(ours) ^ set(ref)
    scale = max(np.max(np.abs(v)) for v in ref.values())
    for k in ref:
        np.testing.assert_allclose(ours[k], ref[k], rtol=rtol, atol=rtol * scale, err_msg=k)


def test_per_example_norms_match_pytorch_transformers(setup):
    graphdef, params, batch, _, ref = setup
    loss_fn = losses.make_pretraining_loss(graphdef, deterministic=True)
    grads = jax.jit(jax.vmap(jax.grad(lambda p, e: loss_fn(p, e, jnp.zeros(2, jnp.uint32))[0]),
                             in_axes=(None, 0)))(params, batch)
    ours = [_to_hf(graphdef, jax.tree.map(lambda g: g[i], grads)) for i in range(N)]
    ref_norms = [math.sqrt(sum(np.sum(g ** 2) for g in r.values())) for r in ref]
    our_norms = [math.sqrt(sum(np.sum(g ** 2) for g in o.values())) for o in ours]
    np.testing.assert_allclose(our_norms, ref_norms, rtol=1e-5)
    _assert_close(ours[0], ref[0], rtol=1e-4)  # and the gradient itself, leaf by leaf


@pytest.mark.parametrize("clipper_name", ["vmap", "ghost_embedding"])
def test_clipped_sum_matches_pytorch_transformers(setup, clipper_name):
    graphdef, params, batch, _, ref = setup
    norms = sorted(math.sqrt(sum(np.sum(g ** 2) for g in r.values())) for r in ref)
    c = float(np.median(norms))  # about half the examples are clipped
    assert sum(n > c for n in norms) >= N // 2 - 1
    mask = np.ones(N, bool)
    if clipper_name == "vmap":
        loss_fn = losses.make_pretraining_loss(graphdef, deterministic=True)
        clipper = clipping.VmapClipper(c, microbatch_size=4)
    else:
        loss_fn = losses.make_factored_pretraining_loss(graphdef, deterministic=True)
        clipper = ghost.TiedEmbeddingClipper(c, microbatch_size=4)
    grad_sum, _, nonfinite = jax.jit(
        lambda p, b, m: clipper.clipped_sum(loss_fn, p, b, m, jax.random.PRNGKey(0)))(
            params, batch, mask)
    assert int(nonfinite) == 0
    _assert_close(_to_hf(graphdef, grad_sum), _clipped_sum_torch(ref, c), rtol=2e-5)
