"""Privacy lineage: what a run's starting model already spent, and on which data.

A model exported by dpbert carries its public privacy report beside the weights
(`privacy_report.json`, `dpbert.reporting.report.public_report`): its total, the DP-SGD segments its
accountant composed (mechanism and steps, this run's and the ones it inherited), and the
vocabularies it counted (each with the sha256 of its vocab.txt). A run that starts from such a
model (`model.init_from_hf`) inherits it as `model.init_data` says:

  same      (the default: dpbert cannot know the data differ) the starting model's training
            data may overlap this run's. Its DP-SGD segments are composed with this run's into
            ONE dp_accounting event (the training epsilon, the budget of dp.target_epsilon and
            a calibrated sigma all include them; the units must then be the same), and each of
            its vocabularies is counted once (a vocabulary this run reuses is the same release,
            never counted twice). A starting model trained on that data WITHOUT DP, or with
            public-seed noise, voids this run's claim.
  disjoint  no record of this run's data was in the starting model's training data: its
            guarantee stays its own (for its data) and is listed on this run's card.
  public    the starting model was trained on public data: nothing to compose; listed.

A vocabulary is judged by its own report whatever `init_data` says (it may have read this run's
data even when the starting model's training did not: the MIMIC-III pipeline builds it from the
notes and pretrains on public text with it).

A folder without `privacy_report.json` is a model trained elsewhere (e.g. a Hugging Face
checkpoint): treated as trained on public data, and the card says so. A dpbert export written
before the report existed is refused with `same` (its cost cannot be composed): re-export it
from its workdir, or declare `disjoint` / `public`.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Mapping

from data_pipelines import fileio
from dpbert.errors import ConfigError

RELATIONS = ("same", "disjoint", "public")
REPORT_FILE = "privacy_report.json"  # the public report beside an export's weights
REPORT_FORMAT = "dpbert-privacy-report/1"
_DPBERT_CARD = "exported by dpbert"


@dataclasses.dataclass(frozen=True)
class Lineage:
    """What a run inherits from its starting model (module docstring).

    relation: `model.init_data`. base: the starting model's public report. segments: its DP-SGD
    segments as `dpbert.dp.ledger.Segment`s (delta and accountant set to this run's), composed
    into this run's training epsilon (empty unless relation is "same"). vocabularies: the
    vocabulary parts of its total (with `vocab_sha256`), counted in this run's total unless it
    uses the same vocabulary (empty unless "same"). voids: why this run cannot be private
    because of its starting model (None when it can).
    """

    relation: str
    base: dict
    segments: tuple = ()
    vocabularies: tuple = ()
    voids: str | None = None

    def entry(self) -> dict[str, Any]:
        """The report's `lineage` field: the starting model's claim and how it was used."""
        base = self.base
        how = {"same": "its training data may overlap this run's (model.init_data='same'): its "
                       "DP-SGD training is composed into this run's training epsilon and its "
                       "vocabularies are counted once in the total",
               "disjoint": "declared disjoint from this run's data (model.init_data="
                           "'disjoint'): its guarantee holds for its own training data and is "
                           "not part of this run's total",
               "public": "declared trained on public data (model.init_data='public'): nothing "
                         "of it is part of this run's total"}[self.relation]
        out = {"relation": self.relation, "how": how,
               "headline": base.get("headline"), "epsilon": base.get("epsilon"),
               "delta": base.get("delta"), "private": base.get("private"),
               "dp": base.get("dp"), "privacy_unit": base.get("privacy_unit"),
               "unit_definition": base.get("unit_definition")}
        if base.get("lineage"):
            out["lineage"] = base["lineage"]
        if self.voids:
            out["voids"] = self.voids
        return out


def _looks_like_dpbert_export(folder: pathlib.Path) -> bool:
    card = folder / "README.md"
    return (folder / "vocab_privacy.json").is_file() or (
        card.is_file() and _DPBERT_CARD in card.read_text(encoding="utf-8", errors="replace"))


def read_report(folder: str | pathlib.Path) -> dict | None:
    """The public privacy report of an exported model folder, or None when it has none.

    Raises:
      ConfigError: the file is not a readable report.
    """
    path = pathlib.Path(folder) / REPORT_FILE
    if not path.is_file():
        return None
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a readable privacy report ({e})") from None
    if not isinstance(report, dict) or report.get("format") != REPORT_FORMAT:
        raise ConfigError(f"{path}: not a dpbert privacy report (format "
                          f"{report.get('format') if isinstance(report, dict) else None!r}, "
                          f"expected {REPORT_FORMAT!r})")
    return report


def _segments(base: Mapping[str, Any], delta: float, accountant: str) -> tuple:
    """The starting model's DP-SGD segments (its inherited ones first) as ledger Segments with
    this run's delta and accountant."""
    from dpbert.dp import ledger as ledger_lib  # noqa: PLC0415

    training = base.get("training") or {}
    raw = list(training.get("inherited_segments") or []) + list(training.get("segments") or [])
    if training and not raw:
        raise ConfigError("the starting model's privacy report has no DP-SGD segments to "
                          "compose (written by an older dpbert?); re-export it from its workdir")
    out = []
    for seg in raw:
        fields = dict(seg["spec"], delta=delta, accountant=accountant)
        try:
            spec = ledger_lib.spec_from_dict(fields)
        except ValueError as e:
            raise ConfigError(
                f"the starting model's DP-SGD training cannot be composed with this run at "
                f"dp.delta={delta}, dp.accountant={accountant!r}: {e}") from None
        out.append(ledger_lib.Segment(spec, int(seg["steps"])))
    return tuple(s for s in out if s.steps > 0)


def load(init_from_hf: str, relation: str, *, privacy_unit: str, dp_enabled: bool,
         delta: float | None, accountant: str | None) -> Lineage | None:
    """The lineage of a run starting from `init_from_hf` (None: no starting model, or one
    without a dpbert privacy report, i.e. trained elsewhere)."""
    if relation not in RELATIONS:
        raise ConfigError(f"config.model.init_data={relation!r}: must be one of {RELATIONS} "
                          "(what the starting model was trained on, relative to this run's "
                          "data)")
    if not init_from_hf:
        return None
    problem = fileio.training_workdir_problem(init_from_hf)
    if problem:  # its privacy_report.json is the run's private one, not an export's
        raise ConfigError(f"config.model.init_from_hf={init_from_hf}: {problem}")
    folder = pathlib.Path(init_from_hf)
    base = read_report(folder)
    if base is None:
        if relation == "same" and _looks_like_dpbert_export(folder):
            raise ConfigError(
                f"config.model.init_from_hf={init_from_hf!r}: a dpbert export without "
                f"{REPORT_FILE} (written before exports carried it), so what its training "
                "spent cannot be composed with this run. Re-export it from its workdir "
                "(launch/export_hf.py --workdir=... --out=...), or declare what it was trained "
                "on: --config.model.init_data=disjoint (other data) or public")
        return None
    if not base.get("read_private_data", True):
        return None  # a conversion of a model without a report (export_hf --from_hf)
    if relation != "same":
        return Lineage(relation, base)
    voids = None
    if not base.get("private"):
        voids = ("the starting model's training may have used this run's data (model.init_data"
                 "='same') and carries no DP guarantee (" + str(base.get("headline")) + "); "
                 "declare model.init_data='disjoint' or 'public' if its data differ")
    base_unit = base.get("privacy_unit")
    if base.get("dp") and base_unit != privacy_unit:
        raise ConfigError(
            f"config.model.init_data='same': the starting model's DP-SGD protects one "
            f"{base_unit!r} and this run one {privacy_unit!r}; epsilons of different units do "
            "not compose. Use the same dp.privacy_unit, or declare model.init_data='disjoint' "
            "if this run's data were not in its training data")
    segments = ()
    if base.get("dp") and dp_enabled:
        segments = _segments(base, delta, accountant)
    vocabularies = tuple(v for v in [base.get("vocabulary") or {}]
                         + list(base.get("inherited_vocabularies") or [])
                         if v.get("read_private_data"))
    return Lineage(relation, base, segments, vocabularies, voids)
