"""Shared defaults of every dpbert experiment config (each field commented).

Experiment files (`configs/demo_dp.py`, `configs/mimic_dp.py`, ...) start from `get_config()` here
and override what differs. Any field can be overridden on the command line:

    python launch/train.py --config=configs/demo_dp.py --config.dp.noise_multiplier=1.5
"""

import ml_collections
from ml_collections import config_dict

from data_pipelines import pretraining


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    # Seed of model initialisation and of every random choice of the run (sampling, masking,
    # dropout, noise) that is not seeded separately below.
    c.seed = 0

    # ---------------------------------------------------------------------------------- model
    c.model = ml_collections.ConfigDict()
    # BERT size preset: tiny (2 layers, 128 hidden), mini (4/256), small, medium, base (12/768),
    # large (24/1024). Ignored when init_from_hf is set (the checkpoint's config.json decides).
    c.model.size = "tiny"
    # Compute dtype: "float32" or "bfloat16" (parameters, gradients and noise stay float32).
    c.model.dtype = "float32"
    # Dropout on hidden states and on attention probabilities (BERT: 0.1).
    c.model.hidden_dropout_prob = 0.1
    c.model.attention_probs_dropout_prob = 0.1
    # Longest sequence the position table supports (>= data.max_seq_length).
    c.model.max_position_embeddings = 512
    # Start from a Hugging Face BERT folder ("" = random initialisation). Its vocab.txt is used
    # unless vocab.file says otherwise (the sizes must then agree).
    c.model.init_from_hf = ""

    # ---------------------------------------------------------------------------------- vocab
    c.vocab = ml_collections.ConfigDict()
    # A BERT vocab.txt. "" = build one from the training corpus before training (into
    # WORKDIR/vocab, reused on resume) with the DP WordPiece builder below, or take the one in
    # model.init_from_hf.
    c.vocab.file = ""
    # Size of a vocabulary built here.
    c.vocab.size = 8000
    # Build it with differential privacy (Laplace noise + threshold on word counts, per
    # document/note); False counts words exactly (only for public corpora).
    c.vocab.dp = True
    # (epsilon, delta) of the vocabulary, per document/note, separate from the training's.
    c.vocab.epsilon = 8.0
    c.vocab.delta = 1e-6
    # K: at most this many distinct words counted per document/note.
    c.vocab.max_words_per_example = 64
    # Seed of the vocabulary noise (None = OS entropy, what a real release should use).
    c.vocab.seed = config_dict.placeholder(int)

    # ----------------------------------------------------------------------------------- data
    # Corpus, example creation (BERT's create_pretraining_data) and masking; see
    # data_pipelines.pretraining.default_data_config for every field.
    c.data = pretraining.default_data_config()

    # ------------------------------------------------------------------- privacy-adaptive (dχ)
    # MLM target (dpbert.losses registry): "vanilla" (predict the privatized token, Qu et al.
    # Eq. 5), "prob" (soft target over dchi.prob_samples privatized draws, Eq. 6) or
    # "denoising" (predict the original token, Eq. 7). Without dχ all three are plain BERT MLM.
    c.mlm_target = "vanilla"
    c.dchi = ml_collections.ConfigDict()
    # dχ privatization of every input token on the fly, on the training devices: "none",
    # "text_to_text" (nearest vocabulary token to the noisy embedding) or "token_rep" (the noisy
    # embedding itself). Any mechanism but "none" freezes the word embedding (it is the
    # user-side φ).
    c.dchi.mechanism = "none"
    # η: larger = less noise (noise norm ~ Gamma(n, 1/η), mean n/η for embedding width n).
    c.dchi.eta = 100.0
    # K privatized draws per masked position for the "prob" target (paper: 10).
    c.dchi.prob_samples = 10
    # Vocabulary rows per nearest-neighbour matmul chunk (memory knob).
    c.dchi.chunk_size = 4096

    # ------------------------------------------------------------------------------------- dp
    c.dp = ml_collections.ConfigDict()
    # DP-SGD on (per-example clipping + Gaussian noise + accounting) or off (public data).
    c.dp.enabled = True
    # sigma: noise std per logical batch is sigma * clip_norm. None = calibrate sigma so that
    # train.num_steps steps spend exactly dp.target_epsilon.
    c.dp.noise_multiplier = config_dict.placeholder(float)
    # C: per-example gradient L2 norm bound (over all trainable parameters).
    c.dp.clip_norm = 1.0
    # How the clipped sum of per-example gradients is computed (the same sum either way, up to
    # float rounding): "mixed_ghost" takes the norms from per-example factors for the dense
    # kernels (layer inputs and output gradients), the tied word embedding and the position
    # table, and the clipped sum from one weighted pass over the same factors (dpbert.dp.
    # mixed_ghost); "ghost_embedding" does that for the tied word embedding only
    # (dpbert.dp.ghost) and materialises the other per-example gradients; "vmap" materialises
    # every per-example gradient (jax.vmap(jax.grad)): slowest, most memory, the reference.
    c.dp.clipping = "ghost_embedding"
    # Stop at the last step whose epsilon is <= this (None = no budget; train.num_steps decides).
    c.dp.target_epsilon = config_dict.placeholder(float)
    # delta of the (epsilon, delta) guarantee; must be < 1 / number of training examples.
    c.dp.delta = 1e-6
    # Privacy accountant of dp_accounting: "pld" (tight, default) or "rdp".
    c.dp.accountant = "pld"
    # "poisson" (each example in each logical batch independently with q = B / N; the proven
    # bound) or "shuffle" (fixed batches of a shuffled epoch; its epsilon is NOT a proven bound).
    c.dp.sampling = "poisson"
    # "global": the noise has std sigma*C in total however many devices share the batch.
    # "per_shard": every batch shard adds sigma*C (TF CrossShardOptimizer); the accountant then
    # uses sigma*sqrt(P) (Hoory et al. Eq. 3).
    c.dp.noise_mode = "global"
    # What one neighbouring record is: "example" (one [CLS] A [SEP] B [SEP] sequence).
    c.dp.privacy_unit = "example"
    # Poisson batches are laid out in a fixed capacity (so shapes never change); it is chosen so
    # that a batch overflows (and is truncated, which the accountant accounts for) with at
    # most this probability per step.
    c.dp.overflow_probability = 1e-9

    # ---------------------------------------------------------------------------------- batch
    c.batch = ml_collections.ConfigDict()
    # B: expected examples per logical batch (one noise draw, one optimizer update).
    c.batch.expected_batch_size = 256
    # Examples per jitted call, over all devices; a logical batch spans as many calls as its
    # capacity needs ("batch spread in time", Hoory et al.). Must divide by the device count.
    c.batch.physical_batch_size = 256
    # Examples whose per-example gradients are materialised at once, over all devices (memory
    # knob; None = the whole physical batch). Must divide physical_batch_size.
    c.batch.microbatch_size = config_dict.placeholder(int)

    # ------------------------------------------------------------------------------ optimizer
    c.optimizer = ml_collections.ConfigDict()
    # "adamw" (BERT's Adam with decoupled weight decay), "lamb" (very large batches) or "sgd".
    c.optimizer.name = "adamw"
    # Peak learning rate, reached after warmup_steps, then linear decay to 0 at train.num_steps.
    c.optimizer.learning_rate = 1e-4
    c.optimizer.warmup_steps = 100
    # Decoupled weight decay (not on LayerNorm parameters or biases).
    c.optimizer.weight_decay = 0.01
    # Adam moments and epsilon (BERT: 0.9, 0.999, 1e-6).
    c.optimizer.b1 = 0.9
    c.optimizer.b2 = 0.999
    c.optimizer.eps = 1e-6

    # ---------------------------------------------------------------------------------- train
    c.train = ml_collections.ConfigDict()
    # Logical steps (optimizer updates) to train for.
    c.train.num_steps = 1000
    # Console line + TensorBoard scalars every this many steps.
    c.train.log_every = 10
    # Evaluate on the held-out split every this many steps (0 = only at the end).
    c.train.eval_every = 200
    # Held-out batches per evaluation (0 = the whole held-out split) and their size.
    c.train.eval_batches = 8
    c.train.eval_batch_size = 64
    # Export WORKDIR/hf (Hugging Face format, privacy model card) at the end.
    c.train.export_hf = True

    # ----------------------------------------------------------------------------- checkpoint
    c.checkpoint = ml_collections.ConfigDict()
    # Save every this many steps (and at the end, and on SIGTERM); 0 = only at the end.
    c.checkpoint.every_steps = 100
    # Keep the newest this many checkpoints.
    c.checkpoint.max_to_keep = 3
    # Write checkpoints in the background while training continues.
    c.checkpoint.async_save = True

    # ----------------------------------------------------------------------------------- mesh
    c.mesh = ml_collections.ConfigDict()
    # Device mesh ("data", "fsdp"): the batch is split over both axes, parameters and optimizer
    # state over "fsdp". -1 = the devices that remain.
    c.mesh.data = -1
    c.mesh.fsdp = 1
    return c
