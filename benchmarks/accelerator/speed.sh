#!/usr/bin/env bash
# The prepared device run of issue 32: dpbert's DP / non-DP step on one GPU beside Opacus's.
#
#   benchmarks/accelerator/speed.sh           # one H100 (<= 8 minutes); wheels from .whl/
#   benchmarks/accelerator/speed.sh --smoke   # the same parts on the CPU, tiny sizes (< 5 min)
#
# Everything goes to $OUT (a temporary folder when unset; benchmarks/accelerator/common.sh
# holds the machinery the prepared scripts share): speed.json (every part: exit code,
# seconds, its JSON rows, the end of its log; rewritten after each part, so a run cut short
# still leaves the parts done) and speed.log (the parts' logs).  Progress lines carry the
# elapsed seconds.  Each part runs under its own `timeout`, and the parts share a budget
# ($SPEED_BUDGET_S, default 470 s; smoke 290 s): a part that would not fit is skipped.
# Parts, most wanted first: versions; BERT-base seq 128, batch 32, fp32: non-private and DP
# step (dp_step.py --quick: time, compile seconds, temp memory; the DP step also with its
# clipping's contractions at the default precision, TF32; a jax.profiler trace of each step,
# $OUT/profile_dp_fp32.trace.json.gz); dpbert.prng's default generator on the GPU checked
# against jax.random (on one GPU jaxlib's CUDA threefry kernel: the bits must be the same); the
# same two steps with DPBERT_PRNG=unrolled (the unrolled threefry, the GPU's default before
# 2026-12-02: what the kernel saves in compile seconds and costs in step time); Opacus (hooks, ghost
# clipping) and PyTorch, same shapes, fp32 + TF32; the same dpbert steps in bf16; the demo's
# examples/s and its second start from the compilation cache; the largest batch of both steps
# (a compile-only search) and both steps timed there (fp32); the DP step's compile seconds
# with the noise drawn leaf by leaf (before issue 32).
# The device lacks some packages: benchmarks/accelerator/fetch_wheels.sh downloads them here
# into .whl/ (ignored); carry .whl, and this script installs them into /tmp/site.
set -u
cd "$(dirname "$0")/../.." || exit 1
source benchmarks/accelerator/common.sh
export DPBERT_COMPILATION_CACHE_DIR=""   # dp_step.py measures compiling: no cache there
acc_init speed "${SPEED_BUDGET_S:-}" 470 290 "$@"

if [ $SMOKE = 1 ]; then
  MODEL=tiny; B=8; SIZES=(--seq_len=32 --preds=4 --vocab_size=2000 --rounds=1)
  DP=(benchmarks/dp_step.py --platform=cpu --devices=1 --search_batch=16 --memory_cap_mib=64)
  DEMO_STEPS=4   # >= the demo's dp.num_bands (BandMF)
else
  MODEL=base; B=32; SIZES=(--seq_len=128 --preds=20 --vocab_size=30522 --rounds=5)
  DP=(benchmarks/dp_step.py --platform=gpu --devices=1 --search_batch=1024
      --memory_cap_mib="${SPEED_MEMORY_CAP_MIB:-60000}")
  DEMO_STEPS=100
fi
QUICK=("${DP[@]}" --quick --json --models=$MODEL "${SIZES[@]}" --quick_max_compiles=1)
largest() {  # the largest batch both steps fitted in a --quick part (else empty)
  $PY -c "import json,sys; r=json.load(open('$PARTS/$1.out'))
m=[r[k]['max_batch'] for k in ('plain','dp')]; print(min(m) if all(m) else '')" 2>/dev/null
}
demo() {  # demo PART: a fresh workdir, the cache of WORK/cache; JSON of examples/s on stdout
  JAX_LOG_COMPILES=1 DPBERT_COMPILATION_CACHE_DIR="$WORK/cache" $PY launch/train.py \
    --config=configs/demo_dp.py --workdir="$WORK/$1" --config.train.num_steps=$DEMO_STEPS \
    --config.train.log_every=$(( DEMO_STEPS < 10 ? 1 : 10 )) --config.train.eval_every=0 \
    --config.train.export_hf=false >&2 && $PY benchmarks/accelerator/collect.py demo "$WORK/$1" \
    "$PARTS/$1.log"
}
export -f demo
export DEMO_STEPS

