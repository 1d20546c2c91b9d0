"""The fine-tuning schedule: train.epochs -> train.num_steps = ceil(epochs x N / B) (B = the
expected batch size), warm-up = optimizer.warmup_fraction of it; results.json's account of it."""

from __future__ import annotations

import copy
import math


def resolve_schedule(config, num_train: int):
    """A copy of `config` with train.num_steps = ceil(epochs x N / B) when train.epochs > 0
    and optimizer.warmup_steps = round(warmup_fraction x num_steps) when that is set."""
    config = copy.deepcopy(config)
    b = float(config.batch.expected_batch_size)
    if config.train.epochs:
        config.train.num_steps = max(1, math.ceil(config.train.epochs * num_train / b))
    if config.optimizer.warmup_fraction is not None:
        config.optimizer.warmup_steps = int(round(config.optimizer.warmup_fraction *
                                                  config.train.num_steps))
    return config


def schedule_report(config, num_train: int) -> dict:
    b = float(config.batch.expected_batch_size)
    steps = int(config.train.num_steps)
    return {"num_steps": steps, "epochs": steps * b / num_train,
            "requested_epochs": float(config.train.epochs) or None,
            "num_train_examples": num_train, "expected_batch_size": b,
            "warmup_steps": int(config.optimizer.warmup_steps),
            "rule": "num_steps = ceil(train.epochs x N / B), B = batch.expected_batch_size "
                    "(with Poisson sampling an epoch is N/B steps in expectation)"}


def epochs_seen(config, num_train: int) -> int:
    """How many (possibly partial) epochs the run's steps cover: releases with fresh noise."""
    return max(1, math.ceil(config.train.num_steps * config.batch.expected_batch_size
                            / num_train - 1e-9))
