"""Fixtures shared with the data-pipeline tests."""

from tests.data_pipelines.conftest import notes_vocab  # noqa: F401 - a fixture (word vocab)
