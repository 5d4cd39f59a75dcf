#!/usr/bin/env bash
# One sweep on one GPU vs sharded over every GPU of the host (device, repo root, >= 2 GPUs):
#   tools/device/gpus_speedup.sh OUT_DIR experiments/flash.yaml
# The GPU is calibrated into the store first, so neither run pays (or skips) it. Both runs cold
# (fresh Triton/Inductor caches: each starts from the same state), into one store, the second
# with --retune --reprofile: else it would keep the first run's Tuner picks and carry its
# profiles (the same code on the same host) and skip what a cold run pays; then `compare`
# of the one-GPU run (all cases on GPU 0) with the sharded run: for cases the shard put on GPU 1
# that is the GPU 0 vs GPU 1 gap, for the rest an A/A pair on GPU 0.
# WARM=1: then each again with its own caches and the store's previous run (the loop's next run).
set -uo pipefail
out=$1; exp=$2
here=$(dirname "$0")
mkdir -p "$out"
python3 -m harness calibrate --store "$out/store" > "$out/calibrate.log" 2>&1
COLD=1 NAME=one_gpu "$here/walltime.sh" "$out" "${LIMIT1:-330}" "$exp"
COLD=1 NAME=all_gpus "$here/walltime.sh" "$out" "${LIMIT2:-240}" "$exp" --gpus all \
  --retune --reprofile
if [ "${WARM:-0}" = 1 ]; then
  CACHES=one_gpu NAME=one_gpu_warm "$here/walltime.sh" "$out" "${LIMIT1:-330}" "$exp"
  CACHES=all_gpus NAME=all_gpus_warm "$here/walltime.sh" "$out" "${LIMIT2:-240}" "$exp" --gpus all
fi
stored() { grep -o 'run stored at .*' "$out/$1.log" | sed 's/run stored at //'; }
one=$(stored one_gpu); all=$(stored all_gpus)
python3 -m harness compare "$one" "$all" --store "$out/store" > "$out/compare.txt" 2>&1
python3 - "$one" "$all" <<'PY' | tee "$out/gpu_gap.txt"
import sys, pandas as pd
from pathlib import Path
def load(d):
    r = pd.read_parquet(Path(d) / "results.parquet"); c = pd.read_parquet(Path(d) / "cases.parquet")
    return r.merge(c[["case_id", "gpu"]], on="case_id")
a, b = load(sys.argv[1]), load(sys.argv[2])
m = a.merge(b, on="case_id", suffixes=("_one", "_all")).dropna(subset=["median_ms_one", "median_ms_all"])
m["gap"] = m["median_ms_all"] / m["median_ms_one"] - 1
col = "gpu_all" if "gpu_all" in m else None
groups = m.groupby(col) if col else [("all", m)]
for g, d in groups:
    w = d.loc[d["gap"].abs().idxmax()]
    print(f"sharded run on GPU {g}: {len(d)} cases, median |gap| {d['gap'].abs().median()*100:.2f}%, "
          f"worst {w['gap']*100:+.2f}% ({w['case_id']})")
PY
