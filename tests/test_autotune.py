"""`triton.autotune` kernels as tunables (harness.tuning.autotune): a user-style module outside the
repository (loaded through $HARNESS_OPS) whose SwiGLU kernel is autotuned over 6 configs;
`variants:` forcing 2 of them run as 2 candidates in the CPU interpreter and pass; a config the
kernel rejects is a one-line error; the autotuner's own timings become pick evidence (its GPU
path, driven here by a `do_bench` the kernel supplies); the since block names a changed pick."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from run_factory import GPU_ENV, case_id, write_run

from harness import store, tuning

from harness.experiment import spec

from harness.tuning import autotune
from harness.errors import SpecError

ROOT = Path(__file__).resolve().parent.parent

USER_MODULE = '''
"""A user's SwiGLU op: its kernel is autotuned over 6 configs, its pruner drops the configs
with fewer than 8 elements per thread (1024 x 8 warps)."""
import torch
import triton
import triton.language as tl

from harness.registry import Op, Param

op = Op("swiglu_user", params=[Param("N", int, size=True)], dtypes=("float16", "float32"))


@op.inputs
def make_inputs(p, dtype, device, gen):
    a = torch.randn(p.N, device=device, generator=gen).to(dtype)
    return a, torch.randn(p.N, device=device, generator=gen).to(dtype)


@op.reference
def reference(a, b):
    return torch.nn.functional.silu(a) * b


@op.flops
def flops(p):
    return 5.0 * p.N


@op.bytes
def nbytes(p, itemsize):
    return 3.0 * p.N * itemsize


def _enough_per_thread(configs, named_args, **kwargs):
    return [c for c in configs if c.kwargs["BLOCK_SIZE"] // (32 * c.num_warps) >= 8]


@triton.autotune(configs=[triton.Config({"BLOCK_SIZE": bs}, num_warps=w)
                          for bs in (1024, 2048, 4096) for w in (4, 8)],
                 key=["n_elements"], prune_configs_by={"early_config_prune": _enough_per_thread})
@triton.heuristics({"EVEN": lambda args: args["n_elements"] % args["BLOCK_SIZE"] == 0})
@triton.jit
def _swiglu_kernel(a_ptr, b_ptr, c_ptr, n_elements, BLOCK_SIZE: tl.constexpr,
                   EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    a = tl.load(a_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    tl.store(c_ptr + offs, (a * tl.sigmoid(a) * b).to(c_ptr.dtype.element_ty), mask=mask)


@op.impl("torch", backend="torch")
def swiglu_torch(a, b):
    return torch.nn.functional.silu(a) * b


@op.impl("triton", backend="triton")
def swiglu_triton(a, b):
    c = torch.empty_like(a)
    n = a.numel()
    _swiglu_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)](a, b, c, n)
    return c
'''

EXPERIMENT = """
name: swiglu-user
op: swiglu_user
baseline: torch
candidates: [triton]
variants: {triton: {BLOCK_SIZE: [1024, 4096], num_warps: [4]}}
sweep: {N: [1000000]}
smoke: {N: [1500]}
dtypes: [float32]
timing: {rep_ms: 1}
correctness: {trials: 1}
"""


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    """The user's folder, outside the repository: swiglu_user.py and its experiment."""
    d = tmp_path_factory.mktemp("user_ops")
    (d / "swiglu_user.py").write_text(USER_MODULE)
    (d / "swiglu.yaml").write_text(EXPERIMENT)
    return d


def _env(user_dir: Path) -> dict:
    return {**os.environ, "HARNESS_OPS": str(user_dir / "swiglu_user.py"),
            "TRITON_INTERPRET": "1", "COLUMNS": "200", "PYTHONPATH": str(ROOT)}


@pytest.fixture
def user_op(user_dir, monkeypatch):
    """The user's op registered in this process (as `HARNESS_OPS=<path>` does)."""
    import harness.registry as reg

    monkeypatch.setenv("HARNESS_OPS", str(user_dir / "swiglu_user.py"))
    monkeypatch.setattr(reg, "_REGISTRY", None)
    monkeypatch.syspath_prepend(str(user_dir))
    yield reg.registry().get_op("swiglu_user")
    sys.modules.pop("swiglu_user", None)


