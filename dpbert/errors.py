"""Errors that name what the user must change."""


class ConfigError(ValueError):
    """A config value that cannot work; the message names the field (config.section.field)."""
