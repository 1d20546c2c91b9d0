r"""Exports a BERT to a Hugging Face folder that `transformers` loads.

    python launch/export_hf.py --workdir=TRAINING_WORKDIR --out=DST [--step=S] [--overwrite]

exports a saved training step (default: the newest) with its privacy report in the model card;

    python launch/export_hf.py --from_hf=SRC_HF_FOLDER --out=DST [--overwrite]

round-trips a HF BERT folder through dpbert (load into the Flax model, write it back out).

--out must be absent or empty; --overwrite replaces a previous export there as a whole (written
beside it, then swapped in: no file of the old export survives, and a failure keeps the old one).
--out is never the source, a folder inside --from_hf, one holding the source, the current
directory or empty. A source without MLM/NSP heads (a BertModel such as MiniLM) gets them
initialised at random, and the model card says so. A fine-tuned task model
(BertForSequenceClassification, BertForTokenClassification, ...: its config.json's
`architectures`, or a trained head in its weights) is refused, since the export would drop
its head and labels; so is a training workdir given as --from_hf (its model is WORKDIR/hf).
"""

from absl import app, flags

from dpbert.runtime import cli

_FROM_HF = flags.DEFINE_string("from_hf", None, "Source Hugging Face BERT folder.")
_WORKDIR = flags.DEFINE_string("workdir", None, "A dpbert training workdir.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the newest).",
                             lower_bound=0)
_OUT = flags.DEFINE_string("out", None, "Destination folder (created if absent; must be empty "
                           "unless --overwrite).")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace a previous Hugging Face export in "
                               "--out (as a whole; no stale files are kept).")
flags.mark_flag_as_required("out")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    given = [f for f in (_FROM_HF, _WORKDIR) if f.present]
    if len(given) != 1:
        raise app.UsageError("give exactly one source: --workdir=DIR or --from_hf=DIR")
    source = given[0]
    problem = cli.check_input_path(source.value, f"--{source.name}")
    if problem:
        raise app.UsageError(problem)
    if source is _FROM_HF:
        problem = cli.check_model_folder(source.value, "--from_hf")
        if problem:
            cli.fail("export_hf", f"{problem}; to export one of its checkpoints, give "
                                  f"--workdir={source.value}", cli.BAD_INPUT)
    if _STEP.value is not None and not _WORKDIR.present:
        raise app.UsageError("--step applies to --workdir exports only")
    # Checked before anything is loaded: a refusal costs no time and writes nothing. The export
    # may not be (or hold) its source; a workdir's own WORKDIR/hf is fine.
    sources = [(f"--{source.name}={source.value}", source.value)]
    problem = cli.check_output_path(_OUT.value, "--out", sources=sources,
                                    inside_sources_ok=source is _WORKDIR)
    if problem:
        cli.fail("export_hf", problem, cli.BAD_INPUT)
    from dpbert.models import hf_export  # here, so that --help is instant

    try:
        hf_export.check_export_destination(_OUT.value, overwrite=_OVERWRITE.value, sources=sources,
                                    inside_sources_ok=source is _WORKDIR)
        if _WORKDIR.value:
            from dpbert.tasks import export
            out = export.export_from_workdir(_WORKDIR.value, _OUT.value, _STEP.value)
        else:
            out = hf_export.export_from_hf(_FROM_HF.value, _OUT.value, overwrite=_OVERWRITE.value)
    except (hf_export.CheckpointError, FileNotFoundError, ValueError) as e:
        cli.fail("export_hf", str(e), cli.BAD_INPUT)
    except OSError as e:
        cli.fail("export_hf", f"{e.filename or _OUT.value}: {e.strerror or e}",
                 cli.BAD_INPUT)
    print(f"wrote {out}")


if __name__ == "__main__":
    cli.run(main, "export_hf")
