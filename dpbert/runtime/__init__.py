"""The one training loop and what it runs on: mesh and sharding, checkpoints, metrics, optimizers, config checks, the launchers' console."""
