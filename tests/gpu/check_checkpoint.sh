#!/bin/sh
# check_checkpoint.sh BUILD: checkpoints on the cuda backend (run by tests/gpu/run.sh on a
# machine with a GPU; BUILD/gemc is the binary). Prints a PASS or FAIL line per check and exits
# with the number of failures.
#   1. two straight 10-step GPU runs write the same checkpoint (the GPU step is deterministic;
#      without that the next check means nothing);
#   2. 5 steps, --save, --resume for 5 more: the checkpoint equals the straight run's byte for
#      byte (parameters, tables, AdamW m/v, Adagrad rowsums, counters, losses, curve), and so
#      do the per-step losses of the reports;
#   3. across backends: a GPU checkpoint evaluated on the CPU gives the GPU's held-out loss,
#      and 3 more steps on the CPU follow 3 more on the GPU closely; a CPU checkpoint resumed
#      on the GPU follows the straight CPU run closely (tolerances below; not bit-exact: the
#      two backends sum in different orders).
# Evaluation points and the held-out set are given explicitly: their defaults follow --steps.
# Tolerances across backends (relative): the same parameters evaluated on both (fp32 sums in
# another order), and losses after a few steps of training apart (AdamW turns last-bit
# differences of tiny gradients into whole steps, so they drift further).
eval_tol=1e-3
train_tol=1e-2
build=${1:-build}
gemc=$build/gemc
model=models/gem_tiny.gem
failed=0
dir=$(mktemp -d "${TMPDIR:-/tmp}/gemc-ckpt.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
trap 'exit 1' INT TERM

pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }

# train NAME ARGS...: one `gemc train` run, its output in $dir/NAME.log, its report in
# $dir/NAME.json; prints a FAIL line (and the log's tail) when it fails.
train() {
  name=$1
  shift
  if "$gemc" train "$model" -q --batch 64 --eval-every 5 --eval-examples 256 \
       --report "$dir/$name.json" "$@" >"$dir/$name.log" 2>&1; then
    return 0
  fi
  fail "gemc train $* (run '$name') exited non-zero:"
  tail -15 "$dir/$name.log"
  return 1
}

# losses FILE.json: the report's per-step losses, one a line.
losses() {
  awk '/"loss": \[/ { on = 1; sub(/.*\[/, "") }
       on { line = $0; end = sub(/\].*/, "", line); print line; if (end) exit }' "$1" |
    tr -s ', ' '\n\n' | grep -v '^$'
}

# eval_loss FILE.json: the final held-out loss.
eval_loss() {
  awk '/"eval": \{/ { on = 1 } on && $1 == "\"loss\":" { sub(/,$/, "", $2); print $2; exit }' "$1"
}

# close A B TOL: |A - B| <= TOL * max(|B|, 1e-3), both finite numbers.
close() {
  awk -v a="$1" -v b="$2" -v tol="$3" 'BEGIN {
    if (a !~ /^-?[0-9.]+([eE][-+]?[0-9]+)?$/ || b !~ /^-?[0-9.]+([eE][-+]?[0-9]+)?$/) exit 1
    d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; if (m < 1e-3) m = 1e-3
    exit !(d <= tol * m) }'
}

# u32 FILE OFFSET, u64 FILE OFFSET: a little-endian word of a file (the machine's order).
u32() { od -An -tu4 -j "$2" -N4 "$1" | tr -d ' '; }
u64() { od -An -tu8 -j "$2" -N8 "$1" | tr -d ' '; }

# entries FILE: "offset size name" of every entry of a checkpoint (docs/train.md, the file).
entries() {
  f=$1
  name_len=$(u32 "$f" 12)
  n=$(u32 "$f" 40)
  pos=$((44 + name_len))
  i=0
  while [ "$i" -lt "$n" ]; do
    len=$(u32 "$f" "$pos")
    entry=$(dd if="$f" bs=1 skip=$((pos + 4)) count="$len" 2>/dev/null)
    size=$(u64 "$f" $((pos + 4 + len)))
    pos=$((pos + 4 + len + 8))
    echo "$pos $size $entry"
    pos=$((pos + size))
    i=$((i + 1))
  done
}

# same_checkpoint WHAT A B: compares two checkpoints byte for byte; on a difference names the
# entries that differ (and how many bytes each).
same_checkpoint() {
  what=$1
  a=$2/checkpoint.gemc
  b=$3/checkpoint.gemc
  if cmp -s "$a" "$b"; then
    pass "$what: the checkpoints are identical ($(wc -c <"$a" | tr -d ' ') bytes)"
    return 0
  fi
  fail "$what: the checkpoints differ"
  if [ "$(wc -c <"$a")" -ne "$(wc -c <"$b")" ]; then
    echo "  sizes: $(wc -c <"$a") and $(wc -c <"$b") bytes"
    return 1
  fi
  entries "$a" >"$dir/entries.txt"
  cmp -l "$a" "$b" | awk -v list="$dir/entries.txt" '
    BEGIN { while ((getline l < list) > 0) { split(l, f, " "); n++; off[n] = f[1]; size[n] = f[2]; name[n] = f[3] } }
    { byte = $1 - 1; hit = 0
      for (i = 1; i <= n; i++) if (byte >= off[i] && byte < off[i] + size[i]) { diff[i]++; hit = 1 }
      if (!hit) other++ }
    END { for (i = 1; i <= n; i++) if (diff[i]) printf "  entry %s: %d of %d bytes differ\n", name[i], diff[i], size[i]
          if (other) printf "  %d bytes outside the entries differ (header, checksum)\n", other }'
  return 1
}

