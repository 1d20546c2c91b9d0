"""Representation-privacy input modes of the fine-tuning tasks (issue 13): `privacy.mode=ome`
and `privacy.mode=texthide`.

    ome   (Lyu et al. 2020, `dpbert.privacy.ome`) the users run the FROZEN encoder of model.init_from_hf
          on their sentence, z-score the representation per vector (no data statistics needed),
          encode each coordinate as l = 1 + m + n bits (sign, m = 4 integer, n = 5 fraction
          bits) and randomize the r·l bits once with a secret key (the run's task key, the
          split and the example id). The service sees only the bits and trains a linear head
          on them (classification only). privacy.ome_variant:
            published   Theorem 1's p, q with privacy.ome_lambda = λ. Its ε (privacy.epsilon,
                        `epsilon_claimed`) holds only at λ = 1; `epsilon_true` is the exact
                        worst case over inputs (`ome.worst_case_epsilon`), ~3,450 at λ = 100,
                        r = 50 whatever ε is asked.
            calibrated  per-bit randomized response whose TRUE ε is privacy.epsilon.
            sue / oue   the unary-encoding baselines (Wang et al. 2017; OME's §2, Δf = 2r):
                        each coordinate one-hot over privacy.ue_levels bins on [-4, 4],
                        symmetric / optimized unary encoding with t = ε/Δf per bit.
          results.json's privacy block and the card carry BOTH numbers. Each example is
          released once (the same bits every epoch; fresh noise per epoch is refused), the
          eval split too. The per-example loss is unchanged, so DP-SGD on the head applies.
          Export: WORKDIR/hf holds the head (`ome_head.safetensors`), `ome_config.json` and a
          card; the encoder is the unchanged starting checkpoint, which transformers'
          BertForSequenceClassification cannot pair with a head on bits.
    texthide  (Huang et al. 2020, `dpbert.privacy.texthide`) the service receives the text as in mode
          none; every training step hides the batch's sentence representations (pooled
          output) with Algorithm 1: each row mixes privacy.k representations (coefficients
          |g|/Σ|g|, random permutations) and is sign-flipped by one of privacy.m secret masks;
          the labels are mixed the same way (soft labels). The mask pool and the per-step
          randomness come from the run's secret task key. privacy.variant = intra, or inter
          (the even slots take sentences of privacy.public_file, a public unlabeled
          label<TAB>text file whose labels are ignored; privacy.label_mode paper | code for
          the labels of those rows, spec §2.2). Evaluation: no mixing, one pool mask per
          example. Encoder and head train. Mixing happens within one physical batch (keep
          batch.physical_batch_size = expected_batch_size); the loss mixes examples, so
          DP-SGD is refused. The head is the Hugging Face linear classifier on the pooled
          output (the paper's is a 3-layer MLP): the HF export loads, but its predictions are
          those of the fine-tuned model only with the secret masks applied (m = 0: as is).
          No ε: the report says it is hiding, not differential privacy.

Registered with `dpbert.tasks.finetuning.register_input_mode` when `dpbert.tasks.finetuning`
is imported.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import numpy as np

from dpbert.errors import ConfigError
from dpbert.tasks import finetuning

OME_VARIANTS = ("published", "calibrated", "sue", "oue")
TEXTHIDE_HEADS = ("mlp", "linear")
_OME_SALT = 0x0E11   # folded into the split key: OME bits never share noise with a dχ release
_POOL_SALT, _STEP_SALT, _EVAL_SALT = 0x7E1D0, 0x7E1D1, 0x7E1D2   # TextHide's secret keys


# ----------------------------------------------------------------------------- OME


@dataclasses.dataclass(frozen=True)
class OmeMode(finetuning.InputMode):
    name: str = "ome"
    tasks: tuple[str, ...] = ("classification",)

    def mechanism(self, config, r: int):
        from dpbert.privacy import ome  # noqa: PLC0415

        p = config.privacy
        try:
            if p.ome_variant == "published":
                mech = ome.OME(eps=float(p.epsilon), lam=float(p.ome_lambda), r=r)
            elif p.ome_variant in ome.UE_KINDS:
                mech = ome.UnaryEncoding(p.ome_variant, eps=float(p.epsilon), r=r,
                                         levels=int(p.ue_levels))
            else:
                mech = ome.CalibratedOME(eps=float(p.epsilon), r=r)
            mech.randomizer  # noqa: B018 - validates eps / lam now
        except ValueError as e:
            raise ConfigError(f"config.privacy (mode ome): {e}") from None
        return mech

    def validate(self, config) -> None:
        p = config.privacy
        finetuning.need(p.ome_variant in OME_VARIANTS, "privacy.ome_variant", p.ome_variant,
                        f"must be one of {OME_VARIANTS}")
        eps = p.epsilon
        finetuning.need(isinstance(eps, (int, float)) and not isinstance(eps, bool)
                        and math.isfinite(eps) and eps > 0, "privacy.epsilon", eps,
                        "must be a finite number > 0 (OME's requested ε)")
        finetuning.need(p.ome_lambda >= 1, "privacy.ome_lambda", p.ome_lambda,
                        "must be >= 1 (Theorem 1's λ; the paper uses 100)")
        finetuning.need(isinstance(p.ue_levels, int) and not isinstance(p.ue_levels, bool)
                        and p.ue_levels >= 2, "privacy.ue_levels", p.ue_levels,
                        "must be an integer >= 2 (bins of the unary encoding)")
        finetuning.need(not p.fresh_noise_each_epoch, "privacy.fresh_noise_each_epoch",
                        p.fresh_noise_each_epoch,
                        "mode ome releases each example once; fresh noise is not supported")
        self.mechanism(config, 4)

    def user_side(self, config, model, vocab_file: str):
        from dpbert.models import heads  # noqa: PLC0415
        from dpbert.privacy import input_privacy  # noqa: PLC0415

        if not isinstance(model, heads.BertForSequenceClassification):
            raise ConfigError("config.privacy.mode='ome' needs the classification task")
        p = config.privacy
        # The encoder snapshot (the users' frozen f), taken before the head is replaced.
        encoder = input_privacy.InputPrivatizer.from_model(input_privacy.InputPrivacyConfig(
            mode="seq_rep", eta=1.0, seq_rep_source=p.seq_rep_source,
            examples_per_call=p.examples_per_call), model, vocab_file)
        mech = self.mechanism(config, model.config.hidden_size)
        replace_head(model, mech.num_features, seed=config.seed)
        return OmeUser(mech, encoder, p.ome_variant, p.seq_rep_source)

    def trainable(self, config):
        return lambda path, leaf: len(path) > 0 and path[0] == "classifier"

    def frozen(self, config) -> list[str]:
        return ["bert (embeddings, encoder, pooler)"]

    def export(self, params, run: dict, out: pathlib.Path, report: dict | None):
        return export_ome(params, run, out, report)


def replace_head(model, width: int, *, seed: int) -> None:
    """The service's classifier reads `width` features (the released bits) instead of the
    hidden size."""
    from flax import nnx  # noqa: PLC0415

    from dpbert.models import bert as model_lib  # noqa: PLC0415

    model.classifier = model_lib._dense(model.config, width, len(model.labels),  # noqa: SLF001
                                        ("embed", "classes"), rngs=nnx.Rngs(seed))


class OmeUser:
    """The users' side of mode ome: frozen encoder -> z-score -> bits -> randomized bits."""

    def __init__(self, mech, encoder, variant: str, source: str):
        self.mech, self.encoder, self.variant, self.source = mech, encoder, variant, source

    def release(self, features, key, *, split: str, epoch=None):
        import jax  # noqa: PLC0415

        from dpbert.privacy import input_privacy  # noqa: PLC0415

        from dpbert.privacy import ome  # noqa: PLC0415

        del epoch  # one release per example (validated)
        f = {k: np.asarray(v) for k, v in features.items()}
        reps = self.encoder.sentence_representations(
            f["input_ids"].astype(np.int32), f["segment_ids"].astype(np.int32),
            f["input_mask"].astype(np.int32))
        split_key = jax.random.fold_in(
            jax.random.fold_in(key, input_privacy.split_salt(split)), _OME_SALT)
        bits = self.mech.privatize(split_key, ome.zscore(reps), row_ids=f["example_id"])
        keep = {k: v for k, v in f.items() if k not in ("input_ids", "segment_ids", "input_mask",
                                                        "example_id", "position_ids")}
        return input_privacy.Release("ome", dict(keep, features=bits.astype(np.float32)))

    def report(self, *, epochs: int, secret_key: bool = True) -> dict:
        from dpbert.privacy import input_privacy  # noqa: PLC0415

        mech = self.mech.privacy_report()
        claimed, true = mech["epsilon_claimed"], mech["epsilon_true"]
        if self.variant == "published":
            what = ("Theorem 1's randomizer as published (λ = {:g}); its ε = {:g} is the "
                    "CLAIMED one, the exact worst case over inputs is ε = {:.6g}".format(
                        mech.get("lam", 1.0), claimed, true))
        elif self.variant == "calibrated":
            what = ("per-bit randomized response calibrated so that the true ε is {:g} (exact "
                    "worst case {:.6g})".format(claimed, true))
        else:
            what = ("{} unary encoding over {} bins on [{:g}, {:g}] with Δf = 2r, claimed ε = "
                    "{:g}, exact worst case {:.6g}".format(
                        self.variant.upper(), mech["levels"], *mech["value_range"], claimed,
                        true))
        width = mech.get("l", mech.get("levels"))
        statement = (("" if secret_key else input_privacy.SEEDED_NOTE + " ") +
                     f"Local DP on the sentence representation (OME, Lyu et al. 2020): each "
                     f"example's {self.source} representation from the frozen encoder was "
                     f"z-scored, encoded as {mech['r']}×{width} bits and randomized once "
                     f"({what}), with a key derived from a secret run key and the example id; "
                     "the same bits in every epoch; the eval split was released the same way. "
                     f"Guarantee: ε_true = {true:.6g}-local DP per example "
                     f"(claimed ε = {claimed:g}).")
        return {"mode": "ome", "variant": self.variant, "frozen": ["bert (embeddings, encoder, "
                "pooler)"], "seq_rep_source": self.source, **mech,
                "train_releases_per_example": 1, "eval_releases_per_example": 1,
                "key": ("secret run key (OS entropy, kept only in the private checkpoint)"
                        if secret_key else "public seed"),
                "statement": statement}


