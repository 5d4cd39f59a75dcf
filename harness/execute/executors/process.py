"""Worker processes: argv and environment, streaming their events, and the per-case watchdog.

`stream` runs one process in its own process group and feeds its `@@harness` lines to a
callback; `run_shard` drives the check + time passes of a list of cases through as many worker
processes as it takes: a worker that dies costs the case in flight (`error`), a case that
outlives its watchdog limit costs itself (`timeout`), and a new worker carries on from the
next case. The local, per-GPU and Ray executors all run shards through `run_shard`.
"""
from __future__ import annotations

import json
import os
import queue
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from harness import store

from harness.execute import pycache, sharing
from harness.errors import HarnessError

PROJECT_ROOT = Path(__file__).resolve().parents[3]
MEASURE_PASSES = ("check", "time")
MAX_RESTARTS = 50


class Interrupted(Exception):
    pass


def triton_cache_dir() -> str:
    """Triton's own default kernel cache folder ($TRITON_HOME or ~, then .triton/cache)."""
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
    return os.path.join(home, ".triton", "cache")


def kernel_caches() -> dict[str, str]:
    """Where this run's workers keep compiled kernels: Triton's cache (pinned by worker_env)
    and Inductor's ($TORCHINDUCTOR_CACHE_DIR, else its default under the temp folder). A run
    records them, so the next one trusts a previous compile only from the same folders."""
    import getpass
    import re
    import tempfile

    try:
        user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    except Exception:  # no user name (some containers): Inductor falls back the same way
        user = "unknown"
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"torchinductor_{user}")
    return {"triton": os.path.abspath(os.environ.get("TRITON_CACHE_DIR") or triton_cache_dir()),
            "inductor": os.path.abspath(inductor)}


def worker_env(device: str, gpu: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT)] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    # Inductor compiles in-process: a worker compiles a few small graphs, and starting its
    # pool of compile processes cost more than that in every worker (tools/device/compile_probe.py)
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    # One Triton kernel cache for every worker, from its first compile to its last. Unset,
    # Triton uses ~/.triton/cache until the worker's first torch.compile kernel, whose
    # CachingAutotuner then sets TRITON_CACHE_DIR to Inductor's own triton/<device> folder for
    # the rest of the process: the compile-ahead workers and the check pass each switched at a
    # different case, so the check pass recompiled half of what compile-ahead had built (on an
    # H200, 2-3 s for each of 5 of triton_flash's 8 kernel classes in flash.yaml's check pass).
    env.setdefault("TRITON_CACHE_DIR", triton_cache_dir())
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    if gpu is not None:  # the worker sees exactly one GPU, and records which one it was
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # the numbering nvidia-smi uses
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        env["HARNESS_GPU"] = str(gpu)
    return pycache.apply_to_env(env)


def worker_argv(run_dir: Path, passes: str, device: str, cases: list[str] | None = None,
                tag: str | None = None, shard: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "harness", "worker", "--run", str(Path(run_dir).resolve()),
            "--passes", passes, "--device", device]
    if cases:
        argv += ["--cases", ",".join(cases)]
    if tag:
        argv += ["--tag", tag]
    if shard is not None:
        argv += ["--shard", str(shard)]
    return argv


