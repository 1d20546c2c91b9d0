r"""Exports a BERT to a Hugging Face folder that `transformers` loads.

    python launch/export_hf.py --from_hf=SRC_HF_FOLDER --out=DST

round-trips a HF BERT folder through dpbert (load into the Flax model, write it back out).
"""

from absl import app, flags

from dpbert import hf

_FROM_HF = flags.DEFINE_string("from_hf", None, "Source Hugging Face BERT folder.")
_OUT = flags.DEFINE_string("out", None, "Destination folder (created if absent).")
flags.mark_flag_as_required("out")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _FROM_HF.value:
        raise app.UsageError("give the source: --from_hf=DIR")
    try:
        out = hf.export_from_hf(_FROM_HF.value, _OUT.value)
    except (hf.CheckpointError, FileNotFoundError, ValueError) as e:
        raise SystemExit(f"export_hf: {e}") from None
    print(f"wrote {out}")


if __name__ == "__main__":
    app.run(main)
