"""Sentence / sentence-pair classification with input privacy (and optionally DP-SGD).

    python launch/finetune.py --config=configs/finetune_classification.py --workdir=/tmp/ft \\
        --config.model.init_from_hf=HF_FOLDER \\
        --config.data.train=../shared/data/sentiment/rt_train.tsv \\
        --config.data.eval=../shared/data/sentiment/rt_dev.tsv \\
        [--config.privacy.mode=text_to_text --config.privacy.eta=75] [--config.dp.enabled=True]

Shared fine-tuning fields: `configs/common.finetune_config()`. Writes WORKDIR/results.json and
WORKDIR/hf (`BertForSequenceClassification`).
"""

from configs import common


def get_config(arg: str | None = None):
    common.parse_arg(arg, {}, config="configs/finetune_classification.py")  # takes none
    c = common.finetune_config()
    # The task on the DP loop (dpbert.tasks): what launch/finetune.py runs.
    c.task = "classification"
    # label<TAB>text or label<TAB>text_a<TAB>text_b files; a first line whose first column is
    # "label" is a header. The eval file must use the training file's label set and layout.
    c.data.train = ""
    c.data.eval = ""
    # Sentiment sentences are short: 64 pieces keep ~99 % of RT sentences whole.
    c.data.max_seq_length = 64
    # Use only the first this many training rows (0 = all): quick runs and benchmarks.
    c.data.max_train_examples = 0
    # With DP-SGD (dp.enabled=True): sigma calibrated for this epsilon over the run's steps.
    c.dp.target_epsilon = 8.0
    return c