part versions 30 $PY benchmarks/accelerator/collect.py versions
# (jax.random's generator, --quick_jax_prng, is not compiled here any more: on an H200 its DP
# step had not compiled after ~100 s, against 60 s unrolled; 2026-11-28, BENCHMARKS.md.)
# The DP step also with its clipping's float32 contractions at the default precision (TF32 on
# a GPU; --quick_dp_precision, a measurement only): how much of the DP step's extra time is
# HIGHEST precision off the tensor cores. (The sigma = 0 split, --quick_sigma0, ran on the H100.)
part dp_fp32 240 $PY "${QUICK[@]}" --batch_size=$B --dtype=float32 --microbatch_search=false \
  --quick_dp_precision=default --quick_profile_dir="$WORK/profile_dp_fp32"
# Files come back from $OUT only two folders down, 8 at most, 16 MiB each: keep the trace's
# Chrome-format file alone (the kernels of each step, "step NAME" annotations), next to the JSON.
TRACE=$(find "$WORK/profile_dp_fp32" -name "*.trace.json.gz" 2>/dev/null | head -1)
[ -n "$TRACE" ] && mv "$TRACE" "$OUT/profile_dp_fp32.trace.json.gz"
part prng 60 $PY benchmarks/accelerator/collect.py prng
part unrolled_fp32 150 env DPBERT_PRNG=unrolled $PY "${QUICK[@]}" --batch_size=$B \
  --dtype=float32 --microbatch_search=false
# Why the noise costs compile time: XLA's compile timers (gpu_compiler / nvptx_compiler on a
# GPU, cpu_compiler in a smoke) and its optimized HLO of the non-private and DP steps,
# compiled only (~100 s on an H200), packed into $OUT/xla_dump_fp32.tgz (modules over 100 KB).
xla_dump() {
  local dump="$WORK/xla_dump"
  mkdir -p "$dump"
  XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_dump_to=$dump --xla_dump_hlo_as_text" \
  TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=gpu_compiler=1,nvptx_compiler=1,cpu_compiler=1 \
    $PY $QUICK_ARGS --batch_size=$B --dtype=float32 --microbatch_search=false \
    --compile_only 2> "$dump/timers.log"
  local rc=$?
  grep -v "^I.*xla_bridge" "$dump/timers.log" | tail -n 20 >&2
  (cd "$dump" && find . -name "*after_optimizations.txt" -size +100k -print0 |
     tar czf "$OUT/xla_dump_fp32.tgz" --null -T - timers.log)
  return $rc
}
export -f xla_dump
export B QUICK_ARGS="${QUICK[*]}"   # a child bash gets no arrays (the arguments hold no spaces)
part xla_dump_fp32 150 bash -c xla_dump
part opacus 70 $PY benchmarks/accelerator/opacus_step.py --models=$MODEL --batch_size=$B \
  "${SIZES[@]}"
part dp_bf16 150 $PY "${QUICK[@]}" --batch_size=$B --dtype=bfloat16 --microbatch_search=false
part demo 90 bash -c 'demo demo'
# The second start repeats the data stage (~30 s on 2 CPU cores: 40 s was too tight for the smoke).
part demo_second_start $([ $SMOKE = 1 ] && echo 60 || echo 40) bash -c 'demo demo_second_start'
# The largest batch: a compile-only search (on the H100 of 2026-11-27 one compile of BERT-base
# at batch 1,024 took over 100 s, so it has its own part, after the timed rows), then both
# steps timed at the largest batch both fitted.
part search_fp32 240 $PY "${QUICK[@]}" --batch_size=$B --dtype=float32 --compile_only
M=$(largest search_fp32)
if [ -n "$M" ]; then
  part dp_fp32_largest 120 $PY "${QUICK[@]}" --batch_size=$M --dtype=float32 \
    --microbatch_search=false
fi
part dp_per_leaf_compile 150 $PY "${QUICK[@]}" --batch_size=$B --dtype=float32 \
  --microbatch_search=false --rounds=1 --quick_per_leaf
acc_done
