"""Ending a harness process without the interpreter's teardown.

A run starts a dozen or more `python -m harness worker` processes, and several end on the run's
critical path: the last compile-ahead worker ends the compile phase, the check/time worker must
end before the time pass's second process takes its turn, a profiled worker before its report
is written. Python's own exit then tears down every module torch, Triton and Inductor loaded,
object by object: on an H100 host a process that had run CUDA work and one torch.compile graph
took 1.1-1.4 s from its last line to its end, against 0.3-0.4 s when the C library's exit()
ended it after the same last line (five processes, TORCHINDUCTOR_COMPILE_THREADS=1 as the
workers run); on a 2-core CPU machine a `harness run` driver took 1.5 s, a process like a worker
2.2 s, against 0.2 s.

`quick_exit(code)` does what an ordinary exit does for the program's data, then skips the
teardown: it ends the threads as the interpreter does (threading's exit hooks, then a wait for
the threads that are not daemons), runs the `atexit` callbacks (logging's flush,
multiprocessing's joins, torch's own), flushes Python's stdout and stderr, and calls the C
library's exit(), which still runs the C-level exit handlers and the shared libraries'
destructors (CUDA's, and those of the libraries ncu and nsys inject: with it, flash.yaml's ncu
and nsys passes on an H100 returned every row they had returned before).
HARNESS_QUICK_EXIT=0 keeps the interpreter's exit (raises SystemExit), as does a platform
where the C library's exit() cannot be found or a Python without threading's exit step.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading

ENV = "HARNESS_QUICK_EXIT"


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def _libc_exit():
    """The C library's exit(int), or None where ctypes cannot load it."""
    try:
        import ctypes

        fn = ctypes.CDLL(None).exit
    except (OSError, AttributeError, TypeError, ImportError):
        return None
    fn.argtypes = [ctypes.c_int]
    return fn


def exit_code(code) -> int:
    """The status SystemExit(code) ends a process with: None 0, an int itself, else 1."""
    if code is None:
        return 0
    return int(code) if isinstance(code, int) else 1


def quick_exit(code=0):
    """End the process with `code` (as SystemExit(code) would: None is 0, an int itself, a
    message printed to stderr and 1), without the interpreter's teardown (the module doc)."""
    if not enabled():
        raise SystemExit(code)
    libc_exit = _libc_exit()
    # the interpreter's first step of its exit: threading's exit hooks (an executor never shut
    # down lets its idle workers go), then a wait for the threads that are not daemons
    threads_done = getattr(threading, "_shutdown", None)
    if libc_exit is None or not callable(threads_done):
        raise SystemExit(code)
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
    threads_done()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    libc_exit(exit_code(code))
