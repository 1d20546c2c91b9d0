"""The embedded default: a tiny BERT pretrained with DP-SGD on synthetic clinical notes.

Runs on a 2-core CPU in a few minutes, needs no download (the notes are generated, the DP
WordPiece vocabulary is built from them first), shows MLM accuracy rising, and prints epsilon.

    python launch/train.py --config=configs/demo_dp.py --workdir=/tmp/dpbert_demo
"""

from configs import common


def get_config(arg: str | None = None):
    common.parse_arg(arg, {}, config="configs/demo_dp.py")  # takes none: an arg is an error
    c = common.get_config()
    c.model.size = "tiny"
    c.model.max_position_embeddings = 128
    c.vocab.size = 2048
    # The vocabulary's cost enters the run's total: it is DP per note, and removing one training
    # sequence modifies the up to 2 notes it reads from, so it counts as 2 replaced records
    # (about 3x this epsilon: dpbert.reporting.report.vocab_relation); it is kept small.
    c.vocab.epsilon = 2.0
    c.vocab.delta = 1e-6
    c.data.corpus = "synthetic"
    c.data.synthetic_num_notes = 3000
    c.data.max_seq_length = 64
    c.data.max_predictions_per_seq = 10
    c.data.eval_fraction = 0.02
    c.dp.noise_multiplier = 1.0
    c.dp.clip_norm = 1.0
    c.dp.target_epsilon = 1.0
    c.dp.delta = 1e-5
    # Poisson batches of expected size 128 (N is about 24k sequences) fit 192 slots except with
    # probability < 1e-6 per step (a truncation that the accountant includes anyway), so one
    # jitted call per logical batch.
    c.dp.overflow_probability = 1e-6
    c.batch.expected_batch_size = 128
    c.batch.physical_batch_size = 192
    c.batch.microbatch_size = 96
    c.optimizer.learning_rate = 2e-3
    c.optimizer.warmup_steps = 20
    c.optimizer.weight_decay = 0.01
    c.train.num_steps = 200
    c.train.log_every = 25
    c.train.eval_every = 100
    c.train.eval_batches = 4
    c.train.eval_batch_size = 128
    c.checkpoint.every_steps = 100
    return c
