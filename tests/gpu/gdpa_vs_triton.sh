#!/usr/bin/env bash
# gdpa_vs_triton.sh: gemc's GDPA kernels and Meta's Triton GDPA on the very same batches, in one
# call on the GPU machine (docs/gdpa_bench.md). For each public cell (B=1152, H=4, d=128, bf16,
# fast_gelu / gelu, non-causal):
#   self-s<s>-N<N>     Meta's "self s": lq ~ U[max(1,(2s-1)N), N], lk = N for every example
#   selfeq-s0.5-N<N>   jagged self: lq = lk ~ U[1, N]
#   cross-kv256-N<N>   lq = N, lk = 256
# the peer (peer_gdpa_public.py) draws the batch with Meta's generate_jagged_data, writes it to
# a lengths file (one "lq lk" pair a line) and times itself on it; then `gemc bench gdpa
# --lengths FILE` times gemc on that same file, and one table prints both sides and the ratio.
# Both count FLOPs alike: forward 4*H*d*sum(lq*lk), backward 2.5x that.
#
# Without the peer (no python3, torch or triton, or Meta's kernel not laid out) the script says
# so, draws each batch itself (awk, the same definitions, other random numbers) and still prints
# gemc's side. It exits 1 when gemc's side failed (no GPU, say), else 0.
#
# Usage: tests/gpu/gdpa_vs_triton.sh [--gemc PATH] [--out DIR] [--ns 512,1024,2048]
#            [--cases self-s0.5,self-s1.0,selfeq-s0.5,cross-kv256] [--reps N] [--peer-dir DIR]
#            [--no-peer] [--peer-warmup MS] [--peer-rep MS] [--peer-timeout SECONDS]
#            [--triton-cache FILE.tgz]
#   --gemc PATH       the gemc binary (default build/gemc; $GEMC)
#   --out DIR         lengths files and logs (default $OUT, else /tmp/gdpa_vs_triton)
#   --peer-dir DIR    holds peer_gdpa_public.py and gdpa_standalone/ (default build/peers;
#                     $PEER_DIR). setup_triton_gdpa.sh MIRROR DIR/gdpa_standalone lays the
#                     kernel out on a machine with the mirror; carry DIR to the GPU machine.
#                     $GDPA_PATH, when set, overrides DIR/gdpa_standalone.
#   --peer-timeout    seconds the peer may take in all (default 420): its first run autotunes
#                     every case for minutes, so split the cells over calls (--cases, --ns)
#                     to stay in a 10-minute call; a warm machine keeps Triton's cache, and
#                     $GEMC_CACHE_DIR (default /tmp/gemc-cache) gemc's cubins.
#   --triton-cache F  Triton's cache as one .tgz: unpacked before the peer runs (when F exists)
#                     and packed back into F after it, with TRITON_CACHE_AUTOTUNING=1, so the
#                     peer's compiled kernels and autotuning winners survive the machine. Give
#                     F under $OUT to get it back from a call, carry it to the next: the peer
#                     then skips its minutes of autotuning per case.
set -u

usage() {
  sed -n '/^# Usage:/,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

GEMC=${GEMC:-build/gemc}
OUT=${OUT:-/tmp/gdpa_vs_triton}
NS=512,1024,2048
CASES=self-s0.5,self-s1.0,selfeq-s0.5,cross-kv256
REPS=10
PEER_DIR=${PEER_DIR:-build/peers}
USE_PEER=1
PEER_ARGS=()
PEER_TIMEOUT=420
TRITON_CACHE=""
need() { [ $# -ge 2 ] || { echo "gdpa_vs_triton: $1 needs a value" >&2; usage; }; }
while [ $# -gt 0 ]; do
  case $1 in
  --gemc) need "$@"; GEMC=$2; shift 2 ;;
  --out) need "$@"; OUT=$2; shift 2 ;;
  --ns) need "$@"; NS=$2; shift 2 ;;
  --cases) need "$@"; CASES=$2; shift 2 ;;
  --reps) need "$@"; REPS=$2; shift 2 ;;
  --peer-dir) need "$@"; PEER_DIR=$2; shift 2 ;;
  --no-peer) USE_PEER=0; shift ;;
  --peer-warmup) need "$@"; PEER_ARGS+=(--warmup "$2"); shift 2 ;;
  --peer-rep) need "$@"; PEER_ARGS+=(--rep "$2"); shift 2 ;;
  --peer-timeout) need "$@"; PEER_TIMEOUT=$2; shift 2 ;;
  --triton-cache) need "$@"; TRITON_CACHE=$2; shift 2 ;;
  -h|--help) usage ;;
  *) echo "gdpa_vs_triton: unknown argument '$1'" >&2; usage ;;
  esac
