r"""Why TextHide stalls at small scale: the TextHide loss on FROZEN sentence features (seconds per
epoch instead of minutes), optionally with one trainable tanh layer standing in for the encoder.

    PYTHONPATH=. python benchmarks/texthide_probe.py --features=minilm --m=256 --k=4
    PYTHONPATH=. python benchmarks/texthide_probe.py --features=minilm_mean --encoder_layer \
        --m=256 --k=4 --input_norm=rms --head_init=0.1 --epochs=6
    PYTHONPATH=. python benchmarks/texthide_probe.py --features_from_hf=W/hf --m=256   # a
        fine-tuned checkpoint's pooled output (e.g. a mode-none run of launch/finetune.py)

Features: MiniLM's pooled output (`minilm`) or mean pool (`minilm_mean`) of
`benchmarks/sentiment_data.features` (cached), or the pooled output of any HF BERT folder. The
head is `dpbert.privacy.texthide.TextHideHead`, the loss `texthide.encrypt` + soft-label CE, the
evaluation the inference path (one pool mask, no mixing). Prints dev accuracy per epoch. A
diagnostic for BENCHMARKS.md "TextHide fine-tuning at small scale", not a product path.
"""

from __future__ import annotations

import pathlib
import sys

from absl import app, flags

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

_DATASET = flags.DEFINE_string("dataset", "rt", "sentiment set")
_FEATURES = flags.DEFINE_enum("features", "minilm", ["minilm", "minilm_mean"], "cached features")
_FROM_HF = flags.DEFINE_string("features_from_hf", "", "pooled output of this HF folder instead")
_CACHE = flags.DEFINE_string("cache_dir", "/tmp/dpbert_ome_cache", "feature cache")
_ENCODER = flags.DEFINE_bool("encoder_layer", False, "a trainable Dense + tanh before hiding")
_M = flags.DEFINE_integer("m", 256, "mask pool size (0 = none, -1 = a fresh mask each time)")
_K = flags.DEFINE_integer("k", 4, "representations mixed per row")
_NORM = flags.DEFINE_enum("input_norm", "none", ["none", "rms"], "TextHideHead input_norm")
_INIT = flags.DEFINE_float("head_init", 0.02, "TextHideHead initializer_range")
_LR = flags.DEFINE_float("learning_rate", 1e-3, "encoder layer's peak learning rate")
_HEAD_LR = flags.DEFINE_float("head_learning_rate", 1e-3, "head's peak learning rate")
_EPOCHS = flags.DEFINE_integer("epochs", 3, "epochs")
_ROWS = flags.DEFINE_integer("train_rows", 0, "first this many training rows (0 = all)")


def pooled_from_hf(folder: pathlib.Path, texts: list[str]):
    from data_pipelines import tokenization
    from dpbert.models import features as feats
    from dpbert.models import hf
    model, _ = hf.load_pretrained(folder)
    tok = tokenization.WordPieceTokenizer(folder / "vocab.txt", do_lower_case=True)
    return feats.encode_texts(model, tok, texts, pooling=("pooled",), max_len=64)["pooled"]


def main(argv):
    del argv
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    import sentiment_data as sd
    from dpbert.privacy import texthide

    cache = pathlib.Path(_CACHE.value)
    cache.mkdir(parents=True, exist_ok=True)
    data = {split: sd.features(_DATASET.value, split, cache) for split in ("train", "dev")}
    x = {s: np.asarray(pooled_from_hf(pathlib.Path(_FROM_HF.value), d["texts"]) if _FROM_HF.value
                       else d[_FEATURES.value], np.float32) for s, d in data.items()}
    y = {s: np.asarray(d["labels"]) for s, d in data.items()}
    if _ROWS.value:
        x["train"], y["train"] = x["train"][:_ROWS.value], y["train"][:_ROWS.value]
    if _ENCODER.value:   # the stand-in encoder sees unit-RMS inputs (its init assumes them)
        scale = np.sqrt(np.mean(x["train"] ** 2))
        x = {s: v / scale for s, v in x.items()}
    d, classes = x["train"].shape[1], int(y["train"].max()) + 1
    print(f"{_DATASET.value}: {len(x['train'])} train / {len(x['dev'])} dev, d = {d}, feature "
          f"RMS {np.sqrt(np.mean(x['train'] ** 2)):.3f}", flush=True)

    class Probe(nnx.Module):
        def __init__(self, rngs):
            init = nnx.initializers.truncated_normal(stddev=0.02)
            self.encoder = (nnx.Linear(d, d, kernel_init=init, rngs=rngs) if _ENCODER.value
                            else None)
            self.head = texthide.TextHideHead(d, classes, initializer_range=_INIT.value,
                                              input_norm=_NORM.value, rngs=rngs)

        def encode(self, v):
            return jnp.tanh(self.encoder(v)) if self.encoder is not None else v

    model = Probe(nnx.Rngs(0))
    pool = texthide.make_mask_pool(jax.random.key(1) if _M.value else None, _M.value, d)
    steps = _EPOCHS.value * (len(x["train"]) // 32)
    sched = lambda lr: optax.warmup_cosine_decay_schedule(0.0, lr, max(steps // 10, 1), steps)  # noqa: E731
    labels = lambda params: jax.tree_util.tree_map_with_path(  # noqa: E731
        lambda path, _: "head" if path[0].key == "head" else "encoder", params)
    tx = optax.multi_transform({"encoder": optax.adamw(sched(_LR.value), weight_decay=0.01),
                                "head": optax.adamw(sched(_HEAD_LR.value), weight_decay=0.01)},
                               labels)
    opt = nnx.Optimizer(model, tx, wrt=nnx.Param)

    @nnx.jit
    def train_step(model, opt, xb, yb, key):
        def loss_fn(mdl):
            hidden = texthide.encrypt(key, mdl.encode(xb), jax.nn.one_hot(yb, classes), pool,
                                      _K.value)
            return jnp.mean(texthide.soft_cross_entropy(mdl.head(hidden.reps), hidden.labels))
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        opt.update(model, grads)
        return loss

    @nnx.jit
    def predict(model, xb, key):
        reps = texthide.texthide_eval_representations(key, model.encode(xb), pool)
        return jnp.argmax(model.head(reps), -1)

    rng, step = np.random.default_rng(0), 0
    for epoch in range(_EPOCHS.value):
        order, losses = rng.permutation(len(x["train"])), []
        for i in range(0, len(order) - 31, 32):
            b = order[i:i + 32]
            losses.append(float(train_step(model, opt, jnp.asarray(x["train"][b]),
                                           jnp.asarray(y["train"][b]),
                                           jax.random.key(1000 + step))))
            step += 1
        acc = float(np.mean(np.asarray(predict(model, jnp.asarray(x["dev"]),
                                               jax.random.key(7))) == y["dev"]))
        print(f"epoch {epoch + 1}: train loss {np.mean(losses[-50:]):.3f}  dev accuracy {acc:.3f}",
              flush=True)


if __name__ == "__main__":
    app.run(main)
