"""Shared defaults of every dpbert experiment config (each field commented).

Experiment files (`configs/demo_dp.py`, `configs/mimic_dp.py`, ...) start from `get_config()` here
and override what differs. Any field can be overridden on the command line:

    python launch/train.py --config=configs/demo_dp.py --config.dp.noise_multiplier=1.5
"""

import difflib
from typing import Collection, Mapping

import ml_collections
from ml_collections import config_dict


# dpbert.models.bert.PRESETS's names (kept here so that loading a config does not import JAX;
# tests/configs checks that they agree).
MODEL_SIZES = ("micro", "tiny", "mini", "small", "medium", "base", "large")


def parse_arg(arg: str | None, allowed: Mapping[str, Collection[str] | None], *,
              config: str, positional: str | None = None) -> dict[str, str]:
    """Parses the `ARG` of `--config=configs/x.py:ARG`: `key=value[,key=value...]`.

    The one idiom of every config file. `allowed` maps each accepted key to its accepted
    values (None: any non-empty string); a config that takes no arg passes `{}`, so that an
    arg it would ignore is an error. `positional` names the key that a bare first value
    stands for (`:tiny` = `:size=tiny`). Every problem is a ValueError naming the config, the
    arg and what is accepted (launchers print it on one line).

    Returns:
      {key: value} for the keys given (defaults are the config's business).
    """
    if not allowed and arg:
        raise ValueError(f"{config} takes no config arg; got {arg!r} (remove ':{arg}')")
    out: dict[str, str] = {}
    for i, part in enumerate(p.strip() for p in (arg or "").split(",")):
        if not part:
            continue
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep:
            if i == 0 and positional:
                key, value = positional, part
            else:
                raise ValueError(f"{config}: config arg {part!r} is not key=value "
                                 f"(accepted: {_accepted(allowed)})")
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"{config}: unknown config arg {key!r}{hint} "
                             f"(accepted: {_accepted(allowed)})")
        if key in out:
            raise ValueError(f"{config}: config arg {key!r} given twice in {arg!r}")
        choices = allowed[key]
        if not value or (choices is not None and value not in choices):
            raise ValueError(f"{config}: config arg {key}={value!r} must be one of "
                             f"{', '.join(choices) if choices else 'a non-empty value'}")
        out[key] = value
    return out


