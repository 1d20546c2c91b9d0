"""The input modes, by `privacy.mode` name: this table is the whole list (a new mode is a
module in this package and one line here)."""

from __future__ import annotations

from dpbert.errors import ConfigError
from dpbert.tasks.input_modes import dchi_modes, ome, texthide
from dpbert.tasks.input_modes.base import InputMode

MODES: dict[str, InputMode] = {m.name: m for m in (
    *dchi_modes.MODES,          # none, token_rep, text_to_text, seq_rep
    ome.OmeMode(),              # ome
    texthide.TextHideMode(),    # texthide
)}


def get(name: str) -> InputMode:
    if name not in MODES:
        raise ConfigError(f"config.privacy.mode={name!r}: must be one of {names()}")
    return MODES[name]


def names() -> tuple[str, ...]:
    return tuple(MODES)