def stream(argv: list[str], env: dict, log_path: Path, on_event, timeout: float | None = None,
           watchdog: Callable[[], bool] | None = None):
    """Run argv in its own process group; `@@harness` lines -> on_event, the rest -> log.

    `timeout` bounds the whole process; `watchdog()` is polled a few times a second and kills
    the group when it returns True. Returns (returncode, timed_out). Ctrl-C kills the group
    and raises Interrupted.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        log.write(f"$ {shlex.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1, start_new_session=True,
                                errors="replace")
        lines: queue.Queue = queue.Queue()

        def pump():
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + timeout if timeout else None
        timed_out = False
        try:
            while True:
                try:
                    line = lines.get(timeout=0.2)
                except queue.Empty:
                    if (deadline and time.monotonic() > deadline) or (watchdog and watchdog()):
                        timed_out = True
                        kill_group(proc)
                        break
                    continue
                if line is None:
                    break
                if line.startswith("@@harness "):
                    try:
                        on_event(json.loads(line[len("@@harness "):]))
                    except json.JSONDecodeError:
                        log.write(line)
                else:
                    log.write(line)
                if watchdog and watchdog():
                    timed_out = True
                    kill_group(proc)
                    break
            rc = proc.wait()
        except KeyboardInterrupt:
            kill_group(proc)
            log.write("[interrupted by Ctrl-C]\n")
            raise Interrupted() from None
        log.write(f"[exit {rc}{' (timed out)' if timed_out else ''}]\n")
    return rc, timed_out


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def describe_rc(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return str(rc)


def join(thread: threading.Thread | None) -> None:
    """Wait for `thread` in short joins, so that Ctrl-C still reaches the waiting thread."""
    while thread is not None and thread.is_alive():
        thread.join(0.2)


def run_threads(threads: list[threading.Thread], stop: threading.Event) -> None:
    """Start `threads` and wait for them all; Ctrl-C sets `stop` (their workers' watchdogs
    kill the process groups), waits for them to wind down and raises Interrupted."""
    for t in threads:
        t.start()
    try:
        for t in threads:
            join(t)
    except KeyboardInterrupt:
        stop.set()
        for t in threads:
            t.join()
        raise Interrupted() from None


class CaseWatch:
    """The (pass, case) a worker has in flight, from its start/done events, and `expired`, the
    watchdog `stream` polls: the case outlived its limit (`limits[case_id]`, seconds) or `stop`
    is set."""

    def __init__(self, limits: dict[str, float], stop: threading.Event | None = None):
        self.limits, self.stop = limits, stop
        self.clear()

    def clear(self) -> None:
        self.pass_name: str | None = None
        self.case: str | None = None
        self.since: float | None = None

    def see(self, ev: dict) -> None:
        if ev.get("event") == "start":
            self.pass_name, self.case = ev.get("name"), ev.get("case_id")
            self.since = time.monotonic()
        elif ev.get("event") == "done":
            self.clear()

    def expired(self) -> bool:
        if self.stop is not None and self.stop.is_set():
            return True
        return bool(self.case and
                    time.monotonic() - self.since > self.limits.get(self.case, float("inf")))


def todo(run_dir: Path, pass_name: str, case_ids: list[str]) -> list[str]:
    done = {r["case_id"] for r in store.read_parts(run_dir, pass_name)}
    return [c for c in case_ids if c not in done]


def time_processes(run_dir: Path) -> int:
    return store.time_processes(run_dir)


def measure_parts(processes: int) -> tuple[str, ...]:
    """The part files the check and time passes write: check, time (the first process) and
    time_p2 ... time_p<processes> (the later ones)."""
    return ("check", *store.time_parts(processes))


def rotated(case_ids: list[str], k: int, processes: int) -> list[str]:
    """The order the time pass's k-th process (k >= 2) takes the cases in: rotated by
    (k - 1) / processes of the list, and reversed for even k (the second process times the
    first case last), so no case is always timed early, or always late, in its process."""
    n = len(case_ids)
    cut = (k - 1) * n // max(1, processes)
    out = case_ids[cut:] + case_ids[:cut]
    return out[::-1] if k % 2 == 0 else out


def run_shard(run_dir: Path, case_ids: list[str], *, device: str, limits: dict[str, float],
              log_path: Path, on_event: Callable[[dict], None], gpu: int | None = None,
              shard: str | None = None, env: dict | None = None,
              stop: threading.Event | None = None, early=None) -> None:
    """Check + time `case_ids` (in this order) until each (pass, case) has a record, then time
    them again in the time pass's later processes (`timing.processes`; each its own worker,
    `--tag time_p<k>`, the cases in `rotated` order, only those whose first timing was ok).

    The second process starts with the first (`Helper`): while the first one checks, it makes
    one untimed call of each case (kernels loaded, graphs traced, cuDNN plans made), holding
    the GPU lock shared (harness.tuning.gpu_lock: it waits while the first one times), and
    waits for its turn. Whatever it leaves undone is done as before, by fresh workers.
    `early` (early_check.EarlyCheck), a first worker started while compile-ahead ran, gets the
    cases in place of a fresh one.

    `limits[case_id]` is the watchdog limit in seconds of one (pass, case); on expiry the
    worker's process group is killed and the case is recorded as `timeout`. Records of this
    shard go to parts/<part>.<shard>.jsonl (parts/<part>.jsonl without a shard). Setting
    `stop` (Ctrl-C seen by another thread) kills the worker and raises Interrupted.
    """
    from harness.tuning import gpu_lock

    helper = None
    try:  # `early` is this function's from here: ended on every way out
        env = {**(env or worker_env(device, gpu)), gpu_lock.ENV: sharing.lock_path(run_dir, gpu)}
        drive = Driver(run_dir, device=device, limits=limits, log_path=log_path,
                       on_event=on_event, gpu=gpu, shard=shard, env=env, stop=stop)
        n = time_processes(run_dir)
        helper = Helper(drive, rotated(case_ids, 2, n)) if n >= 2 and case_ids else None
        if early is not None:
            if stop is not None and stop.is_set():
                raise Interrupted()
            left = {p: set(todo(run_dir, p, case_ids)) for p in MEASURE_PASSES}
            pending = [c for c in case_ids if any(c in v for v in left.values())]
            if pending:
                early.go(pending, drive)
            else:
                early.cancel()
            early = None
            if stop is not None and stop.is_set():
                raise Interrupted()
        drive.run(case_ids, MEASURE_PASSES, None)
        for k in range(2, n + 1):
            timed = {r["case_id"] for r in store.read_parts(run_dir, "time")
                     if r["status"] == "ok"}
            ids = [c for c in rotated(case_ids, k, n) if c in timed]
            part = measure_parts(k)[-1]
            if k == 2 and helper:
                helper.go(ids)  # its turn: it times what it can, the Driver below the rest
            drive.run(ids, (part,), part)
    except BaseException:
        cancel_all(w for w in (early, helper) if w is not None)
        raise


class TurnWorker:
    """A worker process started ahead of its turn (`--wait-for` its turn file), streamed from a
    thread of its own: `go` gives it its cases and waits for its end, `cancel` ends it. Its
    events and a fault it meets belong to `drive` (a Driver: given here, or by `go` for a worker
    started before its Driver existed); its untimed first calls (`prewarm`) are its own. Best
    effort: what it leaves undone, the Driver does after it."""

    def __init__(self, argv: list[str], env: dict, log: Path, limits: dict[str, float],
                 gpu: int | None, go_file: Path, name: str, drive: "Driver | None" = None):
        self.argv, self.env, self.log, self.limits, self.gpu = argv, env, log, limits, gpu
        self.go_file, self.drive = go_file, drive
        self.cancelled = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name=name)
        self.thread.start()

    def _stopped(self) -> bool:
        stop = self.drive.stop if self.drive is not None else None
        return self.cancelled.is_set() or bool(stop is not None and stop.is_set())

    def _run(self) -> None:
        watch = CaseWatch(self.limits)

        def on_ev(ev):
            watch.see(ev)
            if ev.get("name") != "prewarm" and self.drive is not None:
                self.drive.on_event({**ev, "gpu": self.gpu})

        try:
            rc, timed_out = stream(self.argv, self.env, self.log, on_ev,
                                   watchdog=lambda: watch.expired() or self._stopped())
        except Interrupted:
            return
        if self._stopped() or self.drive is None:
            return
        if watch.case and watch.pass_name != "prewarm" and (timed_out or rc != 0):
            self.drive.record_fault(watch, rc, timed_out, self.log)

    def go(self, case_ids: list[str], drive: "Driver | None" = None) -> None:
        """Its turn: `case_ids`, in this order (for `drive`, if given now); wait for it to end
        (Ctrl-C meanwhile: Interrupted, as from a worker the Driver started)."""
        if drive is not None:
            self.drive = drive
        sharing.give_turn(self.go_file, case_ids)
        try:
            join(self.thread)
        except KeyboardInterrupt:
            self.cancel()
            raise Interrupted() from None

    def stop(self) -> None:
        """Ask the worker to end (its watchdog kills it within a fifth of a second)."""
        self.cancelled.set()

    def cancel(self) -> None:
        self.stop()
        self.thread.join()


def cancel_all(workers) -> None:
    """End every TurnWorker of `workers`: all asked first, then waited for, so a second Ctrl-C
    while waiting leaves none of them unasked."""
    workers = list(workers)
    for w in workers:
        w.stop()
    for w in workers:
        w.thread.join()


class Helper(TurnWorker):
    """The time pass's second process, started beside the first (run_shard): `--prewarm` over
    the cases in its order, then `--wait-for` a file that `go` writes with the cases to time."""

    def __init__(self, drive: "Driver", case_ids: list[str]):
        run_dir = drive.run_dir
        tag = measure_parts(2)[-1]
        name = f"{tag}.{drive.shard}" if drive.shard else tag
        go_file = sharing.turn_file(run_dir, name)
        argv = worker_argv(run_dir, "time", drive.device, case_ids, tag=tag,
                           shard=drive.shard) + ["--prewarm", "--wait-for", str(go_file)]
        log = drive.log_path.with_name(f"{drive.log_path.stem}.p2{drive.log_path.suffix}")
        super().__init__(argv, drive.env or worker_env(drive.device, drive.gpu), log,
                         drive.limits, drive.gpu, go_file, f"helper-{name}", drive)


class Driver:
    """Worker processes for a list of cases until each of some parts has a record per case:
    a worker that dies costs the case in flight (`error`), one that outlives its case's
    watchdog limit costs that case (`timeout`), and a new worker goes on from the next."""

    def __init__(self, run_dir: Path, *, device: str, limits: dict[str, float],
                 log_path: Path, on_event: Callable[[dict], None], gpu: int | None,
                 shard: str | None, env: dict | None, stop: threading.Event | None):
        self.run_dir, self.device, self.limits, self.log_path = run_dir, device, limits, log_path
        self.on_event, self.gpu, self.shard, self.env, self.stop = on_event, gpu, shard, env, stop

    def run(self, case_ids: list[str], parts: tuple[str, ...], tag: str | None) -> None:
        """`parts` are the worker's passes (check, time), or with `tag` the one part the
        single `time` pass of the worker writes."""
        run_dir, gpu = self.run_dir, self.gpu
        watch = CaseWatch(self.limits, self.stop)

        def on_ev(ev):
            watch.see(ev)
            self.on_event({**ev, "gpu": gpu})

        restarts = 0
        passes = "time" if tag else ",".join(parts)
        while True:
            left = {p: set(todo(run_dir, p, case_ids)) for p in parts}
            before = sum(len(v) for v in left.values())
            if not before:
                return
            # the shard's own order, longest first, and only the cases still to do
            pending = [c for c in case_ids if any(c in v for v in left.values())]
            argv = worker_argv(run_dir, passes, self.device, pending, tag=tag, shard=self.shard)
            rc, timed_out = stream(argv, self.env or worker_env(self.device, gpu),
                                   self.log_path, on_ev, watchdog=watch.expired)
            if self.stop is not None and self.stop.is_set():
                raise Interrupted()
            if watch.case and (timed_out or rc != 0):
                self.record_fault(watch, rc, timed_out, self.log_path)
            after = sum(len(todo(run_dir, p, case_ids)) for p in parts)
            restarts += 1
            if after == before or restarts > MAX_RESTARTS:
                raise HarnessError(f"the worker makes no progress (exit {describe_rc(rc)}); "
                                   f"see {self.log_path}")


    def record_fault(self, watch: "CaseWatch", rc: int, timed_out: bool, log: Path) -> None:
        """The case a worker had in flight when it died or outlived its limit: recorded as
        `error` or `timeout` in the part of its pass."""
        pass_name, case_id, rel_log = watch.pass_name, watch.case, _rel(log, self.run_dir)
        if timed_out:
            limit = self.limits.get(case_id)
            err = (f"timed out after {limit:g} s (watchdog; timing.case_timeout_s); "
                   f"log: {rel_log}")
            status = "timeout"
        else:
            err = f"worker died ({describe_rc(rc)}); log: {rel_log}"
            status = "error"
        store.append_part(self.run_dir, pass_name,
                          {"case_id": case_id, "status": status, "error": err, "gpu": self.gpu,
                           "host": socket.gethostname()}, shard=self.shard)
        self.on_event({"event": "done", "name": pass_name, "case_id": case_id,
                       "status": status, "gpu": self.gpu})
        watch.clear()


def _rel(path: Path, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(path)
