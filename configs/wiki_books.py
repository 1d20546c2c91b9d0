"""The public, non-private stage: BERT from scratch on Wikipedia + BookCorpus (TFDS).

Hoory et al.'s stage 2: pretrain on public text with the vocabulary built (with DP) from the
private corpus, then continue on the private corpus with configs/mimic_dp.py starting from this
run's export (WORKDIR/hf). No privacy is claimed for this stage: its data is public.

    python launch/train.py --config=configs/wiki_books.py --workdir=W \\
        --config.vocab.file=VOCAB/vocab.txt --config.data.tfds_data_dir=/data/tfds

The TFDS datasets must be prepared beforehand (nothing downloads at run time); TFDS has no
BookCorpus builder, so a BookCorpus copy must be prepared as a TFDS dataset of sentences
(see data_pipelines/tfds_data.py). `:size=tiny` (or `:tiny`) etc. picks the model size.
"""

from configs import common


def get_config(arg: str | None = None):
    args = common.parse_arg(arg, {"size": common.MODEL_SIZES}, config="configs/wiki_books.py",
                            positional="size")
    c = common.get_config()
    c.model.size = args.get("size", "base")
    c.model.max_position_embeddings = 512
    c.vocab.file = ""  # required: the DP vocabulary of the private corpus
    c.data.corpus = "tfds"
    c.data.tfds_names = ("wikipedia/20230601.en", "bookcorpus")
    c.data.tfds_sentence_datasets = ("bookcorpus",)
    c.data.max_seq_length = 128
    c.data.max_predictions_per_seq = 20
    c.data.dupe_factor = 1
    c.dp.enabled = False
    c.batch.expected_batch_size = 256
    c.batch.physical_batch_size = 256
    c.optimizer.name = "adamw"
    c.optimizer.learning_rate = 1e-4
    c.optimizer.warmup_steps = 10_000
    c.optimizer.weight_decay = 0.01
    c.train.num_steps = 1_000_000
    c.train.eval_every = 10_000
    c.checkpoint.every_steps = 5_000
    return c
