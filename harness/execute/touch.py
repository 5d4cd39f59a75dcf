"""What a worker started ahead of its turn sets up while it waits (Worker.run): the once-per-
process work that launches no kernel, so that it is not paid after the turn.

A profiler process started early waits beside the time pass, whose timing must have the GPU
to itself: it may not call its cases yet (harness.execute.profiler_early). Without this its
first case carried the process's own set-up: on an H100 (flash.yaml cold, two runs' per-case
seconds) ncu's first case, eager naive attention, took 8.4 s where a process that had
called its cases before took 4.0 s; nsys's first took 6.4 s against 0.2 s; ncu's first
torch.compile case 5.8 s against 2.0 s.

Here: torch.compile's modules (dynamo, Inductor) and Triton's imported, on the CPU; then, with
the GPU lock shared (harness.tuning.gpu_lock: between two cases of a time pass, never during
one; without it a backward's timing beside a process creating its context read 13-28 %
spreads), CUDA's context, one allocation, a cuBLAS handle and Triton's driver. No kernel.
"""
from __future__ import annotations


def touch(device: str, backends: set) -> None:
    """Set up this process for cases of `backends` ("compile", "triton", ...) on `device`."""
    if device != "cuda":
        return
    import torch

    from harness.tuning import gpu_lock

    if "compile" in backends:
        import torch._dynamo  # noqa: F401
        import torch._inductor.compile_fx  # noqa: F401
    jit = bool(backends & {"compile", "triton"})
    if jit:
        import triton
    with gpu_lock.shared():
        torch.empty(1, device="cuda")  # CUDA's context and the allocator's first block
        torch.cuda.current_blas_handle()
        if jit:
            triton.runtime.driver.active.get_current_device()
