"""Inductor's choice between a kernel's configs, made once per host (harness.tuning.inductor_picks):
stored by the process that benchmarks, reused by the next, never made by a compile-only
process; and gpu_lock.try_exclusive, which that benchmark takes when it is free.

The autotuner here is a stand-in with the contract of Inductor's CachingAutotuner that the
wrapper relies on (`run` autotunes to one launcher through `autotune_to_one_config`, which
takes the fastest of `benchmark_all_configs`'s timings, then launches `(launcher,) =
self.launchers`); a real Inductor on the GPU is the device run's. That the installed torch's
own CachingAutotuner is wrapped, through the import hook, is checked in a fresh process."""
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from harness import tuning
from harness.tuning import gpu_lock, inductor_picks

ROOT = Path(__file__).resolve().parent.parent


class Config:
    def __init__(self, rblock):
        self.rblock = rblock

    def __str__(self):
        return f"R0_BLOCK: {self.rblock}, num_warps: 8"


class Launcher:
    def __init__(self, rblock, ms, calls):
        self.config, self.ms, self.calls = Config(rblock), ms, calls

    def __call__(self, *args, stream=None):
        self.calls.append(self.config.rblock)


def _module():
    """A fresh stand-in of torch._inductor.runtime.triton_heuristics."""
    benched = []

    class CachingAutotuner:
        def __init__(self, filename, timings, calls, meta=None):
            self.filename = filename
            self.launchers = [Launcher(r, ms, calls) for r, ms in timings]
            self.inductor_meta = meta or {}

        def benchmark_all_configs(self, *args, **kwargs):
            benched.append(self.filename)
            if getattr(self, "meanwhile", None):  # what another process does while this times
                self.meanwhile()
            return {lc: lc.ms for lc in self.launchers}

        def autotune_to_one_config(self, *args, **kwargs):
            timings = self.benchmark_all_configs(*args, **kwargs)
            self.launchers = [min(timings, key=timings.get)]

        def run(self, *args, stream=None):
            if len(self.launchers) > 1:
                self.autotune_to_one_config(*args)
            (launcher,) = self.launchers
            launcher(*args, stream=stream)

    return types.SimpleNamespace(CachingAutotuner=CachingAutotuner, benched=benched)


