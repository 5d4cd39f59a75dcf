"""Helpers shared by the kernel packages: interpreter detection, a launch-config tuner,
torch.compile with a roomy recompile cache, and availability predicates."""
from __future__ import annotations

import os
from typing import Callable, Hashable, Sequence


def interpreted() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def needs_cuda(params, dtype: str, device: str) -> str | None:
    """Availability predicate for implementations that only exist on NVIDIA GPUs."""
    return None if device == "cuda" else "needs a CUDA device"


class Tuner:
    """Pick the fastest launch configuration per key, timed on the GPU the first time a key is
    seen (call it in warm-up: the harness keeps warm-up outside profiled NVTX ranges).

    In the interpreter, the first candidate is used without timing.
    """

    def __init__(self, name: str):
        self.name = name
        self.best: dict[Hashable, object] = {}

    def pick(self, key: Hashable, candidates: Sequence, launch: Callable[[object], None]):
        if key in self.best:
            return self.best[key]
        if interpreted() or len(candidates) == 1:
            self.best[key] = candidates[0]
            return candidates[0]
        import triton.testing

        timings = []
        for cfg in candidates:
            try:
                ms = triton.testing.do_bench(lambda: launch(cfg), warmup=5, rep=25,
                                             return_mode="median")
            except Exception:  # a config that fails to compile (e.g. out of shared memory)
                continue
            timings.append((ms, cfg))
        if not timings:
            raise RuntimeError(f"{self.name}: no launch configuration compiled for {key}")
        self.best[key] = min(timings, key=lambda t: t[0])[1]
        return self.best[key]


def interpreter_bf16(dtype) -> bool:
    """True for bf16 in the Triton CPU interpreter, whose tl.dot multiplies the raw uint16
    storage and whose fp32->bf16 casts truncate (triton-lang/triton#11584): kernels upcast
    bf16 tiles to fp32 there. Never true on a GPU."""
    import torch

    return dtype == torch.bfloat16 and interpreted()


def compiled(fn: Callable, dynamic: bool | None = False) -> Callable:
    """torch.compile(fn) with a recompile cache large enough for a whole sweep of shapes."""
    import torch
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
    if hasattr(torch._dynamo.config, "accumulated_cache_size_limit"):
        torch._dynamo.config.accumulated_cache_size_limit = max(
            torch._dynamo.config.accumulated_cache_size_limit, 1024)
    return torch.compile(fn, dynamic=dynamic)
