"""Pretraining's checks before anything is built or spent (`data.preflight`, on in
configs/own_corpus.py): one read of a text / NOTEEVENTS corpus file, then

1. a DP vocabulary to be built here: the corpus's vocabulary records (documents, notes, or
   patients) against the DP threshold (`data_pipelines.vocab_preflight`): refused when too few
   for a useful vocabulary at vocab.epsilon (the records, the vocab.epsilon or the public
   vocab.file that would do), a warning when thin; and the build's own conditions on n
   (vocab.delta < 1/n, ...), worded with the config's fields;
2. with dp.privacy_unit note / patient: the units the training can have are at most the
   corpus's records of that unit (before the held-out split and empty records), so
   batch.expected_batch_size above them is refused, and with a fixed dp.noise_multiplier and
   dp.target_epsilon the plan's budget is checked with that N: a larger N only lowers
   epsilon, so a refusal here is one the real plan would make too (with the accountant's
   fixes, `dpbert.dp.plan.no_step_fits`).

Run on a run's first start only (no WORKDIR/vocab yet), after `loop.validate`. The counts are
exact statistics of the private corpus: printed on the operator's console, never reported.
"""

from __future__ import annotations

import pathlib

import ml_collections
import numpy as np

from data_pipelines import dp_vocab, identity, vocab_preflight
from dpbert.core import units as privacy_units
from dpbert.dp import plan as plan_lib
from dpbert.errors import ConfigError
from dpbert.runtime.hosts import announce

_VOCAB_FIELDS = {"epsilon": "--config.vocab.epsilon", "delta": "--config.vocab.delta",
                 "max_words_per_example": "--config.vocab.max_words_per_example",
                 "file": "--config.vocab.file"}


def check(config: ml_collections.ConfigDict, data: ml_collections.ConfigDict,
          workdir: pathlib.Path) -> None:
    """Raises ConfigError for the first failed precondition (module doc); announces a thin
    vocabulary. `data`: the data section the run builds from (`pretraining.prepare_corpus`).
    A no-op unless data.preflight is on, the corpus is one text / noteevents file and this is
    the run's first start."""
    if not (data.get("preflight") and data.corpus in dp_vocab.FORMATS
            and len(data.paths) == 1) or (workdir / "vocab" / "vocab.txt").is_file():
        return
    unit = privacy_units.get(config.dp.privacy_unit)
    builds_dp_vocab = bool(config.vocab.dp and not config.vocab.file
                           and not config.model.init_from_hf)
    checks_units = config.dp.enabled and unit.per_unit
    if not (builds_dp_vocab or checks_units):
        return
    record = unit.vocab_record if data.corpus == "noteevents" else privacy_units.DOCUMENT_RECORD
    path = data.paths[0]
    announce(f"preflight: counting the {_words(data.corpus, record)} of {path} ...")
    try:
        records = vocab_preflight.count_records(
            path, data.corpus, record, data.max_bad_fraction,
            data.get("duplicate_ids", identity.DEFAULT_RULE))
    except ValueError as e:  # a malformed file, repeated ids: the readers' one line
        raise ConfigError(f"config.data.paths={tuple(data.paths)!r}: {e}") from None
    if builds_dp_vocab:
        _check_vocabulary(config, records, _words(data.corpus, record), path)
    if checks_units:
        _check_units(config, records, unit)


def _words(corpus: str, record: str) -> str:
    return vocab_preflight.RECORD_WORDS[(corpus, record)]


def _check_vocabulary(config, records: int, what: str, path: str) -> None:
    v = config.vocab
    fields = {k: (flag, v.get(k, "")) for k, flag in _VOCAB_FIELDS.items()}
    a = vocab_preflight.assess(records, v.epsilon, v.delta, v.max_words_per_example)
    if a.refused:
        raise ConfigError(vocab_preflight.explain(a, what=what, where=path, fields=fields))
    try:  # the build's own conditions on n, before it reads the corpus again
        dp_vocab.check_conditions(
            dp_vocab.calibrate_histogram(v.epsilon, v.delta, v.max_words_per_example),
            records, names=_VOCAB_FIELDS)
    except dp_vocab.VocabError as e:
        raise ConfigError(f"config.vocab: {e} ({path} has {records} {what})") from None
    if a.thin:
        announce("WARNING: " + vocab_preflight.explain(a, what=what, where=path, fields=fields))
    else:
        announce(f"preflight: {records} {what}, {records / a.threshold:.0f} x the DP "
                 "vocabulary's threshold")


def _check_units(config, records: int, unit: privacy_units.PrivacyUnit) -> None:
    b = config.batch.expected_batch_size
    what = f"{unit.name}s"
    if b > records:
        raise ConfigError(
            f"config.batch.expected_batch_size={b}: exceeds the {records} {what} of the corpus "
            f"(dp.privacy_unit={unit.name!r}: the batch counts {what}, and the training split "
            f"has fewer still): use --config.batch.expected_batch_size={max(1, records // 16)} "
            f"or less (and batch.physical_batch_size, batch.microbatch_size to match)")
    dp = config.dp
    if (dp.noise_multiplier is None or dp.target_epsilon is None
            or dp.get("total_epsilon") is not None or dp.noise_mode != "global"
            or (config.model.init_from_hf and config.model.get("init_data") == "same")):
        return  # sigma calibrated, no target, or a budget that needs the vocabulary's report
    try:
        plan_lib.make_plan(dp, config.batch, num_steps=config.train.num_steps,
                           num_examples=records, num_shards=1, sampler_seed=0,
                           unit_ids=np.arange(records))
    except ConfigError as e:
        if "not even one step" not in str(e):
            return  # the plan's other checks: the real plan makes them with the real N
        raise ConfigError(f"{e} (checked before anything is built, with N = the {records} "
                          f"{what} of the whole corpus; the training split has fewer, which "
                          "only costs more)") from None
