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

The privacy unit is the PATIENT (issue 15; the paper's is one sequence): one SUBJECT_ID with all
the sequences made from their notes, sampled as a whole, at most K = dp.max_examples_per_unit
sequences per logical batch, its mean loss's gradient clipped once to C. Batch sizes count
patients: 2048 expected patients per logical batch (q = 0.044 of MIMIC-III's 46,146 patients),
sigma = 1.5: epsilon = 9.38 at delta = 1e-8 after the 2000 steps (dp_accounting PLD, N = 46,146;
the report gives the exact number for the patients of your training split). The vocabulary built
here is per patient too (a patient's notes share one bound of vocab.max_words_per_example words),
so the total needs no group-privacy lifting. `--config.dp.privacy_unit=example` gives the
paper's per-sequence unit (then set the batch sizes in sequences again, e.g. 131072 / 4096 / 1024).
"""

from configs import common


def get_config(arg: str | None = None):
    args = common.parse_arg(arg, {"size": common.MODEL_SIZES}, config="configs/mimic_dp.py",
                            positional="size")
    c = common.get_config()
    # Stage 2's export (a HF folder with the MIMIC DP vocab); "" trains model.size from scratch
    # with vocab.file.
    c.model.init_from_hf = ""
    # Stage 2 pretrained on public text (Wikipedia + books), not on the notes: nothing of its
    # training enters this run's total (its DP vocabulary still does, by its own report). Set
    # "same" when starting from a model trained on these notes.
    c.model.init_data = "public"
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
    # One patient (SUBJECT_ID) with every sequence made from their notes (see the docstring).
    c.dp.privacy_unit = "patient"
    # K = 8 sequences per sampled patient and logical batch (a fresh random 8 each time the
    # patient is sampled). The noise is set by the number of PATIENTS per batch (each adds at
    # most C), so compute is better spent on more patients than on more sequences of each: K
    # is kept small. On the NOTEEVENTS sample (radiology reports, 128 tokens) a training patient
    # has a median of 12 sequences: K = 8 fills 90 % of the [patients, K] slots, K = 16 only 71 %
    # (padding slots cost compute like real ones), K = 4 drops to a third of a median patient.
    # Patients with long notes (discharge summaries) have far more sequences; K bounds the work
    # per patient per step whatever they have.
    c.dp.max_examples_per_unit = 8
    c.dp.unit_loss = "mean"
    c.dp.noise_multiplier = 1.5
    c.dp.clip_norm = 0.01
    c.dp.delta = 1e-8
    c.dp.target_epsilon = None
    c.dp.accountant = "pld"
    c.dp.sampling = "poisson"
    # Expected PATIENTS per logical batch (up to 16k sequences with K = 8).
    c.batch.expected_batch_size = 2048
    # Patients per jitted call over all devices (512 x K = 4096 sequence slots, the paper
    # setup's per-call size); a logical batch spans ceil(capacity / this) calls.
    c.batch.physical_batch_size = 512
    # Patients whose gradients are formed at once (128 x K = 1024 sequences).
    c.batch.microbatch_size = 128
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
