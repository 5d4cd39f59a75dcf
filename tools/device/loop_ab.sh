#!/usr/bin/env bash
# The loop's speed, this tree against another commit's, in one device call (device, repo root,
# after `source .devcarry/env.sh`):
#   tools/device/loop_ab.sh OUT_DIR BASE_TGZ EXP [LIMIT_S]
# BASE_TGZ: the other commit's harness, `git archive REV harness kernels experiments dashboard
# pyproject.toml | gzip > .devcarry/base_REV.tgz` (carried in .devcarry). Runs, in this order,
# each `python -m harness run EXP` (the tree's own EXP) under `timeout LIMIT_S` (default 300):
#   new_cold   this tree, fresh Triton and Inductor cache folders and an empty store
#   new_next   this tree again on the same folders and store (the loop's next run)
#   base_cold  BASE_TGZ's tree, its own fresh folders and store
#   base_next  BASE_TGZ's tree again
# ROWS="base_cold base_next new_cold new_next" runs the base first; a row may carry a suffix to
# run again (ROWS="base_cold new_cold new_cold2 base_cold2": an ABBA pair of cold runs, each cold
# row with its own fresh folders and store, a next row in its side's latest cold row's).
# EXTRA: more `run` arguments for every row (EXTRA="--gpus all"). Before the first row the
# libraries are imported once, into the page cache; without that step the first run paid for
# the cold host (H100, vector_add.yaml: 81.9 s for this tree first, 64.2 s for the same
# harness code second). Wall times vary by 10-25 s between hosts (docs/measurement.md):
# compare only the rows of one call. Writes OUT_DIR/<row>.log (the run's output) and OUT_DIR/walls.txt (each
# run's own `wall:` line and the command's seconds); the stores stay under
# OUT_DIR/store-<cold row>; the base runs record no git sha (the tree has no .git).
set -uo pipefail
base_tgz=$2; exp=$3; limit=${4:-300}
root=$PWD
out=$(mkdir -p "$1" && cd "$1" && pwd) || exit 2
base=$(mktemp -d)
tar -xzf "$base_tgz" -C "$base" || { echo "loop_ab: cannot read $base_tgz" >&2; exit 2; }
trap 'rm -rf "$base"' EXIT
# the base runs import the base tree's harness and kernels, never this tree's
outer=$(printf '%s' "${PYTHONPATH:-}" | tr ':' '\n' | grep -vx "$root" | paste -sd: -)
python3 -c "import torch, triton, torch._inductor.codecache, torch._dynamo" 2>/dev/null
declare -A cold_of  # side -> its latest cold row (whose folders and store a next row uses)
for row in ${ROWS:-new_cold new_next base_cold base_next}; do
  side=${row%%_*}
  case $side in new|base) ;; *) echo "loop_ab: row $row: expected <new|base>_<cold|next>[suffix]" >&2; exit 2 ;; esac
  case ${row#*_} in
    cold*) cold_of[$side]=$row
           rm -rf "$out/caches-$row" "$out/store-$row"
           mkdir -p "$out/caches-$row/triton" "$out/caches-$row/inductor" ;;
    next*) [ -n "${cold_of[$side]:-}" ] || { echo "loop_ab: $row before a ${side}_cold row" >&2; exit 2; } ;;
    *) echo "loop_ab: row $row: expected <new|base>_<cold|next>[suffix]" >&2; exit 2 ;;
  esac
  caches=$out/caches-${cold_of[$side]}
  if [ "$side" = new ]; then dir=$root; pp=${PYTHONPATH:-}; else dir=$base; pp=$base${outer:+:$outer}; fi
  start=$(date +%s%N)
  # shellcheck disable=SC2086  # EXTRA is a list of arguments
  (cd "$dir" && PYTHONPATH=$pp TRITON_CACHE_DIR=$caches/triton \
     TORCHINDUCTOR_CACHE_DIR=$caches/inductor timeout "$limit" \
     python3 -m harness run "$exp" --store "$out/store-${cold_of[$side]}" ${EXTRA:-}) \
    > "$out/$row.log" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  wall=$(grep -E '^wall:' "$out/$row.log" | tail -1)
  printf '%-9s exit %s, %d.%03d s  %s\n' "$row" "$rc" $((ms / 1000)) $((ms % 1000)) \
    "${wall:-(no wall line)}" | tee -a "$out/walls.txt"
done
