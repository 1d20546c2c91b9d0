"""The fine-tuning recipe: what a field left unset means, with and without DP-SGD.

The fine-tuning configs leave `train.trainable` ("auto"), the batch sizes, the learning rate,
the weight decay and the epochs unset (None); `resolve` fills them from N (the training
examples) and from whether DP-SGD is on. A field the user sets is kept as set.

    without DP   all parameters, B = 32, AdamW lr 5e-5, weight decay 0.01, 2 epochs (BERT's)
    with DP      DP_TRAINABLE (the top encoder layer and the head: its prefix is computed once,
                 dpbert.tasks.prefix_cache), B = min(1024, N / 8) (large batches: the noise
                 σ·C / B per update shrinks with B while ε at a fixed epoch count barely moves,
                 Li et al. 2022, De et al. 2022), SGD with momentum at lr 2.0 on the averaged
                 gradient (DP_OPTIMIZER below says why not Adam; lr 0.5 when the user sets
                 train.trainable=all: DP_LEARNING_RATE_ALL), no weight decay, DP_EPOCHS
                 epochs; σ is calibrated to dp.target_epsilon over
                 the resulting steps (dpbert.dp.plan)

How the DP values were chosen (docs/finetuning.md, "DP fine-tuning"): on the RT, Amazon and
tweets DEV splits, never a test split, at ε = 8 (benchmarks/dp_finetune.py). Choosing
hyper-parameters on private data spends privacy too (Papernot & Steinke 2022): these defaults
were chosen on public benchmark data, so using them costs nothing; a user who tunes them on
their own private data should count that search.
"""

from __future__ import annotations

import copy

AUTO = "auto"
PLAIN = {"trainable": "all", "expected_batch_size": 32, "physical_batch_size": 32,
         "microbatch_size": None, "optimizer": "adamw", "learning_rate": 5e-5,
         "weight_decay": 0.01, "epochs": 2.0}
# A task's own values without DP (config.task -> recipe keys), over PLAIN: NER batches whole
# documents (each many windows), so fewer per batch, more epochs. With DP the task takes the
# DP recipe like any other (one document = one unit).
TASK_PLAIN = {"ner": {"expected_batch_size": 8, "physical_batch_size": 8, "epochs": 4.0}}
DP_TRAINABLE = "top:1"
DP_MAX_BATCH = 1024
# B = N / 8 at most: at least 8 expected batches per epoch, so >= 40 steps in DP_EPOCHS. With
# N / 4 the small sets got 20 steps and SGD had not settled: tweets at ε = 8 ended at 0.694,
# 0.676 and 0.706 over 3 seeds (majority 0.676); with N / 8 (41 steps, same compute) 0.910,
# and with N / 4 over 10 epochs (41 steps, twice the compute) 0.921 and 0.924 (dev split).
DP_BATCH_FRACTION = 8
DP_PHYSICAL_BATCH = 128
DP_MICROBATCH = 32           # the clipper's chunk: 1.3x faster than 128 at once on 2 cores
# SGD with momentum (optimizer.b1 = 0.9), not Adam: Adam divides every coordinate by its own
# noise-dominated second moment, so each of the ~2M noisy coordinates moves by the full step
# every update; on RT at ε = 8 Adam (lr 1e-3 or 1e-4) ended at 0.471, SGD lr 2.0 at 0.779.
DP_OPTIMIZER = "sgd"
DP_LEARNING_RATE = 2.0
# With train.trainable=all (set by the user) the same SGD step at a quarter of the lr: at 2.0
# the noise's random walk (~ lr / (1 - momentum) * sigma C / B * sqrt(steps) per coordinate,
# 0.107 on RT at eps = 8) overwrites MiniLM's pretrained weights (RMS ~0.06): the constant
# prediction at eps = 8 and 3 on an H200 (the same run at sigma = 0.01: 0.805). At eps = 8 on RT
# (one seed each, CPU): lr 0.2 (walk 0.011) 0.736, lr 0.5 (walk 0.027) 0.776
# (benchmarks/noise_walk_probe.py and BENCHMARKS "At accelerator scale").
DP_LEARNING_RATE_ALL = 0.5
DP_EPOCHS = 5.0

# (config section, field, recipe key): what `resolve` fills when it is None ("auto").
FIELDS = (("train", "trainable", "trainable"),
          ("batch", "expected_batch_size", "expected_batch_size"),
          ("batch", "physical_batch_size", "physical_batch_size"),
          ("batch", "microbatch_size", "microbatch_size"),
          ("optimizer", "name", "optimizer"),
          ("optimizer", "learning_rate", "learning_rate"),
          ("optimizer", "weight_decay", "weight_decay"),
          ("train", "epochs", "epochs"))


