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
    # No dropout: the DP noise regularizes, and 100 steps have no signal to spare.
    c.model.hidden_dropout_prob = 0.0
    c.model.attention_probs_dropout_prob = 0.0
    c.vocab.size = 2048
    # The vocabulary is DP per note; removing one training sequence modifies the up to 2 notes
    # it reads from, so it counts as 2 replaced records (about 3x this epsilon in the run's
    # total: dpbert.reporting.report.vocab_relation). 40,000 notes let epsilon 0.5 keep about
    # 440 words (a word survives if about 1,250 notes use it).
    c.vocab.epsilon = 0.5
    c.vocab.delta = 2e-7  # the total delta (vocabulary about 3x this + training) < 1 / N
    c.data.corpus = "synthetic"
    c.data.synthetic_num_notes = 40000
    c.data.max_seq_length = 32
    c.data.masked_lm_prob = 0.3
    c.data.max_predictions_per_seq = 10
    c.data.eval_fraction = 0.02
    c.dp.noise_multiplier = 0.55
    c.dp.clip_norm = 1.0
    # The training's budget: 100 steps at sigma 0.55 spend about 1.7 of it (0.5 would spend
    # 2.0 in 23 steps: at q = 0.0007 the privacy loss grows steeply below sigma 0.55).
    c.dp.target_epsilon = 2.0
    c.dp.delta = 1e-6  # < 1 / N
    # Poisson batches of expected size 256 (N is about 363k sequences) fit 320 slots except with
    # probability < 1e-6 per step (a truncation that the accountant includes anyway), so one
    # jitted call per logical batch.
    c.dp.overflow_probability = 1e-6
    c.batch.expected_batch_size = 256
    c.batch.physical_batch_size = 320
    c.batch.microbatch_size = 160
    c.optimizer.learning_rate = 5e-3
    c.optimizer.warmup_steps = 10
    c.optimizer.weight_decay = 0.01
    c.train.num_steps = 100
    c.train.log_every = 20
    c.train.eval_every = 50
    c.train.eval_batches = 4
    c.train.eval_batch_size = 128
    c.checkpoint.every_steps = 50
    c.fill_mask = "the patient was admitted with [MASK] pain ."
    return c
