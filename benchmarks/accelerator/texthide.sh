#!/usr/bin/env bash
# Issue 33, experiment 3: TextHide (Huang et al. 2020) at the paper's epochs. MiniLM-L6 fine-
# tuned on all 8,454 RT training rows for 20 epochs (batch 32, AdamW lr 1e-4, max 64 pieces;
# dev: the 1,057 RT dev rows) in three runs of launch/finetune.py: TextHide intra (m, k) =
# (256, 4), plain fine-tuning (mode none, the same recipe), TextHide inter (256, 4) with Amazon's
# training sentences as the public set (labels ignored). On the CPU each mask was seen ~16
# times (2,000 rows x 2 epochs / 256: dev 0.502, plain 0.828); here 8,454 x 20 / 256 = 660
# (the paper's SST-2 runs: ~5,000). Issue 13's bar: intra within 4 points of plain.
#
#   benchmarks/accelerator/texthide.sh           # one H100 (<= 8 minutes); carry .whl
#   benchmarks/accelerator/texthide.sh --smoke   # the same parts on the CPU, tiny sizes
#
# Estimated time on one H100 (no dpbert step has been timed on a GPU yet): 20 epochs = 5,284
# steps of 32; at batch 32 a MiniLM step is launch-bound, assumed 8-15 ms (the demo's tiny
# model ran ~27 steps/s of 256 on an H100, ~37 ms per call with its host pipeline): 45-80 s,
# + compile ~30-40 s + start-up and evaluation 15 s: 90-135 s a run; installs 20 s; in all
# 290-425 s for the three runs against the 470 s budget (inter, the last, is the one cut).
# Env overrides: TH_NO_PLAIN (non-empty: no plain run, e.g. when its row exists), TH_EPOCHS
# (20), TH_LR (1e-4), TH_ROWS (0 = all), TH_EXTRA (launcher flags for the two TextHide runs,
# e.g. the paper's head instead of the default: "--config.privacy.texthide_head_input_norm=none
# --config.privacy.texthide_head_init=0.02").
# Measured on one H200 (2026-11-27, TH_BUDGET_S=340, the paper's head, the default then):
# 197 s wall; intra 59 s, plain 50 s, inter 86 s; dev intra 0.471 and inter 0.471 (constant;
# train loss ln 2 throughout), plain 0.875 (BENCHMARKS "At accelerator scale").
# On one H100 with the head's input RMS-normalised and init 0.1 (the defaults since; then set
# by TH_EXTRA), TH_NO_PLAIN=1, TH_BUDGET_S=330: 192 s wall; intra 86 s, inter 104 s; dev intra
# 0.849, inter 0.856.
# --smoke: 1 epoch, m = 16, the RT and Amazon files cut to 64 rows (common.sh), and a
# random 2-layer BERT of width 64 with MiniLM's vocabulary instead of MiniLM.
#
# Writes to $OUT: texthide.json (every part: rc, seconds, the run's dev accuracy, epochs,
# steps, wall seconds; the end of its log) and texthide.log.
set -u
cd "$(dirname "$0")/../.." || exit 1
source benchmarks/accelerator/common.sh
acc_init texthide "${TH_BUDGET_S:-}" 470 290 "$@"
acc_smoke_model

DATA=${DPBERT_SHARED_DATA:-$(cd .. && pwd)/shared/data}
MINILM=$($PY -c "import bench_report; print(bench_report.minilm())" 2>/dev/null)
if [ $SMOKE = 1 ]; then
  EPOCHS=${TH_EPOCHS:-1}; ROWS=${TH_ROWS:-64}; M=16
else
  EPOCHS=${TH_EPOCHS:-20}; ROWS=${TH_ROWS:-0}; M=256
fi
# ft NAME ARGS...: one launch/finetune.py run in WORK/NAME; its figures as one JSON line.
ft() {
  local name=$1
  shift
  $PY launch/finetune.py --config=configs/finetune_classification.py --workdir="$WORK/$name" \
    --config.model.init_from_hf="$MINILM" --config.data.train="$DATA/sentiment/rt_train.tsv" \
    --config.data.eval="$DATA/sentiment/rt_dev.tsv" --config.data.max_train_examples="$ROWS" \
    --config.train.epochs="$EPOCHS" --config.optimizer.learning_rate="${TH_LR:-1e-4}" \
    --config.seed=0 --config.checkpoint.every_steps=0 --config.train.export_hf=False "$@" >&2 \
    && $PY benchmarks/accelerator/collect.py finetune "$WORK/$name"
}
export -f ft
export DATA MINILM EPOCHS ROWS WORK

TEXTHIDE="--config.privacy.mode=texthide --config.privacy.m=$M --config.privacy.k=4 ${TH_EXTRA:-}"
part versions 30 $PY benchmarks/accelerator/collect.py versions
part intra_256_4 150 bash -c "ft intra $TEXTHIDE --config.privacy.variant=intra"
[ -n "${TH_NO_PLAIN:-}" ] || part plain 150 bash -c "ft plain --config.privacy.mode=none"
part inter_256_4 150 bash -c "ft inter $TEXTHIDE --config.privacy.variant=inter \
  --config.privacy.public_file=$DATA/sentiment/amazon_train.tsv"
acc_done
