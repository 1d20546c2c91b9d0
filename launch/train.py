r"""Pretrains BERT with DP-SGD.

    python launch/train.py --config=configs/demo_dp.py --workdir=/tmp/demo
    python launch/train.py --config=configs/mimic_dp.py:size=base --workdir=gs://... \
        --config.dp.noise_multiplier=1.2

Rerunning the same command resumes from the newest checkpoint in --workdir. Off Cloud TPU, a
multi-host run passes --coordinator_address, --num_processes and --process_id on every host.
Everything else lives in the library: `dpbert.tasks.pretraining.train_and_evaluate(config,
workdir)`, the pretraining task on the DP loop (`dpbert.runtime.loop`).
"""

from absl import app, flags, logging
from ml_collections import config_flags

from dpbert.runtime import cli

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (configs/*.py[:arg]).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, reports.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "host:port of process 0 (multi-host, off Cloud TPU).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes (hosts).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    init_from = _CONFIG.value.model.get("init_from_hf") or ""
    problem = (cli.check_output_dir(_WORKDIR.value, "--workdir", sources=[
        (f"config.model.init_from_hf={init_from}", init_from)])
        or cli.check_config_inputs(_CONFIG.value))
    if problem:
        cli.fail("train", problem, cli.BAD_INPUT)
    # Imported here so that --help is instant and XLA flags set by the caller apply.
    from dpbert.runtime import checkpointing, compile_cache
    from dpbert.runtime import loop
    from dpbert.runtime import sharding
    from dpbert.tasks import pretraining

    compile_cache.enable(_CONFIG.value)  # config.runtime.compilation_cache_dir
    problem = checkpointing.workdir_task_problem(_WORKDIR.value, pretraining.TASK.name)
    if problem:  # another task's workdir: one line, not a diff of every config field
        cli.fail("train", problem, cli.BAD_INPUT)

    try:
        loop.validate(pretraining.TASK, _CONFIG.value)  # a bad value fails before any log line
        sharding.initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value,
                                        _PROCESS_ID.value)
        logging.info("JAX: %d processes, %d devices (%s)", *_devices())
        pretraining.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
    except PermissionError as e:
        cli.fail("train", f"{e.filename}: permission denied ({e.strerror})", cli.BAD_INPUT)
    except (FileNotFoundError, ValueError, OSError, FloatingPointError) as e:
        # One clear message for bad input; nothing already written is touched.
        cli.fail("train", str(e), cli.BAD_INPUT)


def _devices():
    import jax
    return jax.process_count(), jax.device_count(), jax.default_backend()


if __name__ == "__main__":
    cli.run(main, "train")
