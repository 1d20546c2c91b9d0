"""Config checks that every task shares, run by `loop.validate` before any work.

Each failure is one `ConfigError` naming the field (`config.section.field=VALUE: why`), for the
values that used to fail late, hang or fail without a name:

* seeds (`seed`, `vocab.seed`, `data.canaries.seed`, ... every field named `seed` or `*_seed`):
  an integer in [0, 2**32 - 1]; NumPy refuses a negative seed deep inside the vocabulary build
  ("expected non-negative integer", no field named), and jax keys keep 32 bits (seed 2**32 would
  silently be seed 0);
* `data.canaries.repetitions`: integers in [0, canaries.MAX_REPETITIONS] (10**9 planted copies
  never finished);
* `data.max_sentence_chars` (pretraining): an integer > 0; at 0 or below every word was cut
  into a sentence of its own, silently (BERT's sentence pairs and NSP then see single words);
* the dχ privacy parameter η of pretraining (`dchi.eta`) and of fine-tuning (`privacy.eta`), one
  field of one section builder (`configs/common.dchi_section`), checked here once for both when
  its mechanism is on: a finite number > 0 and at least MIN_ETA (the noise has a norm of about
  d / η, d the embedding width, which overflows float32 for a tiny η; the run then stopped on
  non-finite parameters with advice to lower the learning rate).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterator

from data_pipelines import canaries
from dpbert.errors import ConfigError

MAX_SEED = 2**32 - 1
# Below this η the dχ noise (norm ~ d/η; d up to 4096) reaches 4e9 and more, and below ~1e-16
# its squares overflow float32 inside LayerNorm. Already at η = 1 the noise (norm ~ d) dwarfs
# every word embedding (norm ~ 1): smaller values add no privacy worth having.
MIN_ETA = 1e-6
# The dχ sections (`configs/common.dchi_section`): (section, the field that turns dχ on, off).
DCHI_SECTIONS = (("privacy", "mode", "none"), ("dchi", "mechanism", "none"))


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    items = node.items() if hasattr(node, "items") else ()
    for key, value in items:
        if hasattr(value, "items"):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check(config: Any) -> None:
    """Raises ConfigError for the first problem found (module doc)."""
    for field, value in _leaves(config):
        leaf = field.rsplit(".", 1)[-1]
        if leaf == "seed" or leaf.endswith("_seed"):
            if value is None and field != "seed":
                continue  # None = drawn from OS entropy (vocab.seed) or unused
            if not (_is_int(value) and 0 <= value <= MAX_SEED):
                raise ConfigError(
                    f"config.{field}={value!r}: a seed must be an integer in [0, {MAX_SEED}] "
                    "(NumPy refuses negative seeds; jax keys keep 32 bits, so a larger seed "
                    "would repeat a smaller one)")
    data = config.get("data") if hasattr(config, "get") else None
    canary_config = data.get("canaries") if hasattr(data, "get") else None
    if canary_config is not None and canary_config.get("enabled"):
        reps = canary_config.get("repetitions")
        reps = reps if isinstance(reps, (list, tuple)) else [reps]
        for r in reps:
            if not (_is_int(r) and 0 <= r <= canaries.MAX_REPETITIONS):
                raise ConfigError(
                    f"config.data.canaries.repetitions={canary_config.get('repetitions')!r}: "
                    f"each count must be an integer in [0, {canaries.MAX_REPETITIONS}] (0 = a "
                    f"never-planted reference canary; {r!r} is not)")
    if hasattr(data, "get") and "max_sentence_chars" in data:
        chars = data.get("max_sentence_chars")
        if not (_is_int(chars) and chars > 0):
            raise ConfigError(
                f"config.data.max_sentence_chars={chars!r}: must be an integer > 0 (sentences "
                "longer than this many characters are cut at whitespace; at 0 or below every "
                "word would become a sentence of its own). The default is 1000")
    for section, mode_field, off in DCHI_SECTIONS:
        node = config.get(section) if hasattr(config, "get") else None
        if hasattr(node, "get") and node.get(mode_field, off) != off:
            check_eta(node.get("eta"), section, f"{mode_field} {node.get(mode_field)!r}")


def check_eta(eta: Any, section: str, what: str) -> None:
    """η of the dχ section `section` (`what` turned it on, e.g. "mode 'token_rep'")."""
    if not (isinstance(eta, numbers.Real) and not isinstance(eta, bool) and math.isfinite(eta)
            and eta > 0):
        raise ConfigError(f"config.{section}.eta must be a finite number > 0 for {what}, "
                          f"got {eta!r}")
    if eta < MIN_ETA:
        raise ConfigError(
            f"config.{section}.eta={eta!r}: below {MIN_ETA:g}. The dχ noise has a norm of "
            f"about d/η (d = the embedding width), {1 / eta:.1e} x d here, which overflows "
            "float32 in the model; already at η = 1 the noise (norm ≈ d) drowns every word "
            f"embedding, so use η >= {MIN_ETA:g} (Qu et al. use 50-175)")
