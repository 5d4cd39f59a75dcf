"""Profiles carried over from the previous run (harness.execute.profile_carry): a profiler pass
profiles only the cases whose code, config or compiled kernels changed, takes the others' rows
from the earlier run, and says so; `--reprofile`, another profiler, other options, another op
or profiler code, a case not ok: profiled again."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from rich.console import Console
from rich.progress import Progress

from harness import store
from harness.execute import profile_carry
from harness.experiment import spec

ROOT = Path(__file__).resolve().parent.parent
ENV = {"device": "cuda", "gpu_name": "NVIDIA H100 80GB HBM3", "driver": "580.1",
       "torch": "2.11", "triton": "3.6"}
OPTIONS = SimpleNamespace(cases="all", timeout_s=60)

# the fake profiler's process: writes the cases it was asked to profile, runs no worker
_ASKED = ("import json, pathlib, sys; out = pathlib.Path(sys.argv[1]); a = sys.argv[2:]; "
          "out.joinpath('asked.json').write_text(json.dumps(a[a.index('--cases') + 1]"
          ".split(',')))")


def _fake(name: str, tables: tuple[str, ...] = ()):
    """A profiler whose process writes the cases it was asked for and runs no worker; with
    `tables`, it writes source lines of them too, as ncu does."""
    from harness.profilers import base

    class Fake(base.Profiler):
        tool = "fake 1.0"

        def availability(self):
            return base.Availability(True, type(self).tool)

        def command(self, worker_argv, out_dir, options):
            return [sys.executable, "-c", _ASKED, str(out_dir), *worker_argv]

        def parse(self, out_dir):
            return pd.DataFrame([{"case_id": c, "source": name, "kernel": "k", "name": "x",
                                  "value": 1.0, "unit": ""} for c in _asked(out_dir)],
                                columns=base.METRIC_COLUMNS)

        def extra_tables(self, out_dir):
            return {"source_lines": lines(_asked(out_dir), 1)} if tables else {}

    Fake.name = Fake.source = name
    Fake.tables = tables
    return Fake


def _asked(out_dir) -> list[str]:
    return json.loads((Path(out_dir) / "asked.json").read_text())


def lines(ids, samples) -> pd.DataFrame:
    return pd.DataFrame([{"case_id": c, "kernel": "k", "file": "k.py", "line": 3, "text": "x",
                          "samples": samples, "share": 0.5, "stall_mix": "{}", "library": False}
                         for c in ids])


@pytest.fixture
def fakeprof(monkeypatch):
    from harness.profilers import base

    fake = _fake("fakeprof", ("source_lines",))
    monkeypatch.setitem(base._REGISTRY, "fakeprof", fake)
    monkeypatch.setitem(base._REGISTRY, "fakensys", _fake("fakensys"))
    return fake


def make_run(tmp_path: Path, name: str, hashes: dict[str, str], *, status="ok",
             passes=None, record=None, metrics_value=None) -> tuple[Path, list[str]]:
    """A cuda run of op scale2 (torch, zeros; N 64 and 1000) named `name` (its time stamp
    orders it), its results carrying `hashes` ({impl: code_hash}); with `metrics_value`, the
    fakeprof rows and source lines of a pass that ended `done` with `record`."""
    from harness.store.results import cases_frame

    exp = spec.from_dict({"name": "selftest", "op": "scale2", "baseline": "torch",
                          "candidates": ["zeros"], "sweep": {"N": [64, 1000]},
                          "dtypes": ["float32"]})
    cases = spec.expand(exp)
    made = store.create_run(tmp_path / "tmp", "selftest", {
        "experiment": exp.model_dump(mode="json"), "device": "cuda", "seed": 1,
        "status": "complete", "passes": passes or {}, "env": ENV,
        "profiler_wall_s": record or {}})
    run = tmp_path / "store" / name
    run.parent.mkdir(exist_ok=True)
    made.rename(run)
    store.write_manifest(run, {**store.load_manifest(run), "run_id": name})
    frame = cases_frame(cases)
    frame["status"] = status
    store.write_table(run, "cases", frame)
    ids = [c.case_id for c in cases]
    impl = {c.case_id: c.impl for c in cases}
    store.write_table(run, "results", pd.DataFrame({
        "case_id": ids, "code_hash": [hashes[impl[c]] for c in ids],
        "config": [None] * len(ids),
        "compiled": ['[{"kernel": "k", "registers": 32}]'] * len(ids)}))
    if metrics_value is not None:
        store.write_table(run, "metrics", pd.DataFrame(
            [{"case_id": c, "source": src, "kernel": "k", "name": "x",
              "value": metrics_value, "unit": ""} for c in ids for src in record]))
        store.write_table(run, "source_lines", lines(ids, 9))
    return run, ids


def profile(run: Path, ids: list[str], names=("fakeprof",)):
    from harness.execute.runner import Runner

    r = Runner(run, Console(file=open(os.devnull, "w")))
    r.profile_cases = lambda which, untimed=False: ids
    with Progress(console=Console(file=open(os.devnull, "w"))) as progress:
        r.profile_passes(progress, [(n, OPTIONS) for n in names])
    asked = run / "raw" / names[0] / "asked.json"
    return r, (json.loads(asked.read_text()) if asked.exists() else None)


def earlier(tmp_path, fakeprof, test_ops, names=("fakeprof",), **kw):
    from harness.registry import get_op

    record = {n: profile_carry.pass_record(fakeprof.tool, OPTIONS, get_op("scale2"))
              for n in names}
    return make_run(tmp_path, "20261101T000000Z-selftest-aaaa", {"torch": "h1", "zeros": "h2"},
                    passes={n: "done" for n in names}, record=record, metrics_value=7.0, **kw)


def test_only_the_changed_implementation_is_profiled_again(tmp_path, fakeprof, test_ops):
    prev, ids = earlier(tmp_path, fakeprof, test_ops)
    run, _ = make_run(tmp_path, "20261102T000000Z-selftest-bbbb", {"torch": "h1", "zeros": "h3"})
    r, asked = profile(run, ids)
    assert sorted(asked) == sorted(c for c in ids if c.startswith("zeros."))
    m = store.load_metrics(run)
    value = dict(zip(m.case_id, m.value))
    assert {c: value[c] for c in ids} == {c: 7.0 if c.startswith("torch.") else 1.0 for c in ids}
    assert r.passes["fakeprof"] == f"done: 2 of 4 cases carried from {prev.name}"
    rec = store.load_manifest(run)["profiler_wall_s"]["fakeprof"]
    assert rec["carried"] == {"from": prev.name, "cases": 2} and rec["cases"] == 2
    assert rec["tool"] == "fake 1.0" and rec["code"] == profile_carry.profiler_code()
    # the source lines of the carried cases come along, beside the fresh ones
    sl = store.load_source_lines(run)
    assert dict(zip(sl.case_id, sl.samples)) == {
        c: 9 if c.startswith("torch.") else 1 for c in ids}


def test_unchanged_code_starts_no_profiler_process(tmp_path, fakeprof, test_ops):
    prev, ids = earlier(tmp_path, fakeprof, test_ops)
    run, _ = make_run(tmp_path, "20261102T000000Z-selftest-bbbb", {"torch": "h1", "zeros": "h2"})
    r, asked = profile(run, ids)
    assert asked is None  # nothing profiled
    assert r.passes["fakeprof"] == f"done: 4 of 4 cases carried from {prev.name}"
    m = store.load_metrics(run)
    assert len(m) == len(ids) and set(m.value) == {7.0}
    # and a run after it carries from it in turn
    later, _ = make_run(tmp_path, "20261103T000000Z-selftest-cccc", {"torch": "h1", "zeros": "h2"})
    r, asked = profile(later, ids)
    assert asked is None and r.passes["fakeprof"].endswith(f"carried from {run.name}")


@pytest.mark.parametrize("change", ["reprofile", "tool", "options", "profiler code", "op code",
                                    "gpu", "not ok before", "pass failed before",
                                    "earlier run unreadable"])
def test_anything_else_changed_profiles_every_case(tmp_path, fakeprof, test_ops, monkeypatch,
                                                   change):
    prev, ids = earlier(tmp_path, fakeprof, test_ops,
                        **({"status": "error"} if change == "not ok before" else {}))
    run, _ = make_run(tmp_path, "20261102T000000Z-selftest-bbbb", {"torch": "h1", "zeros": "h2"})
    m = store.load_manifest(run)
    if change == "reprofile":
        store.write_manifest(run, {**m, "reprofile": True})
    elif change == "tool":
        fakeprof.tool = "fake 2.0"
    elif change == "options":
        monkeypatch.setattr(sys.modules[__name__], "OPTIONS",
                            SimpleNamespace(cases="all", timeout_s=60, sections=["x"]))
    elif change == "profiler code":
        monkeypatch.setattr(profile_carry, "profiler_code", lambda: "0" * 12)
    elif change == "op code":
        monkeypatch.setattr(profile_carry, "op_code", lambda op: "1" * 12)
    elif change == "gpu":
        store.write_manifest(run, {**m, "env": {**ENV, "driver": "590.0"}})
    elif change == "earlier run unreadable":  # best effort: never a failed pass
        (prev / "metrics.parquet").write_bytes(b"not parquet")
    elif change == "pass failed before":
        pm = store.load_manifest(prev)
        store.write_manifest(prev, {**pm, "passes": {"fakeprof": "failed: exit 1"}})
    r, asked = profile(run, ids)
    assert sorted(asked) == sorted(ids)
    assert r.passes["fakeprof"] == "done"


def test_a_case_carries_only_with_the_same_config_and_kernels(tmp_path, fakeprof, test_ops):
    from harness.registry import get_op

    prev, ids = earlier(tmp_path, fakeprof, test_ops)
    run, _ = make_run(tmp_path, "20261102T000000Z-selftest-bbbb", {"torch": "h1", "zeros": "h2"})
    res = store.load_results(run)
    res.loc[res.case_id == ids[0], "config"] = '{"t": {"BLOCK": 64}}'
    res.loc[res.case_id == ids[1], "compiled"] = '[{"kernel": "k", "registers": 40}]'
    store.write_table(run, "results", res)
    op = get_op("scale2")
    assert profile_carry.carried_cases(run, prev, "fakeprof", ids, op) == ids[2:]
    assert profile_carry.carried_cases(run, prev, "otherprof", ids, op) == []  # no rows of it


def test_two_passes_in_turn_each_carry_their_own(tmp_path, fakeprof, test_ops):
    """ncu writes the source lines, nsys none: the second pass to land must not replace the
    first one's table with the earlier run's rows."""
    names = ("fakeprof", "fakensys")
    prev, ids = earlier(tmp_path, fakeprof, test_ops, names=names)
    run, _ = make_run(tmp_path, "20261102T000000Z-selftest-bbbb", {"torch": "h1", "zeros": "h3"})
    r, asked = profile(run, ids, names)
    changed = sorted(c for c in ids if c.startswith("zeros."))
    assert sorted(asked) == changed
    assert sorted(_asked(run / "raw" / "fakensys")) == changed
    for n in names:
        assert r.passes[n] == f"done: 2 of 4 cases carried from {prev.name}"
    m = store.load_metrics(run)
    assert len(m) == 2 * len(ids)  # each pass's rows once
    sl = store.load_source_lines(run)
    assert dict(zip(sl.case_id, sl.samples)) == {c: 1 if c in changed else 9 for c in ids}


@pytest.mark.parametrize("case", ["compiled unknown", "triton kernels unknown",
                                  "compile on another host", "tool version unknown"])
def test_what_cannot_be_told_unchanged_is_profiled(tmp_path, fakeprof, test_ops, monkeypatch,
                                                   case):
    prev, ids = earlier(tmp_path, fakeprof, test_ops)
    run, _ = make_run(tmp_path, "20261102T000000Z-selftest-bbbb", {"torch": "h1", "zeros": "h2"})
    if case == "compiled unknown":  # no provenance in either run
        for d in (prev, run):
            res = store.load_results(d)
            res["compiled"] = None
            store.write_table(d, "results", res)
    elif case == "triton kernels unknown":
        monkeypatch.setattr(profile_carry, "_backend", lambda op, impl: "triton")
        for d in (prev, run):
            res = store.load_results(d)
            res["compiled"] = "[]"
            store.write_table(d, "results", res)
    elif case == "compile on another host":
        monkeypatch.setattr(profile_carry, "_backend", lambda op, impl: "compile")
        for d, host in ((prev, "a"), (run, "b")):
            m = store.load_manifest(d)
            store.write_manifest(d, {**m, "env": {**m["env"], "hostname": host}})
    else:
        monkeypatch.setattr(fakeprof, "tool", "fake (version unknown)")
        pm = store.load_manifest(prev)
        rec = pm["profiler_wall_s"]["fakeprof"]
        store.write_manifest(prev, {**pm, "profiler_wall_s": {
            "fakeprof": {**rec, "tool": "fake (version unknown)"}}})
    r, asked = profile(run, ids)
    assert sorted(asked) == sorted(ids) and r.passes["fakeprof"] == "done"


def test_compile_cases_carry_on_the_same_host_and_caches(tmp_path, fakeprof, test_ops,
                                                         monkeypatch):
    monkeypatch.setattr(profile_carry, "_backend", lambda op, impl: "compile")
    prev, ids = earlier(tmp_path, fakeprof, test_ops)
    run, _ = make_run(tmp_path, "20261102T000000Z-selftest-bbbb", {"torch": "h1", "zeros": "h2"})
    for d in (prev, run):
        m = store.load_manifest(d)
        store.write_manifest(d, {**m, "env": {**m["env"], "hostname": "gpu1"},
                                 "kernel_caches": {"triton": "/c/t", "inductor": "/c/i"}})
    assert profile_carry.carried_cases(run, prev, "fakeprof", ids) == ids


def test_on_a_real_before_after_pair_the_unchanged_peers_carry():
    """Two real H100 runs of flash.yaml (runs/examples), triton_flash and fused_mha edited in
    between: the peers' profiles carry (naive, the SDPA kernels); the edited impls and
    torch.compile (other kernel cache folders) are profiled again."""
    from harness.registry import get_op

    ex = ROOT / "runs" / "examples"
    before, after = (ex / "20261126T123005Z-flash-attention-fwd-09c7",
                     ex / "20261126T123321Z-flash-attention-fwd-0275")
    if not before.is_dir() or not after.is_dir():
        pytest.skip("the example runs are not in this checkout")
    cases = list(store.load_cases(after).case_id)
    op = get_op("attention")
    got = profile_carry.carried_cases(after, before, "ncu", cases, op)
    assert sorted(c.split(".")[0] for c in got) == ["naive", "sdpa_cudnn", "sdpa_efficient",
                                                    "sdpa_flash"]
    got = profile_carry.carried_cases(after, before, "nsys", cases, op)
    assert len(got) == 160 and {c.split(".")[0] for c in got} == {
        "naive", "sdpa_cudnn", "sdpa_efficient", "sdpa_flash"}
