"""The element-wise pieces every groupnorm_mish form shares (the Triton kernels in
triton_groupnorm_mish.py and the Gluon one in smem_gluon.py, which calls @triton.jit functions
as its own): Mish of the affine-normalised value, and a group's statistics from its sums."""
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def _mish_affine(x, a, b, FAST: tl.constexpr, OUT: tl.constexpr):
    """mish(v) of v = x·a + b (a and b per channel row: [CB] vectors, x a [CB, HB] tile), in
    the output's dtype OUT.

    mish(v) = v · n / (n + 2), n = e(e + 2), e = exp(v) (tanh(log(1 + e)) without tanh or log).
    16-bit outputs on the GPU take it as v - v·r, r = 1 / q = 2 / (n + 2), q = h(2h + 2) + 1
    and h = e / 2 = 2^(v·log2e - 1): per element one FMA for v, one for the exponent, two for
    q, one for the result, one ex2 and half a reciprocal (one for two elements: 1/q_a =
    q_b / (q_a q_b)). The MUFU pipe (ex2, rcp: 16 results per clock per SM) had set the pace:
    2 per element cost as many cycles as the other 14 instructions together; now 1.5. The
    exponent is clamped at 28 (v ~ 20: the factor is 1 to fp32 precision from there on, and
    q < 2^57 keeps a pair's product finite). Where r ~ 1 (v < -5) the subtraction leaves an
    absolute error of ~|v|·2^-23 (~1e-6, where |y| < 0.03), below a 16-bit output's tolerance;
    fp32 outputs take v·n / (n + 2), accurate relative to y everywhere.
    """
    LOG2E: tl.constexpr = 1.4426950408889634
    v = x * a[:, None] + b[:, None]
    if OUT != tl.float32:
        # the exponent is made from v (not from x): one value per element stays live across
        # the exponent and the reciprocal, not two (the synchronised form holds 64 per thread:
        # 96 registers, not 167)
        s = tl.minimum(v * LOG2E - 1.0, 28.0)
        if FAST:  # ex2.approx.ftz: no denormal fix-up (2 instructions, not 5)
            h = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [s],
                                          dtype=tl.float32, is_pure=True, pack=1)
        else:  # the CPU interpreter has no inline PTX
            h = tl.exp2(s)
        q = h * (2.0 * h + 2.0) + 1.0
        if FAST:  # one rcp.approx for a pair of elements
            r = tl.inline_asm_elementwise(
                "{ .reg .f32 p, rp; mul.f32 p, $2, $3; rcp.approx.ftz.f32 rp, p;"
                " mul.f32 $0, rp, $3; mul.f32 $1, rp, $2; }",
                "=r,=r,r,r", [q], dtype=tl.float32, is_pure=True, pack=2)
        else:
            r = 1.0 / q
        y = v - v * r
    elif FAST:  # fp32 out: e = exp(min(v, 20)) and a fast (2 ulp) division
        e = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r",
                                      [tl.minimum(v, 20.0) * LOG2E], dtype=tl.float32,
                                      is_pure=True, pack=1)
        n = e * (e + 2.0)
        y = libdevice.fast_dividef(v * n, n + 2.0)
    else:
        e = tl.exp(tl.minimum(v, 20.0))
        n = e * (e + 2.0)
        y = v * n / (n + 2.0)
    return y.to(OUT)


@triton.jit
def _stats(s1, s2, shift, L, eps):
    """(mean, rstd) of a group from its sums of (x - shift) and their squares over L
    elements."""
    m1 = s1 / L
    var = tl.maximum(s2 / L - m1 * m1, 0.0)
    return shift + m1, 1.0 / tl.sqrt(var + eps)
