"""GroupNorm (affine) followed by Mish, for NCHW activations, in one Triton kernel.

    x: (N, C, H, W), G groups of C/G channels; w, b: (C,)
    y = mish((x - mean_g) * rstd_g * w[c] + b[c]),   mish(v) = v * tanh(softplus(v))

In NCHW a group (n, g) is one contiguous run of L = (C/G)·H·W elements, so one program owns
one group and walks it as [CB channels x HB pixels] tiles (no per-element channel division:
w, b are loaded per channel row of the tile).

- ONE_TILE (the whole group fits one register tile, <= 16K elements): one read and one write
  of every element — the minimum.
- otherwise two passes over the group: shifted sums (shift = the group's first element, which
  keeps E[x^2] - E[x]^2 accurate), then normalise + Mish. Each pass is one flat loop over the
  group's tiles, software-pipelined STAGES deep (tl.range(num_stages=)): on an H200 the
  unpipelined kernel reached 40-50 % of the DRAM roof with long_scoreboard the top stall and
  only 44 % occupancy (registers), i.e. too few loads in flight per program (at the SDXL shape
  there are only 128 groups: one program per SM). The second pass walks the tiles in
  reverse so it starts with what the first pass read last: with N·G groups in flight at once
  and each a few hundred KiB at most, the re-read is served mostly by L2 and DRAM sees about
  one read and one write.

Mish without tanh/log: with e = exp(v), tanh(log(1 + e)) = e(e + 2) / (e(e + 2) + 2), so
mish(v) = v · n / (n + 2), n = e(e + 2) — one exp and one division; v > 20 returns v
(n would overflow; the factor is 1 to fp32 precision there).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import Tuner

MAX_ONE_TILE = 16384  # elements of a group kept in registers by the one-pass variant
# candidates per shape (configs()); BLOCK: any power of two up to MAX_ONE_TILE
_tuner = Tuner("groupnorm_mish", ("BLOCK", "num_warps", "STAGES"),
               values={"BLOCK": tuple(2 ** i for i in range(6, 15)), "num_warps": (1, 2, 4, 8, 16),
                       "STAGES": (1, 2, 3, 4)})
# two-pass candidates (BLOCK, num_warps, STAGES): unpipelined, and the tile loops pipelined
# 2-4 deep (STAGES - 1 tiles of BLOCK elements in shared memory per program)
TWO_PASS = ((4096, 8, 1), (8192, 16, 1), (4096, 8, 3), (8192, 16, 3), (2048, 4, 3),
            (4096, 4, 4), (2048, 4, 1), (8192, 8, 2))


@triton.jit
def _mish(v):
    e = tl.exp(v)
    n = e * (e + 2.0)
    return tl.where(v > 20.0, v, v * n / (n + 2.0))


@triton.jit
def _gn_mish(x_ptr, w_ptr, b_ptr, y_ptr, CPG, G, eps,
             HW: tl.constexpr, CB: tl.constexpr, HB: tl.constexpr, NHT: tl.constexpr,
             ONE_TILE: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)  # group index n * G + g
    g = pid % G
    base = pid.to(tl.int64) * CPG * HW  # (n*C + g*CPG) * HW
    L = CPG * HW
    cl = tl.arange(0, CB)
    hw = tl.arange(0, HB)
    if ONE_TILE:
        mask = (cl < CPG)[:, None] & (hw < HW)[None, :]
        offs = base + cl[:, None] * HW + hw[None, :]
        # read L elements of x (the whole group, kept in registers)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(tl.sum(x, axis=1), axis=0) / L
        d = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(tl.sum(d * d, axis=1), axis=0) / L + eps)
        # read CPG of w and of b
        gw = tl.load(w_ptr + g * CPG + cl, mask=cl < CPG, other=0.0).to(tl.float32)
        gb = tl.load(b_ptr + g * CPG + cl, mask=cl < CPG, other=0.0).to(tl.float32)
        v = d * (rstd * gw)[:, None] + gb[:, None]
        # write L elements of y
        tl.store(y_ptr + offs, _mish(v).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        # the group's tiles in one flat loop (t -> channel tile t // NHT, pixel tile t % NHT),
        # so that it is an innermost loop Triton can software-pipeline: with STAGES > 1 the
        # next STAGES - 1 tiles are copied into shared memory (cp.async) while one is reduced
        n_tiles = tl.cdiv(CPG, CB) * NHT
        shift = tl.load(x_ptr + base).to(tl.float32)
        s1 = tl.zeros([CB, HB], tl.float32)
        s2 = tl.zeros([CB, HB], tl.float32)
        for t in tl.range(0, n_tiles, num_stages=STAGES):
            c = (t // NHT) * CB + cl
            h = (t % NHT) * HB + hw
            mask = (c < CPG)[:, None] & (h < HW)[None, :]
            # read CB x HB of x (first pass, DRAM)
            v = tl.load(x_ptr + base + c[:, None] * HW + h[None, :], mask=mask,
                        other=0.0).to(tl.float32)
            v = tl.where(mask, v - shift, 0.0)
            s1 += v
            s2 += v * v
        m1 = tl.sum(tl.sum(s1, axis=1), axis=0) / L
        var = tl.maximum(tl.sum(tl.sum(s2, axis=1), axis=0) / L - m1 * m1, 0.0)
        mean = shift + m1
        rstd = 1.0 / tl.sqrt(var + eps)
        for t in tl.range(0, n_tiles, num_stages=STAGES):
            tr = n_tiles - 1 - t  # reverse order: most recently read tiles first
            c = (tr // NHT) * CB + cl
            h = (tr % NHT) * HB + hw
            c_ok = c < CPG
            mask = c_ok[:, None] & (h < HW)[None, :]
            # read CB of w and of b (L1/L2)
            gw = tl.load(w_ptr + g * CPG + c, mask=c_ok, other=0.0).to(tl.float32)
            gb = tl.load(b_ptr + g * CPG + c, mask=c_ok, other=0.0).to(tl.float32)
            offs = base + c[:, None] * HW + h[None, :]
            # read CB x HB of x (second pass, mostly L2) ; write CB x HB of y
            v = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            # (x - mean) first: folding mean into the bias would cancel badly when |mean| >> std
            tl.store(y_ptr + offs,
                     _mish((v - mean) * (rstd * gw)[:, None] + gb[:, None])
                     .to(y_ptr.dtype.element_ty), mask=mask)


def tile(cpg: int, hw: int, block: int) -> tuple[int, int, bool]:
    """(CB, HB, ONE_TILE) for a tile budget of `block` elements."""
    hb = min(triton.next_power_of_2(hw), block)
    cb = max(1, block // hb)
    return cb, hb, (cb >= cpg and hb >= hw)


def configs(cpg: int, hw: int) -> list[tuple[int, int, int]]:
    """(BLOCK, num_warps, STAGES) candidates; the first is the untimed default."""
    one = triton.next_power_of_2(cpg) * triton.next_power_of_2(hw)
    out = []
    if one <= MAX_ONE_TILE:  # no loop: nothing to pipeline
        out += [(one, w, 1) for w in (8, 16, 4) if 4 <= one // (32 * w) <= 64]
    out += [c for c in TWO_PASS if c[0] < one]
    return out[:8] or [(one, 4, 1)]


def groupnorm_mish(x: torch.Tensor, num_groups: int, w: torch.Tensor, b: torch.Tensor,
                   eps: float = 1e-5, out: torch.Tensor | None = None,
                   config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """mish(GroupNorm(x)) for x (N, C, H, W) contiguous, w, b (C,); returns y (N, C, H, W).

    `config` forces (BLOCK, num_warps, STAGES) instead of the tuned choice.
    """
    if x.dim() != 4:
        raise ValueError(f"expected x of shape (N, C, H, W), got {tuple(x.shape)}")
    N, C, H, W = x.shape
    if C % num_groups != 0:
        raise ValueError(f"C={C} is not divisible by num_groups={num_groups}")
    if w.shape != (C,) or b.shape != (C,):
        raise ValueError(f"weight and bias must have shape ({C},)")
    x = x.contiguous()
    w, b = w.contiguous(), b.contiguous()
    y = torch.empty_like(x) if out is None else out
    cpg, hw = C // num_groups, H * W
    if x.numel() == 0:
        return y

    def launch(cfg):
        block, warps, stages = cfg
        cb, hb, one = tile(cpg, hw, block)
        _gn_mish[(N * num_groups,)](x, w, b, y, cpg, num_groups, eps, HW=hw, CB=cb, HB=hb,
                                     NHT=triton.cdiv(hw, hb), ONE_TILE=one, STAGES=stages,
                                     num_warps=warps)

    if config is None:
        config = _tuner.pick((N, C, hw, num_groups, x.dtype), configs(cpg, hw), launch)
    launch(config)
    return y
