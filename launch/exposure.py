r"""Secret-sharer exposure of the canaries planted in a finished training run.

    python launch/exposure.py --workdir=RUN [--out=DIR] [--step=S]
    python launch/exposure.py --workdir=NON_DP_RUN --compare=DP_RUN --out=DIR    # Fig. 2's shape

The run must have been trained with --config.data.canaries.enabled=True (DP or not); include
repetitions 0 (never-planted reference canaries) to measure the floor. Writes DIR/results.json
(per-canary rows, mean ± sd per (form, repetitions), the runs' ε) and DIR/exposure.png
(exposure vs repetitions). DIR defaults to RUN/exposure. See dpbert/leakage/exposure.py.
"""

import json
import os
import pathlib

from absl import app, flags

from dpbert.runtime import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "A dpbert training workdir with canaries.")
_COMPARE = flags.DEFINE_list("compare", [], "More training workdirs drawn in the same figure "
                             "(e.g. the DP run next to the non-DP one).")
_LABELS = flags.DEFINE_list("labels", [], "One label per run (--workdir first); default: the "
                            "workdirs' names.")
_OUT = flags.DEFINE_string("out", None, "Output folder (default: WORKDIR/exposure).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step of --workdir (default: newest).")
_CANARY_FILE = flags.DEFINE_string("canary_file", None, "The canary record of --workdir, if it "
                                   "cannot be found from the workdir.")
_EXTRAPOLATE = flags.DEFINE_bool("extrapolate", True, "Also the skew-normal extrapolation.")
flags.mark_flag_as_required("workdir")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from dpbert.leakage import exposure  # noqa: PLC0415 - --help stays instant

    workdirs = [_WORKDIR.value, *_COMPARE.value]
    labels = list(_LABELS.value) or [pathlib.Path(w).name for w in workdirs]
    if len(labels) != len(workdirs) or len(set(labels)) != len(labels):
        raise app.UsageError(f"--labels needs {len(workdirs)} distinct labels, got {labels}")
    for flag, value in [("--workdir", _WORKDIR.value)] + [("--compare", w)
                                                          for w in _COMPARE.value]:
        problem = cli.check_input_path(value, flag)
        if problem:
            raise app.UsageError(problem)
    out_flag = "--out" if _OUT.present else "--out (default WORKDIR/exposure)"
    out_value = _OUT.value if _OUT.present else os.path.join(_WORKDIR.value, "exposure")
    # Checked before any model is loaded. The default WORKDIR/exposure lies inside a workdir,
    # which is fine; a workdir itself (or a folder holding one) is not.
    problem = cli.check_output_dir(out_value, out_flag, sources=[
        (f"--workdir={w}" if i == 0 else f"--compare={w}", w) for i, w in enumerate(workdirs)],
        inside_sources_ok=True)
    if problem:
        cli.fail("exposure", problem)
    out = pathlib.Path(out_value)
    runs = []
    try:
        for i, (w, label) in enumerate(zip(workdirs, labels)):
            res = exposure.evaluate_workdir(
                w, step=_STEP.value if i == 0 else None,
                canary_file=_CANARY_FILE.value if i == 0 else None,
                extrapolate=_EXTRAPOLATE.value)
            res["label"] = label
            runs.append(res)
    except (FileNotFoundError, ValueError) as e:
        cli.fail("exposure", str(e))
    out.mkdir(parents=True, exist_ok=True)
    results = {
        "what": "secret-sharer exposure (Carlini et al. 2019) of the planted canaries: "
                "exposure = log2|R| - log2 rank of the secret among the candidate set R by the "
                "MLM at the masked secret position (ties not counted); exposure_extrapolated = "
                "-log2 F(loss of the secret), F a skew-normal fitted to the other candidates' "
                "losses; repetitions 0 = never-planted reference canaries (the floor: "
                "floor_theory = log2|R| - log2(|R|!)/|R|, 1.27 bits for |R| = 21, -> 1/ln 2 = "
                "1.44 as |R| grows); epsilon is the training's (the claim canaries test), "
                "total_epsilon the run's headline",
        "runs": [{"label": r["label"], **r["run"]} for r in runs],
        "canaries": [{"run": r["label"], **row} for r in runs for row in r["canaries"]],
        "summary": [{"run": r["label"], **row} for r in runs for row in r["summary"]],
    }
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    exposure.plot(runs, out / "exposure.png")
    for r in runs:
        run = r["run"]
        eps = (f"training epsilon {run['epsilon']:.3g}, total "
               f"{run['total_epsilon'] or float('nan'):.3g}" if run["dp"] else "no DP")
        print(f"{r['label']} (step {run['step']}, {eps}, |R| = {run['num_candidates']}, floor "
              f"{run['floor_theory']:.2f} bits):")
        for s in r["summary"]:
            ext = s["exposure_extrapolated_mean"]
            print(f"  {s['form']:>6} x{s['repetitions']:<6} n={s['n']:<3} exposure "
                  f"{s['exposure_mean']:6.2f}"
                  + (f" ± {s['exposure_sd']:.2f}" if s["exposure_sd"] is not None else "")
                  + (f"  extrapolated {ext:7.2f}" if ext is not None else ""))
    print(f"wrote {out / 'results.json'} and {out / 'exposure.png'}")


if __name__ == "__main__":
    cli.run(main, "exposure")