if [ ! -x "$gemc" ]; then
  fail "no $gemc"
  exit 1
fi

# --- 1 and 2: GPU resume is bit-exact --------------------------------------------------------
if train straight --backend cuda --steps 10 --save "$dir/a" &&
   train straight2 --backend cuda --steps 10 --save "$dir/a2"; then
  same_checkpoint "determinism (two straight 10-step GPU runs)" "$dir/a" "$dir/a2"
fi
if train half --backend cuda --steps 5 --save "$dir/b" &&
   train resumed --backend cuda --steps 5 --resume "$dir/b" --save "$dir/c"; then
  if [ -f "$dir/a/checkpoint.gemc" ]; then
    same_checkpoint "GPU resume: 5 + 5 steps against 10 straight" "$dir/a" "$dir/c"
    losses "$dir/straight.json" >"$dir/straight.loss"
    losses "$dir/resumed.json" >"$dir/resumed.loss"
    if [ "$(wc -l <"$dir/straight.loss" | tr -d ' ')" -eq 10 ] && cmp -s "$dir/straight.loss" "$dir/resumed.loss"; then
      pass "GPU resume: the 10 per-step losses of the reports are identical"
    else
      fail "GPU resume: per-step losses differ (straight, then resumed):"
      paste "$dir/straight.loss" "$dir/resumed.loss" | head -12
    fi
  fi
fi

# --- 3: across backends ----------------------------------------------------------------------
if [ -f "$dir/c/checkpoint.gemc" ]; then
  # The GPU-trained model, evaluated on the CPU without a step: the GPU's held-out loss.
  if train cpu_eval --backend cpu --steps 0 --resume "$dir/c"; then
    g=$(eval_loss "$dir/resumed.json")
    c=$(eval_loss "$dir/cpu_eval.json")
    if close "$c" "$g" "$eval_tol"; then
      pass "GPU checkpoint on the CPU: held-out loss $c (the GPU's: $g)"
    else
      fail "GPU checkpoint on the CPU: held-out loss $c, the GPU's $g"
    fi
  fi
  # 3 more steps on each backend from the same GPU checkpoint.
  if train cpu_more --backend cpu --steps 3 --resume "$dir/c" --save "$dir/d" &&
     train gpu_more --backend cuda --steps 3 --resume "$dir/c"; then
    losses "$dir/cpu_more.json" | tail -3 >"$dir/cpu_more.loss"
    losses "$dir/gpu_more.json" | tail -3 >"$dir/gpu_more.loss"
    ok=$(wc -l <"$dir/cpu_more.loss" | tr -d ' ')
    paste "$dir/cpu_more.loss" "$dir/gpu_more.loss" >"$dir/more.txt"
    while read -r c g; do close "$c" "$g" "$train_tol" || ok=0; done <"$dir/more.txt"
    if [ "$ok" -eq 3 ]; then
      pass "GPU checkpoint resumed on the CPU: steps 11-13 losses $(tr '\t\n' '/ ' <"$dir/more.txt")(cpu/gpu)"
    else
      fail "GPU checkpoint resumed on the CPU: steps 11-13 losses (cpu, gpu):"
      cat "$dir/more.txt"
    fi
  fi
fi
# A CPU checkpoint resumed on the GPU follows the straight CPU run.
if train cpu_straight --backend cpu --steps 10 &&
   train cpu_half --backend cpu --steps 5 --save "$dir/e" &&
   train gpu_from_cpu --backend cuda --steps 5 --resume "$dir/e"; then
  losses "$dir/cpu_straight.json" | tail -5 >"$dir/cs.loss"
  losses "$dir/gpu_from_cpu.json" | tail -5 >"$dir/gc.loss"
  ok=$(wc -l <"$dir/gc.loss" | tr -d ' ')
  paste "$dir/cs.loss" "$dir/gc.loss" >"$dir/cg.txt"
  while read -r c g; do close "$g" "$c" "$train_tol" || ok=0; done <"$dir/cg.txt"
  if [ "$ok" -eq 5 ]; then
    pass "CPU checkpoint resumed on the GPU: steps 6-10 losses $(tr '\t\n' '/ ' <"$dir/cg.txt")(cpu straight/gpu)"
  else
    fail "CPU checkpoint resumed on the GPU: steps 6-10 losses (cpu straight, gpu resumed):"
    cat "$dir/cg.txt"
  fi
fi

[ "$failed" -eq 0 ] && echo "PASS check_checkpoint: all"
exit "$failed"
