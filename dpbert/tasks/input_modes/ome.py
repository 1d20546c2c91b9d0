"""Input mode ome: randomized bits of the frozen encoder's sentence representation
(Lyu et al. 2020, `dpbert.privacy.ome`; issue 13; `privacy.mode=ome`). Needs a task with
SENTENCE (one label from one sentence vector: classification).

The users run the FROZEN encoder of model.init_from_hf
on their sentence, z-score the representation per vector (no data statistics needed),
encode each coordinate as l = 1 + m + n bits (sign, m = 4 integer, n = 5 fraction
bits) and randomize the r·l bits once with a secret key (the run's task key, the
split and the example id). The service sees only the bits and trains a linear head
on them. privacy.ome_variant:
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
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from dpbert.errors import ConfigError, need
from dpbert.models import bert as model_lib
from dpbert.models import heads
from dpbert.privacy import input_privacy
from dpbert.privacy import ome as ome_lib
from dpbert.tasks.input_modes.base import SENTENCE, InputMode, lineage_section, write_folder

OME_VARIANTS = ("published", "calibrated", "sue", "oue")
_OME_SALT = 0x0E11   # folded into the split key: OME bits never share noise with a dχ release


@dataclasses.dataclass(frozen=True)
class OmeMode(InputMode):
    name: str = "ome"
    needs: tuple[str, ...] = (SENTENCE,)

    def mechanism(self, config, r: int):
        p = config.privacy
        try:
            if p.ome_variant == "published":
                mech = ome_lib.OME(eps=float(p.epsilon), lam=float(p.ome_lambda), r=r)
            elif p.ome_variant in ome_lib.UE_KINDS:
                mech = ome_lib.UnaryEncoding(p.ome_variant, eps=float(p.epsilon), r=r,
                                             levels=int(p.ue_levels))
            else:
                mech = ome_lib.CalibratedOME(eps=float(p.epsilon), r=r)
            mech.randomizer  # noqa: B018 - validates eps / lam now
        except ValueError as e:
            raise ConfigError(f"config.privacy (mode ome): {e}") from None
        return mech

    def validate(self, config) -> None:
        p = config.privacy
        need(p.ome_variant in OME_VARIANTS, "privacy.ome_variant", p.ome_variant,
             f"must be one of {OME_VARIANTS}")
        eps = p.epsilon
        need(isinstance(eps, (int, float)) and not isinstance(eps, bool)
             and math.isfinite(eps) and eps > 0, "privacy.epsilon", eps,
             "must be a finite number > 0 (OME's requested ε)")
        need(p.ome_lambda >= 1, "privacy.ome_lambda", p.ome_lambda,
             "must be >= 1 (Theorem 1's λ; the paper uses 100)")
        need(isinstance(p.ue_levels, int) and not isinstance(p.ue_levels, bool)
             and p.ue_levels >= 2, "privacy.ue_levels", p.ue_levels,
             "must be an integer >= 2 (bins of the unary encoding)")
        need(not p.fresh_noise_each_epoch, "privacy.fresh_noise_each_epoch",
             p.fresh_noise_each_epoch,
             "mode ome releases each example once; fresh noise is not supported")
        self.mechanism(config, 4)

    def user_side(self, config, model, vocab_file: str):
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
    model.classifier = model_lib._dense(model.config, width, len(model.labels),  # noqa: SLF001
                                        ("embed", "classes"), rngs=nnx.Rngs(seed))


class OmeUser:
    """The users' side of mode ome: frozen encoder -> z-score -> bits -> randomized bits."""

    def __init__(self, mech, encoder, variant: str, source: str):
        self.mech, self.encoder, self.variant, self.source = mech, encoder, variant, source

    def release(self, features, key, *, split: str, epoch=None):
        del epoch  # one release per example (validated)
        f = {k: np.asarray(v) for k, v in features.items()}
        reps = self.encoder.sentence_representations(
            f["input_ids"].astype(np.int32), f["segment_ids"].astype(np.int32),
            f["input_mask"].astype(np.int32))
        split_key = jax.random.fold_in(
            jax.random.fold_in(key, input_privacy.split_salt(split)), _OME_SALT)
        bits = self.mech.privatize(split_key, ome_lib.zscore(reps), row_ids=f["example_id"])
        keep = {k: v for k, v in f.items() if k not in ("input_ids", "segment_ids", "input_mask",
                                                        "example_id", "position_ids")}
        return input_privacy.Release("ome", dict(keep, features=bits.astype(np.float32)))

    def report(self, *, epochs: int, secret_key: bool = True) -> dict:
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
            *lineage_section(report),
            "## Use", "",
            f"Encoder: `{run['init_from_hf']}` unchanged ({ip['seq_rep_source']} output); "
            "z-score each representation over its coordinates, encode and randomize as in "
            "`ome_config.json` (`dpbert.privacy.ome`), then apply the head in "
            "`ome_head.safetensors`. This is not a transformers model folder.", ""]
    return write_folder(out, {"ome_config.json": json.dumps(settings, indent=2) + "\n",
                              "README.md": "\n".join(card)},
                        {"ome_head.safetensors": {"classifier.weight": kernel.T.copy(),
                                                  "classifier.bias": bias}}, save_file, report)
