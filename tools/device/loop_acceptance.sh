#!/usr/bin/env bash
# The loop's acceptance runs on one GPU (device, repo root, after `source .devcarry/env.sh`):
#   tools/device/loop_acceptance.sh OUT_DIR STEPS [DEADLINE_S]
# STEPS, comma-separated, run in this order into one store OUT_DIR/store:
#   flash     experiments/flash.yaml, whole (wall time and per-pass split)
#   flash_aa  flash.yaml again at N=4096 (all impls): an A/A pair with the first
#   flash_again  flash.yaml again, whole: the loop's second run (warm caches) and a 280-case A/A
#   worse     triton_flash's D=128 configs (both forms) replaced by one small tile (a code change), N=4096
#             D=128 only: its since-last-run block shows the slowdown and the config/code diff;
#             the kernel file is restored afterwards
#   softmax   experiments/softmax.yaml twice: an A/A pair
#   tune      experiments/tune/flash_fwd_configs.yaml, non-causal: 16 forced configs, the
#             Tuner's pick and cuDNN
#   bwd       experiments/flash_bwd.yaml, whole
#   bwd_again flash_bwd.yaml again, whole: the loop's second run (warm caches) and its A/A pair
#   bwdgrid   experiments/tune/flash_bwd_dkdv_grid.yaml then flash_bwd_dq_grid.yaml (36 + 24
#             forced backward configs at N=4096 D=128 beside the Tuner's pick)
#   clockaa   flash.yaml's triton_flash and sdpa_cudnn cases (the power-hungry ones) twice: an A/A
#             pair whose cases carry the SM clock under load
#   pyc       torch.compile's first call in a fresh process with PYTHONDONTWRITEBYTECODE (twice),
#             then with bytecode under a private PYTHONPYCACHEPREFIX (twice): OUT_DIR/pyc.txt
#   srccost   flash.yaml's ncu case set twice, SourceCounters on (default) and off: the
#             per-case ncu seconds of both (OUT_DIR/srccost.txt)
#   fused_before  the fused-op experiments (layernorm, layernorm_bwd, groupnorm_mish, linear_gelu, mlp;
#             FUSED="a b" names a subset, in that order; FUSED_BEFORE the before-runs' own) with
#             the kernels/ and experiments/ trees of BEFORE_TGZ (`git archive REV kernels
#             experiments | gzip`, carried in .devcarry as before_REV.tgz) swapped in; both
#             restored afterwards; the runs record REV as their git sha (BEFORE_REV overrides)
#   fused     the same experiments with the current kernels: each run's since
#             block pairs it with its fused_before run
#   matmul    linear_gelu.yaml then mlp.yaml (the matmul forms; with SEED_RUNS, their since
#             blocks pair them with the seeded runs)
#   probe     tools/device/compile_probe.py warmcache: compile-ahead's Tuner compiles, then the
#             check pass's, in fresh processes on one new Triton cache (OUT_DIR/probe.txt)
#   fatma     experiments/flash_tma.yaml: triton_flash vs triton_flash_tma vs SDPA flash, cuDNN
#   hprof     flash.yaml at N=4096 with --profile-harness and empty Triton/Inductor caches (as a
#             first run on a fresh machine): each process's cProfile top functions copied to
#             OUT_DIR/hprof/ (where the cold check pass's time goes)
#   fbtma     experiments/flash_bwd_tma.yaml: the backward, pointer loads vs TMA, vs SDPA
#   fatmagrid experiments/tune/flash_fwd_tma_configs.yaml (8 forced TMA configs, causal and not)
#   lgtma     experiments/tune/linear_gelu_tma_configs.yaml (7 forced TMA matmul configs)
#   gngrid    experiments/tune/groupnorm_mish_configs.yaml (forced one-kernel and split configs)
#   wsgrid    experiments/tune/flash_fwd_ws.yaml (TMA forward tiles with and without Triton's
#             warp specialization, D=64 and 128, causal and not, vs cuDNN)
# SEED_RUNS (space-separated run dirs, e.g. committed runs/examples/<id>) are copied into the
# store first, so that a step's since block can pair with a run made in an earlier session.
# Each step is cut at the time left before DEADLINE_S (default 570) so the whole call returns;
# each run's output is OUT_DIR/<step>.log with its wall time appended. `compare` of each A/A pair
# goes to OUT_DIR/<step>.compare.txt.
set -uo pipefail
out=$1; steps=$2; deadline=${3:-570}
store="$out/store"
mkdir -p "$out"
left() { echo $(( deadline - SECONDS - 10 )); }
run() {  # NAME LIMIT ARGS... -> the run dir on stdout (empty if none was stored)
  local name=$1 limit=$2; shift 2
  local l; l=$(left); (( limit > l )) && limit=$l
  if (( limit < 20 )); then echo "$name: skipped, ${l}s left" >> "$out/steps.txt"; return; fi
  local t0=$SECONDS
  timeout "$limit" python3 -m harness run "$@" --store "$store" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc, wall $((SECONDS - t0)) s (limit $limit s)" | tee -a "$out/$name.log" >> "$out/steps.txt"
  grep -o 'run stored at .*' "$out/$name.log" | tail -1 | sed 's/run stored at //'
}
aa() {  # NAME A B
  [ -n "$2" ] && [ -n "$3" ] && python3 -m harness compare "$2" "$3" --store "$store" \
    > "$out/$1.compare.txt" 2>&1
}
fused_all="layernorm layernorm_bwd groupnorm_mish linear_gelu mlp"
mkdir -p "$store"; for r in ${SEED_RUNS:-}; do cp -r "$r" "$store/"; done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu \
  --format=csv > "$out/gpu.txt" 2>&1
