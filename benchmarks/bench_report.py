"""Writing one benchmark's section of BENCHMARKS.md, leaving the other sections alone.

Imported by the scripts beside it as `import bench_report`.
"""

from __future__ import annotations

import pathlib

BENCHMARKS_MD = pathlib.Path(__file__).resolve().parents[1] / "BENCHMARKS.md"


def write_section(heading: str, text: str, *, keep_subsections: bool = False,
                  path: pathlib.Path = BENCHMARKS_MD) -> None:
    """Replaces the section that starts with `heading` (e.g. "## DP vocabulary") by `text`,
    or appends `text` if there is no such section.

    The section ends at the next "## " heading; with `keep_subsections` it ends at the first
    "### " subsection already, so hand-written notes below the generated table survive.
    """
    old = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    start = old.find(heading)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        markers = ("\n## ", "\n### ") if keep_subsections else ("\n## ",)
        ends = [e for e in (old.find(m, start + len(heading)) for m in markers) if e >= 0]
        new = old[:start] + text + (old[min(ends) + 1:] if ends else "")
    path.write_text(new.rstrip("\n") + "\n", encoding="utf-8")
