"""BERT-base continued pretraining on MIMIC-III clinical notes with DP-SGD (Hoory et al. 2021).

The paper's pipeline, as dpbert stages:
  1. DP WordPiece vocabulary from MIMIC-III:  launch/build_vocab.py --format=noteevents ...
  2. public pretraining from scratch on Wikipedia + BookCorpus with that vocabulary:
     launch/train.py --config=configs/wiki_books.py --config.vocab.file=VOCAB/vocab.txt
  3. this config: continue on MIMIC-III NOTEEVENTS with DP-SGD, starting from stage 2's export
     (WORKDIR_2/hf, which carries the same vocab.txt).

    python launch/train.py --config=configs/mimic_dp.py --workdir=W \\
        --config.data.paths=/data/NOTEEVENTS.csv.gz --config.model.init_from_hf=W2/hf \\
        --config.dp.noise_multiplier=1.0

`--config=configs/mimic_dp.py:size=tiny` keeps everything but the model size (smoke tests).
Paper settings: delta = 1e-8, clip C = 0.01, a logical batch of 128k examples spread over many
jitted calls ("batch spread in time", T = 32 on their TPUs), Adam with weight decay, sigma the
sweep knob (kept proportional to sqrt(B) when the batch changes:
dpbert.dp.scale_noise_multiplier_sqrt / recalibrate_for_batch_size).
"""

from configs import common


def get_config(arg: str | None = None):
    args = common.parse_arg(arg, {"size": common.MODEL_SIZES}, config="configs/mimic_dp.py",
                            positional="size")
    c = common.get_config()
    # Stage 2's export (a HF folder with the MIMIC DP vocab); "" trains model.size from scratch
    # with vocab.file.
    c.model.init_from_hf = ""
    c.model.size = args.get("size", "base")
    c.model.max_position_embeddings = 512
    # The DP vocabulary of stage 1 (ignored when init_from_hf brings its own vocab.txt).
    c.vocab.file = ""
    # MIMIC-III NOTEEVENTS.csv.gz (credentialed PhysioNet data; give its path).
    c.data.corpus = "noteevents"
    c.data.paths = ()
    c.data.max_seq_length = 128
    c.data.max_predictions_per_seq = 20
    c.data.dupe_factor = 1
    c.data.eval_fraction = 0.005
    c.data.eval_split_unit = "subject"  # hold out whole patients
    c.dp.enabled = True
    c.dp.noise_multiplier = 1.0
    c.dp.clip_norm = 0.01
    c.dp.delta = 1e-8
    c.dp.target_epsilon = None
    c.dp.accountant = "pld"
    c.dp.sampling = "poisson"
    c.batch.expected_batch_size = 131_072
    # Per jitted call over all devices; a logical batch spans ceil(capacity / this) calls.
    c.batch.physical_batch_size = 4096
    c.batch.microbatch_size = 1024
    c.optimizer.name = "adamw"
    c.optimizer.learning_rate = 1e-4
    c.optimizer.warmup_steps = 100
    c.optimizer.weight_decay = 0.01
    c.train.num_steps = 2000
    # Exact training metrics of private batches are not covered by epsilon (see the report's
    # not_covered note): log them every 50 steps, not every step.
    c.train.log_every = 50
    c.train.eval_every = 100
    c.checkpoint.every_steps = 10
    return c
