"""`harness ab` on the CPU: a throwaway git repository with two commits of a small user op
(the known-effect copy as $HARNESS_OPS module `ke_user`, built by tools/device/known_effect.py),
one real `harness ab` shared by the end-to-end tests; the pieces (the paired statistic, the
interleaved rounds, importing a commit beside the working tree, Tuner scopes) on their own."""
from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from harness import store, tuning

from harness.present import show

from harness.execute import code_tree
from harness.analysis.compare import compare_runs
from harness.analysis.paired import MIN_EFFECT, MIN_EFFECT_MS, MIN_ROUNDS, paired
from harness.errors import HarnessError

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("known_effect_tool",
                                              ROOT / "tools" / "device" / "known_effect.py")
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)

SMOKE = "{M: [3], N: [1000], dtypes: [float16]}"
TINY = {"rep_ms": 5, "warmup_ms": 1, "min_samples": 3}


@pytest.fixture(scope="module")
def ab_pair(tmp_path_factory):
    """base e0 (EXTRA 0) against the working tree at e5 (EXTRA 0.05), on the CPU."""
    out = tmp_path_factory.mktemp("ab")
    repo = out / "repo"
    tags = tool.make_repo(repo, ["5"], timing=TINY, smoke=SMOKE)
    p = subprocess.run([sys.executable, "-m", "harness", "ab", str(repo / "known_effect.yaml"),
                        "--base", "e0", "--store", str(out / "store"), "--device", "cpu",
                        "--fail-on-regression", "1%", "--ncu"], cwd=ROOT,
                       env=tool.env_for(repo), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    base, head = (Path(r["path"]) for r in store.list_runs(out / "store"))
    return {"out": out, "repo": repo, "tags": tags, "stdout": p.stdout, "base": base,
            "head": head}


@pytest.mark.slow
def test_ab_stores_a_pair_of_ordinary_runs(ab_pair):
    base, head, tags = ab_pair["base"], ab_pair["head"], ab_pair["tags"]
    mb, mh = store.load_manifest(base), store.load_manifest(head)
    assert mb["ab"]["role"] == "base" and mb["ab"]["sha"] == tags["e0"]
    assert mb["code_tree"]["sha"] == tags["e0"] and mb["code_tree"]["module"] == "ke_user"
    assert mb["ab"]["head_run"] == head.name and mh["ab"]["base_run"] == base.name
    assert mh["ab"]["rev"] == "working tree" and "code_tree" not in mh
    assert (mh["against"]["run_id"], mh["against"]["how"]) == (base.name, "explicit")
    assert mb["against"]["how"] == "none"
    # each run's op card from its own code: the commit's module, the working tree's
    assert set(mb["op_card"]["impls"]) <= set(mh["op_card"]["impls"]) and mb["op_card"]["impls"]
    assert mb["status"] == mh["status"] == "complete" and mb["seed"] == mh["seed"]
    cb, ch = store.load_cases(base), store.load_cases(head)
    assert list(cb.case_id) == list(ch.case_id) and set(cb.status) == {"ok"}
    rb, rh = (store.load_results(d).set_index("case_id") for d in (base, head))
    cid = "triton.M=3.N=1000.float16"
    assert rb.loc[cid, "code_hash"] != rh.loc[cid, "code_hash"]  # EXTRA 0 -> 0.05
    assert bool(rb.loc[cid, "correct"]) and bool(rh.loc[cid, "correct"])
    rounds = store.load_ab(head)
    assert set(rounds.case_id) == set(ch.case_id)
    one = rounds[rounds.case_id == cid].sort_values("round")
    assert len(one) >= 5 and list(one["first"][:4]) == ["base", "head", "base", "head"]
    assert (one.base_ms > 0).all() and (one.head_ms > 0).all()
    assert len(store.load_samples(head).query("case_id == @cid")) == len(one)


@pytest.mark.slow
def test_every_reader_reads_the_pair_and_the_cpu_is_never_judged(ab_pair):
    from dashboard.compare_data import time_table
    from harness.present.report import Report

    base, head = ab_pair["base"], ab_pair["head"]
    out = ab_pair["stdout"]
    assert "CPU: not judged (paired" in out and "slower (significant" not in out
    assert "ncu: skipped: no CUDA device" in out
    assert f"python -m harness compare {base.name} {head.name}" in out
    c = compare_runs(base, head)
    assert set(c.time.method) == {"cpu"} and set(c.time.mark) == {"unjudged"}
    assert all(t.startswith("CPU: not judged (paired ") for t in c.time.text)
    assert c.floor.text == "CPU: not judged"
    back = compare_runs(head, base)  # either order: the rounds are read the other way round
    assert np.allclose(back.time.ratio.to_numpy(float), 1 / c.time.ratio.to_numpy(float))
    con = Console(file=io.StringIO(), width=250, color_system=None)
    show.render(head, con)
    assert f"since {base.name} (explicit)" in con.file.getvalue()
    assert show.to_json(head)["since"]["counts"] == {"unjudged": 2}
    md = Report(head, store_arg=str(base.parent), against=base).markdown()
    assert f"Compared with base `{base.name}`" in md and "CPU: not judged" in md
    assert set(time_table(c.time)["mark"]) == {"· CPU: not judged"}  # the Compare page


def test_paired_statistic_on_known_rounds():
    rng = np.random.default_rng(3)
    base = 1 + rng.normal(0, 0.005, 60)
    slower = paired(base, base * 1.01 * (1 + rng.normal(0, 0.003, 60)))
    assert slower.mark == "slower" and slower.ci_low > 1 + MIN_EFFECT
    assert slower.text.startswith("1.010x slower (paired, p<0.001, CI 1.0")
    faster = paired(base, base / 1.02)
    assert faster.mark == "faster" and faster.text.startswith("1.020x faster (paired")
    same = paired(base, base * (1 + rng.normal(0, 0.003, 60)))
    assert same.mark == "same" and same.ci_low < 1 < same.ci_high
    assert MIN_EFFECT < same.mde < 0.01
    hiccup = base * (1 + rng.normal(0, 0.003, 60))
    hiccup[7] *= 1.5  # one round hit by another tenant: trimmed, not a change
    assert paired(base, hiccup).mark == "same"
    few = paired(base[:MIN_ROUNDS - 1], base[:MIN_ROUNDS - 1] * 1.2)
    assert few.mark == "ambiguous" and "too few paired rounds" in few.text
    wide = paired(base, base * 1.004 * (1 + rng.normal(0, 0.01, 60)))
    assert wide.mark == "ambiguous" and wide.mde > same.mde
    # the band: MIN_EFFECT, or MIN_EFFECT_MS over a short kernel's time (a 10 us kernel: 2 %)
    short = 0.01 * base  # ms
    assert paired(short, short * 1.015).mark == "same"
    assert paired(short, short * 1.015).band == pytest.approx(MIN_EFFECT_MS / 0.01, rel=0.01)
    assert paired(short, short * 1.03).mark == "slower"
    assert paired(10 * short, 10 * short * 1.015).mark == "slower"  # 100 us: 0.5 %
    assert paired(short, short * 1.015, min_effect_ms=0).mark == "slower"


def test_interleaved_rounds_alternate_on_the_cpu():
    from harness.execute.interleave import MIN_ROUNDS_CPU, bench_pair

    calls = []

    def make(v):
        return lambda: calls.append(v) or sum(range(200 * (v + 1)))

    r = bench_pair([make(0), make(1)], device="cpu", warmup_ms=0.1, rep_ms=1.0, min_samples=3,
                   max_rel_err=0.005)
    assert r.n >= MIN_ROUNDS_CPU and r.burst == 1
    assert list(r.first[:4]) == [0, 1, 0, 1]
    assert len(r.samples[0].ms) == len(r.samples[1].ms) == r.n
    assert all(b0 > 0 and b1 > 0 for b0, b1 in r.burst_ms)
    timed = calls[-2 * r.n:]  # AB BA AB ...: each version takes each slot equally often
    assert timed[:4] == [0, 1, 1, 0]


def _repo(path: Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.email=t@t", "-c", "user.name=t",
                                                 "commit", "-q", "-m", "one"]):
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)
    return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()


