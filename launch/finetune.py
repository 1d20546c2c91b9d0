r"""Fine-tunes a BERT checkpoint for classification or NER, with input privacy and/or DP-SGD.

    python launch/finetune.py --config=configs/finetune_classification.py --workdir=W \
        --config.model.init_from_hf=HF_FOLDER --config.data.train=TRAIN.tsv \
        --config.data.eval=EVAL.tsv [--config.privacy.mode=text_to_text --config.privacy.eta=75]
    python launch/finetune.py --config=configs/finetune_ner.py --workdir=W \
        --config.model.init_from_hf=HF_FOLDER [--config.data.fold=2]

Writes W/results.json (held-out metrics, the schedule, the privacy statement), W/hf (Hugging
Face format), TensorBoard and metrics.jsonl; rerunning the same command resumes from the newest
checkpoint. Everything else lives in the library: `dpbert.tasks.finetuning.run(config,
workdir)`, the fine-tuning tasks on the DP loop (`dpbert.loop`).
"""

import logging as std_logging
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (configs/finetune_*.py).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, results.")
flags.mark_flags_as_required(["config", "workdir"])

NAME = "finetune"


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    # Imported here so that --help is instant and XLA flags set by the caller apply.
    from dpbert.tasks import finetuning

    std_logging.getLogger("absl").addFilter(_quiet_libraries)
    if not flags.FLAGS["verbosity"].present:  # progress lines are printed; INFO would repeat them
        logging.set_verbosity(logging.WARNING)
    try:
        results = finetuning.run(_CONFIG.value, _WORKDIR.value)
    except (FileNotFoundError, ValueError, OSError, FloatingPointError) as e:
        # One clear line for bad input (config, data, checkpoint); nothing written is touched.
        raise SystemExit(f"{NAME}: error: {_one_line(e)}") from None
    shown = {k: round(v, 4) for k, v in results.items()
             if k.startswith("eval_") and k[5:] in ("accuracy", "f1", "loss")}
    print(f"{NAME}: wrote {_WORKDIR.value}/results.json: {shown}", flush=True)


def _one_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return "; ".join(lines) or type(e).__name__


def _quiet_libraries(record: std_logging.LogRecord) -> bool:
    noisy = ("/orbax/", "/jax/", "/jaxlib/", "/flax/")
    return record.levelno >= std_logging.WARNING or not any(n in record.pathname for n in noisy)


def _run():
    if any(a in ("--help", "-h", "--helpfull", "--helpshort", "-?") for a in sys.argv[1:]):
        print(__doc__.strip() + "\n")
        app.usage(shorthelp=True, writeto_stdout=True, exitcode=0)
    try:
        app.run(main)
    except app.UsageError as e:  # noqa: B014 - absl raises it for bad command lines
        raise SystemExit(f"{NAME}: error: {e}") from None


if __name__ == "__main__":
    _run()
