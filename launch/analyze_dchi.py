r"""Privacy analyses of dχ token privatization on a BERT embedding space (Qu et al. 2021, Sec. 5).

    python launch/analyze_dchi.py --embeddings=HF_BERT_FOLDER --eta=50,75,100,125,150,175 \
        --corpus=../shared/data/corpus/web_bible.txt.gz --out=DIR \
        [--samples_per_token=1000] [--vocab_sample=N] [--knn_queries=2000] [--max_tokens=100000]

For each η: embedding geometry (Fig. 3), plausible deniability N_w / S_w (Fig. 4) and
token-embedding inversion accuracy (Table 3); see `dpbert/privacy/dchi_analysis.py`. On a CPU, N_w/S_w
use a seeded sample of 200 regular tokens unless --vocab_sample is given (the whole vocabulary
is ~10 hours on 2 cores); --vocab_sample=0 runs the full analysis. The corpus is plain text
(one sentence or document per line; `.gz` read transparently; for `.tsv` the last field).
Writes DIR/results.json and three plots; only aggregates (the corpus may be private).
"""

from __future__ import annotations

import pathlib

from absl import app, flags

from dpbert.runtime import cli

_EMBEDDINGS = flags.DEFINE_string("embeddings", None, "Hugging Face BERT folder providing φ "
                                  "(word embeddings) and vocab.txt.")
_ETA = flags.DEFINE_list("eta", ["50", "75", "100", "125", "150", "175"],
                         "Comma-separated privacy parameters η (> 0).")
_CORPUS = flags.DEFINE_string("corpus", None, "Text file (.gz ok; .tsv: last field) for the "
                              "token-embedding inversion.")
_OUT = flags.DEFINE_string("out", None, "Output folder (created if absent).")
_SAMPLES = flags.DEFINE_integer("samples_per_token", 1000,
                                "M_txt runs per vocabulary token for N_w and S_w.")
_VOCAB_SAMPLE = flags.DEFINE_integer(
    "vocab_sample", None, "Regular tokens (a seeded random subset) for N_w/S_w; 0 = all of "
    "them. Default: all on an accelerator, 200 on a CPU.")
_KNN_QUERIES = flags.DEFINE_integer(
    "knn_queries", 2000, "Query tokens (seeded random subset) for the k-th-neighbour distances; "
    "0 = all regular tokens. Neighbours are always the whole regular vocabulary.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 100_000,
                                   "Corpus tokens used for the inversion accuracy.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed for noise and subsampling.")
_CHUNK = flags.DEFINE_integer("chunk_size", 4096, "Vocabulary chunk of the exact NN search.")
_QUERIES_PER_CALL = flags.DEFINE_integer(
    "queries_per_call", 8192, "Noisy vectors per nearest-neighbour call (memory: x chunk_size).")
flags.mark_flags_as_required(["embeddings", "corpus", "out"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    problem = (cli.check_input_path(_EMBEDDINGS.value, "--embeddings")
               or cli.check_model_folder(_EMBEDDINGS.value, "--embeddings")
               or cli.check_input_path(_CORPUS.value, "--corpus")
               or cli.check_output_dir(_OUT.value, "--out", sources=[
                   (f"--embeddings={_EMBEDDINGS.value}", _EMBEDDINGS.value)]))
    if problem:
        cli.fail("analyze_dchi", problem, cli.BAD_INPUT)
    import jax  # here, so that --help is instant

    from dpbert.privacy import dchi_analysis as lib

    vocab_sample, note = lib.resolve_vocab_sample(_VOCAB_SAMPLE.value, jax.default_backend())
    try:
        results = lib.run_analysis(
            _EMBEDDINGS.value, lib.parse_etas(_ETA.value), _CORPUS.value, _OUT.value,
            samples_per_token=_SAMPLES.value, vocab_sample=vocab_sample,
            knn_queries=_KNN_QUERIES.value, max_tokens=_MAX_TOKENS.value, seed=_SEED.value,
            chunk_size=_CHUNK.value, queries_per_call=_QUERIES_PER_CALL.value,
            notes=[note] if note else ())
    except lib.AnalysisError as e:
        cli.fail("analyze_dchi", str(e), cli.BAD_INPUT)
    lib.print_table(results)
    print(f"wrote {pathlib.Path(_OUT.value) / 'results.json'} and 3 plots")
    if note:
        print(f"note: {note}")


if __name__ == "__main__":
    cli.run(main, "analyze_dchi")