def _accepted(allowed: Mapping[str, Collection[str] | None]) -> str:
    return ", ".join(f"{k}={'|'.join(v) if v else '...'}" for k, v in allowed.items())


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    # Seed of model initialisation, masking and dropout (public). The DP noise and the Poisson
    # sampling are NOT derived from it: they come from OS entropy (see dp.insecure_seeded_noise).
    c.seed = 0

    # ---------------------------------------------------------------------------------- model
    c.model = ml_collections.ConfigDict()
    # BERT size preset: micro (2 layers, 64 hidden), tiny (2/128), mini (4/256), small, medium,
    # base (12/768), large (24/1024). Ignored when init_from_hf is set (the checkpoint's config.json decides).
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
    # What the starting model (init_from_hf) was trained on, relative to this run's data, when
    # it is a dpbert export with a privacy report (dpbert.reporting.lineage): "same" (may overlap: its
    # DP-SGD is composed into this run's epsilon, its vocabularies counted once; trained without
    # DP, it voids this run's claim), "disjoint" (none of this run's records: its guarantee is
    # listed apart) or "public" (public data). A model without a dpbert report counts as public.
    c.model.init_data = "same"

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
    # Public bound on how many vocabulary records (documents) one training unit spans, needed
    # only for a vocabulary DP per document with training per patient (a note is one record:
    # repeated ROW_IDs are refused or merged, data.duplicate_ids): the vocabulary then counts
    # this many times (group privacy). None = 1. A corpus
    # that exceeds it is refused before training. A vocabulary built per patient needs none.
    c.vocab.max_records_per_unit = config_dict.placeholder(int)
    # Seed of the vocabulary noise: None = OS entropy (a release); an int makes the build
    # reproducible and NOT private (the run's report and model card then say so).
    c.vocab.seed = config_dict.placeholder(int)

    # ----------------------------------------------------------------------------------- data
    # Corpus, example creation (BERT's create_pretraining_data) and masking: `data_config` below.
    c.data = data_config()

    # ------------------------------------------------------------------- privacy-adaptive (dχ)
    # MLM target (dpbert.models.losses registry): "vanilla" (predict the privatized token, Qu et al.
    # Eq. 5), "prob" (soft target over dchi.prob_samples privatized draws, Eq. 6) or
    # "denoising" (predict the original token, Eq. 7). Without dχ all three are plain BERT MLM.
    c.mlm_target = "vanilla"
    # A public sentence with one [MASK]: the end of the run prints the exported model's top 5
    # fill-ins for it (post-processing: no privacy cost). "" = none.
    c.fill_mask = ""
    # dχ's η and its search knob: `dchi_section` (shared with fine-tuning's `privacy`).
    c.dchi = dchi_section(eta=100.0)
    # dχ privatization of every input token on the fly, on the training devices: "none",
    # "text_to_text" (nearest vocabulary token to the noisy embedding) or "token_rep" (the noisy
    # embedding itself). Any mechanism but "none" freezes the word embedding (it is the
    # user-side φ).
    c.dchi.mechanism = "none"
    # K privatized draws per masked position for the "prob" target (paper: 10).
    c.dchi.prob_samples = 10

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
    # "auto" = the task's fastest: for pretraining mixed_ghost with privacy_unit "example",
    # ghost_embedding per note / patient (mixed_ghost clips one sequence); the run's
    # config.json names the clipper used.
    c.dp.clipping = "auto"
    # The TRAINING's epsilon budget: stop at the last step whose training epsilon (DP-SGD,
    # composed with a starting model's on the same data) is <= this (None = no budget;
    # train.num_steps decides). The run's total adds the vocabulary's cost (dp.total_epsilon).
    c.dp.target_epsilon = config_dict.placeholder(float)
    # A budget for EVERYTHING that reads the private corpus: the run's total epsilon (the
    # report's headline: the DP vocabulary under the training's unit + training + a starting
    # model's other vocabularies) stays <= this. Rule: the vocabulary spends what vocab.epsilon
    # costs under the training's neighbouring relation (computed from its mechanism as the
    # report does); the training gets the rest as its target epsilon (sigma calibrated to it
    # when dp.noise_multiplier is None, else the steps are capped). Refused when the vocabulary
    # alone spends it; with dp.target_epsilon also set, that is the training's part and the sum
    # must fit. None = no total budget.
    c.dp.total_epsilon = config_dict.placeholder(float)
    # delta of the (epsilon, delta) guarantee; must be < 1 / N (N = training examples, or units
    # with privacy_unit note / patient).
    c.dp.delta = 1e-6
    # Privacy accountant of dp_accounting: "pld" (tight, default) or "rdp".
    c.dp.accountant = "pld"
    # "dpsgd": i.i.d. Gaussian noise at every step. "bandmf": banded matrix factorization
    # (dpbert.dp.bandmf, jax-privacy's BandMF): the noise is correlated across dp.num_bands
    # steps by a strategy optimized for train.num_steps, and units are sampled by cyclic Poisson
    # sampling (dp.num_bands groups of N // num_bands units, one group per step, so a unit takes
    # part at most once in any num_bands consecutive steps); epsilon is jax-privacy's BandMF
    # event. Its sigma for a target epsilon is usually LARGER than DP-SGD's (each step samples
    # from 1/num_bands of the units: demo, epsilon 1 in 200 steps: 1.08 against 0.81), but the
    # noise of successive steps partly cancels in the parameters, so it needs an optimizer
    # linear in the gradient (optimizer.name="sgd" with momentum: on the demo at 500 steps
    # held-out MLM 0.29 against DP-SGD's 0.21; with Adam, which divides each step by its own
    # noise, 0.13 against 0.22: BENCHMARKS.md "Correlated noise"; the loop warns). Fixed for a
    # run (a resume under another mechanism is refused).
    c.dp.mechanism = "dpsgd"
    # BandMF's bands b (dp.mechanism="bandmf" only): 1 is DP-SGD; more bands correlate the noise
    # over more steps but give each step 1/b of the units to sample from (a group must hold at
    # least batch.expected_batch_size of them).
    c.dp.num_bands = 4
    # "poisson" (each example in each logical batch independently with q = B / N; the proven
    # bound) or "shuffle" (fixed batches of a shuffled epoch; its epsilon is NOT a proven bound).
    c.dp.sampling = "poisson"
    # "global": the noise has std sigma*C in total however many devices share the batch.
    # "per_shard": every batch shard adds sigma*C (TF CrossShardOptimizer); the accountant then
    # uses sigma*sqrt(P) (Hoory et al. Eq. 3).
    c.dp.noise_mode = "global"
    # What one neighbouring record is (the unit the guarantee protects): "example" (one
    # [CLS] A [SEP] B [SEP] sequence), "note" (one note / document with every sequence made
    # from it) or "patient" (one SUBJECT_ID with every sequence made from their notes; a
    # document in plain-text corpora, which have no SUBJECT_IDs). For note / patient, 'random
    # next' segments stay inside the unit, Poisson sampling draws units, each unit's gradient
    # is clipped once to clip_norm, the accountant's N is the number of units, and the batch
    # sizes below count UNITS (dpbert.dp.units).
    c.dp.privacy_unit = "example"
    # K (note / patient only): a sampled unit contributes at most this many sequences to a
    # logical batch (all of them if it has fewer; else K chosen uniformly at random with the
    # run's secret sampler randomness). A physical batch holds [units, K] sequence slots, so
    # memory and compute grow with K; padding slots cost compute too.
    c.dp.max_examples_per_unit = 8
    # Note / patient only: a unit's loss is the "mean" (default: a unit weighs like one example
    # and C tuned per example still fits) or the "sum" of its sequences' losses (more weight
    # to units with more sequences, until clipping). BENCHMARKS.md compares them.
    c.dp.unit_loss = "mean"
    # False (always, for a release): the noise key and the sampler's seed are drawn from OS
    # entropy at the start of the run and kept only in its checkpoints. True derives them from
    # `seed`: runs become reproducible and are NOT private (anyone who knows the seed can remove
    # the noise); every report and model card of such a run says so. Tests and debugging only.
    c.dp.insecure_seeded_noise = False
    # Poisson batches are laid out in a fixed capacity (so shapes never change); it is chosen so
    # that a batch overflows (and is truncated, which the accountant accounts for) with at
    # most this probability per step.
    c.dp.overflow_probability = 1e-9

    # ---------------------------------------------------------------------------------- batch
    c.batch = ml_collections.ConfigDict()
    # B: expected examples per logical batch (one noise draw, one optimizer update); expected
    # UNITS with dp.privacy_unit note / patient (the batch sizes below count units too).
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
    # What trains (dpbert.models.trainable): all | head | top:K (the last K encoder layers and
    # the head) | bitfit (biases and the head). DP-SGD clips, noises and accounts exactly
    # these; the rest is frozen and holds no optimizer state.
    c.train.trainable = "all"
    # Pretraining: the next-sentence-prediction loss beside the MLM loss (BERT). False trains
    # the MLM loss alone (as RoBERTa): the NSP head and the pooler are frozen (no gradient, no
    # noise, not in d), and under DP the clipped gradient is all MLM (the demo: held-out MLM
    # accuracy 0.175 against 0.154 with NSP, same vocabulary; BENCHMARKS.md "The demo under DP").
    c.train.nsp = True
    # Fine-tuning with head / top:K on a fixed release: compute the frozen prefix (embeddings
    # and the layers below the trained ones, dropout off) once per split and train only the
    # top (dpbert.tasks.prefix_cache). Its outputs are private like checkpoints.
    c.train.prefix_cache = True
    # Where the prefix outputs are kept ("" = WORKDIR/prefix_cache).
    c.train.prefix_cache_dir = ""

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

    # -------------------------------------------------------------------------------- runtime
    c.runtime = ml_collections.ConfigDict()
    # JAX's persistent compilation cache (dpbert.runtime.compile_cache): a resumed or swept
    # run loads its compiled steps instead of compiling them again. "auto" =
    # $DPBERT_COMPILATION_CACHE_DIR if set, else $XDG_CACHE_HOME/dpbert/jax or
    # ~/.cache/dpbert/jax; "" = off; else the folder.
    c.runtime.compilation_cache_dir = "auto"
    return c


