"""The embedded default: a micro BERT pretrained with DP-SGD on synthetic clinical notes.

Runs on a 2-core CPU in a few minutes, needs no download (the notes are generated, the DP
WordPiece vocabulary is built from them first), shows MLM accuracy rising, and prints epsilon.

    python launch/train.py --config=configs/demo_dp.py --workdir=/tmp/dpbert_demo

`configs/demo_dp.py:long`: the same at 4x the steps (1,000; sigma calibrated so that the
training spends the same epsilon, 2.95), about 10 minutes on 2 cores (9 min 31 s measured): the compute at which the
model starts to fill clinical slots (BENCHMARKS.md, "The demo under DP", fourth round).
"""

from configs import common


def get_config(arg: str | None = None):
    length = common.parse_arg(arg, {"length": ("long",)}, config="configs/demo_dp.py",
                              positional="length").get("length")
    c = common.get_config()
    # micro: 2 layers of width 64 (about 250k parameters): a third of tiny's time per sequence,
    # and under DP a smaller model is a stronger signal per coordinate at the same noise (the
    # noise's norm grows with the square root of the parameter count; BENCHMARKS.md "The demo
    # under DP"): 250 steps of 512 sequences learn more than 100 of 256 with tiny.
    c.model.size = "micro"
    c.model.max_position_embeddings = 128
    # No dropout: the DP noise regularizes, and 250 steps have no signal to spare.
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
    # The training's budget: 250 steps of 512 at sigma 0.55 spend about 2.89 of it; with the
    # vocabulary's 1.46 the total is about 4.35. At q = 0.0014 the privacy loss hardly grows
    # with the step count (100 steps: 2.5) and steeply below sigma 0.55.
    c.dp.target_epsilon = 2.95
    c.dp.delta = 1e-6  # < 1 / N
    # Poisson batches of expected size 512 (N is about 375k sequences) fit 640 slots except with
    # probability < 1e-6 per step (a truncation that the accountant includes anyway), so one
    # jitted call per logical batch, in two microbatches of 320.
    c.dp.overflow_probability = 1e-6
    c.batch.expected_batch_size = 512
    c.batch.physical_batch_size = 640
    c.batch.microbatch_size = 320
    # Adam's second moment is the noise's variance here, so Adam acts as momentum SGD with a
    # step of lr * B / (sigma * C) per unit of gradient: a high peak rate (5e-3: 0.110 held-out,
    # 1e-2: 0.138 at 200 steps; BENCHMARKS.md).
    c.optimizer.learning_rate = 1.4e-2
    c.optimizer.warmup_steps = 10
    c.optimizer.weight_decay = 0.01
    # The masked-LM loss alone (no next-sentence loss, as RoBERTa): under DP every clipped
    # gradient is spent on MLM (held-out 0.175 against 0.154 with NSP, same vocabulary).
    c.train.nsp = False
    c.train.num_steps = 250
    c.train.log_every = 25
    c.train.eval_every = 125
    c.train.eval_batches = 4
    c.train.eval_batch_size = 128
    c.checkpoint.every_steps = 50
    # A sentence of the notes' language whose slot the same model trained WITHOUT noise for 1,000
    # steps fills (`fibrillation` 0.87; it fills "admitted with [MASK] pain" with `the`).
    c.fill_mask = "the patient has a history of atrial [MASK] ."
    if length == "long":
        c.train.num_steps = 1000
        c.dp.noise_multiplier = None   # calibrated: 1,000 steps spend dp.target_epsilon
        c.train.eval_every = 250
        c.checkpoint.every_steps = 100
    return c
