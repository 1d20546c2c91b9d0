r"""One-run privacy audit (Steinke, Nasr & Jagielski 2023) of a training configuration.

    python launch/audit.py --config=configs/demo_dp.py --out=/tmp/audit [--m=256] \
        [--config.train.num_steps=300 ...]

Draws m random canaries and, from OS entropy, which of them to train on (each with probability
1/2); trains once (OUT/train, an ordinary training workdir; the config's own exposure canaries
are planted too); scores every canary with the trained model; and writes OUT/results.json: an
empirical lower bound on ε at the stated confidence next to the run's claimed ε: the larger of
ours and jax-privacy's one-run bound, with jax-privacy's f-DP bound beside it. The inclusion
bits and scores stay in OUT/private/ (never ship it with the model). Rerunning with the same
--out resumes. See dpbert/leakage/audit.py for the theorem and its exact tail computation.
"""

from absl import app, flags
from ml_collections import config_flags

from dpbert.runtime import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config (configs/*.py).")
_OUT = flags.DEFINE_string("out", None, "Output folder of the audit.")
_M = flags.DEFINE_integer("m", 256, "Audit canaries (each included with probability 1/2).")
_LENGTH = flags.DEFINE_integer("length", 8, "Word pieces per audit canary.")
_SCORE = flags.DEFINE_enum("score", "pll", ["pll", "secret"], "Membership score.")
_CONFIDENCE = flags.DEFINE_float("confidence", 0.95, "Confidence of the lower bound.")
_NUM_DEVICES = flags.DEFINE_integer("num_devices", None, "Train on the first N devices only.")
flags.mark_flags_as_required(["config", "out"])

NAME = "audit"


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import jax  # noqa: PLC0415 - after flag parsing

    from dpbert.leakage import audit  # noqa: PLC0415
    from dpbert.errors import ConfigError  # noqa: PLC0415

    # The arguments and the output folder before any work (run_audit checks them again): a
    # confidence of 0 or an --out that is a file used to fail only after the training.
    try:
        audit.check_arguments(_M.value, _LENGTH.value, _SCORE.value, _CONFIDENCE.value,
                              max_seq_length=_CONFIG.value.data.get("max_seq_length"),
                              prefix="--")
        audit.check_out_dir(_OUT.value, _CONFIG.value, flag="--out")
    except ValueError as e:
        cli.fail(NAME, str(e))
    if _NUM_DEVICES.value is not None and not 1 <= _NUM_DEVICES.value <= jax.device_count():
        cli.fail(NAME, f"--num_devices={_NUM_DEVICES.value}: must be in [1, "
                       f"{jax.device_count()}] (the devices there are)")
    devices = jax.devices()[:_NUM_DEVICES.value] if _NUM_DEVICES.value else None
    try:
        res = audit.run_audit(_CONFIG.value, _OUT.value, m=_M.value, length=_LENGTH.value,
                              score=_SCORE.value, confidence=_CONFIDENCE.value, devices=devices)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        cli.fail(NAME, str(e))
    claimed = (f"{res['claimed_epsilon']:.4g} at delta {res['claimed_delta']:g} (the run's "
               f"total: {res['total_epsilon'] or float('nan'):.4g})" if res["dp"]
               else "infinite (no DP)")
    print(f"audit: epsilon >= {res['epsilon_lower_bound']:.3f} with confidence "
          f"{res['confidence']:g} (delta {res['delta']:g}; {res['headline_bound']}; m = "
          f"{res['m']}); claimed training epsilon {claimed}"
          + ("" if res["consistent"] else "  <-- EXCEEDS THE CLAIM: a privacy bug?"))
    print("  bounds: " + ", ".join(
        f"{name} {b['epsilon_lower_bound']:.3f} (confidence {b['confidence']:g}"
        + ("" if b["in_headline"] else "; Gaussian trade-off assumed, not the headline") + ")"
        for name, b in res["bounds"].items()))
    print(f"wrote {_OUT.value}/results.json")


if __name__ == "__main__":
    cli.run(main, NAME)
