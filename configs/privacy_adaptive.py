"""Privacy-adaptive pretraining (Qu et al. 2021): continue pretraining a public BERT on text that
is dχ-privatized on the fly, so the model learns to read privatized input.

    python launch/train.py --config=configs/privacy_adaptive.py \\
        --config.model.init_from_hf=/path/to/bert-base-uncased \\
        --config.data.paths=/path/to/corpus.txt.gz --workdir=/tmp/pa \\
        --config.dchi.eta=100 --config.mlm_target=denoising

Sweep knobs: `dchi.eta` (privacy level), `mlm_target` (vanilla | prob | denoising),
`dchi.mechanism` (text_to_text | token_rep). The config arg picks the mechanism:
`--config=configs/privacy_adaptive.py:mechanism=token_rep` (or `:token_rep`).

Paper settings (Sec. 6.1): sequence length 128, batch 256, learning rate 2e-5, 20 predictions per
sequence, mask rate 0.15, 10k warmup steps, NSP kept. dχ protects the users' inputs; it composes
with DP-SGD (set dp.enabled=True to also protect the pretraining corpus) but does not need it.
"""

from configs import common


def get_config(arg: str | None = None):
    args = common.parse_arg(arg, {"mechanism": ("text_to_text", "token_rep")},
                            config="configs/privacy_adaptive.py", positional="mechanism")
    c = common.get_config()
    # The starting checkpoint (required): its word embeddings are φ, its vocab.txt the vocabulary.
    c.model.init_from_hf = ""
    c.dchi.mechanism = args.get("mechanism", "text_to_text")
    c.dchi.eta = 100.0
    c.dchi.prob_samples = 10
    c.mlm_target = "denoising"
    # A public corpus (one sentence per line, blank line between documents).
    c.data.corpus = "text"
    c.data.paths = ()
    c.data.max_seq_length = 128
    c.data.max_predictions_per_seq = 20
    c.data.masked_lm_prob = 0.15
    c.model.max_position_embeddings = 512
    # dχ protects the users' text; DP-SGD is off by default here (public pretraining corpus).
    c.dp.enabled = False
    c.batch.expected_batch_size = 256
    c.batch.physical_batch_size = 256
    c.optimizer.name = "adamw"
    c.optimizer.learning_rate = 2e-5
    c.optimizer.warmup_steps = 10_000
    c.optimizer.weight_decay = 0.01
    c.train.num_steps = 100_000
    c.train.eval_every = 5_000
    c.checkpoint.every_steps = 5_000
    return c
