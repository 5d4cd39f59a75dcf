"""An op for testing the harness itself (loaded with HARNESS_OPS=harness_test_ops).

`scale2`: y = 2x over a vector of N elements. Implementations cover the ways a candidate can
go wrong: right, zeros, NaN, an off-by-one store mask (last element never written), an
exception, a hard crash of the worker process (SIGSEGV), and a slow one for Ctrl-C tests.
"""
import os
import signal
import time

import torch

from harness.registry import Op, Param

op = Op("scale2", params=[Param("N", int)], dtypes=("float32", "float16"), primary="gbps",
        description="y = 2x (harness self-test op)")


@op.inputs
def make_inputs(p, dtype, device, gen):
    return (torch.randn(p.N, generator=gen, device=device, dtype=torch.float32).to(dtype),)


@op.reference
def reference(x):
    return x * 2


@op.bytes
def nbytes(p, itemsize):
    return 2.0 * p.N * itemsize


@op.flops
def flops(p):
    return float(p.N)


@op.output
def output(inputs, p):
    return torch.empty_like(inputs[0])


@op.impl("torch", backend="torch")
def good(x):
    return x * 2


@op.impl("zeros", backend="torch", accepts_out=True)
def zeros(x, out):
    return out.zero_()


@op.impl("nan", backend="torch")
def nan(x):
    return torch.full_like(x, float("nan"))


@op.impl("off_by_one", backend="torch", accepts_out=True)
def off_by_one(x, out):
    out[:-1] = x[:-1] * 2  # the last element is never written
    return out


@op.impl("raises", backend="torch")
def raises(x):
    raise RuntimeError("deliberate failure in the kernel")


@op.impl("segfault", backend="torch")
def segfault(x):
    os.kill(os.getpid(), signal.SIGSEGV)


@op.impl("slow", backend="torch")
def slow(x):
    time.sleep(float(os.environ.get("HARNESS_TEST_SLOW_S", "0.3")))
    return x * 2


@op.impl("gpu_only", backend="library",
         unavailable=lambda p, dtype, device: None if device == "cuda" else "needs a CUDA device")
def gpu_only(x):
    return x * 2


@op.impl("hang", backend="torch")
def hang(x):
    while True:  # a deadlocked kernel: never returns (the watchdog must kill it)
        time.sleep(1)


# -- a tuned impl: its Tuner times on the CPU too (the interpreter's Tuners never time), so
# that picks persisted across worker processes are testable without a GPU. Every timing launch
# appends "<pid>" to the file named by $HARNESS_TEST_TUNE_LOG.

from kernels._tuner import Tuner  # noqa: E402

TUNED_CANDIDATES = [(1,), (2,), (3,)]


class _CPUTimedTuner(Tuner):
    def timing_enabled(self):
        return True

    def precompile_enabled(self):
        return False

    def measure(self, launch, cfg):
        launch(cfg)
        return float(abs(cfg[0] - 2))  # deterministic: (2,) is the fastest


_tuner = _CPUTimedTuner("scale2.tuned", ("factor",), configs=TUNED_CANDIDATES,
                        values={"factor": (4,)})


def _timing_launch(cfg):
    path = os.environ.get("HARNESS_TEST_TUNE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")


@op.impl("tuned", backend="torch", tuners=_tuner)
def tuned(x):
    """y = 2x after a Tuner pick keyed by the size (a fake key: the result never depends on it)"""
    _tuner.pick(("scale", x.numel()), TUNED_CANDIDATES, _timing_launch)
    return x * 2


# -- compile-ahead (harness.execute.executors.warm): impls of a compiling backend.
# `warm_tuned`'s Tuner "compiles" (launches) every candidate when asked to compile only, and
# would time on the CPU otherwise; each launch appends "<pid> launch <cfg>" and each timing
# "<pid> measure <cfg>" to $HARNESS_TEST_TUNE_LOG.

def _log_line(text):
    path = os.environ.get("HARNESS_TEST_TUNE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {text}\n")


class _CompilingTuner(_CPUTimedTuner):
    def precompile_enabled(self):
        return True

    def measure(self, launch, cfg):
        _log_line(f"measure {cfg[0]}")
        return super().measure(launch, cfg)


_warm_tuner = _CompilingTuner("scale2.warm_tuned", ("factor",), configs=TUNED_CANDIDATES)


@op.impl("warm_tuned", backend="compile", tuners=_warm_tuner)
def warm_tuned(x):
    """y = 2x after a pick among three 'compiled' candidates"""
    _warm_tuner.pick(("scale", x.numel()), TUNED_CANDIDATES,
                     lambda cfg: _log_line(f"launch {cfg[0]}"))
    return x * 2


@op.impl("warm_ends", backend="compile")
def warm_ends(x):
    """y = 2x; each call first ends compile-ahead (touches $HARNESS_TEST_WARM_OVER, its
    `warm.over`), then times something, as a Tuner would: a check begun while compile-ahead
    ran is held off (gpu_lock.TimingDeferred) though compile-ahead is over when it returns"""
    from harness.tuning import gpu_lock

    path = os.environ.get("HARNESS_TEST_WARM_OVER")
    if path:
        open(path, "a").close()
    with gpu_lock.exclusive():
        return x * 2


@op.impl("warm_hang", backend="compile")
def warm_hang(x):
    while True:  # a compile that never ends
        time.sleep(1)


class OutOfMemoryError(RuntimeError):
    """Named like torch's: the first call of `warm_oom` in a process raises it."""


_OOM_SEEN: list[bool] = []


@op.impl("warm_oom", backend="compile")
def warm_oom(x):
    """y = 2x; the first call in a process runs out of memory"""
    if not _OOM_SEEN:
        _OOM_SEEN.append(True)
        _log_line("oom")
        raise OutOfMemoryError("CUDA out of memory (a test)")
    _log_line("ok")
    return x * 2


@op.impl("warm_slow", backend="compile")
def warm_slow(x):
    """y = 2x after a 1 s 'compile' on every call (compile-ahead's work stealing)"""
    time.sleep(1.0)
    return x * 2
