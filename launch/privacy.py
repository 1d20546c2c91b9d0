r"""DP-SGD privacy accounting from the command line (dp_accounting underneath).

    python launch/privacy.py epsilon --num_examples=N --batch_size=B \
        --noise_multiplier=S --steps=T --delta=D [--accountant=pld|rdp] \
        [--sampling=poisson|shuffle] [--noise_mode=global|per_shard --num_shards=P] \
        [--max_batch_size=M] [--mechanism=dpsgd|bandmf --num_bands=b] [--json]
    python launch/privacy.py calibrate --target_epsilon=E --num_examples=N \
        --batch_size=B --steps=T --delta=D [same options] [--json]

`epsilon` prints the epsilon of T steps of DP-SGD with Poisson sampling
(q = B/N) and noise multiplier S; `calibrate` prints the smallest S (within
0.1 %) whose epsilon is <= E.  With --noise_mode=per_shard (TF
CrossShardOptimizer behaviour) the accountant is given S * sqrt(P) (Hoory et al.
2021, Eq. 3), and `calibrate` prints the per-shard S.  --max_batch_size
accounts Poisson batches truncated to at most M examples (what dpbert's
fixed-shape sampler does).  --mechanism=bandmf --num_bands=b accounts correlated noise
(dp.mechanism=bandmf of a run: cyclic Poisson sampling of b groups, the strategy optimized for
T steps, jax-privacy's accounting).  --json prints ONE JSON object (the privacy report)
on stdout.  The answer is `dpbert.reporting.report.cli_answer`'s.

Example (the scale of Hoory et al.: 83M MIMIC examples, batch 128k, delta 1e-8):

    python launch/privacy.py epsilon --num_examples=83000000 --batch_size=131072 \
        --noise_multiplier=1.0 --steps=10000 --delta=1e-8
"""

from __future__ import annotations

import json

from absl import app, flags

from dpbert.dp import accountants, noise_modes, sampling
from dpbert.reporting import report as report_lib
from dpbert.runtime import cli

flags.DEFINE_integer("num_examples", None, "N, dataset size in privacy units (e.g. sequences).")
flags.DEFINE_float("batch_size", None, "Expected (Poisson) logical batch size B; q = B / N.")
flags.DEFINE_float("noise_multiplier", None, "sigma: noise std / clip norm (epsilon command).")
flags.DEFINE_float("target_epsilon", None, "Epsilon to calibrate sigma for (calibrate command).")
flags.DEFINE_integer("steps", None, "T, number of noisy updates (logical batches).")
flags.DEFINE_float("delta", None, "delta, must be < 1/N.")
flags.DEFINE_enum("accountant", "pld", list(accountants.NAMES),
                  "pld (default, tight) or rdp (cross-check).")
flags.DEFINE_enum(
    "sampling", "poisson", list(sampling.SAMPLING_MODES),
    "poisson (proven bound) or shuffle (epsilon computed as if Poisson; NOT a proven bound).")
flags.DEFINE_enum(
    "noise_mode", "global", list(noise_modes.NOISE_MODES),
    "global: one noise draw of std sigma*C per batch; per_shard: each of num_shards shards "
    "adds std sigma*C (accounted as sigma*sqrt(P)).")
flags.DEFINE_integer("num_shards", 1, "P, data shards (for --noise_mode=per_shard).")
flags.DEFINE_integer("max_batch_size", None,
                     "Optional truncation of Poisson batches (PLD accountant only).")
flags.DEFINE_enum("mechanism", "dpsgd", ["dpsgd", "bandmf"],
                  "dpsgd (i.i.d. noise) or bandmf (correlated noise over --num_bands bands, "
                  "cyclic Poisson sampling: dp.mechanism of a run).")
flags.DEFINE_integer("num_bands", 1, "b, BandMF's bands (--mechanism=bandmf).")
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object instead of text.")

NAME = "privacy.py"


def main(argv):
    if len(argv) != 2 or argv[1] not in report_lib.CLI_COMMANDS:
        raise app.UsageError(f"give exactly one command: {' | '.join(report_lib.CLI_COMMANDS)}; "
                             f"got {argv[1:]}")
    try:
        report, text = report_lib.cli_answer(argv[1], flags.FLAGS.flag_values_dict())
    except ValueError as e:  # one clear line naming the bad value, no traceback
        cli.fail(NAME, str(e), 2)
    print(json.dumps(report, sort_keys=True) if _JSON.value else text)
    return 0


if __name__ == "__main__":
    cli.run(main, NAME)
