"""Input mode texthide: mixed and sign-masked sentence representations in training
(Huang et al. 2020, `dpbert.privacy.texthide`; issue 13; `privacy.mode=texthide`). Needs a
task with SENTENCE (one label from one sentence vector: classification).

The service receives the text as in mode
none; every training step hides the batch's sentence representations (pooled
output) with Algorithm 1: each row mixes privacy.k representations (coefficients
|g|/Σ|g|, random permutations) and is sign-flipped by one of privacy.m secret masks;
the labels are mixed the same way (soft labels). The mask pool and the per-step
randomness come from the run's secret task key. privacy.variant = intra, or inter
(the even slots take sentences of privacy.public_file, a public unlabeled
label<TAB>text file whose labels are ignored; privacy.label_mode paper | code for
the labels of those rows, spec §2.2). Evaluation: no mixing, one pool mask per
example. Encoder and head train. Mixing happens within one physical batch (keep
batch.physical_batch_size = expected_batch_size), or within one microbatch when
batch.microbatch_size is set (privacy.k may not exceed it); the loss mixes examples, so
DP-SGD is refused. The head (privacy.texthide_head) is the paper's 3-layer MLP (WORKDIR/hf:
every weight as safetensors, not a transformers folder) or the Hugging Face linear classifier
on the pooled output (the HF export loads, but its predictions are those of the fine-tuned
model only with the secret masks applied; m = 0: as is).
No ε: the report says it is hiding, not differential privacy.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from data_pipelines import classification as clf
from dpbert.errors import ConfigError, need
from dpbert.models import heads
from dpbert.privacy import input_privacy, texthide
from dpbert.runtime import loop
from dpbert.tasks import starting_model
from dpbert.tasks.input_modes.base import SENTENCE, InputMode, lineage_section, write_folder

TEXTHIDE_HEADS = ("mlp", "linear")
_POOL_SALT, _STEP_SALT, _EVAL_SALT = 0x7E1D0, 0x7E1D1, 0x7E1D2   # TextHide's secret keys
RUN_KEY = "texthide_run_key"  # the batch field carrying the secret run key into the step


@dataclasses.dataclass(frozen=True)
class TextHideMode(InputMode):
    name: str = "texthide"
    needs: tuple[str, ...] = (SENTENCE,)
    loss_shapes: tuple[str, ...] = ("batch",)

    def spec(self, config):
        p = config.privacy
        try:
            return texthide.TextHideSpec(m=p.m, k=p.k, variant=p.variant,
                                         label_mode=p.label_mode)
        except ValueError as e:
            raise ConfigError(f"config.privacy (mode texthide): {e}") from None

    def validate(self, config) -> None:
        spec = self.spec(config)
        b = config.batch
        # The loss (and so the mixing) sees one microbatch at a time when one is set.
        if b.microbatch_size:
            group = ("batch.microbatch_size", b.microbatch_size, "the examples one call of the "
                     "loss sees (a microbatch)", "raise batch.microbatch_size or unset it")
        else:
            group = ("batch.physical_batch_size", b.physical_batch_size or
                     b.expected_batch_size, "the examples of one physical batch",
                     "raise batch.physical_batch_size (and batch.expected_batch_size, equal "
                     "to it without DP-SGD)")
        field, size, what, raise_it = group
        need(spec.k <= size, "privacy.k", spec.k,
             f"larger than config.{field}={size}, {what}: TextHide mixes every row with k - 1 "
             f"others of them, so k must not exceed it; lower privacy.k or {raise_it}")
        p = config.privacy
        need(p.texthide_head in TEXTHIDE_HEADS, "privacy.texthide_head",
             p.texthide_head, f"must be one of {TEXTHIDE_HEADS}")
        need(p.texthide_head_input_norm in texthide.HEAD_INPUT_NORMS,
             "privacy.texthide_head_input_norm", p.texthide_head_input_norm,
             f"must be one of {texthide.HEAD_INPUT_NORMS}")
        need(p.texthide_head_init > 0, "privacy.texthide_head_init",
             p.texthide_head_init, "must be > 0")
        if spec.variant == "inter":
            need(bool(p.public_file), "privacy.public_file", p.public_file,
                 "inter-TextHide needs a public label<TAB>text file (labels ignored)")

    def user_side(self, config, model, vocab_file: str):
        if not isinstance(model, heads.BertForSequenceClassification):
            raise ConfigError("config.privacy.mode='texthide' needs the classification task")
        spec = self.spec(config)
        public = None
        if spec.variant == "inter":
            rows = clf.read_tsv(config.privacy.public_file)
            need(len(rows) >= config.batch.expected_batch_size,
                 "privacy.public_file", config.privacy.public_file,
                 "has fewer sentences than a batch")
            public = clf.encode_examples([r.text_a for r in rows], None,
                                         starting_model.tokenizer(config),
                                         config.data.max_seq_length)
        if config.privacy.texthide_head == "mlp":
            replace_with_mlp_head(model, seed=config.seed,
                                  input_norm=config.privacy.texthide_head_input_norm,
                                  initializer_range=config.privacy.texthide_head_init)
        plain = input_privacy.InputPrivatizer(input_privacy.InputPrivacyConfig(mode="none"))
        return TextHideUser(spec, model.config.hidden_size, plain, public,
                            config.privacy.public_file, config.privacy.texthide_head,
                            config.privacy.texthide_head_input_norm)

    def loss(self, graphdef, config, shape: str, data):
        return texthide_loss(data.extra["user_side"], graphdef, len(data.extra["labels"]))

    def eval_logits(self, graphdef, config, data):
        return texthide_eval(data.extra["user_side"], graphdef)

    def batch_transform(self, config, data):
        # The run key reaches the jitted step and eval as an argument (the loop's operand),
        # each row of the batch carrying it: the mask pool and the step keys are derived from
        # it there. Closed over, the masks would be constants of the compiled programs, which
        # the persistent compilation cache writes to disk.
        def with_key(key, batch, *_):
            rows = batch["input_ids"].shape[0]
            return {**batch, RUN_KEY: jnp.broadcast_to(key, (rows, key.shape[0]))}

        return loop.BatchTransform(np.asarray(data.extra["user_side"].key, np.uint32),
                                   train=with_key, eval=with_key)

    def export(self, params, run: dict, out: pathlib.Path, report: dict | None):
        if run["input_privacy"]["head"].startswith("Hugging Face"):
            return None   # the task's own HF export (the card carries the report)
        return export_texthide(params, run, out, report)


def replace_with_mlp_head(model, *, seed: int, input_norm: str = "none",
                          initializer_range: float = 0.02) -> None:
    """The paper's head h (3 x (Dense(d) + tanh) + Dense(C), `texthide.TextHideHead`) in place
    of the linear classifier: a linear head cannot serve m > 1 sign masks at once."""

    class MlpClassifier(nnx.Module):
        def __init__(self, d, c, rngs):
            self.head = texthide.TextHideHead(d, c, input_norm=input_norm,
                                              initializer_range=initializer_range, rngs=rngs)

        def __call__(self, x):
            return self.head(x.astype("float32"))

    model.classifier = MlpClassifier(model.config.hidden_size, len(model.labels),
                                     nnx.Rngs(seed))


def export_texthide(params, run: dict, out: pathlib.Path, report: dict | None) -> pathlib.Path:
    """WORKDIR/hf for TextHide with the paper's MLP head: every parameter (encoder and head)
    as safetensors, the settings, and a card; not a transformers folder."""
    ip = run["input_privacy"]
    tensors = {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v, np.float32)
               for path, v in jax.tree_util.tree_leaves_with_path(params)}
    dp = (report or {}).get("headline") if (report or {}).get("dp") else None
    card = ["# TextHide fine-tuned classifier (encoder + MLP head)", "",
            "## Representation privacy (TextHide)", "", ip["statement"], "",
            "No ε: TextHide hides representations; it is not differential privacy.", "",
            "## Training", "", dp or "No DP-SGD (TextHide's loss mixes examples).", "",
            *lineage_section(report),
            "## Use", "",
            "`texthide_model.safetensors` holds the encoder (`bert/...`, the BERT layout of "
            "`dpbert.models.heads`) and the head (`classifier/head/...`, `dpbert.privacy.texthide."
            "TextHideHead`); predictions are h(σ ∘ pooled(x)) with the SECRET mask pool, which "
            "is not shipped. Not a transformers model folder.", ""]
    files = {"texthide_config.json": json.dumps(
        {"model_config": run["model_config"], "labels": run["labels"],
         "init_from_hf": run["init_from_hf"], "vocab_sha256": run["vocab_sha256"],
         "texthide": {k: v for k, v in ip.items() if k not in ("statement", "key")}},
        indent=2) + "\n", "README.md": "\n".join(card)}
    return write_folder(out, files, {"texthide_model.safetensors": tensors}, save_file, report)


class TextHideUser:
    """The release of mode texthide is the raw text (mode none); what it keeps is the run's
    secret key, from which the mask pool and the per-step randomness derive."""

    def __init__(self, spec, d: int, plain, public: dict | None, public_file: str, head: str,
                 head_input_norm: str = "none"):
        self.spec, self.d, self.plain, self.public = spec, d, plain, public
        # Whoever runs the exported head needs to know whether it divides its input by the
        # row's RMS (texthide_config.json carries this report).
        self.head_input_norm = head_input_norm if head == "mlp" else "none"
        self.head = ("paper's MLP head (3 x (Dense(d) + tanh) + Dense(C)) on the pooled output"
                     + (", its input divided by the row's RMS" if self.head_input_norm == "rms"
                        else "")
                     if head == "mlp" else
                     "Hugging Face linear classifier on the pooled output")
        self.public_file = public_file
        self.key = None

    def release(self, features, key, *, split: str, epoch=None):
        self.key = key
        return self.plain.release(features, key, split=split, epoch=epoch)

    def pool(self, key):
        """The secret mask pool of the run key `key` (traced: the batch's RUN_KEY)."""
        return texthide.make_mask_pool(jax.random.fold_in(key, _POOL_SALT), self.spec.m, self.d)

    def report(self, *, epochs: int, secret_key: bool = True) -> dict:
        s = self.spec
        m = "∞" if s.m < 0 else s.m
        statement = (("" if secret_key else input_privacy.SEEDED_NOTE + " ") +
                     f"({m}, {s.k})-TextHide {s.variant} (Huang et al. 2020): in every training "
                     f"step each pooled sentence representation was mixed with {s.k - 1} others "
                     "of its batch"
                     + (" (public sentences in the even slots)" if s.variant == "inter" else "")
                     + f" and sign-flipped by one of {m} secret masks (pool and per-step "
                     "randomness from a secret run key); labels mixed alike. Evaluation: no "
                     "mixing, one pool mask per example. This is hiding, NOT differential "
                     "privacy: there is no ε. The service received the raw text. The head was "
                     "trained on masked representations: without the secret masks its "
                     "predictions are not the fine-tuned model's"
                     + (" (m = 0: no masks, they are)." if s.m == 0 else "."))
        return {"mode": "texthide", **s.report(), "frozen": [],
                "public_file": self.public_file if s.variant == "inter" else None,
                "mixing": "within one physical batch",
                "head": self.head, "head_input_norm": self.head_input_norm,
                "key": ("secret run key (OS entropy, kept only in the private checkpoint)"
                        if secret_key else "public seed"),
                "statement": statement}


def _encoder_head(graphdef):
    def rngs(key):
        return None if key is None else nnx.Rngs(dropout=key)

    def encoder_apply(params, inputs, key):
        model = nnx.merge(graphdef, params)
        _, pooled = model.bert(inputs["input_ids"], inputs["segment_ids"], inputs["input_mask"],
                               deterministic=key is None, rngs=rngs(key))
        return pooled

    def head_apply(params, reps, key):
        return nnx.merge(graphdef, params).classify(reps, deterministic=key is None,
                                                    rngs=rngs(key))

    return encoder_apply, head_apply


def texthide_loss(user: TextHideUser, graphdef, num_classes: int):
    """The loop's batch loss (params, batch, mask, keys) -> (sum over rows, metric sums)."""
    spec = user.spec
    public = None if user.public is None else {k: jnp.asarray(v) for k, v in user.public.items()}
    encoder_apply, head_apply = _encoder_head(graphdef)

    def fn(params, batch, mask, keys):
        run_key = batch[RUN_KEY][0]  # an argument, never a constant (TextHideMode.batch_transform)
        pool = user.pool(run_key)
        secret = jax.random.fold_in(run_key, _STEP_SALT)
        # The loop's per-example keys are public (seeded dropout); folded into the secret key
        # they give a secret key that changes every step.
        salt = jax.random.randint(keys[0], (), 0, jnp.iinfo(jnp.int32).max)
        step_key, public_key = jax.random.split(jax.random.fold_in(secret, salt))
        labels = batch["label"]
        public_inputs = None
        if public is not None:
            take = jax.random.choice(public_key, public["input_ids"].shape[0],
                                     (labels.shape[0],), replace=False)
            public_inputs = {k: v[take] for k, v in public.items()}
        inputs = {k: batch[k] for k in ("input_ids", "segment_ids", "input_mask")}
        reps = encoder_apply(params, inputs, keys[1])
        public_reps = None if public_inputs is None else encoder_apply(params, public_inputs,
                                                                       keys[2])
        targets = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
        hidden = texthide.encrypt(step_key, reps, targets, pool, spec.k,
                                  public_reps=public_reps, label_mode=spec.label_mode)
        logits = head_apply(params, hidden.reps, keys[3 % keys.shape[0]])
        w = mask.astype(jnp.float32)
        per_row = texthide.soft_cross_entropy(logits, hidden.labels) * w
        agree = (jnp.argmax(logits, -1) == jnp.argmax(hidden.labels, -1)).astype(jnp.float32)
        return jnp.sum(per_row), {"loss_sum": jnp.sum(per_row), "correct": jnp.sum(agree * w),
                                  "count": jnp.sum(w)}

    return fn


def texthide_eval(user: TextHideUser, graphdef):
    """Eval logits h(σ ∘ f(x)): no mixing, one pool mask per example."""
    encoder_apply, head_apply = _encoder_head(graphdef)

    def logits_fn(params, batch):
        run_key = batch[RUN_KEY][0]
        inputs = {k: batch[k] for k in ("input_ids", "segment_ids", "input_mask")}
        return texthide.texthide_eval_logits(
            encoder_apply, head_apply, params, inputs, jax.random.fold_in(run_key, _EVAL_SALT),
            pool=user.pool(run_key))

    return logits_fn