def test_a_commit_imports_beside_the_working_tree(tmp_path, monkeypatch):
    """The commit's `lazyop` (VERSION 1) and the working tree's (VERSION 2) in one process; an
    absolute import inside a function, run later, reaches the commit's own module."""
    repo = tmp_path / "repo"
    sha = _repo(repo, {"lazyop/__init__.py": "def version():\n    from lazyop.helper import "
                                             "VERSION\n    return VERSION\n",
                       "lazyop/helper.py": "VERSION = 1\n"})
    (repo / "lazyop" / "helper.py").write_text("VERSION = 2\n")
    monkeypatch.syspath_prepend(str(repo))
    tops, paths = code_tree._entries(repo, sha, [""])
    assert tops == ["lazyop"] and paths == ["lazyop"]
    dest = store.tree_dir(tmp_path / "store", "repo", sha)
    code_tree._extract(repo, sha, paths, dest)
    tree = {"repo": str(repo), "rev": "HEAD", "sha": sha, "path": str(dest), "roots": [""],
            "module": "lazyop", "tops": tops}
    try:
        old = code_tree.load_module(tree)
        import lazyop

        assert old.version() == 1 and lazyop.version() == 2
        assert old.__name__ == f"{code_tree.prefix_of(tree)}.lazyop"
        with pytest.raises(HarnessError, match=r"--base nosuch: not a commit of"):
            code_tree.resolve(repo, "nosuch")
        with pytest.raises(HarnessError, match="defines no `op`"):
            code_tree.load_op(tree)
    finally:
        for name in [m for m in sys.modules if "lazyop" in m]:
            del sys.modules[name]


