"""Representation-privacy input modes of the fine-tuning tasks (issue 13): `privacy.mode=ome`.

    ome   (Lyu et al. 2020, `dpbert.ome`) the users run the FROZEN encoder of model.init_from_hf
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
          results.json's privacy block and the card carry BOTH numbers. Each example is
          released once (the same bits every epoch; fresh noise per epoch is refused), the
          eval split too. The per-example loss is unchanged, so DP-SGD on the head applies.
          Export: WORKDIR/hf holds the head (`ome_head.safetensors`), `ome_config.json` and a
          card; the encoder is the unchanged starting checkpoint, which transformers'
          BertForSequenceClassification cannot pair with a head on bits.

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

OME_VARIANTS = ("published", "calibrated")
_OME_SALT = 0x0E11   # folded into the split key: OME bits never share noise with a dχ release


# ----------------------------------------------------------------------------- OME


@dataclasses.dataclass(frozen=True)
class OmeMode(finetuning.InputMode):
    name: str = "ome"
    tasks: tuple[str, ...] = ("classification",)

    def mechanism(self, config, r: int):
        from dpbert import ome  # noqa: PLC0415

        p = config.privacy
        try:
            if p.ome_variant == "published":
                mech = ome.OME(eps=float(p.epsilon), lam=float(p.ome_lambda), r=r)
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
        finetuning.need(not p.fresh_noise_each_epoch, "privacy.fresh_noise_each_epoch",
                        p.fresh_noise_each_epoch,
                        "mode ome releases each example once; fresh noise is not supported")
        self.mechanism(config, 4)

    def user_side(self, config, model, vocab_file: str):
        from dpbert import heads, input_privacy  # noqa: PLC0415

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

    from dpbert import model as model_lib  # noqa: PLC0415

    model.classifier = model_lib._dense(model.config, width, len(model.labels),  # noqa: SLF001
                                        ("embed", "classes"), rngs=nnx.Rngs(seed))


class OmeUser:
    """The users' side of mode ome: frozen encoder -> z-score -> bits -> randomized bits."""

    def __init__(self, mech, encoder, variant: str, source: str):
        self.mech, self.encoder, self.variant, self.source = mech, encoder, variant, source

    def release(self, features, key, *, split: str, epoch=None):
        import jax  # noqa: PLC0415

        from dpbert import input_privacy, ome  # noqa: PLC0415

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
        from dpbert import input_privacy  # noqa: PLC0415

        mech = self.mech.privacy_report()
        claimed, true = mech["epsilon_claimed"], mech["epsilon_true"]
        what = ("Theorem 1's randomizer as published (λ = {:g}); its ε = {:g} is the CLAIMED "
                "one, the exact worst case over inputs is ε = {:.6g}".format(
                    mech.get("lam", 1.0), claimed, true) if self.variant == "published" else
                "per-bit randomized response calibrated so that the true ε is {:g} (exact worst "
                "case {:.6g})".format(claimed, true))
        statement = (("" if secret_key else input_privacy.SEEDED_NOTE + " ") +
                     f"Local DP on the sentence representation (OME, Lyu et al. 2020): each "
                     f"example's {self.source} representation from the frozen encoder was "
                     f"z-scored, encoded as {mech['r']}×{mech['l']} bits and randomized once "
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
    import shutil  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    from safetensors.numpy import save_file  # noqa: PLC0415

    ip = run["input_privacy"]
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        head = params["classifier"]
        kernel, bias = (np.asarray(getattr(head[k], "value", head[k]), np.float32)
                        for k in ("kernel", "bias"))
        save_file({"classifier.weight": kernel.T.copy(), "classifier.bias": bias},
                  str(tmp / "ome_head.safetensors"))
        settings = {"encoder": run["init_from_hf"], "seq_rep_source": ip["seq_rep_source"],
                    "zscore": "per_vector", "labels": run["labels"],
                    "logits": "classifier.weight @ bits + classifier.bias (bits 0/1, r·l)",
                    "mechanism": {k: v for k, v in ip.items()
                                  if k not in ("statement", "key", "frozen")}}
        (tmp / "ome_config.json").write_text(json.dumps(settings, indent=2) + "\n")
        dp = (report or {}).get("headline") if (report or {}).get("dp") else None
        card = ["# Classifier on OME-randomized sentence representations", "",
                "## Privacy of the users' representations (OME)", "",
                f"- **epsilon_true = {ip['epsilon_true']:.6g}** (exact worst case over inputs)",
                f"- epsilon_claimed = {ip['epsilon_claimed']:g} (Theorem 1"
                + (f", λ = {ip['lam']:g}; it holds only at λ = 1)" if "lam" in ip
                   else "; calibrated: equal to the true ε)"),
                "", ip["statement"], "",
                "## Training", "",
                dp or "No DP-SGD on the head (dp.enabled=False): the head's training has no "
                      "(ε, δ) of its own beyond the users' local randomization.", "",
                "## Use", "",
                f"Encoder: `{run['init_from_hf']}` unchanged ({ip['seq_rep_source']} output); "
                "z-score each representation over its coordinates, encode and randomize as in "
                "`ome_config.json` (`dpbert.ome`), then apply the head in "
                "`ome_head.safetensors`. This is not a transformers model folder.", ""]
        (tmp / "README.md").write_text("\n".join(card), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


finetuning.register_input_mode(OmeMode())
