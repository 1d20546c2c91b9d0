r"""Opacus's DP-SGD steps (hooks, ghost clipping) and PyTorch's non-private step on one GPU.

    PYTHONPATH=.:benchmarks python benchmarks/accelerator/opacus_step.py --models=base --json

The modules, loss and steps of benchmarks/torch_step.py (BERT with the MLM head on the gathered
positions, AdamW, C = 1, sigma = 1), moved to CUDA (TF32 on) when there is one, else the CPU
(`--smoke`); ghost clipping with the MLM decoder untied from the word embeddings (Opacus
refuses tied parameters there), as in issue 32's first GPU run.  One JSON object per model:
median step seconds of interleaved rounds, peak
memory, the ratios to the non-private step, the versions.  A step that does not run is
reported with its error, not hidden.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import torch_step  # benchmarks/torch_step.py: dp_step's flags, the modules and steps
from absl import app

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
_make = torch_step.torch_model
UNTIE = {"on": False}  # Opacus's ghost clipping refuses tied parameters


def _model(preset: str) -> torch.nn.Module:
    model = _make(preset)
    if UNTIE["on"]:  # the MLM decoder gets its own copy of the word embeddings
        decoder = model.cls.predictions.decoder
        decoder.weight = torch.nn.Parameter(decoder.weight.detach().clone())
    return model.to(DEVICE)


torch_step.torch_model = _model


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def main(argv):
    del argv
    if DEVICE == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    import opacus  # noqa: F401  (fails loudly: the part's log says it is missing)

    for preset in torch_step._MODELS.value:
        ds = torch_step.dp_step
        batch = {k: v.to(DEVICE) for k, v in torch_step.torch_batch(ds.synthetic_batch(
            ds._BATCH.value, ds._SEQ.value, ds._PREDS.value, ds._VOCAB.value)).items()}
        row = {"model": preset, "device": DEVICE, "batch_size": ds._BATCH.value,
               "seq_len": ds._SEQ.value, "tf32": DEVICE == "cuda",
               "versions": {"torch": torch.__version__, "opacus": opacus.__version__,
                            "transformers": torch_step.transformers.__version__},
               "steps": {}}
        makers = {"torch_plain": lambda: torch_step.TorchPlain(preset, batch),
                  "opacus_hooks": lambda: torch_step.Opacus(preset, batch),
                  "opacus_ghost": lambda: torch_step.Opacus(preset, batch, "ghost")}
        for name, make in makers.items():  # one at a time: each step's own peak memory
            try:
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                UNTIE["on"] = name == "opacus_ghost"
                step = make()
                step()  # warm-up (allocates)
                _sync()
                times = []
                for _ in range(ds._ROUNDS.value):
                    t = time.perf_counter()
                    step()
                    _sync()
                    times.append(time.perf_counter() - t)
                row["steps"][name] = {
                    "s": statistics.median(times),
                    "peak_mib": (torch.cuda.max_memory_allocated() / 2 ** 20
                                 if DEVICE == "cuda" else None)}
                del step
            except Exception as e:  # noqa: BLE001  (reported in the row, not hidden)
                row["steps"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                print(f"[{preset}] {name}: {type(e).__name__}: {e}", file=sys.stderr)
        plain = row["steps"]["torch_plain"].get("s")
        for v in row["steps"].values():
            if plain and v.get("s"):
                v["ratio"] = v["s"] / plain
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    app.run(main)
