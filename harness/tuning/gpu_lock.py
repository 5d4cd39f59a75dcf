"""Sharing one GPU between the worker processes of a run without disturbing a measurement.

Some work needs the GPU to itself: the time pass, and a Tuner's or an autotuner's timing of
its candidates. Other work only needs the GPU to be there: a correctness check, a first call
that loads a compiled kernel. The runner lets untimed work of a second process overlap the
first process's check pass (harness.execute.executors.process: the time pass's later process
loads what it will time meanwhile; harness.execute.runner: cases that compile nothing are
checked beside compile-ahead), and this lock keeps the two kinds apart:

    with gpu_lock.exclusive():   # nothing else of the run touches this GPU meanwhile
        ... timed launches ...
    with gpu_lock.shared():      # waits while timing runs; holds timing off while inside
        ... an untimed call ...

A reader-writer lock over two files (fcntl.flock) named by $HARNESS_GPU_LOCK (the runner sets
it per run and GPU, harness.execute.sharing.lock_path; unset, both are no-ops): `exclusive`
takes the gate, then the lock exclusively; `shared` passes the gate, then takes the lock
shared. The gate makes a waiting timer go first: a process looping over untimed calls cannot
keep re-taking the shared lock ahead of it. Nested `exclusive` blocks (a Tuner timing inside
the time pass) take it once.
"""
from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from typing import Iterator

ENV = "HARNESS_GPU_LOCK"

_fds: dict[str, int] = {}
_depth = {"exclusive": 0, "shared": 0}
_waited = [0.0]  # seconds this process waited to take the lock exclusively
_held = [False]  # timing held off (held_off)


class TimingDeferred(RuntimeError):
    """A timed block began where timing is held off (`held_off`): what called it is done
    again later."""


@contextmanager
def held_off() -> Iterator[None]:
    """Within the block, a timed block (`exclusive`, `try_exclusive`; not one nested in an
    `exclusive` already held) raises TimingDeferred before it takes or times anything, with
    or without a lock path: a check worker turned while compile-ahead's workers still launch
    on its GPU and load the host's cores (harness.execute.compile_phase) leaves a case that
    would time a Tuner's, an autotuner's or Inductor's configs until they end. Timed beside
    them, on two H100s, 7 and 8 of 520 Tuner candidates' first-pass timings came out over
    1.15x (up to 3.3x) their timing in a run without; between two runs with this hold, 0-3
    (flash.yaml cold, six pairs), and three keys' best candidates lost there."""
    old, _held[0] = _held[0], True
    try:
        yield
    finally:
        _held[0] = old


def _refuse() -> None:
    if _held[0] and not _depth["exclusive"]:
        raise TimingDeferred("timing held off while compile-ahead's workers run")


def waited_s() -> float:
    """Seconds this process has waited for `exclusive` so far (another process's untimed work
    held the GPU): a Tuner's evidence says how much of its timing was waiting."""
    return _waited[0]


def path() -> str | None:
    """The lock's path prefix for this process (None: no locking)."""
    return os.environ.get(ENV) or None


def _fd(name: str) -> int:
    fd = _fds.get(name)
    if fd is None:
        os.makedirs(os.path.dirname(name) or ".", exist_ok=True)
        fd = _fds[name] = os.open(name, os.O_RDWR | os.O_CREAT, 0o644)
    return fd


@contextmanager
def exclusive() -> Iterator[None]:
    """The GPU to this process alone for the block (see the module doc)."""
    _refuse()
    base = path()
    if base is None or _depth["exclusive"] or _depth["shared"]:
        # inside `shared` (a check beside compile-ahead whose case times a Tuner) it runs as
        # it is: upgrading could deadlock with another sharer doing the same (the caller
        # keeps no such timing: Worker.run's `ahead`)
        with _counted("exclusive"):
            yield
        return
    gate, lock = _fd(base + ".gate"), _fd(base + ".gpu")
    t0 = time.monotonic()
    _take(gate, lock, None)
    with _holding(gate, lock, t0):
        yield


@contextmanager
def shared() -> Iterator[None]:
    """Untimed GPU work for the block: waits while another process times, and keeps it
    waiting until the block ends (inside `exclusive`, a no-op)."""
    base = path()
    if base is None or _depth["exclusive"]:
        yield
        return
    if _depth["shared"]:
        with _counted("shared"):
            yield
        return
    gate, lock = _fd(base + ".gate"), _fd(base + ".gpu")
    fcntl.flock(gate, fcntl.LOCK_EX)  # a timer holding or waiting for the lock goes first
    fcntl.flock(gate, fcntl.LOCK_UN)
    fcntl.flock(lock, fcntl.LOCK_SH)
    with _counted("shared", lock):
        yield


@contextmanager
def try_exclusive(wait_s: float = 0.0) -> Iterator[bool | None]:
    """`exclusive` if it can be had within `wait_s` seconds, else the block runs as it is:
    yields True (alone), False (another process, or this one in `shared`, kept the GPU) or
    None (no locking). For work that would rather run alone but must not wait without bound
    (Inductor's choice between two configs: harness.tuning.inductor_picks). Holding the gate
    while it waits for the lock keeps new sharers out, as `exclusive` does."""
    _refuse()
    base = path()
    if base is None:
        yield None
        return
    if _depth["exclusive"]:
        yield True
        return
    if _depth["shared"]:  # upgrading could deadlock with another sharer doing the same
        yield False
        return
    gate, lock = _fd(base + ".gate"), _fd(base + ".gpu")
    t0 = time.monotonic()
    if not _take(gate, lock, t0 + wait_s):
        yield False
        return
    with _holding(gate, lock, t0):
        yield True


def _take(gate: int, lock: int, deadline: float | None) -> bool:
    """The gate, then the lock, exclusively: blocking (deadline None) or by polling until
    `deadline` (time.monotonic). True if both are held; False (neither held) past it."""
    if not _flock_ex(gate, deadline):
        return False
    try:
        if _flock_ex(lock, deadline):
            return True
    except BaseException:
        fcntl.flock(gate, fcntl.LOCK_UN)
        raise
    fcntl.flock(gate, fcntl.LOCK_UN)
    return False


@contextmanager
def _holding(gate: int, lock: int, t0: float) -> Iterator[None]:
    """The block with both taken (`_take` since t0): counts the wait, nests, releases both."""
    _waited[0] += time.monotonic() - t0
    with _counted("exclusive", lock, gate):
        yield


@contextmanager
def _counted(kind: str, *held: int) -> Iterator[None]:
    """The block counted in _depth[kind] (what nested blocks of this process see), then the
    `held` files unlocked, in that order."""
    _depth[kind] += 1
    try:
        yield
    finally:
        _depth[kind] -= 1
        for fd in held:
            fcntl.flock(fd, fcntl.LOCK_UN)


def _flock_ex(fd: int, deadline: float | None, every_s: float = 0.005) -> bool:
    """flock(fd, LOCK_EX): blocking (deadline None), else polled until `deadline`."""
    if deadline is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(every_s)