def export_ome(params, run: dict, out: pathlib.Path, report: dict | None) -> pathlib.Path:
    """WORKDIR/hf for mode ome: the head on the bits, its settings and a card with both ε."""
    from safetensors.numpy import save_file  # noqa: PLC0415

    ip = run["input_privacy"]
    head = params["classifier"]
    kernel, bias = (np.asarray(getattr(head[k], "value", head[k]), np.float32)
                    for k in ("kernel", "bias"))
    settings = {"encoder": run["init_from_hf"], "seq_rep_source": ip["seq_rep_source"],
                "zscore": "per_vector", "labels": run["labels"],
                "logits": "classifier.weight @ bits + classifier.bias (bits 0/1, r·l; r·levels "
                          "for sue / oue)",
                "mechanism": {k: v for k, v in ip.items()
                              if k not in ("statement", "key", "frozen")}}
    dp = (report or {}).get("headline") if (report or {}).get("dp") else None
    card = ["# Classifier on OME-randomized sentence representations", "",
            "## Privacy of the users' representations (OME)", "",
            f"- **epsilon_true = {ip['epsilon_true']:.6g}** (exact worst case over inputs)",
            f"- epsilon_claimed = {ip['epsilon_claimed']:g} (Theorem 1"
            + (f", λ = {ip['lam']:g}; it holds only at λ = 1)" if "lam" in ip
               else "; calibrated: equal to the true ε)" if ip["variant"] == "calibrated"
               else f": {ip['variant'].upper()} with Δf = 2r)"),
            "", ip["statement"], "",
            "## Training", "",
            dp or "No DP-SGD on the head (dp.enabled=False): the head's training has no "
                  "(ε, δ) of its own beyond the users' local randomization.", "",
            *_lineage_section(report),
            "## Use", "",
            f"Encoder: `{run['init_from_hf']}` unchanged ({ip['seq_rep_source']} output); "
            "z-score each representation over its coordinates, encode and randomize as in "
            "`ome_config.json` (`dpbert.privacy.ome`), then apply the head in "
            "`ome_head.safetensors`. This is not a transformers model folder.", ""]
    return _write_folder(out, {"ome_config.json": json.dumps(settings, indent=2) + "\n",
                               "README.md": "\n".join(card)},
                         {"ome_head.safetensors": {"classifier.weight": kernel.T.copy(),
                                                   "classifier.bias": bias}}, save_file, report)


