#!/bin/sh
# build_revs.sh REV...: builds gemc at each git revision (a commit, a branch such as try/X) in a
# worktree of its own under /tmp, on this machine, and copies it to build/revs/NAME/gemc (NAME:
# the revision with '/' made '-'), so that one device call can time several builds side by side
# (carry build/revs; tests/gpu/gdpa_ab.sh OLD NEW, docs/gdpa_bench.md). A worktree left by an
# earlier run is moved to the revision and rebuilt incrementally.
# Exits 1 when a revision does not build (the others still do), 2 on no revision.
set -u
[ $# -ge 1 ] || { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
top=$(git rev-parse --show-toplevel) || exit 2
failed=0
for rev in "$@"; do
  name=$(echo "$rev" | tr '/' '-')
  wt=/tmp/gemc-rev-$name
  if [ -d "$wt" ]; then
    git -C "$wt" checkout -q --detach "$rev" || { echo "build_revs: $rev: no such revision" >&2; failed=1; continue; }
  else
    git -C "$top" worktree add -q --detach "$wt" "$rev" || { echo "build_revs: $rev: no worktree" >&2; failed=1; continue; }
  fi
  if make -C "$wt" -j"$(nproc)" build/gemc >"$wt.log" 2>&1; then
    mkdir -p "$top/build/revs/$name" && cp "$wt/build/gemc" "$top/build/revs/$name/gemc"
    echo "build_revs: $rev -> build/revs/$name/gemc ($(git -C "$wt" rev-parse --short HEAD))"
  else
    echo "build_revs: $rev did not build; the log: $wt.log" >&2
    failed=1
  fi
done
exit $failed
