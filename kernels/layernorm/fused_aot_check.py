"""Build the fused-op kernels (vector_add, layernorm fwd/bwd, add_layernorm, linear_gelu/mlp
matmul and its TMA form, fused mlp, groupnorm_mish) for sm_90 without a GPU: does every launch configuration the
Tuners may pick compile, and what does it cost (registers, spill stack, shared memory, wgmma,
16-byte global accesses, cp.async copies of a pipelined loop)?

    python -m kernels.layernorm.fused_aot_check            # every configuration, fp16
    python -m kernels.layernorm.fused_aot_check --quick    # first configuration of each kernel
    python -m kernels.layernorm.fused_aot_check --dtype bf16 --only matmul,mlp_fused

Uses the ptxas and cuobjdump shipped in the triton wheel; must run WITHOUT TRITON_INTERPRET=1.
Ints are specialised as the GPU launch would specialise the benchmark shapes (multiples of 16
marked divisible by 16, unit strides folded to constants). The numbers come from the local
triton (3.9; the GPU box has 3.6): a guide for the config lists, not a measurement.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from kernels._aot import compile_cost, compile_gluon_cost

import triton
import triton.language as tl


@dataclass(frozen=True)
class Build:
    kernel: str
    config: str
    regs: int
    stack: int
    smem_bytes: int
    wgmma: int
    vec16: int  # 128-bit global loads/stores in the PTX
    cp_async: int  # global -> shared copies (a software-pipelined loop's loads)
    tma: int  # cp.async.bulk.tensor copies (TMA loads and stores)
    gdc: int = 0  # griddepcontrol instructions (programmatic dependent launch)

    def line(self) -> str:
        return (f"{self.kernel:14s} {self.config:34s} regs {self.regs:3d}  spill stack "
                f"{self.stack:4d} B  smem {self.smem_bytes / 1024:6.1f} KiB  wgmma "
                f"{self.wgmma:3d}  v4 ld/st {self.vec16:2d}  cp.async {self.cp_async}  "
                f"tma {self.tma}")


def build(fn, name: str, label: str, args: dict, consts: dict, warps: int, stages: int = 1,
          aligned: tuple = ()) -> Build:
    """Compile `fn` for sm_90. `args`: name -> type ("*fp16", "i32", "fp32"); `consts`:
    constexpr values (and unit strides); `aligned`: args the launch marks divisible by 16
    (pointers always are)."""
    signature = {a: args.get(a, "constexpr") for a in fn.arg_names}
    div16 = [a for a, t in args.items() if t.startswith("*")] + list(aligned)
    c = compile_cost(fn, signature, consts, div16, warps, stages)
    return Build(name, label, c.regs, c.stack, c.smem_bytes, c.wgmma, c.vec16, c.cp_async,
                 c.tma, c.gdc)


def build_smem(cfg: tuple, cpg: int, hw: int, dtype: str) -> Build:
    """Compile groupnorm_mish's shared-memory form (a Gluon kernel) for sm_90 at config
    (0, num_warps, STAGES, SPLIT, 2, ROWS)."""
    import torch

    from kernels.groupnorm_mish import smem_gluon as sg

    _, warps, stages, split, _, rows = cfg
    tdt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    cr, c, consts = sg.kernel_consts(cfg, cpg, hw, tdt.itemsize)
    warps, maxnreg = consts.pop("num_warps"), consts.pop("maxnreg", None)
    t = "*" + dtype
    desc = sg.descriptor(torch.empty(cr, c, dtype=tdt), cr)
    sig = {"desc": desc, "x_ptr": t, "w_ptr": t, "b_ptr": t, "y_ptr": t, "part_ptr": "*i64",
           "n_tiles": "i32", "G": "i32", "CPG": "i32", "eps": "fp32"}
    k = compile_gluon_cost(sg._gn_mish_smem, {**{a: "constexpr" for a in consts}, **sig},
                           consts, warps,
                           aligned=[a for a, v in sig.items() if str(v).startswith("*")],
                           maxnreg=maxnreg)
    return Build("groupnorm_mish", f"HW={hw} smem {split}x{cpg * hw // split} w{warps} "
                 f"ROWS={rows} {stages}/SM", k.regs, k.stack, k.smem_bytes, k.wgmma, k.vec16,
                 k.cp_async, k.tma, k.gdc)


def builds(dtype: str, only: set[str] | None, quick: bool = False):
    from kernels.groupnorm_mish import triton_groupnorm_mish as tgm
    from kernels.groupnorm_mish.exchange import lanes
    from kernels.layernorm import triton_layernorm as tln
    from kernels.layernorm import triton_layernorm_bwd as tlb
    from kernels.linear_gelu import triton_matmul as tm
    from kernels.linear_gelu import triton_matmul_tma as tmt
    from kernels.mlp import triton_mlp
    from kernels.vector_add import triton_vector_add as tva

    t = "*" + dtype
    item = 4 if dtype == "fp32" else 2

    def want(k):
        return only is None or k in only

    def pick(configs):
        return list(configs)[:1] if quick else list(configs)

    if want("vector_add"):
        for block, warps in pick(tva.CONFIGS):
            yield build(tva._add_kernel, "vector_add", f"BLOCK={block} w{warps}",
                        {"x_ptr": t, "y_ptr": t, "z_ptr": t, "n": "i64"},
                        {"BLOCK": block, "EVEN": True}, warps, aligned=("n",))
    ln_args = {"x_ptr": t, "r_ptr": t, "h_ptr": t, "y_ptr": t, "w_ptr": t, "b_ptr": t,
               "mean_ptr": "*fp32", "rstd_ptr": "*fp32", "M": "i32", "N": "i32",
               "x_stride": "i32", "r_stride": "i32", "h_stride": "i32", "y_stride": "i32",
               "eps": "fp32"}
    strides = ("N", "x_stride", "r_stride", "h_stride", "y_stride")
    for M, N in ((16384, 1024), (8192, 4096), (8192, 5120))[:1 if quick else 3]:
        for has_res, kname in ((False, "layernorm"), (True, "add_layernorm")):
            if not want(kname):
                continue
            block, tail = tln.segments(N)
            for rows, warps, per_sm, stages in pick(tln.configs(M, N, item, has_res=has_res)):
                consts = {"HAS_RES": has_res, "STORE_STATS": False, "ROWS": rows,
                          "BLOCK_N": block, "TAIL": tail}
                if per_sm:  # the persistent kernel; per_sm is launch-only
                    yield build(tln._ln_fwd_persistent, kname,
                                f"N={N} ROWS={rows} w{warps} persistent STAGES={stages}",
                                ln_args, {**consts, "STAGES": stages}, warps, aligned=strides)
                else:
                    yield build(tln._ln_fwd_rows, kname, f"N={N} ROWS={rows} w{warps}",
                                ln_args, consts, warps, aligned=strides)
        if want("layernorm_bwd"):
            builds_of = {c[1:]: c for c in tlb.configs(M, N, item)}  # per_sm: launch-only
            for _, rows, warps, stages in pick(builds_of.values()):
                yield build(tlb._ln_bwd_rows, "layernorm_bwd",
                            f"N={N} ROWS={rows} w{warps} STAGES={stages}",
                            {"x_ptr": t, "dy_ptr": t, "w_ptr": t, "mean_ptr": "*fp32",
                             "rstd_ptr": "*fp32", "dx_ptr": t, "dwp_ptr": "*fp32",
                             "dbp_ptr": "*fp32", "M": "i32", "N": "i32", "x_stride": "i32",
                             "dy_stride": "i32", "dx_stride": "i32", "rows_per_prog": "i32"},
                            {"ROWS": rows, "BLOCK_N": triton.next_power_of_2(N),
                             "STAGES": stages, "PDL": True}, warps,
                            aligned=("N", "x_stride", "dy_stride", "dx_stride"))
            # the column sum, a programmatic dependent launch on sm_90 (gdc_wait)
            bp, bc = tlb.colsum_tiles(132 * 4, N, 132)
            yield build(tlb._ln_bwd_colsum, "layernorm_bwd", f"N={N} colsum {bp}x{bc} PDL",
                        {"dwp_ptr": "*fp32", "dbp_ptr": "*fp32", "dw_ptr": t, "db_ptr": t,
                         "P": "i32", "N": "i32"},
                        {"BLOCK_P": bp, "BLOCK_C": bc, "PDL": True}, 4, aligned=("N",))
    if want("matmul") and dtype != "fp32":
        for cfg in pick(tm.CONFIGS):
            for act in (1, 2):
                yield build(tm._matmul_bias_act, "matmul",
                            f"{cfg.label()} {'erf' if act == 1 else 'tanh'}",
                            {"a_ptr": t, "w_ptr": t, "bias_ptr": t, "c_ptr": t, "M": "i32",
                             "N": "i32", "K": "i32", "s_am": "i32", "s_wn": "i32",
                             "s_cm": "i32"},
                            {"s_ak": 1, "s_wk": 1, "s_cn": 1, "HAS_BIAS": True, "ACT": act,
                             "EVEN_K": True, "DOT_F32": False, "BLOCK_M": cfg.block_m,
                             "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
                             "GROUP_M": cfg.group_m}, cfg.num_warps, cfg.num_stages,
                            aligned=("M", "N", "K", "s_am", "s_wn", "s_cm"))
    if want("matmul_tma") and dtype != "fp32":
        for cfg in pick(tmt.CONFIGS):
            def desc(rows, cols):
                return f"tensordesc<{dtype}[{rows},{cols}]>"
            yield build(tmt._matmul_tma, "matmul_tma", f"{cfg.label()} erf",
                        {"a_desc": desc(cfg.block_m, cfg.block_k),
                         "w_desc": desc(cfg.block_n, cfg.block_k),
                         "c_desc": desc(cfg.block_m, cfg.block_n // cfg.epi_split),
                         "bias_ptr": t, "M": "i32", "N": "i32", "K": "i32"},
                        {"HAS_BIAS": True, "ACT": 1, "DOT_F32": False, "BLOCK_M": cfg.block_m,
                         "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
                         "GROUP_M": cfg.group_m, "EPI_SPLIT": cfg.epi_split, "NUM_SMS": 132,
                         "C_DTYPE": {"fp16": tl.float16, "bf16": tl.bfloat16}[dtype]},
                        cfg.num_warps, cfg.num_stages, aligned=("M", "N", "K"))
    if want("mlp_fused") and dtype != "fp32":
        for c in pick(triton_mlp.FUSED_CONFIGS):
            yield build(triton_mlp._mlp_fused, "mlp_fused",
                        f"D=128 BM={c.block_m} BH={c.block_h} w{c.num_warps} s{c.num_stages}",
                        {"x_ptr": t, "w1_ptr": t, "b1_ptr": t, "w2_ptr": t, "b2_ptr": t,
                         "y_ptr": t, "M": "i32", "H": "i32", "D": "i32", "s_xm": "i32",
                         "s_w1h": "i32", "s_w2d": "i32", "s_ym": "i32"},
                        {"ACT": 1, "DOT_F32": False, "BLOCK_M": c.block_m, "BLOCK_D": 128,
                         "BLOCK_H": c.block_h}, c.num_warps, c.num_stages,
                        aligned=("M", "H", "D", "s_xm", "s_w1h", "s_w2d", "s_ym"))
    if want("groupnorm_mish"):
        # 32 groups on 132 SMs: the split form's candidates too
        for cpg, hw in ((10, 4096), (20, 1024), (10, 16384))[:1 if quick else 3]:
            cands = tgm.configs(cpg, hw, 32, 132, None, item)
            picked = (cands[:1] + [c for c in cands if c[3] and not c[4]][:1]
                      + [c for c in cands if c[4] == 1][:1]
                      + [c for c in cands if c[4] == 2][:1]) if quick else cands
            for block, warps, stages, split, sync, rows in picked:
                if sync == 2:
                    yield build_smem((block, warps, stages, split, sync, rows), cpg, hw, dtype)
                    continue
                if sync:
                    cb, hb, nct, nht = tgm.sync_tiles(cpg, hw, block)
                    yield build(tgm._gn_mish_sync, "groupnorm_mish",
                                f"HW={hw} sync {nct * nht}x {cb}x{hb} w{warps}",
                                {"x_ptr": t, "w_ptr": t, "b_ptr": t, "y_ptr": t,
                                 "part_ptr": "*i64", "CPG": "i32",
                                 "G": "i32", "eps": "fp32"},
                                {"HW": hw, "CB": cb, "HB": hb, "NCT": nct, "NHT": nht,
                                 "K": lanes(nct * nht, warps),
                                 "PHASE": 0, "FAST": True}, warps)
                    continue
                if split == 0:
                    cb, hb, one = tgm.tile(cpg, hw, block)
                    yield build(tgm._gn_mish, "groupnorm_mish",
                                f"HW={hw} {'one' if one else 'two-pass'} {cb}x{hb} w{warps} "
                                f"STAGES={stages}" + (f" ROWS={rows}" if rows else ""),
                                {"x_ptr": t, "w_ptr": t, "b_ptr": t, "y_ptr": t, "CPG": "i32",
                                 "G": "i32", "eps": "fp32"},
                                {"HW": hw, "CB": cb, "HB": hb, "NHT": triton.cdiv(hw, hb),
                                 "ONE_TILE": one, "STAGES": stages, "FAST": True, "ROWS": rows,
                                 "COLS": tgm.flat_cols(warps, item)}, warps)
                    continue
                split, cpc = tgm.chunks(cpg, split)
                cb, hb, _ = tgm.tile(cpc, hw, block)
                tiles = {"HW": hw, "CB": cb, "HB": hb, "NHT": triton.cdiv(hw, hb),
                         "SPLIT": split, "STAGES": stages}
                label = (f"HW={hw} split {split}x{cpc}ch {cb}x{hb} w{warps} STAGES={stages}"
                         + (f" ROWS={rows}" if rows else ""))
                yield build(tgm._gn_partials, "groupnorm_mish", label + " partials",
                            {"x_ptr": t, "part_ptr": "*fp32", "CPG": "i32", "CPC": "i32"},
                            {**tiles, "ROWS": rows, "COLS": tgm.flat_cols(warps, item)}, warps)
                yield build(tgm._gn_apply, "groupnorm_mish", label + " apply",
                            {"x_ptr": t, "w_ptr": t, "b_ptr": t, "part_ptr": "*fp32",
                             "y_ptr": t, "CPG": "i32", "CPC": "i32", "G": "i32",
                             "eps": "fp32"},
                            {**tiles, "SPLIT_P2": triton.next_power_of_2(split),
                             "FAST": True}, warps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.layernorm.fused_aot_check")
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp32"))
    ap.add_argument("--quick", action="store_true",
                    help="first configuration of each kernel, first shape only")
    ap.add_argument("--only", default=None,
                    help="comma-separated: vector_add, layernorm, add_layernorm, "
                         "layernorm_bwd, matmul, matmul_tma, mlp_fused, groupnorm_mish")
    a = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("fused_aot_check: unset TRITON_INTERPRET (the interpreter has no kernels to "
              "build)", file=sys.stderr)
        return 2
    only = set(a.only.split(",")) if a.only else None
    spills = n = 0
    for b in builds(a.dtype, only, a.quick):  # a configuration that does not build raises
        print(b.line(), flush=True)
        n += 1
        spills += b.stack > 0
    print(f"{n} configuration(s) built for sm_90; {spills} spill registers (the Tuner times "
          "them anyway: a small epilogue spill can still win)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