@pytest.fixture(scope="module")
def variant_run(user_dir, tmp_path_factory):
    """One real CPU run of the user's experiment: torch, triton and 2 forced variants."""
    out = tmp_path_factory.mktemp("store")
    proc = subprocess.run([sys.executable, "-m", "harness", "run", str(user_dir / "swiglu.yaml"),
                           "--store", str(out), "--device", "cpu"], cwd=ROOT,
                          env=_env(user_dir), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = [p for p in out.iterdir() if (p / "manifest.json").exists()]
    return run, proc.stdout


@pytest.fixture(autouse=True)
def _clean_picks():
    tuning.load_picks({})
    tuning.take_new_picks()
    yield
    tuning.load_picks({})
    tuning.take_new_picks()


def test_the_autotuners_configs_are_the_impls_tunables(user_op):
    triton_impl, torch_impl = user_op.get_impl("triton"), user_op.get_impl("torch")
    tun = triton_impl.tunables()
    assert list(tun) == ["BLOCK_SIZE", "num_warps", "num_stages"]
    kernel = tun["BLOCK_SIZE"][0]
    assert kernel.name == "swiglu_user._swiglu_kernel"
    assert kernel.valid_values("BLOCK_SIZE") == (1024, 2048, 4096)
    assert kernel.valid_values("num_warps") == (4, 8)
    assert kernel.valid_values("num_stages") == (3,)
    assert torch_impl.tunables() == {}  # beside the kernel in one file, but never calls it
    assert triton_impl.split_config({"BLOCK_SIZE": 2048}) == {
        "swiglu_user._swiglu_kernel": {"BLOCK_SIZE": 2048}}


def test_variants_over_two_configs_run_as_two_candidates_on_the_cpu_and_pass(variant_run):
    run, stdout = variant_run
    cases = store.load_cases(run).set_index("case_id")
    res = store.load_results(run).set_index("case_id")
    forced = {"triton[BLOCK_SIZE=1024,num_warps=4]": 1024,
              "triton[BLOCK_SIZE=4096,num_warps=4]": 4096}
    assert set(cases.impl) == {"torch", "triton", *forced}
    assert (cases.status == "ok").all() and res.correct.all()
    name = "swiglu_user._swiglu_kernel"
    for impl, block in forced.items():
        cid = cases.index[cases.impl == impl][0]
        # what the autotuner launched (its best_config), not what the YAML asked for
        assert json.loads(res.config[cid]) == {name: {"BLOCK_SIZE": block, "num_warps": 4,
                                                      "num_stages": 3}}
        assert res.config_source[cid] == "forced"
    own = cases.index[cases.impl == "triton"][0]
    assert json.loads(res.config[own]) == {name: {"BLOCK_SIZE": 1024, "num_warps": 4,
                                                  "num_stages": 3}}
    assert res.config_source[own] == "interpreter"  # its first config, nothing benchmarked
    assert "0 active drivers" not in stdout


def test_a_forced_config_the_kernel_rejects_is_one_line_exit_2_and_writes_nothing(user_op,
                                                                                  tmp_path,
                                                                                  capsys):
    from harness.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(EXPERIMENT.replace("num_warps: [4]", "num_warps: [8]"))
    out = tmp_path / "store"
    assert main(["run", str(bad), "--store", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert ("variants.triton: BLOCK_SIZE=1024, num_warps=8 breaks the kernel's "
            "early_config_prune (_enough_per_thread)") in lines[0]
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("variants, expected", [
    ("{triton: {BLOCK: [1024]}}",
     ["variants.triton.BLOCK", "unknown tunable", "BLOCK_SIZE, num_warps, num_stages"]),
    ("{triton: {BLOCK_SIZE: [1024, 512]}}",
     ["variants.triton.BLOCK_SIZE[1]", "512", "valid: 1024, 2048, 4096"]),
    ("{triton: {num_warps: [16]}}", ["num_warps[0]", "valid: 4, 8"]),
    ("{torch: {BLOCK_SIZE: [1024]}}", ["variants.torch", "no tunables", "with tunables: triton"]),
])
def test_unknown_fields_and_values_are_the_tuners_one_line_errors(user_op, tmp_path, variants,
                                                                  expected):
    p = tmp_path / "e.yaml"
    p.write_text(EXPERIMENT.replace(
        "variants: {triton: {BLOCK_SIZE: [1024, 4096], num_warps: [4]}}", f"variants: {variants}"))
    with pytest.raises(SpecError) as exc:
        spec.load(p)
    msg = str(exc.value)
    assert "\n" not in msg and all(part in msg for part in expected), msg


# -- the GPU path, driven on the CPU: the kernel brings its own do_bench ------------------------

SIM_MODULE = '''
import torch
import triton
import triton.language as tl

TIMES = {}  # BLOCK_SIZE -> the ms the kernel's do_bench answers
BENCHED = []  # BLOCK_SIZE of each config timed, in order
CURRENT = [None]


LAUNCHED = []


def _launching(nargs):  # every config's pre_hook: which config is about to launch
    CURRENT[0] = nargs["BLOCK_SIZE"]
    LAUNCHED.append(nargs["BLOCK_SIZE"])


def bench(kernel_call, quantiles):
    kernel_call()
    BENCHED.append(CURRENT[0])
    ms = TIMES[CURRENT[0]]
    return [ms, ms * 0.9, ms * 1.1]


@triton.autotune(configs=[triton.Config({"BLOCK_SIZE": 64}, num_warps=4, pre_hook=_launching),
                          triton.Config({"BLOCK_SIZE": 128}, num_warps=8, pre_hook=_launching),
                          triton.Config({"BLOCK_SIZE": 256}, num_warps=8, pre_hook=_launching)],
                 key=["n"], do_bench=bench,
                 prune_configs_by={"early_config_prune": lambda configs, nargs, **kw: [
                     c for c in configs if c.kwargs["BLOCK_SIZE"] <= max(64, nargs["n"])]})
@triton.jit
def double(x_ptr, y_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


@triton.heuristics({"BLOCK_SIZE": lambda args: 128})
@triton.jit
def _plus(x_ptr, y_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


@triton.heuristics({"EVEN": lambda args: args["n"] % 2 == 0})
@triton.autotune(configs=[triton.Config({"BLOCK_SIZE": 32}), triton.Config({"BLOCK_SIZE": 64})],
                 key=["n"])
@triton.jit
def halve(x_ptr, y_ptr, n, EVEN: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 0.5, mask=offs < n)


def run_double(x):
    y = torch.empty_like(x)
    double[lambda m: (triton.cdiv(x.numel(), m["BLOCK_SIZE"]),)](x, y, x.numel())
    return y


def both(x):
    y, z = torch.empty_like(x), torch.empty_like(x)
    double[lambda m: (triton.cdiv(x.numel(), m["BLOCK_SIZE"]),)](x, y, x.numel())
    halve[lambda m: (triton.cdiv(x.numel(), m["BLOCK_SIZE"]),)](y, z, x.numel())
    _plus[(triton.cdiv(x.numel(), 128),)](z, y, x.numel())
    return y
'''


@pytest.fixture
def sim(tmp_path, monkeypatch):
    """A kernel module whose autotuner times with its own do_bench (the GPU path's shape: the
    autotuner benchmarks) while its kernels run in the interpreter."""
    import importlib

    from harness.registry import Impl

    (tmp_path / "at_sim.py").write_text(SIM_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("at_sim")
    monkeypatch.setattr(autotune, "interpreted", lambda: False)
    yield mod, Impl("triton", "sim", mod.run_double, "triton"), Impl("both", "sim", mod.both,
                                                                       "triton")
    sys.modules.pop("at_sim", None)


def test_the_autotuners_own_timings_are_stored_as_evidence_and_reused(sim):
    mod, impl, _ = sim
    mod.TIMES.update({64: 0.030, 128: 0.012, 256: 0.020})
    x = torch.randn(300)
    with tuning.recording() as log, autotune.steering(impl):
        assert torch.equal(impl.fn(x), 2 * x)
        impl.fn(x)
    assert mod.BENCHED == [64, 128, 256]  # one benchmark, for the first call's key
    key = (300, "torch.float32", "torch.float32")
    assert log.picks == {("at_sim.double", key): ({"BLOCK_SIZE": 128, "num_warps": 8,
                                                   "num_stages": 3}, "autotune")}
    new = tuning.take_new_picks()
    rec = new["at_sim.double"][repr(key)]
    assert rec["source"] == "autotune" and rec["config"]["BLOCK_SIZE"] == 128
    ev = rec["evidence"]
    assert [(c["config"]["BLOCK_SIZE"], c["ms"]) for c in ev["candidates"]] == [
        (64, 0.030), (128, 0.012), (256, 0.020)]
    assert ev["by"] == "triton.autotune" and ev["bench_s"] >= 0
    assert mod.double.cache[key].kwargs["BLOCK_SIZE"] == 128  # the autotuner keeps its pick
    # a later worker of the run (fresh autotuner cache, the stored picks loaded): no benchmark
    mod.double.cache.clear()
    mod.BENCHED.clear()
    tuning.load_picks(new)
    with tuning.recording() as log, autotune.steering(impl):
        impl.fn(x)
    assert mod.BENCHED == [] and log.source() == "autotune"
    assert "run" not in vars(mod.double) and "_bench" not in vars(mod.double)  # put back


def test_forcing_some_fields_times_the_matching_configs_and_all_fields_runs_one(sim):
    mod, impl, _ = sim
    mod.TIMES.update({64: 0.030, 128: 0.012, 256: 0.020})
    x = torch.randn(300)
    part = impl.split_config({"num_warps": 8})
    with tuning.forcing(part), tuning.recording() as log, autotune.steering(impl):
        impl.fn(x)
    assert mod.BENCHED == [128, 256] and log.source() == "forced"
    mod.BENCHED.clear()
    # outside the list: BLOCK_SIZE 64 with 8 warps (each value valid, the pair not declared)
    whole = impl.split_config({"BLOCK_SIZE": 64, "num_warps": 8, "num_stages": 3})
    with tuning.forcing(whole), tuning.recording() as log, autotune.steering(impl):
        assert torch.equal(impl.fn(x), 2 * x)
    assert mod.BENCHED == [] and log.configs() == {
        "at_sim.double": {"BLOCK_SIZE": 64, "num_warps": 8, "num_stages": 3}}
    assert len(mod.double.configs) == 3 and mod.double.cache.keys() == set()


def test_compile_ahead_launches_every_config_once_and_times_none(sim, monkeypatch):
    mod, impl, _ = sim
    seen = []  # the autotuner's cache_results at each launch (its on-disk autotune cache)

    class Launches(list):
        def append(self, block):
            seen.append(mod.double.cache_results)
            super().append(block)

    monkeypatch.setattr(mod, "LAUNCHED", Launches())  # the configs' pre_hook appends here
    monkeypatch.setattr(mod.double, "cache_results", True)  # TRITON_CACHE_AUTOTUNING=1
    with tuning.recording() as log, autotune.steering(impl):  # as the worker's warm pass
        with tuning.compile_only():
            impl.fn(torch.randn(300))
    assert mod.BENCHED == [] and mod.LAUNCHED == [64, 128, 256, 64]  # each, then the call
    assert len(log) == 0 and tuning.take_new_picks() == {}
    # the untimed ties were kept off the disk cache, which is on again afterwards
    assert seen == [False] * 4 and mod.double.cache_results is True


def test_an_autotuned_call_in_setup_times_nothing_and_a_measured_call_times(sim, monkeypatch):
    """A binder's set-up (harness.tuning.setup: the forward of a measured backward) launches
    the first config only, untimed and unlogged, with Triton's disk cache off; the key is not
    kept, so the measured call of the same key benchmarks as always."""
    mod, impl, _ = sim
    mod.TIMES.update({64: 0.030, 128: 0.012, 256: 0.020})
    x = torch.randn(300)
    key = (300, "torch.float32", "torch.float32")
    seen = []  # the autotuner's cache_results at each launch

    class Launches(list):
        def append(self, block):
            seen.append(mod.double.cache_results)
            super().append(block)

    monkeypatch.setattr(mod, "LAUNCHED", Launches())
    monkeypatch.setattr(mod.double, "cache_results", True)
    with tuning.recording() as log, autotune.steering(impl), tuning.setup():
        assert torch.equal(impl.fn(x), 2 * x)
    assert mod.BENCHED == [] and mod.LAUNCHED == [64, 64]  # the first config, then the call
    assert len(log) == 0 and seen == [False, False] and mod.double.cache_results is True
    assert tuning.take_new_picks() == {} and key not in mod.double.cache
    with tuning.recording() as log, autotune.steering(impl):
        with tuning.setup():
            impl.fn(x)
        impl.fn(x)
    assert mod.BENCHED == [64, 128, 256] and log.source() == "autotune"
    assert mod.double.cache[key].kwargs["BLOCK_SIZE"] == 128
    with tuning.recording() as log, autotune.steering(impl), tuning.setup():
        impl.fn(x)  # set-up meeting a timed pick: runs it, still logs nothing
    assert len(log) == 0 and mod.BENCHED == [64, 128, 256]


def test_a_pruner_that_needs_the_arguments_rejects_a_forced_config_at_the_call(sim):
    mod, impl, _ = sim
    kernel = impl.all_tuners()[""]
    forced = {"BLOCK_SIZE": 256, "num_warps": 8, "num_stages": 3}
    assert kernel.violated(forced) is None  # it needs `n`: not decidable at spec load
    with tuning.forcing(impl.split_config(forced)), autotune.steering(impl):
        x = torch.randn(300)
        assert torch.equal(impl.fn(x), 2 * x)
    with pytest.raises(ValueError) as exc:
        with tuning.forcing(impl.split_config(forced)), autotune.steering(impl):
            impl.fn(torch.randn(100))
    assert str(exc.value).startswith("at_sim.double: forced BLOCK_SIZE=256, num_warps=8, "
                                     "num_stages=3 is rejected by the kernel's early_config_prune")


def test_several_autotuned_kernels_are_prefixed_and_heuristics_run_on_the_cpu(sim, monkeypatch):
    from harness.execute.correctness import check_impl
    from harness.registry import Op, Param

    mod, single, both = sim
    monkeypatch.setattr(autotune, "interpreted", lambda: True)
    assert list(single.tunables()) == ["BLOCK_SIZE", "num_warps", "num_stages"]
    assert list(both.tunables()) == ["double.BLOCK_SIZE", "double.num_warps",
                                     "double.num_stages", "halve.BLOCK_SIZE", "halve.num_warps",
                                     "halve.num_stages"]
    op = Op("sim", params=[Param("N", int)], dtypes=("float32",))
    op.inputs(lambda p, dtype, device, gen: (torch.randn(p.N, generator=gen),))
    op.reference(lambda x: x + 1)
    op.bytes(lambda p, i: 2.0 * p.N * i)
    op.impls["both"] = both
    res = check_impl(op, "both", {"N": 200}, config={"halve.BLOCK_SIZE": 64})
    assert res.correct, res.error
    assert mod.BENCHED == []  # the interpreter benchmarks nothing


def test_picks_lists_the_autotuners_timings_fastest_first(tmp_path, capsys):
    from harness.cli import main

    run = tmp_path / "r1"
    run.mkdir()
    (run / store.MANIFEST).write_text("{}")
    ev = {"candidates": [{"config": {"BLOCK_SIZE": 1024, "num_warps": 4}, "ms": 0.0310},
                         {"config": {"BLOCK_SIZE": 2048, "num_warps": 8}, "ms": 0.0195},
                         {"config": {"BLOCK_SIZE": 4096, "num_warps": 8}, "ms": 0.0221},
                         {"config": {"BLOCK_SIZE": 1024, "num_warps": 8},
                          "error": "not timed (pruned by the kernel's prune_configs_by)"}],
          "by": "triton.autotune", "bench_s": 0.8}
    store.save_tuner_picks(run, {"my_ops._swiglu_kernel": {"(1048576, 'torch.float16')": {
        "config": {"BLOCK_SIZE": 2048, "num_warps": 8}, "source": "autotune", "evidence": ev}}})
    assert main(["picks", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.index("19.5") < out.index("22.1") < out.index("31.0") < out.index("pruned")
    assert "(autotune)" in out and "timed by triton.autotune: 0.8 s" in out


def test_the_since_block_says_when_the_autotuner_chose_differently(tmp_path):
    from harness.analysis import pairing
    from harness.analysis.since import since_data

    cid = case_id("triton", 1024)
    cfg = {"my_ops._k": {"BLOCK_SIZE": 1024, "num_warps": 4}}
    meds = {"torch/1024": 1.0, "triton/1024": 0.5}
    write_run(tmp_path, minutes=0, medians=meds, extra={cid: {
        "config": json.dumps(cfg), "config_source": "autotune", "code_hash": "aaaa"}})
    moved = {"my_ops._k": {"BLOCK_SIZE": 2048, "num_warps": 4}}
    after = write_run(tmp_path, minutes=5, medians=meds, seed=2, extra={cid: {
        "config": json.dumps(moved), "config_source": "autotune", "code_hash": "aaaa"}})
    pairing.record(after)
    notes = since_data(after).notes
    assert ("the autotuner chose differently than in the earlier run in 1 case: "
            "triton M=64 N=1024 fp16 (config BLOCK_SIZE 1024 → 2048)") in notes


def test_the_next_run_does_not_inherit_autotune_picks(tmp_path):
    from harness.execute.previous import inherit_picks
    from harness.tuning.provenance import code_hash
    from harness.registry import get_op

    op = get_op("softmax")
    hashes = {i: code_hash(op.get_impl(i).fn) for i in ("torch", "triton")}
    extra = {case_id(i, 1024): {"code_hash": h} for i, h in hashes.items()}
    meds = {"torch/1024": 1.0, "triton/1024": 0.5}
    prev = write_run(tmp_path, minutes=0, medians=meds, extra=extra, env=GPU_ENV)
    store.save_tuner_picks(prev, {
        "softmax": {"(1024,)": {"config": {"num_warps": 4}, "source": "tuned"}},
        "my_ops._k": {"(1024,)": {"config": {"BLOCK_SIZE": 1024}, "source": "autotune"}}})
    this = write_run(tmp_path, minutes=5, medians=meds, extra=extra, env=GPU_ENV)
    (this / "tuner_picks.json").unlink(missing_ok=True)
    assert inherit_picks(this, op) == prev.name
    assert store.load_tuner_picks(this) == {
        "softmax": {"(1024,)": {"config": {"num_warps": 4}, "source": "tuned"}}}


def test_steering_changes_nothing_for_impls_without_autotuned_kernels():
    from harness.registry import get_op

    impl = get_op("softmax").get_impl("triton")
    assert not any(isinstance(t, autotune.AutotunedKernel) for t in impl.all_tuners().values())
    with autotune.steering(impl):
        pass
    assert list(impl.tunables()) == ["num_warps"]


def test_a_flag_valued_config_kwarg_takes_true_and_false_only():
    from types import SimpleNamespace

    import triton

    from harness.registry import Impl
    from harness.experiment.variants import _check_value

    at = SimpleNamespace(configs=[triton.Config({"BLOCK": 64, "EVEN": True}),
                                  triton.Config({"BLOCK": 64, "EVEN": False})],
                         cache={}, run=lambda *a, **k: None)
    kernel = autotune.AutotunedKernel("m.k", "k", at)
    impl = Impl("t", "op", lambda x: x, "triton", tuners={"": kernel})
    assert kernel.valid_values("EVEN") == (False, True)
    _check_value(impl, "EVEN", True, "f")
    with pytest.raises(SpecError, match="1 is not a valid value of EVEN"):
        _check_value(impl, "EVEN", 1, "f")
    with pytest.raises(SpecError, match="True is not a valid value of BLOCK"):
        _check_value(impl, "BLOCK", True, "f")
