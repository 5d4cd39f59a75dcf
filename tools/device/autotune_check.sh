#!/usr/bin/env bash
# Issue #35 on a GPU: a user's @triton.autotune kernel, outside the repository, swept from the YAML.
#   source .devcarry/env.sh; bash tools/device/autotune_check.sh      (repo root, one H100/H200)
# Writes a user-style module (SwiGLU c = silu(a) * b, one Triton kernel autotuned over BLOCK_SIZE
# 1024/2048/4096 x num_warps 4/8, key n_elements) into a folder outside the checkout, loads it
# with HARNESS_OPS=<its path>, and runs an experiment whose candidates are the autotuner's own
# pick (`triton`) and two forced configs (`variants:` BLOCK_SIZE 1024 and 4096 at 4 warps), at
# two sizes (two autotune keys). Then `python -m harness picks RUN`: the autotuner's timings of
# every config per key, fastest first. If time is left (< 100 s spent), the experiment runs again:
# its since block pairs it with the first run (and says if the autotuner chose differently).
# Output, printed and kept under $OUT (default /tmp/autotune_check): run.log, picks.txt,
# picks.json, show.json, again.log, device.txt, the module and YAML, and the store itself.
# Expected wall time on an H100: about 1-2 minutes (two runs), well under 3.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/autotune_check}
mkdir -p "$out"
py=$(command -v python3 || command -v python)
work=$(mktemp -d /tmp/user_kernels.XXXXXX)  # outside the repository: a user's own folder
start=$SECONDS

cat > "$work/swiglu_ops.py" <<'EOF'
"""A user's SwiGLU op (outside kernel-lab): c = silu(a) * b over N elements."""
import torch
import triton
import triton.language as tl

from harness.registry import Op, Param

op = Op("swiglu_user", params=[Param("N", int, size=True)], dtypes=("float16", "bfloat16"))


@op.inputs
def make_inputs(p, dtype, device, gen):
    a = torch.randn(p.N, device=device, generator=gen, dtype=torch.float32).to(dtype)
    b = torch.randn(p.N, device=device, generator=gen, dtype=torch.float32).to(dtype)
    return a, b


@op.reference
def reference(a, b):
    return torch.nn.functional.silu(a) * b


@op.flops
def flops(p):
    return 5.0 * p.N


@op.bytes
def nbytes(p, itemsize):
    return 3.0 * p.N * itemsize  # read a, b; write c


@op.impl("torch", backend="torch")
def swiglu_torch(a, b):
    return torch.nn.functional.silu(a) * b


@triton.autotune(
    configs=[triton.Config({"BLOCK_SIZE": bs}, num_warps=w)
             for bs in (1024, 2048, 4096) for w in (4, 8)],
    key=["n_elements"],
)
@triton.jit
def _swiglu_kernel(a_ptr, b_ptr, c_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    a = tl.load(a_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    tl.store(c_ptr + offs, (a * tl.sigmoid(a) * b).to(c_ptr.dtype.element_ty), mask=mask)


@op.impl("triton", backend="triton")
def swiglu_triton(a, b):
    c = torch.empty_like(a)
    n = a.numel()
    _swiglu_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)](a, b, c, n)
    return c
EOF

cat > "$work/swiglu.yaml" <<'EOF'
name: swiglu-autotune
op: swiglu_user
baseline: torch
candidates: [triton]                                   # the autotuner's own pick
variants: {triton: {BLOCK_SIZE: [1024, 4096], num_warps: [4]}}   # two forced configs
sweep: {N: [4194304, 67108864]}                         # two autotune keys
smoke: {N: [3000]}                                      # (a GPU-less machine: the interpreter)
dtypes: [float16]
timing: {rep_ms: 100}
EOF
cp "$work/swiglu_ops.py" "$work/swiglu.yaml" "$out/"
export HARNESS_OPS="$work/swiglu_ops.py"
store="$out/store"

{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1
  "$py" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} | tee "$out/device.txt"

echo "== python -m harness list (the impl's tunables)"
"$py" -m harness list --experiments "$work" 2>&1 | grep -E "swiglu_user|tunables" | tee "$out/list.txt"

echo "== python -m harness run $work/swiglu.yaml"
timeout 150 "$py" -m harness run "$work/swiglu.yaml" --store "$store" 2>&1 | tee "$out/run.log"
run=$(ls -d "$store"/*-swiglu-autotune-* 2>/dev/null | head -1)
if [ -z "$run" ]; then echo "no run was stored"; exit 1; fi
echo "run: $run ($(( SECONDS - start )) s)"

echo "== python -m harness picks $(basename "$run")"
"$py" -m harness picks "$run" 2>&1 | tee "$out/picks.txt"
"$py" -m harness picks "$run" --format json > "$out/picks.json" 2>&1
"$py" -m harness show "$run" --format json > "$out/show.json" 2>&1
"$py" - "$run" <<'EOF' | tee "$out/configs.txt"
import json, sys
import pandas as pd
run = sys.argv[1]
cases = pd.read_parquet(f"{run}/cases.parquet")[["case_id", "impl", "status"]]
res = pd.read_parquet(f"{run}/results.parquet")
df = cases.merge(res, on="case_id")
for r in df.itertuples():
    print(f"{r.case_id}: {r.status} correct={r.correct} median_us={r.median_ms * 1e3:.1f} "
          f"source={r.config_source} config={r.config}")
EOF

if (( SECONDS - start < 100 )); then
  echo "== again (its since block pairs it with the first run)"
  timeout $(( 175 - (SECONDS - start) )) "$py" -m harness run "$work/swiglu.yaml" \
    --store "$store" 2>&1 | tee "$out/again.log"
else
  echo "== again: skipped ($(( SECONDS - start )) s spent)"
fi
echo "wall: $(( SECONDS - start )) s" | tee -a "$out/device.txt"
rm -rf "$work"
