#!/usr/bin/env bash
# The loop's runs one after another, with the profile carry-over checked (device, repo root,
# after `source .devcarry/env.sh`):
#   tools/device/carry_check.sh OUT
# EXP (default experiments/flash.yaml), TAG (default flash: the store /tmp/store_$TAG and cache
# folders /tmp/kc_$TAG), RUNS (default "cold next reprofile": the first run meets fresh
# Triton/Inductor cache folders and an empty store, the rest follow in that store; `reprofile`
# adds --reprofile), EXTRA (more `run` arguments, e.g. "--gpus all").
# Writes OUT/walls.txt (each command's wall), OUT/<tag>_<run>.log, OUT/<tag>_diff.txt
# (tools/device/carry_diff.py: pass walls, carried cases, carried against fresh ncu rows) and
# OUT/<tag>_runs.tgz (the store without the profilers' reports).
set -u
OUT=$1; EXP=${EXP:-experiments/flash.yaml}; TAG=${TAG:-flash}
export TRITON_CACHE_DIR=/tmp/kc_$TAG/triton TORCHINDUCTOR_CACHE_DIR=/tmp/kc_$TAG/inductor
rm -rf "/tmp/kc_$TAG" "/tmp/store_$TAG"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader \
  > "$OUT/${TAG}_gpu.txt"
one() {
  local label=$1; shift
  local s e rc
  s=$(date +%s%N)
  # shellcheck disable=SC2086  # EXTRA is a list of arguments
  python3 -m harness run "$EXP" --store "/tmp/store_$TAG" ${EXTRA:-} "$@" \
    > "$OUT/${TAG}_$label.log" 2>&1
  rc=$?
  e=$(date +%s%N)
  echo "$TAG $label rc=$rc wall=$(( (e - s) / 1000000 )) ms" | tee -a "$OUT/walls.txt"
}
for label in ${RUNS:-cold next reprofile}; do
  case $label in
    reprofile) one "$label" --reprofile ;;
    *) one "$label" ;;
  esac
done
python3 "$(dirname "$0")/carry_diff.py" "/tmp/store_$TAG" | tee "$OUT/${TAG}_diff.txt"
tar czf "$OUT/${TAG}_runs.tgz" --exclude="*.ncu-rep" --exclude="*.nsys-rep" --exclude="*.sqlite" \
  -C /tmp "store_$TAG"
