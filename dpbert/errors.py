"""Errors that name what the user must change, and the one check that raises them."""

from typing import Any


class ConfigError(ValueError):
    """A config value that cannot work; the message names the field (config.section.field)."""


def need(cond: bool, field: str, value: Any, why: str) -> None:
    """Raises ``ConfigError("config.FIELD=VALUE!r: WHY")`` unless `cond`.

    `field` is the dotted path below ``config`` ("dp.clip_norm"), `value` the value it holds
    (shown with repr), `why` what it must be or what to do instead.
    """
    if not cond:
        raise ConfigError(f"config.{field}={value!r}: {why}")
