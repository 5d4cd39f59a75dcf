"""First light of groupnorm_mish's shared-memory form (SYNC 2, kernels/groupnorm_mish/
smem_gluon.py) on a Hopper GPU: is every candidate correct on shapes that exercise its cases
(one tile per group; several synchronised tiles; more tiles than programs, so programs loop
and prefetch; a last round with idle programs; fp16, bf16, fp32), and does an unaligned x fall
back? A correctness probe; its speed is measured by `python -m harness run
experiments/groupnorm_mish.yaml` (the Tuner times this form beside the others).

    python3 tools/device/groupnorm_smem_check.py          (device: sm_90; exit 1 on a mismatch)

The reference is F.group_norm + F.mish in fp64 on the same inputs; a config passes when its
largest error is within 2x that of torch (the same ops in the input dtype) or of the Triton
two-pass form (the same Mish arithmetic: fast exp2 and division), plus one output ulp.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from kernels.groupnorm_mish import candidates, smem_gluon
from kernels.groupnorm_mish import triton_groupnorm_mish as tgm

# (N, C, H, W, G): 80 MiB SD shapes, SDXL 128 groups (S = 4 synchronised tiles, programs
# looping), batch 1, a group count that leaves programs idle in the last round, small ones
SHAPES = ((16, 320, 64, 64, 32), (32, 640, 32, 32, 32), (4, 320, 128, 128, 32),
          (1, 320, 128, 128, 32), (3, 96, 48, 64, 8), (7, 64, 32, 32, 4))


def ref(x, w, b, g, dtype):
    return F.mish(F.group_norm(x.to(dtype), g, w.to(dtype), b.to(dtype), 1e-5))


def main() -> int:
    dev = torch.device("cuda")
    reason = smem_gluon.unsupported(dev)
    if reason:
        print(f"groupnorm_smem_check: {reason}", file=sys.stderr)
        return 2
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    gen = torch.Generator(device=dev).manual_seed(0)
    bad = n = 0
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for N, C, H, W, G in SHAPES:
            x = (1.5 * torch.randn(N, C, H, W, device=dev, generator=gen) + 0.2).to(dtype)
            w = (1 + 0.1 * torch.randn(C, device=dev, generator=gen)).to(dtype)
            b = (0.1 * torch.randn(C, device=dev, generator=gen)).to(dtype)
            want = ref(x.double(), w.double(), b.double(), G, torch.float64)
            torch_err = (ref(x, w, b, G, dtype).double() - want).abs().max().item()
            base = tgm.groupnorm_mish(x, G, w, b, config=tgm.FALLBACK)
            torch_err = max(torch_err, (base.double() - want).abs().max().item())
            ulp = torch.finfo(dtype).eps * want.abs().max().item()
            cfgs = candidates.smem_configs(C // G, H * W, x.element_size(), sms)
            for cfg in cfgs:
                y = torch.full_like(x, float("nan"))  # poisoned: an unwritten element fails
                tgm.groupnorm_mish(x, G, w, b, out=y, config=cfg)
                err = (y.double() - want).abs().max().item()
                ok = err <= 2 * torch_err + ulp  # NaN fails
                bad += not ok
                n += 1
                print(f"{str(dtype)[6:]:9s} {N}x{C}x{H}x{W} G={G} {cfg}: max err {err:.3g} "
                      f"(torch {torch_err:.3g}) {'ok' if ok else 'MISMATCH'}", flush=True)
            if cfgs and dtype == torch.float16 and N == 3:  # a 16-byte-misaligned x
                xs = torch.empty(x.numel() + 1, device=dev, dtype=dtype)[1:].view_as(x)
                xs.copy_(x)
                y = tgm.groupnorm_mish(xs, G, w, b, config=cfgs[0])
                err = (y.double() - want).abs().max().item()
                ok = err <= 2 * torch_err + ulp
                bad += not ok
                n += 1
                print(f"misaligned x, {cfgs[0]} (falls back to {tgm.FALLBACK}): max err "
                      f"{err:.3g} {'ok' if ok else 'MISMATCH'}", flush=True)
    print(f"{n - bad} of {n} configurations correct")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