# ----------------------------------------------------------------------------- TextHide


@dataclasses.dataclass(frozen=True)
class TextHideMode(finetuning.InputMode):
    name: str = "texthide"
    tasks: tuple[str, ...] = ("classification",)
    loss_shapes: tuple[str, ...] = ("batch",)

    def spec(self, config):
        from dpbert.privacy import texthide  # noqa: PLC0415

        p = config.privacy
        try:
            return texthide.TextHideSpec(m=p.m, k=p.k, variant=p.variant,
                                         label_mode=p.label_mode)
        except ValueError as e:
            raise ConfigError(f"config.privacy (mode texthide): {e}") from None

    def validate(self, config) -> None:
        spec = self.spec(config)
        b = config.batch
        physical = b.physical_batch_size or b.expected_batch_size
        finetuning.need(physical >= spec.k, "batch.physical_batch_size", physical,
                        f"TextHide mixes k = {spec.k} examples of one physical batch")
        p = config.privacy
        finetuning.need(p.texthide_head in TEXTHIDE_HEADS, "privacy.texthide_head",
                        p.texthide_head, f"must be one of {TEXTHIDE_HEADS}")
        from dpbert.privacy import texthide  # noqa: PLC0415

        finetuning.need(p.texthide_head_input_norm in texthide.HEAD_INPUT_NORMS,
                        "privacy.texthide_head_input_norm", p.texthide_head_input_norm,
                        f"must be one of {texthide.HEAD_INPUT_NORMS}")
        finetuning.need(p.texthide_head_init > 0, "privacy.texthide_head_init",
                        p.texthide_head_init, "must be > 0")
        if spec.variant == "inter":
            finetuning.need(bool(p.public_file), "privacy.public_file", p.public_file,
                            "inter-TextHide needs a public label<TAB>text file (labels ignored)")

    def user_side(self, config, model, vocab_file: str):
        from dpbert.models import heads  # noqa: PLC0415
        from dpbert.privacy import input_privacy  # noqa: PLC0415

        if not isinstance(model, heads.BertForSequenceClassification):
            raise ConfigError("config.privacy.mode='texthide' needs the classification task")
        spec = self.spec(config)
        public = None
        if spec.variant == "inter":
            from data_pipelines import classification as clf  # noqa: PLC0415

            rows = clf.read_tsv(config.privacy.public_file)
            finetuning.need(len(rows) >= config.batch.expected_batch_size,
                            "privacy.public_file", config.privacy.public_file,
                            "has fewer sentences than a batch")
            public = clf.encode_examples([r.text_a for r in rows], None,
                                         finetuning.tokenizer(config),
                                         config.data.max_seq_length)
        if config.privacy.texthide_head == "mlp":
            replace_with_mlp_head(model, seed=config.seed,
                                  input_norm=config.privacy.texthide_head_input_norm,
                                  initializer_range=config.privacy.texthide_head_init)
        plain = input_privacy.InputPrivatizer(input_privacy.InputPrivacyConfig(mode="none"))
        return TextHideUser(spec, model.config.hidden_size, plain, public,
                            config.privacy.public_file, config.privacy.texthide_head,
                            config.privacy.texthide_head_input_norm)

    def loss(self, task, graphdef, config, shape: str):
        return texthide_loss(task.user_side, graphdef, len(task.labels))

    def eval_logits(self, task, graphdef, config):
        return texthide_eval(task.user_side, graphdef)

    def export(self, params, run: dict, out: pathlib.Path, report: dict | None):
        if run["input_privacy"]["head"].startswith("Hugging Face"):
            return None   # the task's own HF export (the card carries the report)
        return export_texthide(params, run, out, report)


