"""Provenance per case: code_hash over the impl's module and reachable Triton kernels, the
compiled-kernel description (its matching logic; the GPU side needs a GPU), the stored config
and config_source, and picks reused by a later worker process."""
import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_inproc import run_cli

from harness import store

from harness.tuning import provenance

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
       "HARNESS_OPS": "harness_test_ops", "COLUMNS": "200", "TRITON_INTERPRET": "1"}

KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def _double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, x * {factor}, mask=offs < n)


CONFIGS = {configs}  # launch configs beside the kernel: an edit here is a code change too
'''
IMPL = '''
from . import kern


def impl(x):
    return kern._double
'''


def _package(root: Path, name: str, factor: int, configs: str = "[(128, 4)]"):
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "kern.py").write_text(KERNEL.format(factor=factor, configs=configs))
    (pkg / "impl.py").write_text(IMPL)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(f"{name}.impl")


def test_code_hash_follows_the_kernel_source_and_nothing_else(tmp_path):
    a = _package(tmp_path, "prov_a", 2)
    same = _package(tmp_path, "prov_same", 2)  # identical sources under another name
    changed = _package(tmp_path, "prov_changed", 3)  # one character of the kernel differs
    h = provenance.code_hash(a.impl)
    assert len(h) == 12 and int(h, 16) >= 0
    assert provenance.code_hash(a.impl) == h
    assert provenance.code_hash(same.impl) == h
    assert provenance.code_hash(changed.impl) != h
    retuned = _package(tmp_path, "prov_retuned", 2, configs="[(64, 4)]")  # kernel unchanged
    assert provenance.code_hash(retuned.impl) != h
    _, kernels = provenance.reachable(a.impl)
    assert [k[0] for k in kernels] == ["_double"]  # found through the imported module


def test_a_registered_impl_reaches_kernels_in_the_modules_it_imports():
    from harness.registry import registry

    impl = registry().get_op("attention").get_impl("triton_flash")
    names = {k[0] for k in provenance.reachable(impl.fn)[1]}
    # the second and third forms the Tuners fold in (TMA, Gluon) count too
    assert {"_flash_fwd_kernel", "_bwd_dkdv_kernel", "_bwd_dq_kernel", "_mma",
            "_flash_fwd_tma_kernel", "_bwd_dkdv_tma_kernel", "_bwd_dq_tma_kernel",
            "_flash_fwd_gluon_kernel"} <= names
    torch_impl = registry().get_op("attention").get_impl("naive")
    assert provenance.code_hash(torch_impl.fn) != provenance.code_hash(impl.fn)


class _CK:
    """A CompiledKernel as Triton 3.x builds it (only what provenance reads)."""

    def __init__(self, name, function, regs, spills, shared, warps, stages, consts, args):
        self.name, self.function, self.n_regs, self.n_spills = name, function, regs, spills
        self.metadata = SimpleNamespace(shared=shared, num_warps=warps, num_stages=stages,
                                        name=name)
        self.src = SimpleNamespace(constants=consts, fn=SimpleNamespace(arg_names=args))


def test_launched_handles_map_to_compiled_kernels_and_missing_fields_are_dropped():
    a = _CK("_fwd", 0xA, 168, 0, 98304, 8, 3, {(3,): 128, (4,): 64}, ["q", "k", "v", "BLOCK_M",
                                                                     "BLOCK_N"])
    b = SimpleNamespace(function=0xB, metadata=SimpleNamespace(num_warps=4), name="_pre")
    jit = SimpleNamespace(device_caches={0: ({"k1": a, "k2": b}, None, None, None, None)})
    compiled = provenance._compiled_objects([("_fwd", None, jit)])
    launches = [{"name": "_pre", "function": 0xB}, {"name": "_fwd", "function": 0xA},
                {"name": "_fwd", "function": 0xA}, {"name": "triton_poi_fused_0",
                                                    "function": 0xC}]
    out = provenance.match_launches(launches, compiled)
    assert out[0] == {"kernel": "_fwd", "num_warps": 4, "launches": 1}
    assert out[1] == {"kernel": "_fwd", "registers": 168, "spills": 0, "shared_bytes": 98304,
                      "num_warps": 8, "num_stages": 3,
                      "constexprs": {"BLOCK_M": 128, "BLOCK_N": 64}, "launches": 2}
    assert out[2] == {"kernel": "triton_poi_fused_0", "launches": 1}  # not reachable: name only


def test_the_interpreter_compiles_nothing():
    from harness.registry import Params, registry

    import torch

    op = registry().get_op("softmax")
    impl = op.get_impl("triton")
    x = torch.randn(3, 40)
    call = op.bind_impl(impl, (x,), Params(M=3, N=40), torch.empty_like(x))
    assert provenance.compiled_kernels(call, impl.fn, lambda: None) == []


def _run(*args, env=None):
    return run_cli(args, env=env or ENV)  # in this process (tests/cli_inproc.py)


def _only_run(root: Path) -> Path:
    runs = [d for d in root.iterdir() if (d / "manifest.json").exists()]
    assert len(runs) == 1, runs
    return runs[0]


def test_a_later_worker_reuses_the_picks_and_times_nothing(tmp_path):
    exp = tmp_path / "t.yaml"
    exp.write_text(textwrap.dedent("""
        name: tuned
        op: scale2
        baseline: torch
        candidates: [tuned]
        variants: {tuned: {factor: [4]}}
        sweep: {N: [64, 100]}
        dtypes: [float32]
        """))
    log = tmp_path / "launches.log"
    env = {**ENV, "HARNESS_TEST_TUNE_LOG": str(log)}
    p = _run("run", str(exp), "--out", str(tmp_path / "runs"), env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    run = _only_run(tmp_path / "runs")
    first = log.read_text().split()
    assert len(first) == 2 * 3  # two sizes x three candidates, in the first worker only
    picks = store.load_tuner_picks(run)
    assert set(picks["scale2.tuned"]) == {repr(("scale", 64)), repr(("scale", 100))}
    res = store.load_results(run).set_index("case_id")
    assert json.loads(res.config["tuned.N=64.float32"]) == {"scale2.tuned": {"factor": 2}}
    assert res.config_source["tuned.N=64.float32"] == "tuned"
    assert json.loads(res.config["tuned~factor=4.N=64.float32"]) == {
        "scale2.tuned": {"factor": 4}}
    assert res.config_source["tuned~factor=4.N=64.float32"] == "forced"
    assert res.code_hash.notna().all() and res.code_hash.nunique() == 1  # one module
    # a second worker process on the same run dir (as the ncu/nsys passes or --resume start)
    p = subprocess.run([sys.executable, "-m", "harness", "worker", "--run", str(run),
                        "--passes", "check", "--device", "cpu", "--tag", "again"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert log.read_text().split() == first  # no launch for timing
    again = {r["case_id"]: r for r in store.read_parts(run, "again")}
    assert again["tuned.N=100.float32"]["config_source"] == "tuned"
    assert json.loads(again["tuned.N=100.float32"]["config"]) == {"scale2.tuned": {"factor": 2}}


@pytest.mark.slow
def test_a_variant_run_on_the_cpu_stores_and_shows_its_configs(tmp_path):
    exp = tmp_path / "sm.yaml"
    exp.write_text(textwrap.dedent("""
        name: sm-variants
        op: softmax
        baseline: triton
        candidates:
          - torch
          - {name: sm_w8, impl: triton, config: {num_warps: 8}}
        variants: {triton: {num_warps: [1, 16]}}
        sweep: {M: [3], N: [100]}
        dtypes: [float32]
        """))
    out = tmp_path / "runs"
    p = _run("run", str(exp), "--out", str(out), "--cases", "triton[num_warps=16],sm_w8,torch")
    assert p.returncode == 0, p.stdout + p.stderr
    run = _only_run(out)
    cases = store.load_cases(run)
    assert sorted(cases.impl) == ["sm_w8", "torch", "triton[num_warps=16]"]
    js = json.loads(_run("show", str(run), "--format", "json").stdout)
    by = {c["impl"]: c for c in js["cases"]}
    assert by["triton[num_warps=16]"]["config"] == {"softmax": {"num_warps": 16}}
    assert by["sm_w8"]["config"] == {"softmax": {"num_warps": 8}}
    assert by["sm_w8"]["config_source"] == "forced" and by["sm_w8"]["compiled"] == []
    assert by["torch"]["config"] is None and len(by["torch"]["code_hash"]) == 12
    table = _run("show", str(run)).stdout
    assert "triton[num_warps=16]" in table and "16 (forced)" in table


def test_a_bad_variant_is_one_line_exit_2_and_writes_nothing(tmp_path):
    exp = tmp_path / "bad.yaml"
    exp.write_text(textwrap.dedent("""
        name: bad
        op: softmax
        baseline: torch
        variants: {triton: {num_warps: [3]}}
        sweep: {M: [3], N: [100]}
        """))
    out = tmp_path / "runs"
    p = _run("run", str(exp), "--out", str(out))
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "variants.triton.num_warps[0]" in lines[0]
    assert "valid: 1, 4, 8, 16, 32" in lines[0]
    assert not out.exists() or not any(out.iterdir())


def test_the_next_run_of_unchanged_code_keeps_the_picks_and_retune_times_again(tmp_path,
                                                                            test_ops):
    from harness.execute.previous import inherit_picks
    from harness.registry import registry

    exp = tmp_path / "t.yaml"
    exp.write_text("name: tuned\nop: scale2\nbaseline: torch\ncandidates: [tuned]\n"
                   "sweep: {N: [64, 100]}\ndtypes: [float32]\n")
    log = tmp_path / "launches.log"
    env = {**ENV, "HARNESS_TEST_TUNE_LOG": str(log)}
    out = tmp_path / "runs"
    assert _run("run", str(exp), "--out", str(out), env=env).returncode == 0
    first = _only_run(out)
    assert len(log.read_text().split()) == 2 * 3 and \
        store.load_manifest(first)["tuner_picks_from"] is None
    p = _run("run", str(exp), "--out", str(out), env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    second = sorted(d for d in out.iterdir() if d.is_dir() and d != first)[-1]
    assert len(log.read_text().split()) == 2 * 3  # nothing timed again
    assert store.load_manifest(second)["tuner_picks_from"] == first.name
    res = store.load_results(second).set_index("case_id")
    assert json.loads(res.config["tuned.N=64.float32"]) == {"scale2.tuned": {"factor": 2}}
    p = _run("run", str(exp), "--out", str(out), "--retune", env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert len(log.read_text().split()) == 2 * 2 * 3  # timed afresh
    third = sorted(d for d in out.iterdir() if d.is_dir())[-1]
    m = store.load_manifest(third)
    assert m["retune"] is True and "tuner_picks_from" not in m
    # code that changed since the previous run: nothing is taken over
    op = registry().get_op("scale2")
    res = store.load_results(third)
    store.write_table(third, "results", res.assign(code_hash="0123456789ab"))
    fresh = store.create_run(out, "tuned", {**store.load_manifest(third), "retune": False})
    store.write_table(fresh, "cases", store.load_cases(third))
    assert inherit_picks(fresh, op) is None
    store.write_table(third, "results", res)
    assert inherit_picks(fresh, op) == third.name and store.load_tuner_picks(fresh)
