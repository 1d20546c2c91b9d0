"""``random.Random`` with cheaper ``randint`` and ``choice``: the same draws and the same values.

CPython computes ``randint(a, b)`` as ``randrange(a, b + 1)``, i.e. ``a + _randbelow(b - a +
1)`` after argument checks, and ``choice(seq)`` as ``seq[_randbelow(len(seq))]``, where
``_randbelow(n)`` draws ``n.bit_length()`` random bits until they are below ``n``. The synthetic
notes (~100 such calls per note) and BERT's instance creation (a few per sequence) call them
hundreds of thousands of times; this subclass does the same draws without the checks and the
two frames in between (``random``, ``shuffle``, ``sample`` are ``random.Random``'s). The synthetic
notes and the instances are pinned by tests to what ``random.Random`` gave.
"""

from __future__ import annotations

import random


class Random(random.Random):
    """``random.Random``, with ``randint`` and ``choice`` as CPython computes them (module
    doc)."""

    def randint(self, a: int, b: int) -> int:
        n = b - a + 1
        if n <= 0:
            return super().randint(a, b)  # its ValueError
        # _randbelow_with_getrandbits(n), inlined: k random bits until a value below n.
        k = n.bit_length()
        r = self.getrandbits(k)
        while r >= n:
            r = self.getrandbits(k)
        return a + r

    def choice(self, seq):
        n = len(seq)
        if not n:
            raise IndexError("Cannot choose from an empty sequence")
        k = n.bit_length()
        r = self.getrandbits(k)
        while r >= n:
            r = self.getrandbits(k)
        return seq[r]