for step in ${steps//,/ }; do
  case $step in
    flash) f1=$(run flash 300 experiments/flash.yaml) ;;
    flash_aa) f2=$(run flash_aa 120 experiments/flash.yaml --cases '*N=4096*')
              aa flash_aa "${f1:-}" "${f2:-}" ;;
    flash_again) f3=$(run flash_again 300 experiments/flash.yaml)
                 aa flash_again "${f1:-}" "${f3:-}" ;;
    worse)
      ks="kernels/attention/flash_fwd.py kernels/attention/flash_fwd_tma.py"
      for k in $ks; do cp "$k" "$out/$(basename "$k").orig"; done
      python3 - $ks <<'PY'
import re, sys
for p in sys.argv[1:]:  # both forms' D=128 candidates (the Tuner times both where N allows TMA)
    s = open(p).read()
    s2 = re.sub(r"128: \[\(128, 64, 8, 3\)[^\]]*\]", "128: [(64, 32, 4, 2)]", s, count=1)
    assert s2 != s, f"the D=128 configs of {p} not found"
    open(p, "w").write(s2)
PY
      run worse 90 experiments/flash.yaml --cases 'triton_flash.*N=4096.D=128*' > /dev/null
      for k in $ks; do cp "$out/$(basename "$k").orig" "$k"; done ;;
    softmax) s1=$(run softmax_a 120 experiments/softmax.yaml)
             s2=$(run softmax_b 120 experiments/softmax.yaml)
             aa softmax_aa "${s1:-}" "${s2:-}" ;;
    tune) run tune 150 experiments/tune/flash_fwd_configs.yaml --cases '*causal=false*' > /dev/null ;;
    bwd) b1=$(run bwd 400 experiments/flash_bwd.yaml) ;;
    bwd_again) b2=$(run bwd_again 400 experiments/flash_bwd.yaml)
               aa bwd_again "${b1:-}" "${b2:-}" ;;
    clockaa) c1=$(run clock_a 150 experiments/flash.yaml --cases 'triton_flash.*,sdpa_cudnn.*')
             c2=$(run clock_b 150 experiments/flash.yaml --cases 'triton_flash.*,sdpa_cudnn.*')
             aa clockaa "${c1:-}" "${c2:-}" ;;
    bwdgrid) run bwd_dkdv 200 experiments/tune/flash_bwd_dkdv_grid.yaml > /dev/null
             run bwd_dq 150 experiments/tune/flash_bwd_dq_grid.yaml > /dev/null ;;
    fused_before)
      [ -f "${BEFORE_TGZ:-}" ] || { echo "fused_before: BEFORE_TGZ not set or missing" >> "$out/steps.txt"; continue; }
      rm -rf "$out/now" && mkdir -p "$out/now" && cp -r kernels experiments "$out/now/"
      rm -rf kernels experiments && tar xzf "$BEFORE_TGZ"
      # the runs record the archive's commit (BEFORE_REV, else the tgz's name before_<rev>.tgz)
      now_sha=${HARNESS_GIT_SHA:-}
      export HARNESS_GIT_SHA=${BEFORE_REV:-$(basename "$BEFORE_TGZ" .tgz | sed 's/^before_//')}
      for e in ${FUSED_BEFORE:-${FUSED:-$fused_all}}; do
        run "before_$e" 150 "experiments/$e.yaml" > /dev/null
      done
      export HARNESS_GIT_SHA=$now_sha
      rm -rf kernels experiments && cp -r "$out/now/kernels" "$out/now/experiments" . ;;
    fused)
      for e in ${FUSED:-$fused_all}; do
        run "$e" 150 "experiments/$e.yaml" > /dev/null
      done ;;
    matmul) run linear_gelu 150 experiments/linear_gelu.yaml > /dev/null
            run mlp 150 experiments/mlp.yaml > /dev/null ;;
    probe) timeout "$(left)" python3 tools/device/compile_probe.py warmcache > "$out/probe.txt" 2>&1
           echo "probe: exit $?" >> "$out/steps.txt" ;;
    fatma) run fatma 240 experiments/flash_tma.yaml > /dev/null ;;
    hprof)
      cold=$(mktemp -d)
      h=$(TRITON_CACHE_DIR="$cold/triton" TORCHINDUCTOR_CACHE_DIR="$cold/inductor" \
          run hprof 240 experiments/flash.yaml --cases '*N=4096*' --profile-harness)
      [ -n "$h" ] && mkdir -p "$out/hprof" && cp "$h"/raw/harness_profile/*.txt "$out/hprof/" ;;
    fbtma) run fbtma 300 experiments/flash_bwd_tma.yaml > /dev/null ;;
    fatmagrid) run fatmagrid 200 experiments/tune/flash_fwd_tma_configs.yaml > /dev/null ;;
    lgtma) run lgtma 200 experiments/tune/linear_gelu_tma_configs.yaml > /dev/null ;;
    gngrid) run gngrid 200 experiments/tune/groupnorm_mish_configs.yaml > /dev/null ;;
    wsgrid) run wsgrid 200 experiments/tune/flash_fwd_ws.yaml > /dev/null ;;
    pyc)
      p=$(mktemp -d)  # not the harness's own prefix: later steps must start as cold as before
      code='import time, torch; t = time.time(); f = torch.compile(lambda x: x * 2 + 1)
f(torch.ones(8, device="cuda")); torch.cuda.synchronize(); print(f"first call {time.time() - t:.2f} s")'
      TIMEFORMAT='%R s wall'
      for label in dontwrite dontwrite prefix prefix; do
        echo "== $label"
        if [ "$label" = dontwrite ]; then time (PYTHONDONTWRITEBYTECODE=1 python3 -c "$code")
        else time (env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX="$p" python3 -c "$code"); fi
      done >> "$out/pyc.txt" 2>&1
      echo "pyc: done" >> "$out/steps.txt" ;;
    srccost)
      python3 - experiments/flash.yaml "$out/flash_nosrc.yaml" <<'PY'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
d["profile"]["ncu"]["source_lines"] = False
yaml.safe_dump(d, open(sys.argv[2], "w"), sort_keys=False)
PY
      c='*.N=4096.D=128.causal=false.mode=fwd.float16'
      on=$(run src_on 150 experiments/flash.yaml --cases "$c")
      off=$(run src_off 150 "$out/flash_nosrc.yaml" --cases "$c")
      [ -n "$on" ] && [ -n "$off" ] && python3 - "$on" "$off" > "$out/srccost.txt" 2>&1 <<'PY'
import json, sys
on, off = (json.load(open(f"{d}/manifest.json"))["profiler_wall_s"]["ncu"] for d in sys.argv[1:3])
print(f"ncu pass: source on {on['wall_s']} s (export {on.get('export_s')} s), "
      f"off {off['wall_s']} s (export {off.get('export_s')} s)")
for case, s_on in sorted(on["per_case_s"].items()):
    s_off = off["per_case_s"].get(case)
    print(f"{case:72s} on {s_on:6.2f}  off {s_off:6.2f}  +{s_on - s_off:5.2f} s")
PY
      ;;
    *) echo "unknown step $step (flash, flash_aa, flash_again, worse, softmax, tune, bwd, bwd_again, bwdgrid, clockaa, pyc, srccost, fused_before, fused, fatma, fbtma, fatmagrid, lgtma, gngrid, wsgrid, hprof, matmul, probe)"; exit 2 ;;
  esac
done
cat "$out/steps.txt"
