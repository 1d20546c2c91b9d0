r"""dpbert's train steps beside PyTorch's (eager) and Opacus's, on one CPU, same shapes.

    pip install opacus --no-deps      # benchmark-only (setup.py extra "bench")
    PYTHONPATH=. python benchmarks/torch_step.py [--models=tiny,mini] [--write]

For each BERT size (vocabulary 30,522, seq 128, 20 predictions, batch 32, dropout on, AdamW,
C = 1, sigma = 1) one step of:

* dpbert non-private (XLA, one CPU device; the step of benchmarks/dp_step.py),
* dpbert DP-SGD with the default clipper (configs/common.py `dp.clipping`) and with
  `mixed_ghost`,
* PyTorch eager non-private: `transformers.BertForPreTraining` with the MLM head applied to the
  gathered masked positions (as dpbert does; HF's forward would score all 128 positions),
* Opacus DP-SGD on the same module and forward (per-sample gradients by hooks,
  `GradSampleModule` + `DPOptimizer`), and Opacus's "ghost" fast gradient clipping
  (`GradSampleModuleFastGradientClipping`, two backward passes) where it runs,

in interleaved rounds (median of per-round times).  PyTorch runs with its default intra-op
threads (all cores); XLA with its own pool.
"""

from __future__ import annotations

import os
import sys

from absl import app

# One CPU device for XLA (set before dp_step imports JAX); the flags are dp_step's
# (--models, --batch_size, --seq_len, --preds, --vocab_size, --rounds, --write).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=1").strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import dp_step  # noqa: E402  (benchmarks/dp_step.py: the dpbert steps and the flags)

_MODELS, _BATCH, _SEQ, _PREDS = dp_step._MODELS, dp_step._BATCH, dp_step._SEQ, dp_step._PREDS
_VOCAB, _ROUNDS, _WRITE = dp_step._VOCAB, dp_step._ROUNDS, dp_step._WRITE

import platform as platform_lib  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

import bench_report  # noqa: E402
from dpbert.models import bert as model_lib  # noqa: E402

SECTION = "## PyTorch and Opacus on CPU"


def torch_model(preset: str) -> torch.nn.Module:
    layers, hidden, heads = model_lib.PRESETS[preset]
    config = transformers.BertConfig(
        vocab_size=_VOCAB.value, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=4 * hidden, hidden_act="gelu",
        max_position_embeddings=512, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(config).train()
    head = model.cls.predictions
    assert head.decoder.bias is head.bias
    # The head owns the decoder's bias a second time; Opacus would then treat the whole head as
    # one module for functorch (which fails on transformers 5 here). The bias stays the decoder
    # Linear's: same parameters, same numerics.
    del head._parameters["bias"]
    return model


def torch_batch(batch: dict) -> dict:
    return {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}


def torch_loss(model: torch.nn.Module, b: dict, reduction: str = "mean") -> torch.Tensor:
    """MLM (gathered positions) + NSP loss, mean over the batch (or per example)."""
    ids = b["input_ids"].long()
    # Explicit per-example position ids (HF's default is one broadcast row, which Opacus would
    # see as a batch of 1).
    # (on the ids' device; contiguous: Opacus's ghost clipping views them)
    positions = torch.arange(ids.shape[1], device=ids.device)[None].expand(
        ids.shape[0], -1).contiguous()
    seq, pooled = model.bert(input_ids=ids, attention_mask=b["input_mask"].long(),
                             token_type_ids=b["segment_ids"].long(), position_ids=positions,
                             return_dict=False)[:2]
    pos = b["masked_lm_positions"].long()
    gathered = torch.gather(seq, 1, pos[..., None].expand(-1, -1, seq.shape[-1]))
    logits = model.cls.predictions(gathered)
    nsp = model.cls.seq_relationship(pooled)
    mlm = torch.nn.functional.cross_entropy(
        logits.transpose(1, 2), b["masked_lm_ids"].long(), reduction="none")
    w = b["masked_lm_weights"]
    per_example = (mlm * w).sum(1) / w.sum(1).clamp(min=1.0) + torch.nn.functional.cross_entropy(
        nsp, b["next_sentence_labels"].long(), reduction="none")
    return per_example.mean() if reduction == "mean" else per_example


class TorchPlain:
    def __init__(self, preset, batch):
        self.model = torch_model(preset)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, weight_decay=0.01)
        self.batch = batch

    def __call__(self):
        self.opt.zero_grad(set_to_none=True)
        torch_loss(self.model, self.batch).backward()
        self.opt.step()


