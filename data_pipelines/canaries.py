"""Secret-sharer canaries (Carlini et al. 2019; Hoory et al. 2021, Sec. 5.2).

A canary is a short sequence of word pieces ``H... S H...`` in one of the forms ``HS``, ``HSH``,
``HHSHH``: ``H`` are generic words, ``S`` is a secret word piece drawn uniformly from the
vocabulary's candidate set ``R`` (whole-word, alphabetic pieces that the tokenizer maps to
themselves). Each canary is planted ``repetitions`` times, as its own sentence, at positions
drawn uniformly over the sentence slots of the training documents (seeded); ``repetitions = 0``
makes a reference canary, generated like the others but never planted (its exposure is the
floor an un-memorized secret has). A canary with ``placement = "example"`` is planted instead
as ``repetitions`` training examples of its own, appended after instance creation
(``append_canary_examples``): each copy is then exactly one example, the DP privacy unit, and the
rest of the data set does not depend on it (what a privacy audit needs). After training,
the exposure of a canary is ``log2 |R| - log2 rank(S)``, where ``rank(S)`` is the rank of the
secret among all candidates in ``R`` when the model predicts the masked secret position in the
canary's context; everything that measurement needs is written to a JSON file:

  {"format_version", "seed", "vocab_fingerprint", "num_candidates", "candidate_ids",
   "candidate_rule", "canaries": [{"canary_id", "form", "text", "tokens", "token_ids",
   "secret", "secret_id", "secret_position", "repetitions", "placement",
   "insertions": [{"doc_index", "doc_key", "sentence_index"} or {"example_index"}]}]}

``doc_index`` / ``sentence_index`` are the canary sentence's place in the training corpus that
instance creation reads (after insertion); ``doc_key`` is the document's key in the source
(ROW_ID for notes, the content key of a text document). ``example_index`` is the index of an
example-placed copy among the training examples.

The insertion works on tokenized documents (``tokenized_corpus.TokenizedCorpus``), so corpora that
do not fit in memory as text need no second pass.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from data_pipelines import fileio, textcheck, tokenization
from data_pipelines.documents import NO_SUBJECT
from data_pipelines.example_keys import example_keys
from data_pipelines.instances import Instances
from data_pipelines.tokenized_corpus import CorpusBuilder, TokenizedCorpus

FORMS = ("HS", "HSH", "HHSHH")
PLACEMENTS = ("sentence", "example")
# Form of the one-run privacy audit's canaries (dpbert.leakage.audit): random word-piece sequences whose
# inclusion is the audit's secret; exposure reports leave them out.
AUDIT_FORM = "audit"
CANARY_FILE_VERSION = 1
# Most copies of one canary: each is a sentence of its own, so a count of 10**9 (a typo) would
# draw and plant 10**9 sentences (gigabytes, hours) instead of failing. Secret-sharer
# experiments use 1-10,000.
MAX_REPETITIONS = 100_000

# Generic words for the H positions: frequent, content-free English words. Only those that the
# vocabulary keeps as one piece are used.
GENERIC_WORDS = (
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "with", "as", "at", "by", "from",
    "this", "that", "it", "be", "are", "or", "an", "not", "but", "which", "have", "has", "had",
    "were", "they", "there", "been", "one", "all", "would", "will", "their", "more", "when",
    "also", "some", "what", "about", "other", "into", "time", "only", "new", "may", "then",
    "first", "any", "like", "now", "such", "over", "after", "very", "just", "where", "most",
    "well", "back", "good", "much", "same", "each", "still", "here", "found", "made", "part",
    "said", "both", "between", "under", "never", "again", "while", "last", "might", "great",
    "old", "year", "off", "come", "since", "against", "place", "long", "little", "down", "day",
    "way", "even", "many", "because", "those", "these", "through", "before", "right", "being",
)
_ALPHA = re.compile(r"^[a-z]+$")


@dataclasses.dataclass
class Canary:
    """One planted secret (see module docstring for the JSON fields)."""

    canary_id: str
    form: str
    tokens: list[str]
    token_ids: list[int]
    secret: str
    secret_id: int
    secret_position: int
    repetitions: int
    insertions: list[dict[str, int]] = dataclasses.field(default_factory=list)
    # "sentence": a sentence of the training documents; "example": training examples of its own.
    placement: str = "sentence"

    @property
    def text(self) -> str:
        return " ".join(self.tokens)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["text"] = self.text
        return d


def secret_candidates(tokenizer: tokenization.WordPieceTokenizer, *,
                      min_chars: int = 3) -> np.ndarray:
    """The secret space R: ids of vocab pieces that are whole lower-case alphabetic words of at
    least ``min_chars`` letters and that the tokenizer maps back to exactly themselves.

    Returns:
      int32 [|R|], ascending.
    """
    words = [(i, t) for i, t in enumerate(tokenizer.vocab)
             if len(t) >= min_chars and _ALPHA.match(t)]
    encoded = tokenizer.encode_batch([t for _, t in words])
    return np.asarray([i for (i, _), ids in zip(words, encoded)
                       if len(ids) == 1 and ids[0] == i], dtype=np.int32)


def generic_word_ids(tokenizer: tokenization.WordPieceTokenizer) -> list[tuple[str, int]]:
    """(word, id) of the GENERIC_WORDS that are single pieces in this vocab."""
    out = []
    for word, ids in zip(GENERIC_WORDS, tokenizer.encode_batch(list(GENERIC_WORDS))):
        if len(ids) == 1 and tokenizer.vocab[ids[0]] == word:
            out.append((word, int(ids[0])))
    return out


def make_canaries(tokenizer: tokenization.WordPieceTokenizer, *, forms: Sequence[str] = FORMS,
                  repetitions: Sequence[int] = (1, 10, 100), canaries_per_setting: int = 1,
                  seed: int = 0) -> list[Canary]:
    """Draws ``canaries_per_setting`` canaries for every (form, repetition count).

    Secrets are distinct across canaries (drawn without replacement from ``secret_candidates``)
    and never one of the generic words; the H words are drawn i.i.d. from the generic words.
    A repetition count of 0 makes reference canaries (never planted).

    Raises:
      ValueError: an unknown form, a repetition count < 0, or a vocab too small.
    """
    for form in forms:
        if form not in FORMS:
            raise ValueError(f"unknown canary form {form!r}; choose from {FORMS}")
    for r in repetitions:
        if not 0 <= int(r) <= MAX_REPETITIONS:
            raise ValueError(f"canary repetitions must be >= 0 (0 = a never-planted reference "
                             f"canary) and <= {MAX_REPETITIONS}, got {r}")
    if canaries_per_setting < 1:
        raise ValueError(f"canaries_per_setting must be >= 1, got {canaries_per_setting}")
    generic = generic_word_ids(tokenizer)
    if len(generic) < 5:
        raise ValueError(f"the vocab {tokenizer.vocab_file} keeps only {len(generic)} of the "
                         f"generic canary words as single pieces; need at least 5")
    generic_set = {i for _, i in generic}
    candidates = [int(i) for i in secret_candidates(tokenizer) if int(i) not in generic_set]
    total = len(forms) * len(repetitions) * canaries_per_setting
    if len(candidates) < total:
        raise ValueError(f"the vocab has {len(candidates)} secret candidates, fewer than the "
                         f"{total} canaries asked for")
    rng = random.Random(f"canaries:{seed}")
    secrets = rng.sample(candidates, total)
    out = []
    k = 0
    for form in forms:
        for reps in repetitions:
            for j in range(canaries_per_setting):
                secret = secrets[k]
                k += 1
                tokens, ids, pos = [], [], -1
                for symbol in form:
                    if symbol == "S":
                        pos = len(tokens)
                        tokens.append(tokenizer.vocab[secret])
                        ids.append(secret)
                    else:
                        word, wid = rng.choice(generic)
                        tokens.append(word)
                        ids.append(wid)
                out.append(Canary(canary_id=f"{form}-r{reps}-{j}", form=form, tokens=tokens,
                                  token_ids=ids, secret=tokenizer.vocab[secret],
                                  secret_id=secret, secret_position=pos,
                                  repetitions=int(reps)))
    return out


def insert_canaries(corpus: TokenizedCorpus, canaries: Sequence[Canary], *,
                    seed: int, doc_keys: np.ndarray | None = None,
                    ) -> TokenizedCorpus:
    """Plants every sentence-placed canary ``repetitions`` times as a sentence of the training
    documents (example-placed canaries are left to ``append_canary_examples``).

    Each planting picks a slot uniformly among all sentence slots of the corpus (a document with
    n sentences has n + 1 slots: before each sentence and at its end), independently (seeded).
    Fills each canary's ``insertions`` with the final (doc_index, sentence_index) and doc key.

    Args:
      corpus: the training documents.
      canaries: from ``make_canaries``; their ``insertions`` are overwritten.
      seed: placement seed.
      doc_keys: int64 [num_documents], source keys to record (default: the corpus's own
        ``doc_keys``).

    Returns:
      A new corpus with the canary sentences inserted.
    """
    if corpus.num_documents == 0:
        raise ValueError("cannot plant canaries in an empty corpus")
    keys = corpus.doc_keys if doc_keys is None else np.asarray(doc_keys)
    rng = np.random.default_rng([seed, 0xCA7A])
    sentences_per_doc = np.diff(corpus.doc_offsets)
    slots = sentences_per_doc + 1
    slot_ends = np.cumsum(slots)
    plantings: dict[int, list[tuple[int, float, int]]] = {}
    for c_index, canary in enumerate(canaries):
        if canary.placement != "sentence":
            continue
        canary.insertions = []
        draws = rng.integers(0, slot_ends[-1], size=canary.repetitions)
        ties = rng.random(canary.repetitions)  # random order among canaries sharing a slot
        for draw, tie in zip(draws.tolist(), ties.tolist()):
            doc = int(np.searchsorted(slot_ends, draw, side="right"))
            slot = draw - (int(slot_ends[doc - 1]) if doc else 0)
            plantings.setdefault(doc, []).append((slot, tie, c_index))

    builder = CorpusBuilder()
    canary_ids = [np.asarray(c.token_ids, np.int32) for c in canaries]
    for doc in range(corpus.num_documents):
        s0, s1 = int(corpus.doc_offsets[doc]), int(corpus.doc_offsets[doc + 1])
        sents = [corpus.tokens[corpus.sentence_offsets[j]:corpus.sentence_offsets[j + 1]]
                 for j in range(s0, s1)]
        if doc in plantings:
            out: list[np.ndarray] = []
            plants = sorted(plantings[doc])
            p = 0
            for slot in range(len(sents) + 1):
                while p < len(plants) and plants[p][0] == slot:
                    c_index = plants[p][2]
                    canaries[c_index].insertions.append(
                        {"doc_index": doc, "doc_key": int(keys[doc]),
                         "sentence_index": len(out)})
                    out.append(canary_ids[c_index])
                    p += 1
                if slot < len(sents):
                    out.append(sents[slot])
            sents = out
        builder.add_document(sents, int(corpus.subject_ids[doc]), int(corpus.doc_keys[doc]))
    return builder.build()


def append_canary_examples(instances: Instances, canaries: Sequence[Canary]) -> Instances:
    """Appends ``repetitions`` training examples for every example-placed canary.

    A copy is the instance ``[CLS] A [SEP] B [SEP]`` with A the first ceil(n/2) pieces of the
    canary and B the rest (``is_random_next`` False, no document: index -1, subject
    ``NO_SUBJECT``, key -1, no corpus sentence), appended after the corpus's instances, so the corpus's own examples
    (their indices, segmentation and masking) do not depend on which canaries are planted.
    Copy j of a canary has the example key ``example_keys("canary", canary_id, 0, j)``: its
    masking depends on nothing else. Fills each such canary's ``insertions`` with
    ``{"example_index": i}``.

    Raises:
      ValueError: a canary shorter than 2 pieces (A and B must be non-empty).
    """
    pieces, a_lengths, keys = [], [], []
    n = len(instances)
    for canary in canaries:
        if canary.placement != "example":
            continue
        ids = np.asarray(canary.token_ids, np.int32)
        if len(ids) < 2:
            raise ValueError(f"canary {canary.canary_id}: an example-placed canary needs at least "
                             f"2 pieces, got {len(ids)}")
        canary.insertions = []
        keys.append(example_keys("canary", canary.canary_id, 0, np.arange(canary.repetitions)))
        for _ in range(canary.repetitions):
            canary.insertions.append({"example_index": n + len(pieces)})
            pieces.append(ids)
            a_lengths.append((len(ids) + 1) // 2)
    if not pieces:
        return instances
    k = len(pieces)
    lengths = np.asarray([len(p) for p in pieces], np.int64)
    none = np.full(k, -1, np.int64)
    no_subject = np.full(k, NO_SUBJECT, np.int64)
    return Instances(
        tokens=np.concatenate([np.asarray(instances.tokens), *pieces]).astype(np.int32),
        offsets=np.concatenate([np.asarray(instances.offsets),
                                instances.offsets[-1] + np.cumsum(lengths)]).astype(np.int64),
        a_lengths=np.concatenate([instances.a_lengths, a_lengths]).astype(np.int32),
        is_random_next=np.concatenate([instances.is_random_next, np.zeros(k, bool)]),
        doc_index=np.concatenate([instances.doc_index, none]).astype(np.int32),
        b_doc_index=np.concatenate([instances.b_doc_index, none]).astype(np.int32),
        subject_id=np.concatenate([instances.subject_id, no_subject]),
        b_subject_id=np.concatenate([instances.b_subject_id, no_subject]),
        doc_key=np.concatenate([instances.doc_key, none]),
        b_doc_key=np.concatenate([instances.b_doc_key, none]),
        a_sentence_start=np.concatenate([instances.a_sentence_start, none]),
        a_sentence_count=np.concatenate([instances.a_sentence_count,
                                         np.zeros(k, np.int32)]).astype(np.int32),
        b_sentence_start=np.concatenate([instances.b_sentence_start, none]),
        b_sentence_count=np.concatenate([instances.b_sentence_count,
                                         np.zeros(k, np.int32)]).astype(np.int32),
        example_key=np.concatenate([instances.example_key, *keys]).astype(np.int64))


def write_canary_file(path: str | os.PathLike, canaries: Sequence[Canary],
                      tokenizer: tokenization.WordPieceTokenizer, *, seed: int,
                      extra: dict[str, Any] | None = None) -> None:
    """Writes the canary record (JSON, see module docstring); atomic (temp file + rename)."""
    candidates = secret_candidates(tokenizer)
    record = {
        "format_version": CANARY_FILE_VERSION,
        "seed": seed,
        "vocab_file": tokenizer.vocab_file,
        "vocab_fingerprint": tokenization.vocab_fingerprint(tokenizer.vocab_file),
        "do_lower_case": tokenizer.do_lower_case,
        "candidate_rule": "whole-word lower-case alphabetic vocab pieces of >= 3 letters that "
                          "tokenize to themselves",
        "num_candidates": int(len(candidates)),
        "candidate_ids": candidates.tolist(),
        "canaries": [c.to_json() for c in canaries],
        **(extra or {}),
    }
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fileio.atomic_write_text(path, json.dumps(record, indent=1))


_CANARY_FIELDS = {f.name for f in dataclasses.fields(Canary)}
_REQUIRED_CANARY_FIELDS = {f.name for f in dataclasses.fields(Canary)
                           if f.default is dataclasses.MISSING
                           and f.default_factory is dataclasses.MISSING}


def load_canary_file(path: str | os.PathLike) -> tuple[list[Canary], dict[str, Any]]:
    """Reads a canary file: (canaries, the whole record).

    Read under the byte-level rules of every text reader (``textcheck``: gzip read, a UTF-8
    byte-order mark skipped, bad UTF-8 and control characters refused with line and column).
    Errors (``ValueError``) name the file, the JSON position or the canary's index, never a
    value of the file (a canary's text is the audit's secret).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: canary file not found")
    with textcheck.open_text(path, ValueError, newline="\n") as f:
        try:
            text = f.read()
        except textcheck.READ_ERRORS as e:
            raise textcheck.read_error(path, 0, e, ValueError) from None
    for number, line in enumerate(text.split("\n"), start=1):
        problem = textcheck.line_problem(path, number, line)
        if problem:
            raise ValueError(problem)
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:   # its msg holds no content ("Expecting ',' delimiter")
        raise ValueError(f"{path}:{e.lineno}:{e.colno}: not a canary file (JSON: "
                         f"{e.msg})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{path}: not a canary file (not a JSON object)")
    version = record.get("format_version")
    if version != CANARY_FILE_VERSION:
        shown = version if isinstance(version, int) else textcheck.describe(str(version))
        raise ValueError(f"{path}: unknown canary file version {shown} (expected "
                         f"{CANARY_FILE_VERSION})")
    if not isinstance(record.get("canaries"), list):
        raise ValueError(f"{path}: not a canary file (no list 'canaries')")
    canaries = []
    for k, c in enumerate(record["canaries"]):
        where = f"{path}: canary #{k}"
        if not isinstance(c, dict):
            raise ValueError(f"{where}: not a JSON object")
        c = dict(c)
        c.pop("text", None)
        missing = sorted(_REQUIRED_CANARY_FIELDS - set(c))
        unknown = set(c) - _CANARY_FIELDS
        if missing or unknown:
            raise ValueError(f"{where}: " + "; ".join(
                ([f"missing field(s) {', '.join(missing)}"] if missing else [])
                + ([f"{len(unknown)} unknown field(s)"] if unknown else [])))
        canary = Canary(**c)
        if canary.placement not in PLACEMENTS:
            raise ValueError(f"{where}: placement ({textcheck.describe(str(canary.placement))})"
                             f" is not one of {PLACEMENTS}")
        if not isinstance(canary.repetitions, int) or canary.repetitions < 0:
            raise ValueError(f"{where}: repetitions must be an integer >= 0")
        try:
            consistent = (len(canary.tokens) == len(canary.token_ids)
                          and 0 <= canary.secret_position < len(canary.token_ids)
                          and canary.token_ids[canary.secret_position] == canary.secret_id)
        except TypeError:
            consistent = False
        if not consistent:
            raise ValueError(f"{where}: tokens, token_ids, secret_position and secret_id "
                             "disagree")
        canaries.append(canary)
    return canaries, record
