"""The peers our kernel is measured against: PyTorch's fused SDPA backends and torch.compile.

`sdpa(backend)` returns an impl running F.scaled_dot_product_attention on (B, H, N, D) inputs
with only that backend allowed (torch raises, and the case records the error, if it refuses).
`sdpa_unavailable(backend)` returns a cheap availability predicate for the registry.

`torch_compile_attention` is torch.compile of `naive_attention`, compiled once per
(D, causal, dtype, with/without grad): the batch*head and sequence dims are marked dynamic, so a
sweep over N at fixed tokens reuses one graph instead of compiling one per shape. AOTAutograd's
donated buffers are turned off so that the backward can be replayed with retain_graph=True.

A dynamic graph's generated kernels are chosen at its first call: Inductor's heuristics read
the first shape's sizes as hints and its autotuner times the reduction configs on that shape,
and every later shape reuses the choice. Left to the sweep, which shape comes first depends on
which cases run: on an H200, torch_compile at N=4096 causal bf16 measured 5.88 ms after a full
flash.yaml (first shape N=16384) and 4.58 ms in a `--cases '*N=4096*'` run of the same code, a
1.28x "change" between two runs that changed nothing. So the first call of each graph is made
at one fixed seed shape (SEED_SHAPE: 16 heads of N=4096 on a GPU; small on the CPU), the same
whatever the sweep: a case's torch_compile kernels no longer depend on the cases before it.
A compile-only call (compile-ahead, a prewarm) chooses none of Inductor's configs
(harness.tuning.inductor_picks), so it does not count as the seed: the first measured call of
the process seeds the graph, and the choice is made at SEED_SHAPE there too (or read from the
one that process's host stored, made at SEED_SHAPE as well).
The head dim is marked static for the same reason: Dynamo makes a dim dynamic when a frame
recompiles because it changed, so a process that met D=128 before D=64 built another D=64
graph than one that met D=64 first. On an H200 the check pass of flash.yaml then missed
Inductor's cache for 4 of the 8 graphs compile-ahead had built (3.4-4.7 s each).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kernels._common import compiled
from kernels.attention.reference import naive_attention

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


def sdpa(backend: str) -> Callable:
    chosen = BACKENDS[backend]

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False):
        with sdpa_kernel(chosen):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    run.__doc__ = f"F.scaled_dot_product_attention restricted to SDPBackend.{chosen.name}"
    return run


def sdpa_unavailable(backend: str):
    """Availability predicate (params, dtype, device) -> reason | None; cheap checks only."""

    def reason(p, dtype: str, device: str) -> str | None:
        if device != "cuda":
            return (f"needs a CUDA device (the peer is the CUDA {backend} kernel; torch's CPU "
                    f"SDPA is a different kernel)")
        if p.D % 8 or p.D > 256:
            return f"sdpa {backend}: head dim must be a multiple of 8 and <= 256, got D={p.D}"
        major, minor = torch.cuda.get_device_capability()
        if backend == "flash":
            if major < 8:
                return f"sdpa flash needs compute capability >= 8.0, this GPU is {major}.{minor}"
            if not torch.backends.cuda.flash_sdp_enabled():
                return "sdpa flash is disabled (torch.backends.cuda.flash_sdp_enabled() is False)"
        if backend == "efficient" and not torch.backends.cuda.mem_efficient_sdp_enabled():
            return ("sdpa efficient is disabled "
                    "(torch.backends.cuda.mem_efficient_sdp_enabled() is False)")
        if backend == "cudnn":
            version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() \
                else None
            if version is None or version < 90000:
                return f"sdpa cudnn needs cuDNN >= 9.0, found {version}"
            if major < 8:
                return f"sdpa cudnn needs compute capability >= 8.0, this GPU is {major}.{minor}"
            if not torch.backends.cuda.cudnn_sdp_enabled():
                return "sdpa cudnn is disabled (torch.backends.cuda.cudnn_sdp_enabled() is False)"
        return None

    return reason


def _no_donated_buffers() -> None:
    """The bwd mode measures autograd.grad(..., retain_graph=True) repeatedly on one graph;
    AOTAutograd's donated buffers forbid retain_graph, so they are turned off."""
    import torch._functorch.config

    if hasattr(torch._functorch.config, "donated_buffer"):
        torch._functorch.config.donated_buffer = False


_compiled_naive = compiled(lambda q, k, v, causal: naive_attention(q, k, v, causal=causal),
                           dynamic=None, before=_no_donated_buffers)
SEED_SHAPE = {"cuda": (16, 4096), "cpu": (2, 64)}  # (batch*heads, N) of each graph's first call
_seeded: set[tuple] = set()
_seeded_untimed: set[tuple] = set()  # seeded by a compile-only call (see _seed)


def _dynamic_views(q, k, v) -> list[torch.Tensor]:
    import torch._dynamo

    B, H, N, D = q.shape
    flat = [t.reshape(B * H, N, D) for t in (q, k, v)]
    for t in flat:
        torch._dynamo.maybe_mark_dynamic(t, 0)
        torch._dynamo.maybe_mark_dynamic(t, 1)
        # D static, always: left alone, a process that met D=128 first recompiled its D=64
        # graph with D dynamic (Dynamo's automatic dynamic shapes), so the graph, its kernels
        # and Inductor's cache key depended on the order a worker met the cases in
        torch._dynamo.mark_static(t, 2)
    return flat


def _seed(q: torch.Tensor, causal: bool) -> None:
    """The graph's first call (forward, and backward when q requires grad) at SEED_SHAPE, once
    per (D, causal, dtype, device, grad) in a process: see the module doc."""
    grad = q.requires_grad and torch.is_grad_enabled()
    key = (q.shape[-1], causal, q.dtype, q.device.type, grad)
    from harness import tuning

    # a compile-only call chooses none of Inductor's configs (harness.tuning.inductor_picks):
    # it seeds apart, once, and the process's first measured call seeds again
    seeded = _seeded_untimed if tuning.compiling_only() else _seeded
    if key in seeded:
        return
    seeded.add(key)
    bh, n = SEED_SHAPE.get(q.device.type, SEED_SHAPE["cpu"])
    gen = torch.Generator(device=q.device).manual_seed(0)
    qkv = [torch.randn(1, bh, n, q.shape[-1], device=q.device, dtype=q.dtype, generator=gen)
           .requires_grad_(grad) for _ in range(3)]
    o = _compiled_naive(*_dynamic_views(*qkv), causal)
    if grad:
        torch.autograd.grad(o, qkv, torch.ones_like(o))
    del o, qkv


def torch_compile_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                            causal: bool = False) -> torch.Tensor:
    """torch.compile(naive_attention) on (B*H, N, D) views, B*H and N dynamic -> (B, H, N, D);
    each graph first called at SEED_SHAPE (the module doc says why)."""
    B, H, N, D = q.shape
    _seed(q, causal)
    return _compiled_naive(*_dynamic_views(q, k, v), causal).view(B, H, N, D)