class Opacus:
    """Opacus DP-SGD step: per-sample gradients (hooks, or ghost clipping), clip, noise, AdamW."""

    def __init__(self, preset, batch, mode: str = "hooks"):
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        model = torch_model(preset)
        self.mode = mode
        if mode == "ghost":
            from opacus.grad_sample import GradSampleModuleFastGradientClipping
            from opacus.optimizers import DPOptimizerFastGradientClipping
            from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

            self.module = GradSampleModuleFastGradientClipping(model, max_grad_norm=1.0,
                                                               use_ghost_clipping=True)
            opt = torch.optim.AdamW(self.module.parameters(), lr=1e-4, weight_decay=0.01)
            self.opt = DPOptimizerFastGradientClipping(
                opt, noise_multiplier=1.0, max_grad_norm=1.0,
                expected_batch_size=_BATCH.value)
            self.criterion = DPLossFastGradientClipping(
                self.module, self.opt, _PerExample(self), loss_reduction="mean")
        else:
            self.module = GradSampleModule(model)
            opt = torch.optim.AdamW(self.module.parameters(), lr=1e-4, weight_decay=0.01)
            self.opt = DPOptimizer(opt, noise_multiplier=1.0, max_grad_norm=1.0,
                                   expected_batch_size=_BATCH.value)
        self.batch = batch

    def __call__(self):
        self.opt.zero_grad(set_to_none=True)
        if self.mode == "ghost":
            self.criterion(None, None).backward()
        else:
            torch_loss(self.module._module, self.batch).backward()
        self.opt.step()


class _PerExample(torch.nn.Module):
    """Adapter: Opacus's DPLoss calls criterion(output, target) for per-example losses."""

    def __init__(self, owner):
        super().__init__()
        self.owner = owner
        self.reduction = "mean"  # DPLoss sets "none" around the call; we return per example

    def forward(self, output, target):
        del output, target
        return torch_loss(self.owner.module._module, self.owner.batch, reduction="none")


class Jax:
    """One compiled dpbert step (dp_step.Bench on one device), fed its own outputs."""

    def __init__(self, bench, kind: str):
        b = _BATCH.value
        fn, args = bench.plain_step(b) if kind == "plain" else bench.dp_step(kind, b)
        self.kind, self.fn, self.args = kind, Bench.compile(fn, args)[0], args

    def __call__(self):
        out = jax.block_until_ready(self.fn(*self.args))
        if self.kind == "plain":
            self.args = out + self.args[2:]
        else:
            self.args = (out[2], out[0], out[1]) + self.args[3:]


Bench = dp_step.Bench


def bench_model(preset: str) -> dict:
    bench = Bench(preset, 1)
    batch = torch_batch(dp_step.synthetic_batch(_BATCH.value, _SEQ.value, _PREDS.value,
                                                _VOCAB.value))
    steps = {"dpbert non-private": Jax(bench, "plain")}
    for c in dict.fromkeys([dp_step.DEFAULT_CLIPPER, "mixed_ghost"]):
        steps[f"dpbert DP ({c})"] = Jax(bench, c)
    steps["PyTorch non-private"] = TorchPlain(preset, batch)
    steps["Opacus DP (hooks)"] = Opacus(preset, batch)
    try:
        ghost = Opacus(preset, batch, "ghost")
        ghost()
        steps["Opacus DP (ghost clipping)"] = ghost
    except Exception as e:  # noqa: BLE001  (report, do not hide: printed below)
        print(f"[{preset}] Opacus ghost clipping does not run here: {type(e).__name__}: {e}",
              file=sys.stderr)
    times = {k: [] for k in steps}
    for f in steps.values():  # warm-up
        f()
    names = list(steps)
    for r in range(_ROUNDS.value):
        for name in (names if r % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - start)
        print(f"[{preset}] round {r}: " + ", ".join(f"{k} {v[-1]:.2f}"
                                                   for k, v in times.items()), file=sys.stderr)
    return {"preset": preset, "params": bench.num_params, "times": times}


def main(argv):
    del argv
    warnings.filterwarnings("ignore")
    rows = [bench_model(m) for m in _MODELS.value]
    load = os.getloadavg()[0]
    lines = [SECTION, "",
             f"`PYTHONPATH=. python benchmarks/torch_step.py --models={','.join(_MODELS.value)}` "
             f"on {platform_lib.machine()}, {os.cpu_count()} CPU cores; JAX {jax.__version__} "
             f"(1 CPU device), PyTorch {torch.__version__} ({torch.get_num_threads()} threads), "
             f"transformers {transformers.__version__}, Opacus "
             f"{__import__('opacus').__version__}; load average {load:.1f} at the end. "
             f"Vocabulary {_VOCAB.value}, seq {_SEQ.value}, {_PREDS.value} predictions, batch "
             f"{_BATCH.value}, dropout on, AdamW; DP: C=1, sigma=1. Median of {_ROUNDS.value} "
             "interleaved rounds; ratios per round against PyTorch's non-private step, then the "
             "median (range: min-max over the rounds).", "",
             "| model | step | s | vs. PyTorch non-private (range) |", "|---|---|---|---|"]
    for r in rows:
        base = r["times"]["PyTorch non-private"]
        for name, ts in r["times"].items():
            ratios = [t / b for t, b in zip(ts, base)]
            lines.append(f"| {r['preset']} | {name} | {statistics.median(ts):.2f} | "
                         f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-"
                         f"{max(ratios):.2f}) |")
    text = "\n".join(lines) + "\n"
    print(text)
    if _WRITE.value:
        bench_report.write_section(SECTION, text, keep_subsections=True)


if __name__ == "__main__":
    app.run(main)
