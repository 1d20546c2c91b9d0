"""Rule-based sentence splitting for clinical notes (no external model).

BERT's pretraining examples are built from documents made of sentences; MIMIC-style notes are
not written one sentence per line, so this module turns a note's TEXT into sentences.

What it copes with, and how:

* **Line-wrapped text** (notes wrapped at a fixed width, mid-sentence): a line continues the
  previous one unless there is a structural break (blank line, section header, list item, title
  line), or the previous line is short and the new one starts with a capital (a short line with
  no end punctuation is a field/table row, not a wrapped sentence).
* **Section headers** ("FINDINGS:", "IMPRESSION:", "History of Present Illness:") at the start of
  a line start a new block; a header alone on its line is attached to the first sentence that
  follows it ("IMPRESSION: Minimally improved edema."), so it never becomes a one-word sentence
  (only a header that ends the note stays alone).
* **Title lines** ("FINAL REPORT", "PA AND LATERAL CHEST FILM, ___ AT ___"): all capitals, own
  sentence.
* **Numbered and bulleted lists** ("1. ...", "2) ...", "- ...", "* ..."), on their own lines or
  inline ("IMPRESSION: 1. No pneumonia. 2. Small effusion."): each item is a sentence and the
  item number's period is not a sentence end.
* **De-identification placeholders** ``___``: treated as words (a sentence may start or end with
  one).
* **Abbreviations**: titles ("Dr.", "Mr.", "Mrs.", ...) and initials never end a sentence; dotted
  abbreviations ("p.o.", "b.i.d.", "e.g.") end one only when a capital letter follows; decimals
  ("2.5 cm") are never split because no space follows the point.

Sentences longer than ``max_chars`` (lab tables pasted as one line) are cut at whitespace so a
single "sentence" cannot swallow a whole pretraining example.
"""

from __future__ import annotations

import re

# Words after which a period never ends a sentence (lower-cased, without the period).
_TITLE_ABBREVIATIONS = frozenset({
    "dr", "drs", "mr", "mrs", "ms", "prof", "sr", "jr", "st", "vs", "v", "no", "nos", "approx",
    "appt", "fig", "figs", "ref", "dept", "univ", "inc", "ltd", "co", "mt", "ft", "apt", "ave",
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
})
# Abbreviations that can end a sentence, so the period ends one when a capital follows.
_DOTTED_ABBREVIATION = re.compile(r"^(?:[a-z]\.){1,4}[a-z]?$", re.IGNORECASE)  # p.o b.i.d e.g
_OTHER_ABBREVIATIONS = frozenset({
    "etc", "mg", "mcg", "ml", "cc", "hr", "hrs", "min", "mins", "sec", "wk", "wks", "yr", "yrs",
    "mo", "mos", "pt", "pts", "hx", "dx", "tx", "rx", "sx", "fx", "bx", "qd", "bid", "tid", "qid",
    "qhs", "prn", "po", "iv", "im", "sq", "sc", "pr", "q", "h", "approx", "resp", "temp", "wt",
    "ht", "neg", "pos", "cont", "disch", "adm", "abd", "ext", "max", "tab", "tabs", "cap", "caps",
})

# Words before a one-letter sex ("y/o M."): that period ends the sentence.
_SEX_CONTEXT = frozenset({"y/o", "yo", "old", "year-old", "y.o.", "sex:"})
# A section header at the start of a line: a short label followed by ':' and a space or the end.
_HEADER = re.compile(r"^(?P<label>[A-Za-z][A-Za-z0-9 /&(),'#-]{0,58}?)\s*:(?=\s|$)\s*(?P<rest>.*)$")
_HEADER_FUNCTION_WORDS = frozenset({"of", "and", "or", "the", "on", "at", "to", "for", "in", "with",
                                    "by", "from", "a", "an", "per"})
# List items: "1.", "12)", "a)", "-", "*", "•" followed by a space.
_LIST_ITEM = re.compile(r"^(?:\d{1,2}[.)]|[a-zA-Z][)]|[-*•+])\s+\S")
# Candidate sentence ends: terminal punctuation, optional closing quotes/brackets, whitespace.
_CANDIDATE_END = re.compile(r"[.!?]+[\"')\]]*\s+")
_HAS_WORD = re.compile(r"[A-Za-z0-9]")

# A line shorter than this with no end punctuation is a field/table row rather than a line of
# wrapped prose; wrapped prose lines are long (MIMIC wraps near 70-80 characters).
_SHORT_LINE = 40


# ASCII text: at least two letters; a lower-case letter. Where a line is ASCII, these decide
# "two letters or more, all upper case" without a Python loop over its characters.
_TWO_LETTERS = re.compile(r"[A-Za-z][^A-Za-z]*[A-Za-z]")
_LOWER = re.compile(r"[a-z]")


def _two_letters_all_upper(text: str) -> tuple[bool, bool]:
    """(``text`` has at least two letters, they are all upper case)."""
    if text.isascii():
        if _TWO_LETTERS.search(text) is None:
            return False, False
        return True, _LOWER.search(text) is None
    letters = [c for c in text if c.isalpha()]
    return len(letters) >= 2, all(c.isupper() for c in letters)


