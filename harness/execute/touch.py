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

A check worker started beside compile-ahead (harness.execute.executors.early_check, `turn`)
sets CUDA up only once the GPU has CONTEXT_ROOM free (NVML), or not at all if its turn comes
first (its first case does, as in a fresh worker): compile-ahead and the checks beside it may
hold nearly the whole GPU, and a context that does not fit ends the process (flash_bwd.yaml on
an H100: "CUDA error: out of memory" at the context, and the gain was lost). Turned while the
compile phase still runs (harness.execute.compile_phase), it sets CUDA up once there is room,
before its first case waits for compile-ahead (two H100s, flash.yaml: without it, each GPU's
first check, fused_mha at N=16384, took 4.5-5.2 s, against 1.2-1.9 s set up ahead).
"""
from __future__ import annotations

import os
import time

CONTEXT_ROOM = 4 << 30  # bytes free before a waiting check worker makes its CUDA context


def touch(device: str, backends: set, turn: str | None = None,
          gpu: int | None = None) -> None:
    """Set up this process for cases of `backends` ("compile", "triton", ...) on `device`;
    `turn`: the turn file of a check worker started beside compile-ahead (above), on `gpu`
    (its HARNESS_GPU, None if not pinned)."""
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
    # a process with a CUDA context needs no room for one
    if turn is not None and not torch.cuda.is_initialized() and not room_before(turn, gpu):
        return
    with gpu_lock.shared():
        torch.empty(1, device="cuda")  # CUDA's context and the allocator's first block
        torch.cuda.current_blas_handle()
        if jit:
            triton.runtime.driver.active.get_current_device()


def room_before(turn: str, gpu: int | None, poll_s: float = 0.1) -> bool:
    """Wait until GPU `gpu` has CONTEXT_ROOM free (True; also where NVML cannot say which GPU
    or how much) or `turn` exists (False)."""
    from harness.execute.sharing import orphaned
    from harness.machine import nvml

    if gpu is None:  # not pinned: NVML's index of the GPU CUDA shows is 0 unless some are hidden
        if os.environ.get("CUDA_VISIBLE_DEVICES"):
            return True
        gpu = 0
    parent = os.getppid()
    while not os.path.exists(turn):
        free = nvml.free_bytes(gpu)
        if free is None or free >= CONTEXT_ROOM:
            return True
        orphaned(parent)
        time.sleep(poll_s)
    return False


def set_up_beside(device: str, backends: set, gate, gpu: int | None) -> None:
    """A check worker turned while the compile phase runs (`gate`: its sharing.AheadGate):
    `touch` once the GPU has room for a context or compile-ahead is over. A context that
    still does not fit is left to the first case after compile-ahead (else the process would
    end with no case in flight, and its Driver with it)."""
    import traceback

    try:
        touch(device, backends, turn=str(gate.folder / "warm.over"), gpu=gpu)
    except Exception:
        traceback.print_exc()
        gate.wait("warm")
