r"""Fine-tunes a BERT checkpoint for classification or NER, with input privacy and/or DP-SGD.

    python launch/finetune.py --config=configs/finetune_classification.py --workdir=W \
        --config.model.init_from_hf=HF_FOLDER --config.data.train=TRAIN.tsv \
        --config.data.eval=EVAL.tsv [--config.privacy.mode=text_to_text --config.privacy.eta=75]
        [--config.privacy.mode=ome --config.privacy.epsilon=1 --config.privacy.ome_lambda=100]
        [--config.privacy.mode=texthide --config.privacy.m=256 --config.privacy.k=4]
        [--config.dp.enabled=True --config.dp.target_epsilon=8]
    python launch/finetune.py --config=configs/finetune_ner.py --workdir=W \
        --config.model.init_from_hf=HF_FOLDER [--config.data.fold=2]

Writes W/results.json (held-out metrics, the schedule, the privacy statement), W/hf (Hugging
Face format; for ome and TextHide's MLP head a documented safetensors folder), TensorBoard and metrics.jsonl; rerunning the same command resumes from the newest
checkpoint. Everything else lives in the library: `dpbert.tasks.finetuning.run(config,
workdir)`, the fine-tuning tasks on the DP loop (`dpbert.runtime.loop`).
"""

from absl import app, flags, logging
from ml_collections import config_flags

from dpbert.runtime import cli

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (configs/finetune_*.py).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, results.")
flags.mark_flags_as_required(["config", "workdir"])

NAME = "finetune"


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    init_from = _CONFIG.value.model.get("init_from_hf") or ""
    problem = (cli.check_output_dir(_WORKDIR.value, "--workdir", sources=[
        (f"config.model.init_from_hf={init_from}", init_from)])
        or cli.check_config_inputs(_CONFIG.value))
    if problem:
        cli.fail(NAME, problem)
    if not flags.FLAGS["verbosity"].present:  # progress lines are printed; INFO would repeat them
        logging.set_verbosity(logging.WARNING)
    # Imported here so that --help is instant and XLA flags set by the caller apply.
    from dpbert.runtime import checkpointing, compile_cache
    from dpbert.tasks import finetuning

    compile_cache.enable(_CONFIG.value)  # config.runtime.compilation_cache_dir
    task = _CONFIG.value.get("task")
    problem = isinstance(task, str) and checkpointing.workdir_task_problem(_WORKDIR.value, task)
    if problem:  # another task's workdir: one line, not a diff of every config field
        cli.fail(NAME, problem)

    try:
        results = finetuning.run(_CONFIG.value, _WORKDIR.value)
    except (FileNotFoundError, ValueError, OSError, FloatingPointError) as e:
        # One clear line for bad input (config, data, checkpoint); nothing written is touched.
        cli.fail(NAME, str(e))
    shown = {k: round(v, 4) for k, v in results.items()
             if k.startswith("eval_") and k[5:] in ("accuracy", "f1", "loss")}
    print(f"{NAME}: wrote {_WORKDIR.value}/results.json: {shown}", flush=True)


if __name__ == "__main__":
    cli.run(main, NAME)
