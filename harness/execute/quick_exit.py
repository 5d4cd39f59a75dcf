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
multiprocessing's joins, torch's own), flushes Python's stdout and stderr (a failed flush is
reported and the status is 120, as Python's), puts the signal handlers set in Python back to
the default, and calls the C library's exit(), which still runs the C-level exit handlers and
the shared libraries' destructors (CUDA's, and those of the libraries ncu and nsys inject:
with it, flash.yaml's ncu and nsys passes on an H100 returned every row they had returned
before). What it skips is the teardown's finalisers: a Python file object left
open loses what it still buffered (the harness's own files are closed as written; worker
events are flushed line by line). HARNESS_QUICK_EXIT=0 keeps the interpreter's exit (raises
SystemExit), as does a platform where the C library's exit() cannot be found or a Python
without threading's exit step.
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
    """The C library's exit(int), or None where ctypes cannot load it. Called as ctypes calls C
    (the GIL released): a daemon thread of Python may run on while the exit handlers run, which
    the interpreter's exit would have stopped. Holding the GIL instead (ctypes.PyDLL) would stop
    them, but a library thread that waits for the GIL would then hold up a destructor that joins
    it, where Python's exit lets such a thread end; this form is the one run on the GPUs (the
    flash.yaml and flash_bwd.yaml runs of docs/measurement.md, with ncu and nsys)."""
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


def _unraisable(what: str) -> None:
    """Report the exception being handled as the interpreter reports one it ignores at exit."""
    try:
        import traceback

        sys.stderr.write(f"Exception ignored {what}:\n{traceback.format_exc()}")
        sys.stderr.flush()
    except Exception:
        pass


def _default_signals() -> None:
    """The handlers this process set in Python (SIGINT's KeyboardInterrupt, a SIGTERM handler)
    back to the default, as the interpreter's exit does: a signal during the C library's exit
    then ends the process by that signal instead of setting a flag nothing reads."""
    import signal

    for sig in signal.valid_signals():
        try:
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):
            pass


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
    status = exit_code(code)
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
    try:
        threads_done()
    except KeyboardInterrupt:  # Ctrl-C while waiting: reported, and the exit goes on
        _unraisable("while waiting for the threads at exit")
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is None or getattr(stream, "closed", False):
            continue
        try:
            stream.flush()
        except Exception:  # stdout on a closed pipe, a full disk: reported, 120, as Python does
            if stream is sys.stdout:
                _unraisable(f"while flushing {stream!r}")
                status = 120
    _default_signals()
    libc_exit(status)
