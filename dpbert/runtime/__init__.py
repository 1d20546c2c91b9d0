"""The one training loop and what it runs on.

    loop.py          run(task, config, workdir): the Task protocol, TaskData, the jitted step
    evaluation.py    held-out evaluation (Evaluator) and the closing summary line
    saved_run.py     checkpoints + privacy_report.json (Saver), reading a saved step back
    guards.py        one process per workdir (Lock), a checkpoint on SIGTERM / Ctrl-C (Stop)
    hosts.py         the primary process, waiting for it, progress lines
    checkpointing, sharding, metrics, optimizers, config_checks, cli (the launchers' console)
"""
