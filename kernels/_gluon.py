"""Gluon (triton.experimental.gluon), as the Hopper kernels written in it import it: one place
for the import that may fail, the names that changed between triton 3.6 (the GPU box) and 3.9
(this machine's CPU wheel), and the version check. `gluon` is None where Gluon is missing."""
from __future__ import annotations

import triton

MIN_TRITON = (3, 6)

try:  # the API used here is 3.6's and 3.9's; older Gluon spelled warp_specialize apart
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: F401
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    # the TMA copies were renamed after 3.6 (3.9 keeps the old names only to raise)
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    # a CTA-wide barrier: gl.thread_barrier in 3.6, gl.barrier in 3.9
    cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
except (ImportError, AttributeError):  # pragma: no cover
    gluon = gl = fence_async_shared = mbarrier = tma = warpgroup_mma = None
    warpgroup_mma_wait = GluonDescriptor = tma_load = tma_store = cta_barrier = None

# a TMA reduce-add from shared memory (the one-pass backward's dQ): tma.async_atomic_add in
# 3.9; 3.6 builds the same operation (create_async_tma_reduce) but has no Python function for
# it. None where neither is there (flash_bwd_gluon.unsupported then says so).
tma_atomic_add = getattr(tma, "async_atomic_add", None) if tma is not None else None
if tma is not None and tma_atomic_add is None:
    try:
        from triton._C.libtriton import ir as _ir
        from triton.language.core import builtin as _builtin

        _REDUCE_ADD = _ir.DESCRIPTOR_REDUCE_KIND.ADD

        @_builtin
        def tma_atomic_add(tensor_desc, coord, src, _semantic=None):
            """global[coord box] += src (a shared memory tile), by one TMA reduction."""
            coord = _semantic._convert_to_ir_values(coord, require_i64=False)
            _semantic.builder.create_async_tma_reduce(_REDUCE_ADD, tensor_desc.handle, coord,
                                                      src.handle)
    except (ImportError, AttributeError):  # pragma: no cover
        tma_atomic_add = None


def hopper_unavailable(device, what: str) -> str | None:
    """Why the Gluon Hopper kernel `what` ("the Gluon forward", ...) cannot run on `device`:
    no Gluon (or an older triton), no GPU (the CPU interpreter does not run Gluon), not sm_90
    (wgmma); None when it can."""
    from kernels._common import interpreted

    if gluon is None or triton_version() < MIN_TRITON:
        return (f"{what} needs triton >= {'.'.join(map(str, MIN_TRITON))} "
                f"(triton.experimental.gluon), got {triton.__version__}")
    if interpreted() or device.type != "cuda":
        return "Gluon kernels run on a GPU only (the CPU interpreter does not run them)"
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        return f"{what} is written for Hopper's wgmma (sm_90); this GPU is sm_{major}{minor}"
    return None


def triton_version() -> tuple[int, int]:
    """(major, minor) of the installed triton."""
    major, minor = triton.__version__.split(".")[:2]
    return int(major), int(minor)
