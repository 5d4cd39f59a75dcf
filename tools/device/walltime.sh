#!/usr/bin/env bash
# The harness measuring itself: wall time of whole `harness run`s on the device, the runs kept.
#   usage (device, repo root, after `source .devcarry/env.sh`):
#     tools/device/walltime.sh OUT_DIR LIMIT_S experiments/x.yaml [more run args]
# Writes OUT_DIR/<name>.log (the run's output + `time`) and the store under OUT_DIR/store.
# COLD=1: fresh Triton and Inductor caches for this run (what a first run on a new machine pays),
# kept under OUT_DIR/caches/<name>; CACHES=<name>: this run reuses that earlier run's caches.
set -uo pipefail
out=$1; limit=$2; exp=$3; shift 3
name=${NAME:-$(basename "$exp" .yaml)}
mkdir -p "$out"
if [ "${COLD:-0}" = 1 ]; then
  rm -rf "$out/caches/$name"; mkdir -p "$out/caches/$name/triton" "$out/caches/$name/inductor"
  export TRITON_CACHE_DIR=$out/caches/$name/triton TORCHINDUCTOR_CACHE_DIR=$out/caches/$name/inductor
elif [ -n "${CACHES:-}" ]; then
  export TRITON_CACHE_DIR=$out/caches/$CACHES/triton TORCHINDUCTOR_CACHE_DIR=$out/caches/$CACHES/inductor
fi
start=$(date +%s%N)
timeout "$limit" python3 -m harness run "$exp" --store "$out/store" "$@" > "$out/$name.log" 2>&1
rc=$?
end=$(date +%s%N)
ms=$(( (end - start) / 1000000 ))
printf '%s: exit %s, wall %d.%03d s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) | tee -a "$out/$name.log"