done

# --- the arguments --------------------------------------------------------------------------
whole() { [[ $1 =~ ^[0-9]+$ ]]; }
for n in ${NS//,/ }; do
  whole "$n" && [ "$n" -ge 1 ] && [ "$n" -le 65536 ] ||
    { echo "gdpa_vs_triton: --ns takes lengths in [1, 65536], got '$n'" >&2; exit 2; }
done
for c in ${CASES//,/ }; do
  case $c in self-s0.5|self-s1.0|selfeq-s0.5|cross-kv256) ;;
  *) echo "gdpa_vs_triton: unknown case '$c' (self-s0.5, self-s1.0, selfeq-s0.5, cross-kv256)" >&2
     exit 2 ;;
  esac
done
whole "$REPS" || { echo "gdpa_vs_triton: --reps takes a whole number, got '$REPS'" >&2; exit 2; }
whole "$PEER_TIMEOUT" ||
  { echo "gdpa_vs_triton: --peer-timeout takes seconds, got '$PEER_TIMEOUT'" >&2; exit 2; }
[ -x "$GEMC" ] || { echo "gdpa_vs_triton: no gemc at $GEMC (build it, or pass --gemc)" >&2; exit 2; }
[ -n "${NS//,/}" ] && [ -n "${CASES//,/}" ] || { echo "gdpa_vs_triton: no cells to run" >&2; exit 2; }