def _is_header_label(label: str) -> bool:
    """True when `label` looks like a section header (all caps, or short Title Case phrase)."""
    two, upper = _two_letters_all_upper(label)
    if not two:
        return False
    if upper:
        return True
    words = label.split()
    if len(words) > 5:
        return False
    return all(w[0].isupper() or w.lower() in _HEADER_FUNCTION_WORDS or not w[0].isalpha()
               for w in words) and words[0][0].isupper()


def _is_title_line(line: str) -> bool:
    """An all-capitals line without end punctuation ("FINAL REPORT")."""
    if not line or len(line) > 80 or line[-1] in ".!?:":
        return False
    two, upper = _two_letters_all_upper(line)
    return two and upper


def _blocks(text: str) -> list[str]:
    """Groups a note's lines into blocks (paragraph, header section, list item, title).

    A header alone on its line is prepended to the following block.
    """
    blocks: list[str] = []
    current: list[str] = []
    pending_header = ""

    def flush() -> None:
        nonlocal current
        if current:
            blocks.append(" ".join(current))
        current = []

    def start(piece: str) -> None:
        nonlocal pending_header
        flush()
        if pending_header:
            piece = f"{pending_header} {piece}"
            pending_header = ""
        current.append(piece)

    for raw in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        line = " ".join(raw.split())  # tabs / runs of spaces -> one space
        if not line:
            flush()
            continue
        m = _HEADER.match(line)
        if m and _is_header_label(m.group("label")):
            label = m.group("label").strip() + ":"
            if pending_header:  # headers in a row ("FINDINGS:" then "PORTABLE CHEST:")
                label = f"{pending_header} {label}"
                pending_header = ""
            if m.group("rest"):
                start(f"{label} {m.group('rest')}")
            else:
                flush()
                pending_header = label
            continue
        if _LIST_ITEM.match(line):
            start(line)
            continue
        if _is_title_line(line) and not pending_header:
            flush()
            blocks.append(line)
            continue
        if current:
            prev = current[-1]
            wrapped = (len(prev) >= _SHORT_LINE or prev[-1] in ",;-/" or line[0].islower()
                       or not line[0].isalpha())
            if prev[-1] in ".!?" or wrapped:
                # Joined; a sentence end inside is found by the splitter below.
                current.append(line)
                continue
        start(line)
    flush()
    if pending_header:
        blocks.append(pending_header)
    return blocks


def _previous_word(block: str, end: int) -> str:
    """The whitespace-delimited word ending at `end` (exclusive), opening brackets removed."""
    start = block.rfind(" ", 0, end) + 1
    return block[start:end].lstrip("([\"'")


def _split_block(block: str) -> list[str]:
    """Splits one block (no newlines) into sentences."""
    sentences: list[str] = []
    start = 0
    for m in _CANDIDATE_END.finditer(block):
        end = m.end()
        if end >= len(block):
            break
        nxt = block[end]
        word = _previous_word(block, m.start())  # "p.o" for "p.o. The"
        lower = word.lower()
        if nxt.islower():
            continue  # "approx. three", "q.d. and"
        if lower in _TITLE_ABBREVIATIONS and block[m.start()] == ".":
            continue  # "Dr. Smith", "No. 5"
        if (len(word) == 1 and word.isupper() and block[m.start()] == "." and nxt.isupper()
                and _previous_word(block, m.start() - 2).lower() not in _SEX_CONTEXT):
            continue  # initials: "J. Smith" (but "60 y/o M. He ..." ends a sentence)
        if word.isdigit() and len(word) <= 2 and block[m.start()] == ".":
            # "1. No pneumonia": an item number at the start of the sentence is no sentence end.
            before = block[start:m.start() - len(word)].strip()
            if not before or before.endswith(":"):
                continue
        if not (nxt.isupper() or nxt.isdigit() or nxt in "_#([\"'"):
            continue
        # Dotted ("p.o.") and unit abbreviations end a sentence only before a capital letter.
        if block[m.start()] == "." and (_DOTTED_ABBREVIATION.match(word)
                                         or lower in _OTHER_ABBREVIATIONS):
            if not nxt.isupper():
                continue
        sentences.append(block[start:end].strip())
        start = end
    sentences.append(block[start:].strip())
    return sentences


def _cut_long(sentence: str, max_chars: int) -> list[str]:
    """Cuts a sentence longer than `max_chars` at whitespace (a word longer than it stays whole)."""
    if len(sentence) <= max_chars:
        return [sentence]
    pieces, current, length = [], [], 0
    for word in sentence.split(" "):
        if current and length + 1 + len(word) > max_chars:
            pieces.append(" ".join(current))
            current, length = [], 0
        current.append(word)
        length += len(word) + (1 if length else 0)
    if current:
        pieces.append(" ".join(current))
    return pieces


def split_sentences(text: str, *, max_chars: int = 1000) -> list[str]:
    """Splits a clinical note (or any prose) into sentences.

    Args:
      text: the note's text, with its original line breaks.
      max_chars: sentences longer than this are cut at whitespace.

    Returns:
      The sentences in order, whitespace-normalized, each containing a letter or digit.
    """
    out: list[str] = []
    for block in _blocks(text):
        for sentence in _split_block(block):
            if _HAS_WORD.search(sentence):
                out.extend(_cut_long(sentence, max_chars))
    return out
