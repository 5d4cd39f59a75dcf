"""Compile a Triton kernel for sm_90 without a GPU and read what it costs.

Used by the per-family build checks (kernels/attention/aot_check.py,
kernels/layernorm/fused_aot_check.py). Uses the ptxas and cuobjdump shipped in the triton wheel;
must run WITHOUT TRITON_INTERPRET=1 (under the interpreter @triton.jit gives Python functions).
The numbers come from the local triton, not the GPU box's: a guide for config lists.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler import compile as triton_compile


@dataclass(frozen=True)
class Cost:
    regs: int
    stack: int  # spill stack, bytes
    smem_bytes: int
    wgmma: int  # wgmma.mma_async instructions in the PTX
    vec16: int  # 128-bit global loads/stores in the PTX
    cp_async: int = 0  # cp.async global -> shared copies in the PTX (a pipelined loop's loads)
    tma: int = 0  # cp.async.bulk.tensor copies in the PTX (TMA loads and stores)
    gdc: int = 0  # griddepcontrol instructions (programmatic dependent launch) in the PTX


def _resources(cubin: bytes) -> tuple[int, int]:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    regs = re.search(r"REG:(\d+)", out)
    stack = re.search(r"STACK:(\d+)", out)
    if regs is None or stack is None:
        raise RuntimeError(f"cuobjdump -res-usage gave no REG/STACK: {out[:200]!r}")
    return int(regs.group(1)), int(stack.group(1))


def _cost(k) -> Cost:
    regs, stack = _resources(k.asm["cubin"])
    ptx = k.asm["ptx"]
    return Cost(regs, stack, int(k.metadata.shared), ptx.count("wgmma.mma_async"),
                len(re.findall(r"(?:ld|st)\.global[^\n]*\.v4\.b32", ptx)),
                len(re.findall(r"cp\.async\.c[ag]\.shared", ptx)),
                ptx.count("cp.async.bulk.tensor"), ptx.count("griddepcontrol."))


def compile_gluon_cost(fn, signature: dict, consts: dict, warps: int,
                       capability: int = 90, aligned=(), maxnreg: int | None = None) -> Cost:
    """Compile the Gluon kernel `fn` (signature: arg -> type, "constexpr", or a host-side
    Gluon TensorDescriptor, whose type string is taken from it: only its dtype, shape and block
    matter, a CPU tensor will do; `aligned`: args the launch marks divisible by 16; `maxnreg`:
    the launch's register cap, if any). `regs` is the launch's per-thread budget; a
    warp-specialized kernel's partitions re-divide it (setmaxnreg)."""
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    sig = {a: t if isinstance(t, str) else mangle_type(t) for a, t in signature.items()}
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = GluonASTSource(fn, sig, constexprs=consts, attrs=attrs)
    options = {"num_warps": warps, **({"maxnreg": maxnreg} if maxnreg else {})}
    return _cost(triton_compile(src, target=GPUTarget("cuda", capability, 32), options=options))


def compile_cost(fn, signature: dict, consts: dict, aligned, warps: int, stages: int,
                 capability: int = 90) -> Cost:
    """Compile `fn` (signature: arg -> type or "constexpr"; `aligned`: args the launch marks
    divisible by 16, as Triton does for 16-aligned pointers and multiples of 16)."""
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    return _cost(triton_compile(src, target=GPUTarget("cuda", capability, 32),
                                options={"num_warps": warps, "num_stages": stages}))
