r"""DP-SGD privacy accounting from the command line (dp_accounting underneath).

    python launch/privacy.py epsilon --num_examples=N --batch_size=B \
        --noise_multiplier=S --steps=T --delta=D [--accountant=pld|rdp] \
        [--sampling=poisson|shuffle] [--noise_mode=global|per_shard --num_shards=P] \
        [--max_batch_size=M] [--json]
    python launch/privacy.py calibrate --target_epsilon=E --num_examples=N \
        --batch_size=B --steps=T --delta=D [same options] [--json]

`epsilon` prints the epsilon of T steps of DP-SGD with Poisson sampling
(q = B/N) and noise multiplier S; `calibrate` prints the smallest S (within
0.1 %) whose epsilon is <= E.  With --noise_mode=per_shard (TF
CrossShardOptimizer behaviour) the accountant is given S * sqrt(P) (Hoory et al.
2021, Eq. 3), and `calibrate` prints the per-shard S.  --max_batch_size
accounts Poisson batches truncated to at most M examples (what dpbert's
fixed-shape sampler does).  --json prints ONE JSON object (the privacy report)
on stdout.

Example (the scale of Hoory et al.: 83M MIMIC examples, batch 128k, delta 1e-8):

    python launch/privacy.py epsilon --num_examples=83000000 --batch_size=131072 \
        --noise_multiplier=1.0 --steps=10000 --delta=1e-8
"""

from __future__ import annotations

import json
import sys

from absl import app, flags

from dpbert.runtime import cli
from dpbert.dp import accounting, calibration

_NUM_EXAMPLES = flags.DEFINE_integer("num_examples", None,
                                     "N, dataset size in privacy units (e.g. sequences).")
_BATCH_SIZE = flags.DEFINE_float("batch_size", None,
                                 "Expected (Poisson) logical batch size B; q = B / N.")
_NOISE_MULTIPLIER = flags.DEFINE_float("noise_multiplier", None,
                                       "sigma: noise std / clip norm (epsilon command).")
_TARGET_EPSILON = flags.DEFINE_float("target_epsilon", None,
                                     "Epsilon to calibrate sigma for (calibrate command).")
_STEPS = flags.DEFINE_integer("steps", None, "T, number of noisy updates (logical batches).")
_DELTA = flags.DEFINE_float("delta", None, "delta, must be < 1/N.")
_ACCOUNTANT = flags.DEFINE_enum("accountant", "pld", list(accounting.ACCOUNTANTS),
                                "pld (default, tight) or rdp (cross-check).")
_SAMPLING = flags.DEFINE_enum(
    "sampling", "poisson", list(accounting.SAMPLING_MODES),
    "poisson (proven bound) or shuffle (epsilon computed as if Poisson; NOT a proven bound).")
_NOISE_MODE = flags.DEFINE_enum(
    "noise_mode", "global", list(accounting.NOISE_MODES),
    "global: one noise draw of std sigma*C per batch; per_shard: each of num_shards shards "
    "adds std sigma*C (accounted as sigma*sqrt(P)).")
_NUM_SHARDS = flags.DEFINE_integer("num_shards", 1, "P, data shards (for --noise_mode=per_shard).")
_MAX_BATCH_SIZE = flags.DEFINE_integer(
    "max_batch_size", None, "Optional truncation of Poisson batches (PLD accountant only).")
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object instead of text.")

COMMANDS = ("epsilon", "calibrate")


def _require(**values) -> None:
    missing = [f"--{name}" for name, value in values.items() if value is None]
    if missing:
        raise ValueError(f"missing required flag(s): {', '.join(missing)}")


def run(command: str) -> dict:
    """Runs `command` with the parsed flags; returns the privacy report dict."""
    _require(num_examples=_NUM_EXAMPLES.value, batch_size=_BATCH_SIZE.value,
             steps=_STEPS.value, delta=_DELTA.value)
    common = dict(expected_batch_size=_BATCH_SIZE.value, num_examples=_NUM_EXAMPLES.value,
                  delta=_DELTA.value, sampling=_SAMPLING.value,
                  noise_mode=_NOISE_MODE.value, num_shards=_NUM_SHARDS.value,
                  max_batch_size=_MAX_BATCH_SIZE.value, accountant=_ACCOUNTANT.value)
    if command == "epsilon":
        _require(noise_multiplier=_NOISE_MULTIPLIER.value)
        sigma = _NOISE_MULTIPLIER.value
        epsilon = None
    else:
        _require(target_epsilon=_TARGET_EPSILON.value)
        sigma = calibration.calibrate_noise_multiplier(
            target_epsilon=_TARGET_EPSILON.value, steps=_STEPS.value, **common)
        epsilon = None  # Recomputed below: the report states the calibrated sigma's epsilon.
    spec = accounting.AccountingSpec(noise_multiplier=sigma, **common)
    report = accounting.privacy_report(spec, _STEPS.value, clip_norm=None, epsilon=epsilon)
    if command == "calibrate":
        report["target_epsilon"] = _TARGET_EPSILON.value
    return report


def _text(command: str, report: dict) -> str:
    lines = []
    if command == "epsilon":
        lines.append(f"epsilon = {report['epsilon']:.6g}  (delta = {report['delta']:.3g})")
    else:
        lines.append(f"noise_multiplier = {report['noise_multiplier']:.6g}  "
                     f"(epsilon = {report['epsilon']:.6g} <= target "
                     f"{report['target_epsilon']:.6g}, delta = {report['delta']:.3g})")
    lines.append(f"  accountant={report['accountant']} sampling={report['sampling']} "
                 f"q={report['sampling_probability']:.6g} steps={report['steps']} "
                 f"noise_mode={report['noise_mode']} num_shards={report['num_shards']} "
                 f"effective_noise_multiplier={report['effective_noise_multiplier']:.6g}")
    if not report["proven_bound"]:
        lines.append(f"  WARNING: {report['note']}")
    elif accounting.COARSE_GRID_NOTE in report["note"]:
        coarse = report["note"][report["note"].index(accounting.COARSE_GRID_NOTE):]
        lines.append(f"  NOTE: {coarse}")
    return "\n".join(lines)


def main(argv):
    if len(argv) != 2 or argv[1] not in COMMANDS:
        raise app.UsageError(f"give exactly one command: {' | '.join(COMMANDS)}; got {argv[1:]}")
    command = argv[1]
    try:
        report = run(command)
    except ValueError as e:
        # One clear line naming the bad value, no traceback.
        print(f"privacy.py {command}: {e}", file=sys.stderr)
        return 2
    if _JSON.value:
        print(json.dumps(report, sort_keys=True))
    else:
        print(_text(command, report))
    return 0


if __name__ == "__main__":
    cli.run(main, "privacy.py")
