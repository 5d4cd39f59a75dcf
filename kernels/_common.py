"""Helpers shared by the kernel packages: interpreter detection and the launch-config Tuner
(both from kernels/_tuner.py), torch.compile with a roomy recompile cache, the SM count a
persistent kernel sizes its grid by, and Triton's host-side TensorDescriptor (None before
triton 3.4: the TMA impls then say they are unavailable)."""
from __future__ import annotations

from typing import Callable

from kernels._tuner import Rule, Tuner, interpreted  # noqa: F401  (re-exported)

try:  # host-side tensor descriptors (TMA): triton >= 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None


def sm_count(device, cpu_programs: int = 4) -> int:
    """SMs of a CUDA device; off the GPU (the interpreter) `cpu_programs`, so that a
    persistent walk still gives each program several tiles."""
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_properties(device).multi_processor_count
    return cpu_programs


def interpreter_bf16(dtype) -> bool:
    """True for bf16 in the Triton CPU interpreter, whose tl.dot multiplies the raw uint16
    storage and whose fp32->bf16 casts truncate (triton-lang/triton#11584): kernels upcast
    bf16 tiles to fp32 there. Never true on a GPU."""
    import torch

    return dtype == torch.bfloat16 and interpreted()


def compiled(fn: Callable, dynamic: bool | None = False, before: Callable | None = None
             ) -> Callable:
    """torch.compile(fn), built on the first call (importing an op costs no dynamo set-up),
    with a recompile cache large enough for a whole sweep of shapes. `before()` runs once,
    just before, for compile settings an op needs."""
    state: dict = {}

    def call(*args, **kwargs):
        if "fn" not in state:
            import torch
            import torch._dynamo

            cfg = torch._dynamo.config
            cfg.cache_size_limit = max(cfg.cache_size_limit, 256)
            if hasattr(cfg, "accumulated_cache_size_limit"):
                cfg.accumulated_cache_size_limit = max(cfg.accumulated_cache_size_limit, 1024)
            if before is not None:
                before()
            state["fn"] = torch.compile(fn, dynamic=dynamic)
        return state["fn"](*args, **kwargs)

    return call
