#!/usr/bin/env bash
# Timing integrity when sharded (device, >= 2 GPUs of one model, repo root):
#   tools/device/shard_integrity.sh OUT_DIR experiments/softmax.yaml
# Times the same experiment on GPU 0 twice (A/A: the between-run noise) and on GPU 1 once, with
# the profiler passes off, then compares: GPU 0 vs GPU 1 must be no worse than GPU 0 vs GPU 0
# (every case `same` or `ambiguous`, no significant `faster`/`slower` beyond the A/A pair's).
# Then one `--gpus 0,1` run, which shards the cases: compared with the GPU 0 run likewise.
set -euo pipefail
out=$1; exp=$2
mkdir -p "$out"
store="$out/store"
run() {  # -> the new run's directory
  python3 -m harness run "$exp" --store "$store" "$@" > "$out/last.log" 2>&1 || { cat "$out/last.log"; exit 1; }
  grep -o 'run stored at .*' "$out/last.log" | sed 's/run stored at //'
}
a=$(run --gpus 0); a2=$(run --gpus 0); b=$(run --gpus 1); s=$(run --gpus 0,1)
for pair in "$a $a2 A/A-gpu0" "$a $b gpu0-vs-gpu1" "$a $s gpu0-vs-sharded"; do
  set -- $pair
  echo "== $3" | tee -a "$out/summary.txt"
  python3 -m harness compare "$1" "$2" --store "$store" | tee -a "$out/summary.txt"
done
