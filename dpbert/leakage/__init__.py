"""Measuring what a trained model leaks: secret-sharer exposure and the one-run privacy audit."""
