"""The embedded default: a micro BERT pretrained under DP (BandMF correlated noise from
jax-privacy, SGD with momentum) on synthetic clinical notes.

Runs on a 2-core CPU in under 4 minutes, needs no download (the notes are generated, the DP
WordPiece vocabulary is built from them first), shows MLM accuracy rising, fills a clinical
slot ("atrial [MASK]" -> fibrillation) and prints epsilon.

    python launch/train.py --config=configs/demo_dp.py --workdir=/tmp/dpbert_demo

`configs/demo_dp.py:long`: the same at 2.5x the steps (1,500; sigma calibrated so that the
training spends the same epsilon, 2.95), about 9 minutes on 2 cores (8 min 53 s measured:
held-out 0.556, `fibrillation` 0.87; BENCHMARKS.md, "The demo under DP", fifth round).
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
    # Sequences of 16 pieces (a clause of a note; the privacy unit is one such sequence): twice
    # the sequences per CPU second of 32-piece ones, so twice the steps in the same time, and the
    # slot-filling context of the probe is local (BENCHMARKS.md, fifth round: 32 -> 16 at equal
    # steps and epsilon lifted held-out accuracy and halved the time).
    c.data.max_seq_length = 16
    c.data.masked_lm_prob = 0.3
    c.data.max_predictions_per_seq = 5
    c.data.eval_fraction = 0.02
    # Correlated noise (BandMF, 4 bands; jax-privacy's strategy and amplified accounting): each
    # step's noise partly cancels the previous 3 steps', so the noise of the SUM of the updates,
    # what SGD with momentum integrates, is ~0.6x DP-SGD's at the same epsilon (BENCHMARKS.md
    # "Correlated noise"). With SGD it learned far more than DP-SGD + Adam at equal steps and
    # epsilon (fifth round: held-out 0.46 against 0.34 at sequence 16). Cyclic Poisson sampling:
    # the sequences are split into 4 groups and step t samples group t mod 4.
    c.dp.mechanism = "bandmf"
    c.dp.num_bands = 4
    c.dp.noise_multiplier = None   # calibrated: train.num_steps spend dp.target_epsilon
    c.dp.clip_norm = 1.0
    # The training's budget; with the vocabulary's 1.46 the total is about 4.41 (the issue's
    # ceiling for the demo: 4.46).
    c.dp.target_epsilon = 2.95
    c.dp.delta = 1e-6  # < 1 / N
    # Poisson batches of expected size 512 (N is about 530k sequences) fit 640 slots except with
    # probability < 1e-6 per step (a truncation that the accountant includes anyway), so one
    # jitted call per logical batch, in two microbatches of 320.
    c.dp.overflow_probability = 1e-6
    c.batch.expected_batch_size = 512
    c.batch.physical_batch_size = 640
    c.batch.microbatch_size = 320
    # SGD with momentum 0.9 (optimizer.b1): linear in the gradient, so it keeps BandMF's
    # cancellation (Adam divides each step by its own noise level and undoes it: BandMF + Adam
    # lost to DP-SGD, BENCHMARKS.md "Correlated noise"). Peak rate (fifth round, per unit of
    # clipped mean gradient, 550 steps): 1.3 -> held-out 0.459, 1.6 -> 0.459-0.472, 2.0 ->
    # 0.479, 3.0 diverged by step 50. No weight decay.
    c.optimizer.name = "sgd"
    c.optimizer.learning_rate = 2.0
    c.optimizer.warmup_steps = 10
    c.optimizer.weight_decay = 0.0
    # The masked-LM loss alone (no next-sentence loss, as RoBERTa): under DP every clipped
    # gradient is spent on MLM (held-out 0.175 against 0.154 with NSP, same vocabulary).
    c.train.nsp = False
    c.train.num_steps = 550
    c.train.log_every = 50
    c.train.eval_every = 275
    c.train.eval_batches = 4
    c.train.eval_batch_size = 128
    c.checkpoint.every_steps = 100
    # A sentence of the notes' language whose slot the model trained WITHOUT noise for 1,000
    # steps (sequence 32, Adam) fills (`fibrillation` 0.87; it fills "admitted with [MASK] pain"
    # with `the`): chosen before any DP run was probed with it.
    c.fill_mask = "the patient has a history of atrial [MASK] ."
    if length == "long":
        c.train.num_steps = 1500   # sigma is calibrated: 1,500 steps spend dp.target_epsilon
        c.train.log_every = 100
        c.train.eval_every = 500
        c.checkpoint.every_steps = 100
    return c
