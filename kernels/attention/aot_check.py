"""Build the attention kernels for a GPU target without a GPU: does each launch configuration
compile for sm_90, and what does it cost (registers, spill stack, shared memory, wgmma count)?

    python -m kernels.attention.aot_check              # every configuration, D 64 and 128
    python -m kernels.attention.aot_check --quick      # the first configuration of each kernel

Uses the ptxas and cuobjdump shipped in the triton wheel. It must run WITHOUT
TRITON_INTERPRET=1 (under the interpreter @triton.jit gives Python functions, not kernels).
The numbers come from the local triton (3.9 here; the GPU box has 3.6): a guide for pruning the
config lists, not a measurement.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from kernels._aot import compile_cost, compile_gluon_cost



# Spill stack (bytes, this machine's triton build) a configuration may keep without failing the
# check, keyed (kernel, D, causal, config): any growth past it fails. The one-pass Gluon
# backward's programs take their (head, key tile) from an atomic ticket (flash_bwd_gluon.py), so
# the consumers' row offsets are loaded values ptxas cannot recompute from the block index:
# triton 3.9's causal D=128 builds spill 56 B (3 stages) and 40 B (2), where they spilled none
# before the ticket (its non-causal 2-stage build, 64 B before, 96 B now, is over: as before).
# The GPU's triton 3.6 builds reported n_spills up to 8 (before: up to 4), and the kernels'
# do_bench medians were within 1 % of the ticket-less ones or faster (one H100, D 64 and 128,
# N 4096 and 16384, causal and not).
SPILL_BUDGET = {("gluon_bwd_tma", 128, True, (64, 128, 4, 3)): 56,
                ("gluon_bwd_tma", 128, True, (64, 128, 4, 2)): 40}


@dataclass(frozen=True)
class Build:
    kernel: str
    D: int
    causal: bool
    config: tuple
    regs: int
    stack: int
    smem_bytes: int
    wgmma: int
    tma: int  # cp.async.bulk.tensor copies in the PTX (TMA loads and stores)

    def line(self) -> str:
        return (f"{self.kernel:10s} D={self.D:<3d} causal={str(self.causal):5s} {str(self.config):18s}"
                f" regs {self.regs:3d}  spill stack {self.stack:4d} B  smem "
                f"{self.smem_bytes / 1024:6.1f} KiB  wgmma {self.wgmma}  tma {self.tma}")


def build(fn, name: str, pointers: dict[str, str], scalars: dict[str, str], consts: dict,
          config: tuple, D: int, causal: bool, capability: int = 90) -> Build:
    """Compile `fn` for sm_<capability>; pointers 16-byte aligned and n_ctx % 16 == 0 (what
    Triton assumes at launch for the sweep's shapes)."""
    signature = {**pointers, **scalars, **{k: "constexpr" for k in consts}}
    c = compile_cost(fn, signature, consts, [*pointers, "n_ctx"], config[2], config[3],
                     capability)
    return Build(name, D, causal, tuple(config), c.regs, c.stack, c.smem_bytes, c.wgmma, c.tma)


def build_gluon(D: int, causal: bool, config: tuple, dtype: str = "fp16") -> Build | None:
    """The Gluon FA3-form forward (flash_fwd_gluon.py) for sm_90; None without Gluon."""
    import torch

    from kernels.attention import flash_fwd_gluon as fg

    if fg.gluon is None:
        return None
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    rows = torch.empty(4 * fg.BLOCK_M, D, dtype=tdt)  # a CPU tensor: only its type matters
    bm, bn, warps, stages = config
    dq, dk, dv, do = fg.descriptors([rows] * 4, bn)
    sig = {"desc_q": dq, "desc_k": dk, "desc_v": dv, "desc_o": do,
           "LSE": "*fp32", "n_ctx": "i32", "qk_scale": "fp32"}
    wg = bm // fg.SUB_M
    consts = {"BLOCK_N": bn, "STAGES": stages, "CAUSAL": causal, "OVERLAP": True,
              "PINGPONG": False, "NUM_WG": wg,  # the variant the Tuner's TMA: 4 launches
              "CONSUMER_REGS": fg.CONSUMER_REGS[wg], "HEADS_FIRST": False}
    c = compile_gluon_cost(fg._flash_fwd_gluon_kernel, {**sig, **{k: "constexpr" for k in consts}},
                           consts, warps)
    return Build("gluon_tma", D, causal, tuple(config), c.regs, c.stack, c.smem_bytes, c.wgmma,
                 c.tma)


def build_gluon_bwd(D: int, causal: bool, config: tuple, dtype: str = "fp16") -> Build | None:
    """The one-pass Gluon backward (flash_bwd_gluon.py) for sm_90; None without Gluon."""
    import torch

    from kernels.attention import flash_bwd_gluon as gb

    if gb.gluon is None:
        return None
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    rows = torch.empty(4 * gb.BLOCK_N, D, dtype=tdt)  # CPU tensors: only their types matter
    acc = torch.empty(4 * gb.BLOCK_N, D, dtype=torch.float32)
    flat = torch.empty(4 * gb.BLOCK_N, dtype=torch.float32)
    names = ("desc_q", "desc_k", "desc_v", "desc_do", "desc_dqa", "desc_lse", "desc_delta")
    sig = {**dict(zip(names, gb.descriptors(rows, rows, rows, rows, acc, flat, flat))),
           "DK": "*" + dtype, "DV": "*" + dtype, "DQ": "*" + dtype, "DQA": "*fp32",
           "SYNC": "*i32", "n_ctx": "i32", "n_bh": "i32", "ring": "i32", "qk_scale": "fp32",
           "sm_scale": "fp32"}
    consts = {"STAGES": config[3], "CAUSAL": causal, "CAST_ROWS": gb.CAST_ROWS}
    c = compile_gluon_cost(gb._flash_bwd_gluon_kernel,
                           {**sig, **{k: "constexpr" for k in consts}}, consts, config[2])
    return Build("gluon_bwd_tma", D, causal, tuple(config), c.regs, c.stack, c.smem_bytes,
                 c.wgmma, c.tma)


def builds(quick: bool, dtype: str = "fp16", dims=(64, 128)):
    """Yield a Build per (kernel, D, causal, config)."""
    from kernels.attention import (flash_bwd, flash_bwd_gluon, flash_bwd_tma, flash_fwd,
                                   flash_fwd_gluon, flash_fwd_tma, fused_mha)

    t = "*" + dtype
    fwd_ptrs = {"Q": t, "K": t, "V": t, "O": t, "LSE": "*fp32"}
    bwd_ptrs = {"Q": t, "K": t, "V": t, "DO": t, "LSE": "*fp32", "DELTA": "*fp32"}
    bwd_scalars = {"n_ctx": "i32", "qk_scale": "fp32", "sm_scale": "fp32"}
    pick = (lambda cs: cs[:1]) if quick else (lambda cs: cs)

    def descs(D: int, **boxes: int) -> dict[str, str]:
        return {name: f"tensordesc<{dtype}[{rows},{D}]>" for name, rows in boxes.items()}
    for D in dims:
        for causal in (False, True):
            flags = {"HEAD_DIM": D, "CAUSAL": causal, "INTERP_BF16": False}
            for c in pick(flash_fwd.FWD_CONFIGS[D]):
                yield build(flash_fwd._flash_fwd_kernel, "fwd", fwd_ptrs,
                            {"n_ctx": "i32", "qk_scale": "fp32"},
                            {**flags, "BLOCK_M": c[0], "BLOCK_N": c[1]}, c, D, causal)
            for c in pick(flash_fwd_tma.TMA_CONFIGS[D]):
                yield build(flash_fwd_tma._flash_fwd_tma_kernel, "fwd_tma",
                            {**descs(D, desc_q=c[0], desc_k=c[1], desc_v=c[1], desc_o=c[0]),
                             "LSE": "*fp32"}, {"n_ctx": "i32", "qk_scale": "fp32"},
                            {**flags, "BLOCK_M": c[0], "BLOCK_N": c[1], "WS": False}, c, D,
                            causal)
            for c in pick(flash_fwd_gluon.GLUON_CONFIGS[D]):
                b = build_gluon(D, causal, c, dtype)
                if b is not None:
                    yield b
            for c in pick(flash_bwd_gluon.GLUON_CONFIGS.get(D, [])):
                b = build_gluon_bwd(D, causal, c, dtype)
                if b is not None:
                    yield b
            for c in pick(flash_bwd.DKDV_CONFIGS[D]):
                yield build(flash_bwd._bwd_dkdv_kernel, "bwd_dkdv", {**bwd_ptrs, "DK": t, "DV": t},
                            bwd_scalars, {**flags, "BLOCK_M1": c[0], "BLOCK_N1": c[1]}, c, D,
                            causal)
            for c in pick(flash_bwd.DQ_CONFIGS[D]):
                yield build(flash_bwd._bwd_dq_kernel, "bwd_dq", {**bwd_ptrs, "DQ": t},
                            bwd_scalars, {**flags, "BLOCK_M2": c[0], "BLOCK_N2": c[1]}, c, D,
                            causal)
            for c in pick(flash_bwd.DKDV_CONFIGS[D]):
                bm, bn = c[0], c[1]
                yield build(flash_bwd_tma._bwd_dkdv_tma_kernel, "dkdv_tma",
                            {**descs(D, desc_q=bm, desc_k=bn, desc_v=bn, desc_do=bm),
                             "LSE": "*fp32", "DELTA": "*fp32",
                             **descs(D, desc_dk=bn, desc_dv=bn)}, bwd_scalars,
                            {**flags, "BLOCK_M1": bm, "BLOCK_N1": bn}, c, D, causal)
            for c in pick(flash_bwd.DQ_CONFIGS[D]):
                bm, bn = c[0], c[1]
                yield build(flash_bwd_tma._bwd_dq_tma_kernel, "dq_tma",
                            {**descs(D, desc_q=bm, desc_k=bn, desc_v=bn, desc_do=bm),
                             "LSE": "*fp32", "DELTA": "*fp32", **descs(D, desc_dq=bm)},
                            bwd_scalars, {**flags, "BLOCK_M2": bm, "BLOCK_N2": bn}, c, D,
                            causal)
            for c in pick(fused_mha.CONFIGS):
                yield build(fused_mha._fused_mha_kernel, "fused_mha",
                            {"Q": t, "K": t, "V": t, "O": t, "S": "*fp32"},
                            {"n_ctx": "i32", "qk_scale": "fp32"},
                            {**flags, "BLOCK_M": c[0], "BLOCK_N": c[1]}, c, D, causal)
        yield build(flash_bwd._bwd_preprocess, "bwd_delta",
                    {"O": t, "DO": t, "DELTA": "*fp32", "ACC": "*fp32", "SYNC": "*i32"},
                    {"n_ctx": "i32", "ring": "i32"},
                    {"HEAD_DIM": D, "BLOCK": flash_bwd.PRE_BLOCK, "ZERO": True},
                    (flash_bwd.PRE_BLOCK, 0, 4, 1), D, False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.attention.aot_check")
    ap.add_argument("--quick", action="store_true", help="first configuration of each kernel")
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    ap.add_argument("--d", default="64,128", help="head dims, comma-separated")
    a = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("aot_check: unset TRITON_INTERPRET (the interpreter has no kernels to build)",
              file=sys.stderr)
        return 2
    spills = 0
    for b in builds(a.quick, a.dtype, tuple(int(x) for x in a.d.split(","))):
        over = b.stack > SPILL_BUDGET.get((b.kernel, b.D, b.causal, b.config), 0)
        print(b.line() + ("  (over budget)" if over else ""), flush=True)
        spills += over
    print(f"{spills} configuration(s) spill registers past their budget (SPILL_BUDGET)")
    return 1 if spills else 0


if __name__ == "__main__":
    sys.exit(main())
