"""The secret randomness of a DP run: the noise key and the sampler seed (host side).

DP-SGD's guarantee assumes that nobody can predict the Gaussian noise or which examples a
logical batch holds. If both derive from a seed that is written down (a config file, a log, a
model card), anyone who has that seed can regenerate the noise and subtract it from a released
update: the guarantee is void. So a DP run draws them from the operating system's entropy
(`secrets`) when it starts, keeps them only in its checkpoints (private, like the training
data: they already hold un-noised gradient sums), and reads them back on resume so that a
resumed run is bitwise the run it would have been.

`RunSecrets.seeded(seed)` derives both from a public seed instead. That makes runs
reproducible for tests and debugging, and is NOT private: every report and model card of such
a run says so (`SEEDED_NOTE`).

Multi-host: process 0 draws, every process receives the same values (`broadcast`), since all
hosts must add the same noise and load the same batches.
"""

from __future__ import annotations

import dataclasses
import secrets

import numpy as np

SEEDED_NOTE = ("NOT private: noise and batch sampling derived from a public seed "
               "(dp.insecure_seeded_noise=True); anyone who knows the seed can remove the noise. "
               "For tests and debugging only.")
SECRET_NOTE = ("Noise and batch sampling are drawn from OS entropy at the start of the run and "
               "kept only in the (private) checkpoints.")
_NOISE_STREAM = 1  # the engine's former noise stream of the seed's key (bitwise compatible)
_TASK_STREAM = 2
_DROPOUT_STREAM = 0xD0  # the per-example (dropout) key of a DP run, folded into the task key


@dataclasses.dataclass(frozen=True)
class RunSecrets:
    """noise_key: raw uint32[2] JAX PRNG key of the DP noise; sampler_seed: Poisson sampler
    seed (non-negative, < 2**63); task_key: raw uint32[2] key of a task's own secret randomness
    (e.g. the one-time dχ release of fine-tuning inputs, standing for the users' local noise);
    secret: False when derived from a public seed."""

    noise_key: tuple[int, int]
    sampler_seed: int
    secret: bool
    task_key: tuple[int, int] = (0, 0)

    def __repr__(self) -> str:  # never print the values (logs are not private)
        return f"RunSecrets(secret={self.secret}, values hidden)"

    @classmethod
    def draw(cls) -> "RunSecrets":
        """Fresh secrets from OS entropy (`secrets`, i.e. os.urandom)."""
        return cls((secrets.randbits(32), secrets.randbits(32)), secrets.randbits(63), True,
                   (secrets.randbits(32), secrets.randbits(32)))

    @classmethod
    def seeded(cls, seed: int) -> "RunSecrets":
        """Public-seed values (NOT private): the noise key is fold_in(PRNGKey(seed), 1) and the
        sampler seed is `seed`, which is what every run used before secrets existed."""
        import jax  # noqa: PLC0415  (host-only users need not import JAX)

        def key(stream: int) -> tuple[int, int]:
            k = jax.random.fold_in(jax.random.PRNGKey(seed), stream)
            k0, k1 = (int(x) for x in np.asarray(k, np.uint32).reshape(2))
            return k0, k1

        return cls(key(_NOISE_STREAM), int(seed), False, key(_TASK_STREAM))

    def to_array(self) -> np.ndarray:
        seed = self.sampler_seed
        return np.asarray([*self.noise_key, seed >> 32, seed & 0xFFFFFFFF, int(self.secret),
                           *self.task_key], np.uint32)

    @classmethod
    def from_array(cls, a: np.ndarray) -> "RunSecrets":
        a = [int(x) for x in np.asarray(a, np.uint32)]
        return cls((a[0], a[1]), (a[2] << 32) | a[3], bool(a[4]), (a[5], a[6]))

    def broadcast(self) -> "RunSecrets":
        """Process 0's values on every process (identity in a single-process run)."""
        import jax  # noqa: PLC0415

        if jax.process_count() == 1:
            return self
        from jax.experimental import multihost_utils  # noqa: PLC0415

        return RunSecrets.from_array(
            np.asarray(multihost_utils.broadcast_one_to_all(self.to_array())))

    def noise_key_array(self) -> np.ndarray:
        return np.asarray(self.noise_key, np.uint32)

    def task_key_array(self) -> np.ndarray:
        return np.asarray(self.task_key, np.uint32)


def dropout_key(task_key: np.ndarray) -> np.ndarray:
    """The raw uint32[2] key of a DP run's per-example randomness (dropout): fold_in(task key,
    a stream of its own), so it is as secret as the task key.

    Why secret: the clippers key an example's dropout by its POSITION in the logical batch, and
    positions depend on which other units the (secret) sampler drew. With a public key the
    masks given to each position are known, and removing one unit shifts the positions -- so
    the masks -- of the units after it: the neighbouring run would differ in more than one
    unit's clipped gradient. With a secret key every position's mask is an independent draw
    nobody can predict, so each sampled unit sees fresh independent dropout whatever else is in
    the batch, which is what the subsampled-Gaussian analysis assumes.
    """
    import jax  # noqa: PLC0415

    key = jax.random.fold_in(jnp_key(task_key), _DROPOUT_STREAM)
    return np.asarray(key, np.uint32).reshape(2)


def jnp_key(raw: np.ndarray):
    """A raw uint32[2] key as a JAX array."""
    import jax.numpy as jnp  # noqa: PLC0415

    return jnp.asarray(np.asarray(raw, np.uint32).reshape(2))


def for_run(insecure_seeded: bool, seed: int, *,
            seeded_task_key: bool | None = None) -> RunSecrets:
    """The secrets of a fresh run: drawn (and shared by all processes), or seeded.

    `seeded_task_key` (default: `insecure_seeded`) decides the task key on its own: a run
    without DP-SGD may take its (then meaningless) noise and sampling from the public seed, but
    a task's own secret randomness (the users' dχ release of fine-tuning inputs) must still
    come from OS entropy unless the run is explicitly insecure."""
    seeded_task_key = insecure_seeded if seeded_task_key is None else seeded_task_key
    out = RunSecrets.seeded(seed) if insecure_seeded else RunSecrets.draw().broadcast()
    if seeded_task_key == insecure_seeded:
        return out
    task_key = (RunSecrets.seeded(seed) if seeded_task_key
                else RunSecrets.draw().broadcast()).task_key
    return dataclasses.replace(out, task_key=task_key)