@pytest.fixture
def picks(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(inductor_picks, "folder", lambda: tmp_path / "inductor" / "picks")
    monkeypatch.setattr(inductor_picks, "_device_tag", lambda: "GPU X|torch t|triton t")
    monkeypatch.setitem(inductor_picks._installed, "patched", False)
    for k in inductor_picks.counts:
        monkeypatch.setitem(inductor_picks.counts, k, 0)
    mod = _module()
    inductor_picks._patch(mod)
    return mod


def test_a_choice_is_benchmarked_once_and_reused_by_the_next_process(picks):
    calls = []
    first = picks.CachingAutotuner("/c/ab/cabc123.py", [(2048, 1.2), (1024, 1.0)], calls)
    first.run("x", stream=0)
    first.run("x", stream=0)
    assert picks.benched == ["/c/ab/cabc123.py"] and calls == [1024, 1024]
    # another process (a fresh autotuner of the same kernel file): the stored timings decide,
    # even if its own benchmark would have gone the other way
    later = picks.CachingAutotuner("/c/ab/cabc123.py", [(2048, 0.5), (1024, 9.0)], calls)
    later.run("x", stream=0)
    assert picks.benched == ["/c/ab/cabc123.py"] and calls[-1] == 1024
    assert inductor_picks.counts == {"reused": 1, "benchmarked": 1, "deferred": 0}
    (rec,) = [p for p in (inductor_picks.folder()).glob("*.json")]
    import json

    stored = json.loads(rec.read_text())
    assert stored["ms"] == {"R0_BLOCK: 2048, num_warps: 8": 1.2,
                            "R0_BLOCK: 1024, num_warps: 8": 1.0}
    assert stored["file"] == "cabc123.py" and stored["alone"] is None  # no run lock here
    assert "reused" in inductor_picks.summary()


def test_another_kernel_file_or_other_configs_choose_again(picks):
    calls = []
    picks.CachingAutotuner("/c/ab/cabc123.py", [(2048, 1.2), (1024, 1.0)], calls).run(stream=0)
    picks.CachingAutotuner("/c/de/cdef456.py", [(2048, 1.0), (1024, 1.2)], calls).run(stream=0)
    picks.CachingAutotuner("/c/ab/cabc123.py", [(4096, 0.7), (2048, 1.0)], calls).run(stream=0)
    assert len(picks.benched) == 3 and calls == [1024, 2048, 4096]
    # a kernel with one config is not autotuned at all, and nothing is stored for it
    picks.CachingAutotuner("/c/gh/cgh.py", [(512, 1.0)], calls).run(stream=0)
    assert len(picks.benched) == 3 and len(list(inductor_picks.folder().glob("*.json"))) == 3


def test_a_compile_only_process_chooses_nothing(picks):
    calls = []
    warm = picks.CachingAutotuner("/c/ab/cabc123.py", [(2048, 1.2), (1024, 1.0)], calls)
    with tuning.compile_only():
        warm.run(stream=0)  # launches the first config, benchmarks nothing
        assert calls == [2048] and picks.benched == []
        # the choice stays open: every config is back as the next call starts
        assert "run" in warm.__dict__
        warm.run(stream=0)
        assert calls == [2048, 2048] and picks.benched == []
    assert inductor_picks.counts["deferred"] == 2 and inductor_picks.counts["benchmarked"] == 0
    # the same process, measuring now: it chooses (and stores the choice)
    warm.run(stream=0)
    assert calls[-1] == 1024 and picks.benched == ["/c/ab/cabc123.py"]
    assert "run" not in warm.__dict__ and len(warm.launchers) == 1
    # a compile-only process that finds a stored choice takes it
    other = picks.CachingAutotuner("/c/ab/cabc123.py", [(2048, 1.2), (1024, 1.0)], calls)
    with tuning.compile_only():
        other.run(stream=0)
    assert calls[-1] == 1024 and len(other.launchers) == 1 and len(picks.benched) == 1


def test_the_first_stored_choice_stays(picks):
    """Two processes benchmark one kernel at once (two GPUs of a host): the one that stores
    second takes the first one's timings, so both launch the same config."""
    calls = []
    first = picks.CachingAutotuner("/c/ab/cabc123.py", [(2048, 1.2), (1024, 1.0)], calls)
    second = picks.CachingAutotuner("/c/ab/cabc123.py", [(2048, 0.9), (1024, 1.0)], calls)
    second.meanwhile = lambda: first.run(stream=0)  # the other process stores first
    second.run(stream=0)
    assert calls == [1024, 1024]  # not 2048, second's own (faster there) timing
    assert inductor_picks.counts["benchmarked"] == 2


def test_an_unreadable_record_is_benchmarked_and_replaced(picks):
    calls = []
    tuner = picks.CachingAutotuner("/c/ab/cabc123.py", [(2048, 1.2), (1024, 1.0)], calls)
    k = inductor_picks.key(tuner)
    base = inductor_picks.folder()
    base.mkdir(parents=True)
    for bad in ('[1]', '"s"', '{"ms": {"R0_BLOCK: 2048, num_warps: 8": "fast", '
                '"R0_BLOCK: 1024, num_warps: 8": 1.0}}', '{"ms": 3}', 'not json'):
        (base / f"{k}.json").write_text(bad)
        assert inductor_picks.stored(tuner) is None
    tuner.run(stream=0)
    assert calls == [1024] and picks.benched == ["/c/ab/cabc123.py"]
    again = picks.CachingAutotuner("/c/ab/cabc123.py", [(2048, 1.2), (1024, 1.0)], calls)
    assert inductor_picks.stored(again) is not None  # replaced by this benchmark's


def test_coordinate_descent_is_left_to_inductor(picks):
    calls = []
    tuner = picks.CachingAutotuner("/c/ab/cabc123.py", [(2048, 1.2), (1024, 1.0)], calls,
                                   meta={"coordinate_descent_tuning": True})
    with tuning.compile_only():
        tuner.run(stream=0)
    assert calls == [1024] and inductor_picks.counts["deferred"] == 0


def test_off_by_environment(monkeypatch):
    monkeypatch.setenv(inductor_picks.ENV, "0")
    monkeypatch.setitem(inductor_picks._installed, "hook", False)
    inductor_picks.install()
    assert inductor_picks._installed["hook"] is False


def test_the_installed_torch_autotuner_is_wrapped_on_import(tmp_path):
    code = (
        "import sys\n"
        "from harness.tuning import inductor_picks as p\n"
        "p.install()\n"
        "assert p.MODULE not in sys.modules\n"
        "import torch._inductor.runtime.triton_heuristics as th\n"
        "c = th.CachingAutotuner\n"
        "print(p._installed['patched'], c.benchmark_all_configs.__qualname__,"
        " c.autotune_to_one_config.__qualname__)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [
        "True", "_patch.<locals>.benchmark_all_configs",
        "_patch.<locals>.autotune_to_one_config"], out.stdout


HOLDER = """
import sys, time
from harness.tuning import gpu_lock
with getattr(gpu_lock, sys.argv[1])():
    print("in", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _hold(tmp_path, kind, seconds):
    env = {**os.environ, "PYTHONPATH": str(ROOT), gpu_lock.ENV: str(tmp_path / "lk" / "gpu0")}
    p = subprocess.Popen([sys.executable, "-c", HOLDER, kind, str(seconds)], env=env,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "in"
    return p


def test_try_exclusive_waits_a_bounded_time(tmp_path, monkeypatch):
    import time

    monkeypatch.setenv(gpu_lock.ENV, str(tmp_path / "lk" / "gpu0"))
    monkeypatch.setattr(gpu_lock, "_fds", {})
    holder = _hold(tmp_path, "shared", 1.5)  # releases after 1.5 s
    try:
        t0 = time.monotonic()
        with gpu_lock.try_exclusive(wait_s=0.3) as alone:
            assert alone is False
        assert 0.25 < time.monotonic() - t0 < 1.4
        with gpu_lock.try_exclusive(wait_s=20) as alone:
            assert alone is True
        assert time.monotonic() - t0 < 10
    finally:
        holder.kill()
        holder.wait()


def test_try_exclusive_takes_a_free_lock_and_never_waits(tmp_path, monkeypatch):
    monkeypatch.setenv(gpu_lock.ENV, str(tmp_path / "lk" / "gpu0"))
    monkeypatch.setattr(gpu_lock, "_fds", {})
    with gpu_lock.try_exclusive() as alone:
        assert alone is True
        with gpu_lock.exclusive():  # nested: taken once
            pass
    for kind in ("shared", "exclusive"):
        holder = _hold(tmp_path, kind, 30)
        try:
            import time

            t0 = time.monotonic()
            with gpu_lock.try_exclusive() as alone:
                assert alone is False
            assert time.monotonic() - t0 < 5
        finally:
            holder.kill()
            holder.wait()
    with gpu_lock.try_exclusive() as alone:  # free again
        assert alone is True
    with gpu_lock.shared():  # this process shares: no upgrade (two sharers could deadlock)
        with gpu_lock.try_exclusive() as alone:
            assert alone is False
    monkeypatch.delenv(gpu_lock.ENV)
    with gpu_lock.try_exclusive() as alone:
        assert alone is None



def test_a_config_puts_back_its_cpu_copies_once_not_after_every_call(picks, monkeypatch):
    """Inductor's `bench` (torch 2.13: harness/tuning/inductor_picks.restored_once) copies an
    argument written in place to the CPU when a GPU copy would raise peak memory, and puts it
    back after every timed call: at N=16384 a 16 GiB host-to-device copy per call. Wrapped, it
    goes back once per config, from the copies taken before that config's first call, and the
    argument is whole when the choice is made."""
    events = []

    class CachingAutotuner(picks.CachingAutotuner):
        def bench(self, launcher, *args, **kwargs):
            copies = {"in_out": ("arg", f"pristine before {launcher.config.rblock}")}
            events.append(("copy", launcher.config.rblock))
            for _ in range(3):  # Inductor's benchmarker calls kernel_call several times
                launcher(*args)
                self.restore_args_from_cpu(copies)
            return launcher.ms

        def restore_args_from_cpu(self, copies):
            events.append(("restore", copies["in_out"][1]))

        def benchmark_all_configs(self, *args, **kwargs):  # as Inductor's: one bench a config
            return {lc: self.bench(lc, *args, **kwargs) for lc in self.launchers}

    mod = types.SimpleNamespace(CachingAutotuner=CachingAutotuner)
    monkeypatch.setitem(inductor_picks._installed, "patched", False)
    inductor_picks._patch(mod)
    calls = []
    a = mod.CachingAutotuner("/c/rb/crb.py", [(2048, 1.2), (1024, 1.0)], calls)
    a.run("x", stream=0)
    assert events == [("copy", 2048), ("restore", "pristine before 2048"),
                      ("copy", 1024), ("restore", "pristine before 1024")]
    assert calls == [2048] * 3 + [1024] * 3 + [1024]  # benchmarked, then the chosen one
    assert "bench" not in vars(a) and "restore_args_from_cpu" not in vars(a)  # unwrapped after
    events.clear()
    a.restore_args_from_cpu({"in_out": ("arg", "outside a benchmark")})
    assert events == [("restore", "outside a benchmark")]
    # a user's Triton kernel (its time may depend on what it overwrites) and coordinate
    # descent (its neighbours are timed later, Inductor's way): as Inductor does it
    for name, meta, custom in (("/c/cu/ccu.py", {}, True),
                               ("/c/cd/ccd.py", {"coordinate_descent_tuning": True}, False)):
        events.clear()
        b = mod.CachingAutotuner(name, [(2048, 1.2), (1024, 1.0)], calls, meta)
        b.custom_kernel = custom
        b.benchmark_all_configs("x")
        assert [e for e in events if e[0] == "restore"] == [
            ("restore", "pristine before 2048")] * 3 + [("restore", "pristine before 1024")] * 3
    # a benchmark that raises: the argument goes back, the benchmark's error goes on
    events.clear()
    c = mod.CachingAutotuner("/c/er/cer.py", [(2048, 1.2), (1024, 1.0)], calls)

    def second_call_fails(self, *a, stream=None):  # a launch that fails once one has run
        self.calls.append(self.config.rblock)
        if self.calls.count(self.config.rblock) > 1:
            raise ZeroDivisionError

    c.launchers[1].__class__ = type("Broken", (Launcher,), {"__call__": second_call_fails})
    calls.clear()
    with pytest.raises(ZeroDivisionError):
        c.benchmark_all_configs("x")
    assert events[-2:] == [("copy", 1024), ("restore", "pristine before 1024")]
    assert "bench" not in vars(c) and "restore_args_from_cpu" not in vars(c)
