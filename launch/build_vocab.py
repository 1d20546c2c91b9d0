r"""Builds a differentially private BERT WordPiece vocabulary from a private corpus.

Example (MIMIC-III notes; one note is one example)::

  PYTHONPATH=. python launch/build_vocab.py \
      --input=/data/mimic/NOTEEVENTS.csv.gz --format=noteevents \
      --vocab_size=30522 --epsilon=8 --delta=1e-6 --max_words_per_example=64 \
      --out=/tmp/mimic_vocab

Writes ``<out>/vocab.txt`` (loads in ``transformers.BertTokenizerFast(vocab=...)``),
``<out>/vocab_privacy.json`` (epsilon, delta, K, the mechanism, the example definition)
and ``<out>/word_counts.tsv`` (surviving words with noisy counts, also DP).  ``--no_dp``
builds the non-private vocabulary from raw counts and says so in the json.  See
``data_pipelines/dp_vocab.py`` for the mechanism and ``docs/dp_vocab.md`` for the design.
"""

import os
import sys

from absl import app, flags, logging

from data_pipelines import corpora, dp_vocab, identity, vocab_report
from dpbert.runtime import cli

_INPUT = flags.DEFINE_string("input", None, "Corpus file (.gz allowed).")
_FORMAT = flags.DEFINE_enum("format", "text", list(dp_vocab.FORMATS),
                            "text: one sentence per line, blank line between documents "
                            "(example = document); noteevents: MIMIC-III NOTEEVENTS.csv "
                            "(example = note).")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", None, "Number of lines of vocab.txt.",
                                   lower_bound=1)
_EPSILON = flags.DEFINE_float("epsilon", None, "Example-level epsilon (add/remove one "
                              "example). Required unless --no_dp.")
_DELTA = flags.DEFINE_float("delta", None, "Example-level delta. Required unless --no_dp.")
_K = flags.DEFINE_integer("max_words_per_example", 64,
                          "K: distinct words one example may contribute (each once).",
                          lower_bound=1)
_OUT = flags.DEFINE_string("out", None, "Output folder (must not hold a vocabulary).")
_NO_DP = flags.DEFINE_boolean("no_dp", False, "Build the NON-private vocabulary from raw "
                              "counts (for comparison only).")
_LOWER = flags.DEFINE_boolean("do_lower_case", True, "Uncased BERT normalisation "
                              "(lowercase + strip accents).")
_SEED = flags.DEFINE_integer("seed", None, "Seed for bounding and noise: reproducible "
                             "builds only; leave unset for a release (OS entropy).",
                             lower_bound=0, upper_bound=2**32 - 1)
_WORKERS = flags.DEFINE_integer("num_workers", min(os.cpu_count() or 1, 8),
                                "Processes that count words.", lower_bound=1)
_ACCOUNTING = flags.DEFINE_enum("accounting", "pld", list(dp_vocab.ACCOUNTING_MODES),
                                "pld: tight PLD analysis of the K-bounded histogram; "
                                "basic: Hoory et al.'s eps'=eps/K, Lap(2/eps') recipe.")
_UNIT = flags.DEFINE_enum("unit", "document", list(dp_vocab.UNITS),
                          "document: one note / document is one example; patient (noteevents): "
                          "the notes of one SUBJECT_ID together are one example, for training "
                          "with dp.privacy_unit='patient'.")
_NUM_UNUSED = flags.DEFINE_integer("num_unused", dp_vocab.DEFAULT_NUM_UNUSED,
                                   "[unusedN] slots between [PAD] and [UNK] (99: BERT ids).",
                                   lower_bound=0)
_MAX_BAD = flags.DEFINE_float("max_bad_fraction", corpora.DEFAULT_MAX_BAD_FRACTION,
                              "Largest share of corpus rows (text: lines) that may be unparseable "
                              "(skipped); more is an error naming the first bad row's line.",
                              lower_bound=0.0, upper_bound=1.0)
_DUPLICATES = flags.DEFINE_enum(
    "duplicate_ids", identity.DEFAULT_RULE, list(identity.RULES),
    "A ROW_ID (noteevents) or a document text (text) that occurs more than once: refuse "
    "(default: an error with the count and the first rows, nothing written) or "
    "merge_identical (keep one copy where all copies are identical; copies that differ are "
    "still refused). Use the same rule as the training's data.duplicate_ids.")

flags.mark_flags_as_required(["input", "vocab_size", "out"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    problem = (cli.check_input_path(_INPUT.value, "--input")
               or cli.check_output_dir(_OUT.value, "--out"))
    if problem:  # before the corpus is read: nothing is counted for an unusable --out
        cli.fail("build_vocab", problem)
    dp = not _NO_DP.value
    if dp and (_EPSILON.value is None or _DELTA.value is None):
        raise app.UsageError("--epsilon and --delta are required (or pass --no_dp)")
    try:
        result = dp_vocab.build_vocab(
            _INPUT.value, _FORMAT.value, _VOCAB_SIZE.value, _EPSILON.value, _DELTA.value,
            _K.value, _OUT.value, dp=dp, do_lower_case=_LOWER.value, seed=_SEED.value,
            num_workers=_WORKERS.value, accounting=_ACCOUNTING.value,
            num_unused=_NUM_UNUSED.value, progress=True, max_bad_fraction=_MAX_BAD.value,
            min_learned_tokens=1, unit=_UNIT.value, duplicate_ids=_DUPLICATES.value)
    except (dp_vocab.VocabError, corpora.CorpusError) as e:
        cli.fail("build_vocab", str(e))
    notes, info, done = vocab_report.console_summary(result.report, result.vocab_path,
                                                     result.privacy_path)
    for line in notes:  # the duplicates dropped (an exact count: console only) and warnings
        print(f"build_vocab: {line}", file=sys.stderr)
    logging.info(info)
    print(done)


if __name__ == "__main__":
    cli.run(main, "build_vocab")