def dchi_section(*, eta: float) -> ml_collections.ConfigDict:
    """dχ's fields that pretraining (`dchi`: privatization inside the train step) and
    fine-tuning (`privacy`: the users' release before training) share; each stage adds the
    field that turns it on (`dchi.mechanism`, `privacy.mode`) and its own knobs. η is checked
    once for both (`dpbert.runtime.config_checks`) when that field is not "none"."""
    c = ml_collections.ConfigDict()
    # η of dχ-privacy: larger = less noise (noise norm ~ Gamma(n, 1/η), mean n/η for embedding
    # width n); a finite number >= 1e-6. Ignored when the mechanism / mode is "none".
    c.eta = eta
    # Vocabulary rows per step of the exact nearest-token search (text_to_text; memory knob).
    c.chunk_size = 4096
    return c


def data_config() -> ml_collections.ConfigDict:
    """The ``data`` section: corpus, example creation (BERT's create_pretraining_data) and
    masking, read by ``data_pipelines.pretraining.build_datasets``."""
    c = ml_collections.ConfigDict()
    # Which corpus: "text" (BERT text files), "noteevents" (MIMIC-III NOTEEVENTS.csv(.gz)),
    # "synthetic" (generated clinical notes, no files needed) or "tfds" (prepared TFDS datasets).
    c.corpus = "synthetic"
    # Input files. text: one or more files, one sentence per line, blank line between documents
    # (.gz allowed). noteevents: one NOTEEVENTS.csv or NOTEEVENTS.csv.gz.
    c.paths = ()
    # noteevents / tfds mimic_noteevents: keep only notes of these CATEGORY values, e.g.
    # ("Discharge summary",); () keeps all.
    c.noteevents_categories = ()
    # synthetic: number of generated notes and their seed.
    c.synthetic_num_notes = 2000
    c.synthetic_seed = 0
    # tfds: dataset names read with tfds.data_source (must be prepared; nothing downloads),
    # e.g. ("wikipedia/20230601.en", "bookcorpus") or ("mimic_noteevents",).
    c.tfds_names = ("wikipedia/20230601.en",)
    # tfds: data directory ("" = $TFDS_DATA_DIR or ~/tensorflow_datasets) and split.
    c.tfds_data_dir = ""
    c.tfds_split = "train"
    # tfds: name of the text feature.
    c.tfds_text_key = "text"
    # tfds: datasets whose examples are single sentences (e.g. a sentence-level BookCorpus);
    # tfds_sentences_per_document consecutive sentences of them form one document.
    c.tfds_sentence_datasets = ()
    c.tfds_sentences_per_document = 256
    # Largest share of a corpus file's rows (NOTEEVENTS) or lines (text) that may be unreadable
    # (malformed CSV, bad UTF-8, ...) before reading stops with an error naming the first bad
    # one; below it they are skipped and counted.
    c.max_bad_fraction = 0.01
    # Records whose identity repeats (the same ROW_ID in NOTEEVENTS / synthetic notes / the
    # mimic_noteevents TFDS set, or the same text twice in a plain-text or other TFDS corpus):
    # "refuse" (default: one error naming the file, how many ids repeat and the positions of
    # the first copies, before anything is tokenized) or "merge_identical" (keep the first copy
    # of each id when all its copies are identical, i.e. the same SUBJECT_ID, HADM_ID,
    # CATEGORY and TEXT; ids whose copies differ are still refused). Many notes of one
    # SUBJECT_ID are not duplicates. Without this a repeated note would be two vocabulary
    # records and two documents under a per-note guarantee (data_pipelines/identity.py). A
    # vocabulary built in the workdir follows the same rule.
    c.duplicate_ids = "refuse"
    # text / noteevents, on a run's first start: read the corpus once before anything is built
    # or spent, count its records (documents, notes, patients) and refuse with the fix (the
    # records needed, the vocab.epsilon, sigma or target that would do) when (1) a DP
    # vocabulary built here could not be useful: a word survives only if about tau records
    # use it (tau from vocab.epsilon, vocab.delta, vocab.max_words_per_example), refused below
    # 2 tau records, a warning below 10 tau; (2) with dp.privacy_unit note / patient:
    # batch.expected_batch_size exceeds the units, or (fixed dp.noise_multiplier) not even one
    # step fits dp.target_epsilon. configs/own_corpus.py turns it on; False skips the read.
    c.preflight = False
    # Use at most this many documents per source (0 = all); for quick runs.
    c.max_documents = 0
    # Sentences longer than this many characters are cut at whitespace (pasted tables).
    c.max_sentence_chars = 1000
    # Sequence length S of every example ([CLS] A [SEP] B [SEP] + padding).
    c.max_seq_length = 128
    # P: the maximum number of masked positions per example.
    c.max_predictions_per_seq = 20
    # Fraction of tokens masked (BERT: 0.15), then 80 % [MASK] / 10 % random / 10 % unchanged.
    c.masked_lm_prob = 0.15
    # Probability that a document's target length is drawn shorter (BERT: 0.1).
    c.short_seq_prob = 0.1
    # Number of instance-creation passes over the corpus (different segmentations). Each pass
    # adds examples containing the same text. Even at 1, one sentence lands in several examples
    # ('random next' segments B copy text of other documents): the privacy report states how
    # many examples one sentence / document / subject touches. BERT used 10 offline.
    c.dupe_factor = 1
    # Mask whole words (all ## pieces of a word together).
    c.whole_word_masking = False
    # Lower-case (and strip accents) before WordPiece; must match the vocab (uncased: True).
    c.do_lower_case = True
    # Fraction of documents held out for evaluation (0 = no eval set).
    c.eval_fraction = 0.01
    # Hold out whole "document"s, or whole "subject"s (patients: all their notes; needs
    # SUBJECT_IDs, i.e. noteevents / synthetic / mimic_noteevents).
    c.eval_split_unit = "document"
    # Seed of the held-out split, instance creation and masking.
    c.seed = 12345
    # Directory for the cache of created instances ("" = no cache: rebuilt in memory each run).
    # Entries are keyed by a fingerprint of (corpus files, vocab, parameters).
    c.cache_dir = ""
    # Secret-sharer canaries planted in the TRAINING documents (Hoory et al. Sec. 5.2).
    c.canaries = ml_collections.ConfigDict()
    c.canaries.enabled = False
    # Forms: H = generic word, S = secret word piece drawn from the vocab.
    c.canaries.forms = ("HS", "HSH", "HHSHH")
    # Each canary is planted this many times; one (or per_setting) canary per (form, count).
    # 0 makes reference canaries that are never planted (the exposure floor).
    c.canaries.repetitions = (0, 1, 10, 100)
    c.canaries.per_setting = 1
    # Seed of the secrets and of the planting positions.
    c.canaries.seed = 0
    # Where to write the canary JSON record ("" = canaries.json in the cache entry; one of the
    # two is required).
    c.canaries.output_file = ""
    # Plant exactly the canaries of this canary file (data_pipelines.canaries format, same
    # vocab), each by its own placement and repetitions, instead of generating them from forms /
    # repetitions / per_setting ("" = generate). Privacy audits plant their examples this way.
    c.canaries.file = ""
    # Batches prepared ahead of the trainer by background threads.
    c.prefetch = 2
    return c