def test_tuner_scopes_keep_the_versions_picks_apart():
    with tuning.scope("code:a"):
        tuning.remember("t", ("k",), {"BLOCK": 64}, "tuned")
    with tuning.scope("code:b"):
        assert tuning.stored_pick("t", ("k",)) is None
        tuning.merge_picks({"t": {repr(("k",)): {"config": {"BLOCK": 128}, "source": "tuned"}}})
    with tuning.scope("code:a"):
        assert tuning.stored_pick("t", ("k",))["config"] == {"BLOCK": 64}
        assert tuning.take_new_picks() == {"t": {repr(("k",)): {"config": {"BLOCK": 64},
                                                               "source": "tuned"}}}
    assert tuning.stored_pick("t", ("k",)) is None  # outside: the process's own picks


def test_the_known_effect_copy_moves_its_extra_bytes():
    import torch

    from harness.registry import Params
    from kernels.known_effect import copy_kernel, op

    x = torch.randn(3, 1000, dtype=torch.float16)
    pad = torch.randn(400, dtype=torch.float16)
    scratch = torch.full((400,), -7.0, dtype=torch.float16)
    y = copy_kernel.copy(x, pad, scratch, 0.05)
    n_extra = round(0.05 * x.numel())
    assert torch.equal(y, x) and n_extra == 150
    assert torch.equal(scratch[:n_extra], pad[:n_extra])
    assert (scratch[n_extra:] == -7.0).all()  # exactly the extra elements, no more
    with pytest.raises(ValueError, match="extra must be within"):
        copy_kernel.copy(x, pad, scratch, 0.5)
    assert op.byte_count(Params({"M": 3, "N": 1000}), 2) == 12000.0


def test_the_detection_table_counts_marks_by_size():
    rows = [{"impl": "triton", "mark": "slower", "base_ms": 0.2, "mde": 0.004, "ratio": 0.98},
            {"impl": "triton", "mark": "ambiguous", "base_ms": 0.01, "mde": 0.02},
            {"impl": "triton", "mark": "same", "base_ms": 0.06, "mde": 0.006, "ratio": 1.0},
            {"impl": "torch", "mark": "same", "base_ms": 0.2, "mde": 0.003}]
    s = tool.summarize(rows, "triton")
    assert (s["n"], s["n_long"], s["mde_median"]) == (3, 2, 0.006)
    assert s["marks"]["slower"] == 1 and s["long"] == {**s["long"], "slower": 1, "same": 1,
                                                       "ambiguous": 0}
    md = tool.table([{"effect": "2", "method": "ab", "wall_s": 12.0, "triton": s,
                      "torch": tool.summarize(rows, "torch")}])
    assert s["effect_long"][0] == pytest.approx(0.5 * (1 / 0.98 - 1))  # time moved, >= 50 us
    assert ("| 2 % | ab | 1 / 1 / 1 of 3 | 1 / 1 / 0 of 2 | +1.0% (+0.0 to +2.0) | 0.60% | "
            "0 / 1 / 0 of 1 | 12 |") in md


