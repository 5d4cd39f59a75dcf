"""What the processes of one run hand each other through the run directory, all under
raw/locks/ (removed when the passes end):

- the GPU lock's files (harness.tuning.gpu_lock), one pair per GPU: `lock_path`;
- turn files: a process started early (the time pass's second process, the nsys process
  while ncu runs) waits (`wait_turn`) until its driver writes the JSON list of the cases it
  does now (`give_turn`);
- compile-ahead's class claims (`Claims`): exactly one worker compiles a class, and the
  lock (one per GPU) a compile worker holds while it uses the GPU's whole memory alone
  (`whole_memory`).
"""
from __future__ import annotations

import fcntl
import gc
import json
import os
import re
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

LOCKS = ("raw", "locks")


def folder(run_dir, *sub: str) -> Path:
    """raw/locks/<sub...> of `run_dir`, created."""
    p = Path(run_dir, *LOCKS, *sub)
    p.mkdir(parents=True, exist_ok=True)
    return p


def clear(run_dir, *sub: str) -> None:
    """Remove raw/locks/<sub...> of `run_dir` (what a finished pass left)."""
    shutil.rmtree(Path(run_dir, *LOCKS, *sub), ignore_errors=True)


def lock_path(run_dir, gpu: int | None) -> str:
    """The GPU lock's path prefix for `run_dir` on GPU `gpu` (None: the one GPU the run's
    workers see, by CUDA_VISIBLE_DEVICES)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").replace(",", "-")
    key = f"gpu{gpu}" if gpu is not None else f"gpu-{visible or 'default'}"
    return str(Path(run_dir, *LOCKS, key))


def turn_file(run_dir, name: str) -> Path:
    """A fresh turn file's path (none written yet)."""
    path = folder(run_dir) / f"{name}.go"
    path.unlink(missing_ok=True)
    return path