def finetune_config() -> ml_collections.ConfigDict:
    """What every fine-tuning config shares (configs/finetune_*.py): `get_config()` with the
    pretraining-only sections removed, the fine-tuning data/privacy sections added, and
    defaults for one CPU. Fields that differ from `get_config()` are commented here."""
    c = get_config()
    # Pretraining only: the corpus pipeline, the DP vocabulary builder, privacy-adaptive MLM.
    del c.dchi, c.mlm_target, c.fill_mask
    del c.model.size, c.model.max_position_embeddings  # the checkpoint's config.json decides
    # The checkpoint to fine-tune (required): a Hugging Face BERT folder (BertModel such as
    # MiniLM, dpbert's pretraining export, or a fine-tuned BertFor*Classification).
    c.model.init_from_hf = ""
    # Dropout before the classifier (None = model.hidden_dropout_prob, as Hugging Face).
    c.model.classifier_dropout = config_dict.placeholder(float)

    c.vocab = ml_collections.ConfigDict()
    # The data's tokenizer vocabulary ("" = the checkpoint's vocab.txt). One that differs from
    # the checkpoint's vocab.txt, or has another size than its word embeddings, is refused.
    c.vocab.file = ""

    c.data = ml_collections.ConfigDict()
    # Training and held-out files (each task says its format and what "" means).
    c.data.train = ""
    c.data.eval = ""
    # Label names in class-id order (() = from the training data).
    c.data.labels = ()
    # WordPieces per sequence, [CLS] and [SEP] included.
    c.data.max_seq_length = 128
    # Batches prepared ahead of the trainer by a background thread.
    c.data.prefetch = 2

    # Input privacy (Qu et al. 2021): what the users release instead of their text, once,
    # before training (dpbert.tasks.finetuning's input modes). The service trains and evaluates
    # on the released train and eval splits only.
    # dχ's η and its search knob: `dchi_section` (shared with pretraining's `dchi`). For MiniLM
    # (n = 384) the text_to_text inversion accuracy on RT is about 0.05 / 0.25 / 0.5 / 0.87 /
    # 0.97 at η = 40 / 60 / 75 / 100 / 120.
    c.privacy = dchi_section(eta=75.0)
    # none (raw text) | token_rep (a noisy embedding per token; the word embeddings are frozen)
    # | text_to_text (the nearest vocabulary token to it) | seq_rep (a noisy sentence vector
    # from the frozen encoder; the head alone trains; classification only) | ome (randomized
    # bits of the frozen encoder's sentence vector, below; classification only) | texthide
    # (mixed and sign-masked sentence representations in training, below).
    c.privacy.mode = "none"
    # Re-privatize the training split every epoch: E epochs then cost E·η by composition (the
    # report says so); False = one release, seen in every epoch (the local-privacy model).
    c.privacy.fresh_noise_each_epoch = False
    # seq_rep: s(x) = "pooled" (the pooler output HF's classifier reads) or "cls_hidden".
    c.privacy.seq_rep_source = "pooled"
    # Memory/speed knobs of the release: regular tokens / sentences per jitted call.
    c.privacy.tokens_per_call = 4096
    c.privacy.examples_per_call = 256
    # Mode ome (Lyu et al. 2020; classification only): the users release their frozen
    # encoder's sentence representation (privacy.seq_rep_source), z-scored and randomized as
    # r x 10 bits; the service trains a linear head on the bits. privacy.epsilon is the
    # requested ε; ome_variant "published" uses Theorem 1's p, q with ome_lambda = λ (its ε
    # holds only at λ = 1: results.json and the card give epsilon_claimed AND the exact
    # epsilon_true), "calibrated" makes the true ε equal privacy.epsilon, "sue" / "oue" are
    # the unary-encoding baselines (privacy.ue_levels bins on [-4, 4] per coordinate).
    c.privacy.epsilon = 1.0
    c.privacy.ome_variant = "published"
    c.privacy.ome_lambda = 1.0
    c.privacy.ue_levels = 16
    # Mode texthide (Huang et al. 2020; classification, not with DP-SGD): every training step
    # mixes k pooled representations of the physical batch and flips their signs with one of
    # m secret masks (m = 0: no masks, -1: a fresh mask each time); variant "intra", or
    # "inter" with public sentences (privacy.public_file, a label<TAB>text file whose labels
    # are ignored) in the even slots; label_mode "paper" or "code" (the official code's
    # labels for those rows).
    c.privacy.m = 256
    c.privacy.k = 4
    c.privacy.variant = "intra"
    c.privacy.label_mode = "paper"
    c.privacy.public_file = ""
    # TextHide's head: "mlp" (the paper's 3 x (Dense(d) + tanh) + Dense(C); WORKDIR/hf then
    # holds all weights as safetensors, not a transformers folder) or "linear" (HF's
    # classifier, a BertForSequenceClassification export; cannot serve m > 1 masks well).
    c.privacy.texthide_head = "mlp"
    # The MLP head's input normalisation: "rms" divides each hidden row by its root mean square
    # (the same under every sign mask, so it reads nothing the row does not carry), "none" is
    # the paper's head; and the std of its weights at initialisation (the paper's: 0.02). The
    # defaults are what learns: MiniLM on RT, (256, 4), 20 epochs on an H100, dev 0.849 intra
    # / 0.856 inter; with the paper's head ("none", 0.02) the constant prediction (0.471).
    c.privacy.texthide_head_input_norm = "rms"
    c.privacy.texthide_head_init = 0.1

    # DP-SGD on the downstream set (its own (ε, δ), privacy unit: one training example as the
    # task defines it). Off by default: the downstream data is protected by the input privacy.
    c.dp.enabled = False
    # "auto": the mixed ghost clipper for classification in modes none / token_rep /
    # text_to_text (no per-example gradient of the word embedding or of the dense kernels);
    # vmap otherwise (NER's multi-window documents, seq_rep / OME features).
    c.dp.clipping = "auto"
    c.dp.delta = 1e-5

    # The recipe (dpbert.tasks.recipe) fills what is left unset (None, trainable "auto") from
    # N and dp.enabled: without DP all parameters, B 32, lr 5e-5, weight decay 0.01, 2 epochs;
    # with DP the top layer and the head (train.trainable=top:1), B = min(1024, N/8) (physical
    # 128, microbatch 32), SGD with momentum lr 2.0 (AdamW if only the learning rate is set),
    # no weight decay, 5 epochs. A value set here or by a flag is kept.
    c.train.trainable = "auto"
    c.batch.expected_batch_size = config_dict.placeholder(int)
    c.batch.physical_batch_size = config_dict.placeholder(int)
    c.batch.microbatch_size = config_dict.placeholder(int)

    c.optimizer.name = config_dict.placeholder(str)   # the recipe: adamw, or sgd with DP
    c.optimizer.learning_rate = config_dict.placeholder(float)
    # The task head (freshly initialised) trains at this multiple of the learning rate.
    c.optimizer.head_learning_rate_scale = 1.0
    # Warm-up as a fraction of train.num_steps (None = optimizer.warmup_steps as given).
    c.optimizer.warmup_fraction = 0.1
    c.optimizer.weight_decay = config_dict.placeholder(float)

    # Epochs over the training set; > 0 sets train.num_steps = ceil(epochs x N / B) with
    # B = batch.expected_batch_size (0 = train.num_steps as given; None = the recipe's).
    c.train.epochs = config_dict.placeholder(float)
    c.train.log_every = 20
    c.train.eval_every = 0
    c.train.eval_batches = 0  # the whole held-out split
    c.train.eval_batch_size = 64
    c.checkpoint.every_steps = 200
    c.checkpoint.max_to_keep = 2
    return c
