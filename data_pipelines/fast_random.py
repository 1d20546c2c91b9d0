"""``random.Random`` with cheaper ``randint`` and ``choice``: the same draws and the same values.

CPython computes ``randint(a, b)`` as ``randrange(a, b + 1)``, i.e. ``a + _randbelow(b - a +
1)`` after argument checks, and ``choice(seq)`` as ``seq[_randbelow(len(seq))]``. The synthetic
notes (~100 such calls per note) and BERT's instance creation (a few per sequence) call them
hundreds of thousands of times; this subclass skips the checks and ``randrange``'s frame, nothing
else (``_randbelow``, ``random``, ``shuffle``, ``sample`` are ``random.Random``'s). The synthetic
notes and the instances are pinned by tests to what ``random.Random`` gave.
"""

from __future__ import annotations

import random


class Random(random.Random):
    """``random.Random``, with ``randint`` and ``choice`` as CPython computes them (module
    doc)."""

    def randint(self, a: int, b: int) -> int:
        if b < a:
            return super().randint(a, b)  # its ValueError
        return a + self._randbelow(b - a + 1)

    def choice(self, seq):
        if not len(seq):
            raise IndexError("Cannot choose from an empty sequence")
        return seq[self._randbelow(len(seq))]
