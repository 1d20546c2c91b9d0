"""Token classification (NER, BIO) with input privacy (and optionally DP-SGD).

    python launch/finetune.py --config=configs/finetune_ner.py --workdir=/tmp/ner \\
        --config.model.init_from_hf=HF_FOLDER [--config.data.fold=1]

Default data: the i2b2-2010-shaped synthetic notes (problem / test / treatment), 5-fold split
by document. Shared fine-tuning fields: `configs/common.finetune_config()`. Writes
WORKDIR/results.json (entity micro-F1) and WORKDIR/hf (`BertForTokenClassification`).
"""

from configs import common


def get_config(arg: str | None = None):
    common.parse_arg(arg, {}, config="configs/finetune_ner.py")  # takes none: an arg is an error
    c = common.finetune_config()
    # The task on the DP loop (dpbert.tasks): what launch/finetune.py runs.
    c.task = "ner"
    # CoNLL-style BIO files ("token ... tag" lines, blank line between sentences, -DOCSTART-
    # between documents). data.train = "" uses the synthetic notes below; data.eval = "" splits
    # the training documents k-fold (below) and holds out fold data.fold.
    c.data.train = ""
    c.data.eval = ""
    # The synthetic i2b2-2010-shaped set (data_pipelines.synthetic_ner): number of notes and seed.
    c.data.synthetic_num_notes = 170
    c.data.synthetic_seed = 0
    # k-fold by document: k, the held-out fold, and the seed of the split (a document's fold is a
    # hash of its content and the seed, never of its position: data_pipelines.ner.kfold_documents).
    c.data.num_folds = 5
    c.data.fold = 0
    c.data.fold_seed = 0
    # A document's pieces are cut into windows of max_seq_length (with [CLS], [SEP]) every
    # `stride` pieces; all windows of a document form one training example (the privacy unit).
    c.data.max_seq_length = 128
    c.data.stride = 64
    # Documents per batch (one document = many windows) and epochs are the recipe's
    # (dpbert.tasks.recipe): without DP 8 documents per batch and 4 epochs; with DP-SGD the DP
    # recipe (top:1, B = min(1024, N/4), SGD, ...), as for classification.
    c.train.log_every = 10
    c.train.eval_batch_size = 64
    c.dp.target_epsilon = 8.0
    c.dp.delta = 1e-3  # < 1/N for the 136 training documents of a fold
    return c
