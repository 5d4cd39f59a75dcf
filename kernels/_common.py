"""Helpers shared by the kernel packages: interpreter detection, a launch-config tuner, and
torch.compile with a roomy recompile cache."""
from __future__ import annotations

import os
from typing import Callable, Hashable, Sequence


def interpreted() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


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