def test_the_aa_script_snapshots_kernels_and_counts_marks(tmp_path):
    """tools/device/aa.py: `ab --base HEAD` must be the working tree exactly, so the script
    commits kernels/ as it is into a git directory of its own (GIT_DIR / GIT_WORK_TREE)."""
    spec_ = importlib.util.spec_from_file_location("aa_tool", ROOT / "tools" / "device" / "aa.py")
    aa = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(aa)
    env = aa.git_env(tmp_path)
    files = subprocess.run(["git", "ls-tree", "-r", "--name-only", "HEAD"], env=env, cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    assert "kernels/softmax/__init__.py" in files and all(f.startswith("kernels/")
                                                         for f in files)
    top = subprocess.run(["git", "-C", str(ROOT / "kernels"), "rev-parse", "--show-toplevel"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(top).resolve() == ROOT.resolve()  # what harness.execute.code_tree will see
    rows = [{"impl": "triton", "key": "a", "mark": "same", "method": "paired", "text": "same"},
            {"impl": "torch", "key": "b", "mark": "slower", "method": "measured",
             "text": "1.10x slower"}]
    m = aa.marks(rows)
    assert (m["pairs"], m["marked"], m["marked_rows"]) == (2, 1, ["b: 1.10x slower"])
    assert m["method"] == {"paired": {"same": 1}, "measured": {"slower": 1}}


def test_ncu_counters_and_hot_lines_side_by_side(tmp_path):
    """What `ab --ncu` prints after profiling both versions, on two stored runs' metrics and
    source lines (the profiling itself needs a GPU)."""
    import pandas as pd
    from run_factory import case_id, ncu_rows, write_run

    from harness.present.ab_show import side_by_side

    cid = case_id("triton", 1024)
    base = write_run(tmp_path, minutes=0, medians={"triton/1024": 1.0}, metrics=ncu_rows(
        cid, duration_us=100.0, registers_per_thread=32, dram_throughput_pct=80.0))
    head = write_run(tmp_path, minutes=1, medians={"triton/1024": 1.02}, metrics=ncu_rows(
        cid, duration_us=102.0, registers_per_thread=40, dram_throughput_pct=82.0))
    for d, share in ((base, 0.6), (head, 0.7)):
        store.write_table(d, "source_lines", pd.DataFrame([{
            "case_id": cid, "kernel": "k", "file": "/x/copy_kernel.py", "line": 21,
            "text": "tl.store(y_ptr + offs, x)", "samples": 100.0, "share": share,
            "stall_mix": json.dumps({"long_scoreboard": 100}), "library": False}]))
    con = Console(file=io.StringIO(), width=300, color_system=None)
    side_by_side(base, head, compare_runs(base, head, noise=0.07), con)
    out = con.file.getvalue()
    assert "ncu triton M=64 N=1024 fp16 (base → head): ncu duration 100.0 us -> 102.0 us" in out
    assert "registers 32 -> 40" in out and "DRAM throughput 80% -> 82%" in out
    assert "base · k: copy_kernel.py:21" in out and "60.0 %" in out
    assert "head · k: copy_kernel.py:21" in out and "70.0 %" in out


def test_both_versions_share_inputs_and_outputs_of_one_layout():
    """Where a buffer lies moves a memory-bound kernel's time by a few %: the two versions get
    the same buffers whenever they are interchangeable, workspaces of unchosen content
    included, and their own when the head's op makes other inputs."""
    import torch

    from harness.execute.ab_worker import _equal, _same_layout

    x = torch.randn(4, 8)
    ws = [torch.full((16,), float(i)) for i in range(3)]  # what torch.empty gave three times
    assert _equal((x, ws[0], 3), (x.clone(), ws[1], 3), again=(x.clone(), ws[2], 3))
    assert not _equal((x, ws[0]), (x.clone(), ws[1]))  # no second making: content may matter
    assert not _equal((x, ws[0]), (x + 1, ws[0]), again=(x.clone(), ws[0]))  # other values
    assert not _equal((x, 3), (x, 4))
    assert not _equal((x,), (x.t().contiguous().t(),), again=(x,))  # other strides
    assert not _equal((x,), (x.double(),), again=(x,))
    nan = torch.full((3,), float("nan"))
    assert _equal((nan,), (nan.clone(),))  # the same bits, NaN or not
    assert _same_layout((x, x), (torch.empty_like(x), torch.empty_like(x)))
    assert not _same_layout(x, torch.empty(8, 4))
    assert not _same_layout(x, None)


def test_a_commit_extracts_without_tarfiles_data_filter(tmp_path, monkeypatch):
    """Python 3.10 and 3.11 before 3.11.4 have no tarfile filter: `ab` still extracts a commit,
    and still refuses a member that would land outside its folder."""
    import io
    import tarfile

    from harness.errors import HarnessError
    from harness.execute import code_tree

    def archive(name: str) -> tarfile.TarFile:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            data = b"X = 1\n"
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        buf.seek(0)
        return tarfile.open(fileobj=buf)

    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    code_tree._safe_extract(archive("pkg/mod.py"), tmp_path / "ok")
    assert (tmp_path / "ok" / "pkg" / "mod.py").read_text() == "X = 1\n"
    with pytest.raises(HarnessError, match="outside the tree"):
        code_tree._safe_extract(archive("../evil.py"), tmp_path / "bad")
    assert not (tmp_path / "evil.py").exists()