def values(dp: bool, num_train: int | None, task: str = "", trainable: str = AUTO) -> dict:
    """The recipe's values; num_train None: before the data is read (B then assumes a
    large N; `resolve` runs again with the count); task: config.task (TASK_PLAIN);
    trainable: the user's train.trainable (under DP, "all" has its own learning rate)."""
    if not dp:
        return {**PLAIN, **TASK_PLAIN.get(task, {})}
    n = DP_MAX_BATCH * DP_BATCH_FRACTION if num_train is None else int(num_train)
    batch = max(1, min(DP_MAX_BATCH, n // DP_BATCH_FRACTION))
    return {"trainable": DP_TRAINABLE, "expected_batch_size": batch,
            "physical_batch_size": min(DP_PHYSICAL_BATCH, batch),
            "microbatch_size": (DP_MICROBATCH if min(DP_PHYSICAL_BATCH, batch) % DP_MICROBATCH == 0
                                else None),
            "optimizer": DP_OPTIMIZER,
            "learning_rate": DP_LEARNING_RATE_ALL if trainable == "all" else DP_LEARNING_RATE,
            "weight_decay": 0.0,
            "epochs": DP_EPOCHS}


def trainable(config) -> str:
    """The run's train.trainable, "auto" resolved (for code that sees the config before
    `resolve`, e.g. a task's prepare called on its own)."""
    spec = config.train.trainable
    return values(bool(config.dp.enabled), None)["trainable"] if spec == AUTO else spec


def _unset(section, field) -> bool:
    value = section[field]
    return value is None or (field == "trainable" and value == AUTO)


def resolve(config, num_train: int | None = None):
    """A copy of `config` with every unset recipe field filled (module docstring); its
    `recipe` field says which were filled and from what rule."""
    config = copy.deepcopy(config)
    chosen = values(bool(config.dp.enabled), num_train, config.get("task", ""),
                    config.train.trainable)
    if config.optimizer.get("learning_rate") is not None:
        # A learning rate the user set was meant for the documented optimizer (AdamW); the
        # recipe's SGD step (2.0) comes only with its own learning rate.
        chosen["optimizer"] = PLAIN["optimizer"]
    filled = list(config.get("recipe_filled") or ())
    for section, field, key in FIELDS:
        node = config[section]
        if field in node and _unset(node, field):
            value = chosen[key]
            if field == "microbatch_size" and value and config.batch.physical_batch_size % value:
                value = None   # a physical batch the user set that the chunk does not divide
            node[field] = value
            filled.append(f"{section}.{field}")
    with config.unlocked():
        config.recipe_filled = tuple(filled)   # for results.json (`report`)
    return config


# The train.trainable choices the recipe's DP learning rates were measured with (BENCHMARKS
# "DP fine-tuning"; "all" takes DP_LEARNING_RATE_ALL).
DP_LR_MEASURED = ("top:1", "head", "all")


def caution(config) -> str | None:
    """A warning for a DP run whose optimizer the recipe half-chose; None otherwise.

    1. The recipe filled the learning rate (its SGD lr 2.0) while the user chose a
       train.trainable it was not measured with (DP_LR_MEASURED). At lr 2.0 the noise alone
       moves every trained coordinate by ~lr / (1 - momentum) * sigma C / B * sqrt(steps),
       about 0.1 at eps = 8: the fresh head and top layer of top:1 are relearned, but all
       parameters at that lr collapsed (DP_LEARNING_RATE_ALL says where).
    2. The user set the learning rate but not the optimizer: the lr is taken as meant for
       the documented optimizer, AdamW (`resolve`), which under DP follows the noise
       (DP_OPTIMIZER says why; on RT at eps = 8 it gave the constant prediction)."""
    filled = set(config.get("recipe_filled") or ())
    if not config.dp.enabled:
        return None
    if ("optimizer.name" in filled and "optimizer.learning_rate" not in filled
            and config.optimizer.name != DP_OPTIMIZER):
        return (f"you set optimizer.learning_rate={config.optimizer.learning_rate:g} but not "
                f"optimizer.name, so the run uses {config.optimizer.name} (the optimizer that "
                f"lr is documented for) instead of the DP recipe's {DP_OPTIMIZER} with "
                "momentum; under DP-SGD Adam's per-coordinate scaling follows the noise (on RT "
                "at eps = 8 it gave the constant prediction); set "
                f"--config.optimizer.name={DP_OPTIMIZER} (or name the optimizer you want to "
                "silence this)")
    spec = config.train.trainable
    if ("optimizer.learning_rate" not in filled or "train.trainable" in filled
            or spec in DP_LR_MEASURED):
        return None
    return (f"the recipe's DP learning rate ({config.optimizer.name} lr "
            f"{config.optimizer.learning_rate:g}) was chosen for train.trainable="
            f"{DP_TRAINABLE}, not for train.trainable={spec} (at that lr, all parameters "
            "gave the constant prediction on RT at eps = 8 and 3: the noise overwrote the "
            "pretrained weights)"
            "; set --config.optimizer.name=sgd and a smaller --config.optimizer.learning_rate "
            "(the noise's random walk per coordinate scales with it), or leave "
            "train.trainable unset (docs/finetuning.md, 'DP fine-tuning')")


def report(config) -> dict:
    """results.json's account of the recipe: the fields it filled, and the rule."""
    return {"filled": {k: config[k.split(".")[0]][k.split(".")[1]]
                       for k in config.get("recipe_filled") or ()},
            "rule": ("DP-SGD: train.trainable=%s, B = min(%d, N/%d), %s lr %g (%g with "
                     "train.trainable=all; momentum optimizer.b1), no weight decay, %g epochs, "
                     "sigma calibrated to dp.target_epsilon (dpbert.tasks.recipe)"
                     % (DP_TRAINABLE, DP_MAX_BATCH, DP_BATCH_FRACTION, DP_OPTIMIZER,
                        DP_LEARNING_RATE, DP_LEARNING_RATE_ALL, DP_EPOCHS))
            if config.dp.enabled else
            "without DP: all parameters, B = {expected_batch_size}, lr {learning_rate:g}, weight "
            "decay {weight_decay:g}, {epochs:g} epochs".format(
                **values(False, None, config.get("task", "")))}