def replace_with_mlp_head(model, *, seed: int, input_norm: str = "none",
                          initializer_range: float = 0.02) -> None:
    """The paper's head h (3 x (Dense(d) + tanh) + Dense(C), `texthide.TextHideHead`) in place
    of the linear classifier: a linear head cannot serve m > 1 sign masks at once."""
    from flax import nnx  # noqa: PLC0415

    from dpbert.privacy import texthide  # noqa: PLC0415

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
    import jax  # noqa: PLC0415
    from safetensors.numpy import save_file  # noqa: PLC0415

    ip = run["input_privacy"]
    tensors = {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v, np.float32)
               for path, v in jax.tree_util.tree_leaves_with_path(params)}
    dp = (report or {}).get("headline") if (report or {}).get("dp") else None
    card = ["# TextHide fine-tuned classifier (encoder + MLP head)", "",
            "## Representation privacy (TextHide)", "", ip["statement"], "",
            "No ε: TextHide hides representations; it is not differential privacy.", "",
            "## Training", "", dp or "No DP-SGD (TextHide's loss mixes examples).", "",
            *_lineage_section(report),
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
    return _write_folder(out, files, {"texthide_model.safetensors": tensors}, save_file, report)


def _lineage_section(report: dict | None) -> list[str]:
    """The card lines on the starting model's privacy (`dpbert.reporting.lineage`), if it had any."""
    from dpbert.reporting import report as report_lib  # noqa: PLC0415

    lines = report_lib.lineage_lines(report or {})
    return ["## Starting model", "", *lines, ""] if lines else []


def _write_folder(out: pathlib.Path, texts: dict, tensors: dict, save_file,
                  report: dict | None = None) -> pathlib.Path:
    """Writes `out` as a whole (a sibling temporary folder renamed into place), with the run's
    public privacy report (`report.public_report`: no exact corpus statistic)."""
    import shutil  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    from dpbert.reporting import lineage  # noqa: PLC0415
    from dpbert.reporting import report as report_lib  # noqa: PLC0415

    texts = {**texts, lineage.REPORT_FILE: json.dumps(report_lib.public_report(report),
                                                      indent=2, sort_keys=True) + "\n"}
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        for name, text in texts.items():
            (tmp / name).write_text(text, encoding="utf-8")
        for name, arrays in tensors.items():
            save_file(arrays, str(tmp / name))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


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

    def pool(self):
        import jax  # noqa: PLC0415

        from dpbert.privacy import texthide  # noqa: PLC0415

        if self.key is None:
            raise RuntimeError("TextHide: the mask pool needs the run key (release first)")
        return texthide.make_mask_pool(jax.random.fold_in(self.key, _POOL_SALT),
                                       self.spec.m, self.d)

    def report(self, *, epochs: int, secret_key: bool = True) -> dict:
        from dpbert.privacy import input_privacy  # noqa: PLC0415

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
    from flax import nnx  # noqa: PLC0415

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
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from dpbert.privacy import texthide  # noqa: PLC0415

    pool, spec = user.pool(), user.spec
    secret = jax.random.fold_in(user.key, _STEP_SALT)
    public = None if user.public is None else {k: jnp.asarray(v) for k, v in user.public.items()}
    encoder_apply, head_apply = _encoder_head(graphdef)

    def fn(params, batch, mask, keys):
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
    import jax  # noqa: PLC0415

    from dpbert.privacy import texthide  # noqa: PLC0415

    pool = user.pool()
    key = jax.random.fold_in(user.key, _EVAL_SALT)
    encoder_apply, head_apply = _encoder_head(graphdef)

    def logits_fn(params, batch):
        inputs = {k: batch[k] for k in ("input_ids", "segment_ids", "input_mask")}
        return texthide.texthide_eval_logits(encoder_apply, head_apply, params, inputs, key,
                                             pool=pool)

    return logits_fn


finetuning.register_input_mode(OmeMode())
finetuning.register_input_mode(TextHideMode())