# Every cell: the peer's case name, in the peer's order (all of one case over N, case by case).
CELLS=()
for c in ${CASES//,/ }; do for n in ${NS//,/ }; do CELLS+=("$c-N$n"); done; done
if [ ${#CELLS[@]} -gt 16 ]; then  # gemc bench takes 16 --lengths files at a time
  echo "gdpa_vs_triton: ${#CELLS[@]} cells; at most 16 per call" >&2; exit 2
fi
mkdir -p "$OUT/lengths" || exit 2
rm -f "$OUT"/lengths/lengths-*.txt "$OUT/peer.log" "$OUT/gemc.log" "$OUT/gemc.err"
export GEMC_CACHE_DIR=${GEMC_CACHE_DIR:-/tmp/gemc-cache}

echo "== gdpa_vs_triton: $(date -u '+%Y-%m-%d %H:%M UTC'), $("$GEMC" --version 2>&1 | head -1)"
command -v nvidia-smi >/dev/null 2>&1 &&
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1

# --- the peer -----------------------------------------------------------------------------
PEER_SCRIPT=""
for p in "$PEER_DIR/peer_gdpa_public.py" shared/peers/gdpa/peer_gdpa_public.py \
         ../shared/peers/gdpa/peer_gdpa_public.py; do
  [ -f "$p" ] && { PEER_SCRIPT=$p; break; }
done
GDPA_PATH=${GDPA_PATH:-$PEER_DIR/gdpa_standalone}
KERNEL=$GDPA_PATH/ads_mkl/ops/oss/gdpa/triton/triton_generalized_dot_product_attention.py
PEER_STATUS=""  # empty: the peer ran
if [ $USE_PEER = 0 ]; then
  PEER_STATUS="not run (--no-peer)"
elif [ -z "$PEER_SCRIPT" ]; then
  PEER_STATUS="not installed: no peer_gdpa_public.py in $PEER_DIR (copy ../shared/peers/gdpa/ there)"
elif [ ! -f "$KERNEL" ]; then
  PEER_STATUS="not installed: no Meta kernel under $GDPA_PATH (setup_triton_gdpa.sh MIRROR $GDPA_PATH)"
elif ! command -v python3 >/dev/null 2>&1; then
  PEER_STATUS="not installed: no python3"
elif ! python3 -c 'import torch, triton' >/dev/null 2>&1; then
  PEER_STATUS="not installed: python3 cannot import torch and triton"
elif ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
       >/dev/null 2>&1; then
  PEER_STATUS="not run: torch sees no GPU"
fi
CACHE_ENV=()
if [ -z "$PEER_STATUS" ] && [ -n "$TRITON_CACHE" ]; then
  # Triton's cache in a directory of its own; a packed one unpacks into it
  TRITON_DIR=$(mktemp -d /tmp/gdpa-triton-cache.XXXXXX) || exit 2
  if [ -f "$TRITON_CACHE" ]; then
    if tar -xzf "$TRITON_CACHE" -C "$TRITON_DIR"; then
      echo "== Triton's cache: $(find "$TRITON_DIR" -type f | wc -l) files from $TRITON_CACHE"
    else
      echo "== Triton's cache: $TRITON_CACHE does not unpack; starting empty" >&2
      rm -rf "$TRITON_DIR" && mkdir -p "$TRITON_DIR"
    fi
  fi
  CACHE_ENV=(TRITON_CACHE_DIR="$TRITON_DIR" TRITON_CACHE_AUTOTUNING=1)
fi
if [ -z "$PEER_STATUS" ]; then
  echo "== the peer: $PEER_SCRIPT (GDPA_PATH=$GDPA_PATH), cases ${CASES} over N ${NS}"
  PREFIXES=$(for c in "${CELLS[@]}"; do printf '%s,' "$c"; done)
  timeout "$PEER_TIMEOUT" env GDPA_PATH="$GDPA_PATH" ${CACHE_ENV[@]+"${CACHE_ENV[@]}"} \
    python3 "$PEER_SCRIPT" --out "$OUT/lengths" \
    --cases "${PREFIXES%,}" --ns "$NS" ${PEER_ARGS[@]+"${PEER_ARGS[@]}"} 2>&1 | tee "$OUT/peer.log"
  rc=${PIPESTATUS[0]}
  if [ ${#CACHE_ENV[@]} -gt 0 ]; then  # pack what the peer left, timed out or not
    if tar -czf "$TRITON_CACHE.part" -C "$TRITON_DIR" . && mv "$TRITON_CACHE.part" "$TRITON_CACHE"; then
      echo "== Triton's cache: packed into $TRITON_CACHE ($(du -k "$TRITON_CACHE" | cut -f1) KB)"
    else
      echo "== Triton's cache: could not pack it into $TRITON_CACHE" >&2
      rm -f "$TRITON_CACHE.part"
    fi
    rm -rf "$TRITON_DIR"
  fi
  if [ "$rc" = 124 ]; then PEER_STATUS="timed out after ${PEER_TIMEOUT}s (split the cells: --cases, --ns)"
  elif [ "$rc" != 0 ]; then PEER_STATUS="failed (exit $rc; $OUT/peer.log)"
  fi
fi
[ -n "$PEER_STATUS" ] && echo "== the peer: $PEER_STATUS; gemc's side only where it wrote no batch"
touch "$OUT/peer.log"

# --- the batches the peer did not write -----------------------------------------------------
# lengths-CELL.txt as the peer would draw it (its definitions; awk's random numbers, not torch's).
draw() { sh "$(dirname "$0")/gdpa_draw.sh" "$1" "$2"; }  # draw CELL FILE
SOURCE=()
for i in "${!CELLS[@]}"; do
  f=$OUT/lengths/lengths-${CELLS[$i]}.txt
  if [ -s "$f" ] && grep -q "^${CELLS[$i]}," "$OUT/peer.log"; then
    SOURCE[$i]=peer
  else
    draw "${CELLS[$i]}" "$f"
    SOURCE[$i]=own
  fi
done

# --- gemc ---------------------------------------------------------------------------------
ARGS=()
for c in "${CELLS[@]}"; do ARGS+=(--lengths "$OUT/lengths/lengths-$c.txt"); done
echo "== $GEMC bench gdpa --act gelu --reps $REPS ${ARGS[*]}"
"$GEMC" bench gdpa --act gelu --reps "$REPS" "${ARGS[@]}" >"$OUT/gemc.log" 2>"$OUT/gemc.err"
GEMC_RC=$?
cat "$OUT/gemc.log"
[ $GEMC_RC = 0 ] || { echo "== gemc failed (exit $GEMC_RC):"; cat "$OUT/gemc.err"; }
# The same batches with @schedule(deterministic = false): dQ by float atomics in the dK/dV kernel.
echo "== $GEMC bench gdpa --atomic-dq --act gelu --reps $REPS ..."
"$GEMC" bench gdpa --atomic-dq --act gelu --reps "$REPS" "${ARGS[@]}" >"$OUT/gemc_atomic.log" \
  2>"$OUT/gemc_atomic.err" || { echo "== gemc --atomic-dq failed:"; cat "$OUT/gemc_atomic.err"; }
cat "$OUT/gemc_atomic.log"

# --- one table ----------------------------------------------------------------------------
peer_field() {  # CELL FIELD: a field of the peer's CSV line for CELL (fwd_TFLOPs: 6, bwd: 8)
  awk -F, -v c="$1" -v i="$2" '$1 == c && $2 !~ /^ERR/ { print $i; exit }' "$OUT/peer.log"
}
gemc_field() {  # FILE COLUMN [LOG]: a column of gemc's row for FILE, trimmed
  awk -F'|' -v f="$1" -v i="$2" '{ g = $2; gsub(/^ +| +$/, "", g) }
    g == f { v = $i; gsub(/^ +| +$/, "", v); print v; exit }' "${3:-$OUT/gemc.log}"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else printf "-" }'; }
echo
echo "gemc vs Meta's Triton GDPA on the same batches, this run (TFLOP/s fwd / bwd; ratio = gemc / Triton)"
echo "| cell | batch | sum lq | gemc kernel | gemc fwd / bwd | Triton fwd / bwd | fwd ratio | bwd ratio | gemc bwd, atomic dQ | its ratio | gemc tile spread |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for i in "${!CELLS[@]}"; do
  c=${CELLS[$i]}
  f=$OUT/lengths/lengths-$c.txt
  gf_gb=$(gemc_field "$f" 8)
  gf=${gf_gb% / *} gb=${gf_gb#* / }
  tf=$(peer_field "$c" 6) tb=$(peer_field "$c" 8)
  sum=$(awk '!/^#/ && NF == 2 { s += $1 } END { print s + 0 }' "$f")  # the file's own
  gsum=$(gemc_field "$f" 4) psum=$(peer_field "$c" 2)
  [ -n "$gsum" ] && [ "$gsum" != "$sum" ] && echo "warning: $c: gemc read sum lq $gsum, not $sum" >&2
  [ -n "$psum" ] && [ -n "$sum" ] && [ "$psum" != "$sum" ] &&
    echo "warning: $c: the peer's sum lq $psum is not gemc's $sum" >&2
  triton=$([ -n "$tf" ] && echo "$tf / $tb" || echo "-")
  if [ -z "$tf" ] && grep -q "^$c,ERR" "$OUT/peer.log"; then triton="error ($OUT/peer.log)"; fi
  batch=$([ "${SOURCE[$i]}" = peer ] && echo "the peer's" || echo "own draw")
  ga=$(gemc_field "$f" 8 "$OUT/gemc_atomic.log")
  ga=${ga#* / }
  echo "| $c | $batch | $sum | $(gemc_field "$f" 7) | ${gf_gb:--} | $triton | $(ratio "$gf" "$tf") | $(ratio "$gb" "$tb") | ${ga:--} | $(ratio "$ga" "$tb") | $(gemc_field "$f" 10) |"
done
echo "lengths files and logs: $OUT"
[ $GEMC_RC = 0 ] || exit 1
exit 0