def give_turn(path: Path, case_ids: list[str]) -> None:
    """Its turn, to the process waiting for `path`: the cases it does now (written whole)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(list(case_ids)))
    os.replace(tmp, path)


def wait_turn(path: str, poll_s: float = 0.05, watch_parent: bool = False) -> list[str]:
    """Wait until `path` exists; its case ids. `watch_parent` (a worker the driver started
    itself, not one a profiler wraps): if the driver is gone (killed outright), end instead of
    waiting for ever (`orphaned`)."""
    parent = os.getppid()
    while not os.path.exists(path):
        if watch_parent:
            orphaned(parent)
        time.sleep(poll_s)
    return [str(c) for c in json.loads(Path(path).read_text())]


def orphaned(parent: int) -> None:
    """Exit (status 3) if this process's parent is no longer `parent`: nobody will give the
    turn it waits for (its driver was killed with SIGKILL, or by the out-of-memory killer)."""
    if os.getppid() != parent:
        print("worker: the process that started this one is gone; nothing to wait for",
              file=sys.stderr, flush=True)
        os._exit(3)


class Claims:
    """Compile classes claimed by the compile-ahead workers (schedule.warm_plans): a class is
    claimed by creating its file (exclusively), so exactly one worker compiles it. The folder
    holds units.json ({case: class}), written by `write`."""

    def __init__(self, folder: str):
        self.folder = Path(folder)
        self.unit_of = {k: str(v) for k, v in
                        json.loads((self.folder / "units.json").read_text()).items()}
        self.mine: set[str] = set()
        self.theirs: set[str] = set()

    @staticmethod
    def write(path: Path, unit_of: dict[str, object]) -> None:
        """units.json in folder `path`: each case's class, numbered."""
        numbers = {u: k for k, u in enumerate(dict.fromkeys(unit_of.values()))}
        (path / "units.json").write_text(json.dumps({c: numbers[u] for c, u in unit_of.items()}))

    def take(self, case_id: str) -> bool:
        unit = self.unit_of.get(case_id)
        if unit is None or unit in self.mine:
            return True
        if unit in self.theirs:
            return False
        try:
            os.close(os.open(self.folder / f"class{unit}", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            self.theirs.add(unit)
            return False
        self.mine.add(unit)
        return True


def out_of_memory(exc: BaseException | str) -> bool:
    """Whether `exc` (or a record's error line) says the GPU ran out of memory (torch's,
    cuBLAS's or a library's words)."""
    if type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return "out of memory" in text or "alloc_failed" in text


_ASKED = re.compile(r"Tried to allocate ([\d.]+) (GiB|MiB|KiB|B)\b")


def room_for(exc: BaseException) -> bool:
    """Whether this GPU has free now at least twice what the allocation that raised `exc`
    asked for (torch's "Tried to allocate 16.00 GiB"): room for it while another worker
    takes as much. False when the message does not say."""
    import torch

    m = _ASKED.search(str(exc))
    if m is None:
        return False
    asked = float(m.group(1)) * {"GiB": 2 ** 30, "MiB": 2 ** 20, "KiB": 2 ** 10, "B": 1}[m.group(2)]
    return torch.cuda.mem_get_info()[0] >= 2 * asked


@contextmanager
def whole_memory(run_dir, share: float, gpu: str | None = None,
                 alone: bool = True) -> Iterator[None]:
    """For a case that needs more than a compile worker's `share` of the GPU's memory
    (torch.cuda.set_per_process_memory_fraction): the whole of it for the block, what the
    block cached handed back and the share restored after; `alone`: one worker of the run at
    a time on that GPU (`gpu`, by default the worker's own, HARNESS_GPU). On an H100 every
    N=16384 case of torch.compile's attention backward and of fused_mha had failed
    compile-ahead at 0.1 of the memory (8-16 GiB asked, 50-61 GiB free) and was compiled by the
    check pass instead (the first took 11-16 s there). A worker alone compiles alone too (a
    case's first call compiles, then runs): fused_mha's N=16384 cases, whose scratch fails
    before their kernels compile, took 3-22 s each in flash.yaml's compile-ahead with --gpus
    all on two H100s against 2.4-8.0 s on one (Worker.do_warm: beside the others first where
    room_for says so)."""
    import torch

    gpu = os.environ.get("HARNESS_GPU") if gpu is None else gpu
    name = f"whole-memory.gpu{gpu}" if gpu else "whole-memory"
    fd = os.open(folder(run_dir, "warm") / name, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if alone:
            fcntl.flock(fd, fcntl.LOCK_EX)
        torch.cuda.set_per_process_memory_fraction(1.0)
        try:
            yield
        finally:
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.set_per_process_memory_fraction(share)
    finally:
        os.close(fd)  # (closing it unlocks it)


# -- the compile phase, while the check pass's workers start on what it has finished -------------

AHEAD = "ahead"  # raw/locks/ahead/: cases.json, and warm.over / beside.over as each ends


class AheadGate:
    """What compile-ahead and the checks beside it still hold, for a check worker whose turn
    came while they run (harness.execute.compile_phase): a compile-ahead case is the check's
    once it has its warm record (its kernels are on disk) or compile-ahead is over; a case of
    the checks beside it, once they are over (then unless they checked it). `walk` yields the
    worker's cases in its order, each as soon as it is free, and waits when none is. A case
    that would have timed something (gpu_lock.held_off) is `defer`red until compile-ahead is
    over, one that ran out of memory beside the phase until all of it is. `open` answers None
    where no compile phase runs beside the check pass."""

    def __init__(self, run_dir, folder: Path, cases: dict, poll_s: float = 0.1):
        self.run_dir, self.folder, self.poll_s = Path(run_dir), folder, poll_s
        self.warm = set(cases.get("warm") or ())
        self.beside = set(cases.get("beside") or ())
        self.warmed: set[str] = set()
        self.waiting: list = []
        self.deferred: dict[str, str] = {}  # case -> what it waits for ("warm", "")
        self.checked: set[str] | None = None  # what the checks beside recorded, once over
        self.parent = os.getppid()
        self.read_at = float("-inf")  # when the warm records were last read

    @classmethod
    def open(cls, run_dir) -> "AheadGate | None":
        path = Path(run_dir, *LOCKS, AHEAD)
        try:
            cases = json.loads((path / "cases.json").read_text())
        except (OSError, ValueError):
            return None
        return cls(run_dir, path, cases)

    @staticmethod
    def start(run_dir, warm: list[str], beside: list[str]) -> Path:
        """The driver's side: the phase's cases written (before any worker's turn)."""
        path = folder(run_dir, AHEAD)
        for what in ("warm", "beside"):
            (path / f"{what}.over").unlink(missing_ok=True)
        tmp = path / "cases.tmp"
        tmp.write_text(json.dumps({"warm": list(warm), "beside": list(beside)}))
        os.replace(tmp, path / "cases.json")
        return path

    @staticmethod
    def end(run_dir, what: str) -> None:
        """The driver's side: `what` ("warm", "beside") is over."""
        (folder(run_dir, AHEAD) / f"{what}.over").touch()

    def over(self, what: str = "") -> bool:
        """Whether `what` is over (no `what`: both)."""
        return all((self.folder / f"{w}.over").exists() for w in ([what] if what else
                                                                  ("warm", "beside")))

    def _refresh(self) -> None:
        from harness import store

        left = self.warm - self.warmed
        if left and time.monotonic() - self.read_at >= self.poll_s and not self.over("warm"):
            self.read_at = time.monotonic()
            self.warmed |= {r["case_id"] for r in store.read_parts(self.run_dir, "warm")} & left

    def built(self, case_id: str) -> bool:
        """Whether what compile-ahead builds for `case_id` is on disk (its warm record, or
        compile-ahead over), or it builds nothing for it."""
        return case_id not in self.warm or case_id in self.warmed or self.over("warm")

    def held(self, case_id: str) -> bool:
        if case_id in self.deferred:
            return not self.over(self.deferred[case_id])
        if case_id in self.beside:
            return not self.over("beside")
        return not self.built(case_id)

    def _first(self, items: list, free):
        """The first of `items` that is `free`, once one is (the warm records read again
        meanwhile); ends the process if its driver is gone."""
        while True:
            self._refresh()
            found = next((i for i in items if free(i)), None)
            if found is not None:
                return found
            orphaned(self.parent)
            time.sleep(self.poll_s)

    def wait(self, what: str = "") -> None:
        """Until `what` is over (no `what`: both); ends the process if its driver is gone."""
        while not self.over(what):
            orphaned(self.parent)
            time.sleep(self.poll_s)

    def held_back(self, rec: dict) -> str | None:
        """What the record of a case begun beside the phase says it waits for: "warm" (it
        would have timed: gpu_lock.TimingDeferred), "" (the whole phase: it ran out of the
        memory compile-ahead's workers and the checks beside them hold), else None. Either
        way once more, also where the phase ended while it ran (`defer` then gives it back at
        once): answered None there, a check held off by compile-ahead's last moments was
        recorded as an error and its case skipped by the time pass (flash.yaml cold, two
        H100s, 39f8313: one case in each of two runs)."""
        text = rec.get("error") or ""
        if rec.get("status") != "error" or rec.get("context_dead"):
            return None
        if text.startswith("TimingDeferred"):
            return "warm"
        if out_of_memory(text):
            return ""
        return None

    def defer(self, item, case_id: str, until: str = "") -> None:
        """`item` again once `until` ("warm": compile-ahead; "": the whole phase) is over."""
        self.deferred[case_id] = until
        self.waiting.append(item)

    def loadable(self, case_ids: list[str]):
        """`case_ids` in their order, each once what compile-ahead builds for it is on disk
        (its warm record, or compile-ahead over): a waiting process's first call
        (harness.execute.prewarm) then loads it instead of compiling it again."""
        left = list(case_ids)
        while left:
            case_id = self._first(left, self.built)
            left.remove(case_id)
            yield case_id

    def walk(self, items: list, key=lambda item: item[0]):
        """`items` in their order, each once it is free (`held` False); a case the checks
        beside compile-ahead recorded meanwhile is left out."""
        from harness import store

        self.waiting = list(items)
        while self.waiting:
            free = self._first(self.waiting, lambda i: not self.held(key(i)))
            self.waiting.remove(free)
            case_id = key(free)
            if case_id in self.beside and case_id not in self.deferred:
                if self.checked is None:
                    self.checked = {r["case_id"] for r in store.read_parts(self.run_dir,
                                                                           "check")}
                if case_id in self.checked:
                    continue
            self.deferred.pop(case_id, None)
            yield free
