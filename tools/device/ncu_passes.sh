#!/usr/bin/env bash
# ncu's replay passes and time per kernel by what the pass collects: one experiment's ncu cases
# run under YAML variants of their profile block, one cache folder (warmed first), then each
# variant's ncu wall, passes per kernel, per-case seconds, canonical values against the first
# variant and source lines (device, repo root, after `source .devcarry/env.sh`):
#   tools/device/ncu_passes.sh OUT
# EXP (default experiments/flash_bwd.yaml), CASES (default its N=4096 D=128 non-causal fp16
# cases), VARIANTS (default "default nosections section sampling nosource"):
#   default     the YAML's own profile block
#   nosections  sections: []   (source lines as the harness collects them)
#   section     sections: [], the whole SourceCounters section (HARNESS_NCU_SOURCE=section)
#   sampling    sections: [], source lines from the PC-sampling metrics only
#   nosource    sections: [], source_lines: false
set -u
OUT=$1; EXP=${EXP:-experiments/flash_bwd.yaml}
CASES=${CASES:-'*.N=4096.D=128.causal=false.mode=bwd.float16'}
export TRITON_CACHE_DIR=/tmp/kc_passes/triton TORCHINDUCTOR_CACHE_DIR=/tmp/kc_passes/inductor
S=/tmp/store_passes; rm -rf "$S" /tmp/kc_passes
for v in warm ${VARIANTS:-default nosections section sampling nosource}; do
  python3 - "$v" "$EXP" <<'PY'
import sys, yaml
v, exp = sys.argv[1], sys.argv[2]
e = yaml.safe_load(open(exp))
ncu = dict((e.get("profile") or {}).get("ncu") or {})
if v == "warm":
    e["profile"] = {}
elif v != "default":
    ncu["sections"] = []
    if v == "nosource":
        ncu["source_lines"] = False
    e["profile"] = {**(e.get("profile") or {}), "ncu": ncu}
e["name"] = f"passes-{v}"
yaml.safe_dump(e, open(f"/tmp/passes_{v}.yaml", "w"))
PY
  s=$(date +%s)
  if [ "$v" = section ]; then export HARNESS_NCU_SOURCE=section; else unset HARNESS_NCU_SOURCE; fi
  timeout 300 python3 -m harness run "/tmp/passes_$v.yaml" --store "$S" --cases "$CASES" \
    > "$OUT/passes_$v.log" 2>&1
  echo "$v rc=$? wall=$(( $(date +%s) - s )) s" | tee -a "$OUT/passes.txt"
done
unset HARNESS_NCU_SOURCE
python3 - "$S" <<'PY' | tee -a "$OUT/passes.txt"
import collections, glob, json, os, re, sys
import pandas as pd
runs = [r for r in sorted(glob.glob(sys.argv[1] + "/2*")) if "-passes-warm-" not in r]
values = {}
for r in runs:
    v = r.split("-passes-")[1].rsplit("-", 1)[0]
    w = (json.load(open(r + "/manifest.json")).get("profiler_wall_s") or {}).get("ncu") or {}
    log = open(r + "/raw/ncu/ncu.log").read() if os.path.exists(r + "/raw/ncu/ncu.log") else ""
    print(v, "wall", w.get("wall_s"), "run", w.get("run_s"), "export", w.get("export_s"),
          "passes", dict(collections.Counter(re.findall(r"(\d+) passes", log))),
          {k.split(".")[0]: s for k, s in sorted((w.get("per_case_s") or {}).items())})
    m = pd.read_parquet(r + "/metrics.parquet")
    values[v] = m[m.source == "ncu"].groupby(["case_id", "kernel", "name"]).value.first()
    p = r + "/source_lines.parquet"
    if os.path.exists(p):
        sl = pd.read_parquet(p)
        print("   source lines", len(sl), sl.groupby(["case_id", "kernel"]).samples.sum().to_dict())
if values:
    df = pd.DataFrame(values)
    first = df.columns[0]
    for v in df.columns[1:]:
        both = df[[first, v]].dropna()
        rel = (both[v] - both[first]).abs() / both[first].abs().clip(lower=1e-9)
        print(f"{v} vs {first}: {len(both)} values, {int(df[first].notna().sum() - len(both))} "
              f"missing, relative difference median {rel.median():.4f}, p90 {rel.quantile(0.9):.4f}")
PY
tar czf "$OUT/store_passes.tgz" --exclude="*.ncu-rep" --exclude="*.nsys-rep" -C /tmp store_passes
