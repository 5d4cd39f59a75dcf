"""Warp stalls on the Triton source line, parsed from REAL captures (H200, ncu 2025.3.1, triton
3.6; tests/fixtures/ncu_source/README.md): `_softmax_rows` (8192x8192 fp16) and
`_flash_fwd_kernel` (B=4 H=16 N=4096 D=128 fp16), each as a .ncu-rep with SourceCounters and
as the source-page CSV (`--page source --print-source cuda,sass --print-units base`)."""
import json
from pathlib import Path

import pytest

from harness.profilers import ncu_source as S

FIX = Path(__file__).parent / "fixtures" / "ncu_source"
FLASH = "/work/main/kernels/attention/flash_fwd.py"
SOFTMAX = "/work/main/kernels/softmax/triton_softmax.py"
CASES = {"softmax": "triton.M=8192.N=8192.float16",
         "flash": "triton_flash.B=4.H=16.N=4096.D=128.causal=false.mode=fwd.float16"}
STANDARD = "/opt/torch/.venv/lib/python3.12/site-packages/triton/language/standard.py"


@pytest.fixture(scope="module", params=["softmax", "flash"])
def both(request):
    k = request.param
    rep = S.parse_report_lines(FIX / f"src_{k}.ncu-rep")
    csv = S.parse_source_csv((FIX / f"src_{k}_source.csv").read_text())
    return k, rep, csv


def test_columns_and_shares(both):
    k, rep, csv = both
    for df in (rep, csv):
        assert list(df.columns) == S.SOURCE_LINE_COLUMNS
        assert df.share.sum() == pytest.approx(1.0)  # every sample is on some line
        assert (df.samples > 0).all()
        assert df.kernel.nunique() == 1
        assert list(df.samples) == sorted(df.samples, reverse=True)
    # the report knows the case (NVTX range of domain harness); the CSV page does not
    assert set(rep.case_id) == {CASES[k]} and set(csv.case_id) == {""}


def test_report_and_csv_agree(both):
    """Same lines, same samples, same text; same stall mix except `warpgroup_arrive`, which
    the source-page CSV has no column for (its All Samples total still counts it)."""
    _, rep, csv = both
    m = rep.merge(csv, on=["kernel", "file", "line"], how="outer", suffixes=("_r", "_c"),
                  indicator=True)
    assert (m._merge == "both").all()
    assert list(m.samples_r) == list(m.samples_c)
    assert (m.text_r.str.strip() == m.text_c.str.strip()).all()
    assert (m.library_r == m.library_c).all()
    for a, b in zip(m.stall_mix_r, m.stall_mix_c):
        a = json.loads(a)
        a.pop("warpgroup_arrive", None)
        assert a == json.loads(b)
    assert list(S.top_lines(rep).line) == list(S.top_lines(csv).line)


def test_softmax_golden():
    df = S.parse_report_lines(FIX / "src_softmax.ncu-rep")
    assert df.kernel.iloc[0] == "_softmax_rows" and df.samples.sum() == 7622
    top = S.top_lines(df)
    assert [(f.split("/")[-1], n) for f, n in zip(top.file, top.line)] == [
        ("triton_softmax.py", 31), ("triton_softmax.py", 33), ("standard.py", 191),
        ("standard.py", 170), ("triton_softmax.py", 36)]
    load = top.iloc[0]
    assert load.file == SOFTMAX and load.samples == 3466 and load.share == pytest.approx(0.4547, abs=1e-4)
    assert load.text.strip().startswith("x = tl.load(x_ptr + row * x_stride + cols")
    assert json.loads(load.stall_mix)["long_scoreboard"] == 3220  # the load waits on DRAM
    assert next(iter(json.loads(load.stall_mix))) == "long_scoreboard"
    assert not load.library
    red = top.iloc[2]  # tl.max's reduction inside Triton's standard library: a barrier
    assert red.file == STANDARD and red.library and red.line == 191
    assert "core.reduce" in red.text and S.mix_text(red.stall_mix, red.samples).startswith(
        "barrier 84 %")


def test_flash_golden():
    df = S.parse_report_lines(FIX / "src_flash.ncu-rep")
    assert df.kernel.iloc[0] == "_flash_fwd_kernel" and df.samples.sum() == 123243
    top = S.top_lines(df)
    assert [(f.split("/")[-1], n) for f, n in zip(top.file, top.line)] == [
        ("flash_fwd.py", 55), ("standard.py", 263), ("flash_fwd.py", 99),
        ("standard.py", 170), ("flash_fwd.py", 87)]
    dot = top.iloc[0]
    assert dot.file == FLASH and dot.text.strip() == "return tl.dot(a, b, acc)"
    assert dot.share == pytest.approx(0.2979, abs=1e-4)
    assert S.mix_text(dot.stall_mix, dot.samples) == "barrier 64 %, wait 11 %"
    assert "warpgroup_arrive" in json.loads(df[(df.line == 263)].stall_mix.iloc[0])
    assert top.iloc[2].text.strip() == "p = tl.exp2(qk)"


def test_layernorm_csv():
    df = S.parse_source_csv((FIX / "src_layernorm_source.csv").read_text())
    assert df.kernel.iloc[0] == "_ln_fwd_rows" and df.share.sum() == pytest.approx(1.0)
    assert df.library.any() and (~df.library).any()


def test_unescaped_quotes_in_source_text():
    # ncu writes `other=-float("inf")` inside a quoted field without doubling the quotes
    df = S.parse_source_csv((FIX / "src_softmax_source.csv").read_text())
    assert 'other=-float("inf")).to(tl.float32)' in df[df.line == 31].text.iloc[0]


def test_csv_refusals():
    with pytest.raises(ValueError, match="--print-source cuda,sass"):
        S.parse_source_csv((FIX / "src_flash_source_cuda.csv").read_text())
    with pytest.raises(ValueError, match="not an ncu source-page CSV"):
        S.parse_source_csv('"ID","Process ID"\n"1","2"\n')


def test_csv_two_kernels_in_one_export():
    """Two results exported together: a file seen again for the same function is the next kernel."""
    text = (FIX / "src_softmax_source.csv").read_text()
    df = S.parse_source_csv(text + text, case_id="c")
    assert list(df.kernel.unique()) == ["_softmax_rows", "_softmax_rows #2"]
    assert df.groupby("kernel").share.sum().tolist() == pytest.approx([1.0, 1.0])


def test_is_library():
    assert S.is_library(STANDARD)
    assert S.is_library("/x/dist-packages/triton/runtime/jit.py")
    assert S.is_library("triton/language/core.py")
    assert not S.is_library(FLASH)
    assert not S.is_library("/home/me/triton_kernels/mine.py")


def test_reason_names():
    from harness.profilers.metrics import pcsamp_reason

    assert pcsamp_reason("long_sb") == "long_scoreboard"
    assert pcsamp_reason("no_instructions") == "no_instruction"
    assert pcsamp_reason("sleep") == "sleeping" and pcsamp_reason("gmma") == "gmma"


# -- the profile pass: option, command, tables ------------------------------------------------------

def _cases(*impls, op="softmax"):
    import pandas as pd

    return pd.DataFrame({"case_id": [f"{i}.M=1.N=1.float16" for i in impls], "op": op,
                         "impl": list(impls)})


def test_option_auto_is_on_for_triton_cases_only(tmp_path):
    from harness.profilers.ncu import Ncu, any_triton
    from harness.experiment.spec import NcuOptions

    cases = _cases("triton", "torch")
    assert any_triton(cases, list(cases.case_id))
    assert not any_triton(cases, ["torch.M=1.N=1.float16"])
    ncu = Ncu()
    on = ncu.prepare(NcuOptions(), cases, list(cases.case_id))
    assert on.source_lines is True
    argv = ncu.command(["w"], tmp_path, on)
    assert argv[argv.index("--import-source") + 1] == "yes"
    assert "smsp__pcsamp_sample_count" in argv[argv.index("--metrics") + 1].split(",")
    off = ncu.prepare(NcuOptions(), cases, ["torch.M=1.N=1.float16"])
    assert off.source_lines is False
    assert "--import-source" not in ncu.command(["w"], tmp_path, off)
    forced = ncu.prepare(NcuOptions(source_lines=False), cases, list(cases.case_id))
    assert forced.source_lines is False
    assert "--import-source" not in ncu.command(["w"], tmp_path, forced)
    with pytest.raises(Exception, match="source_lines"):
        NcuOptions(source_lines="sometimes")


def test_extra_tables_from_the_report(tmp_path):
    import shutil

    from harness.profilers.ncu import Ncu
    from harness.experiment.spec import NcuOptions

    shutil.copy(FIX / "src_softmax.ncu-rep", tmp_path / "report.ncu-rep")
    ncu = Ncu()
    ncu.command(["w"], tmp_path, NcuOptions(source_lines=True))
    df = ncu.extra_tables(tmp_path)["source_lines"]
    assert set(df.case_id) == {CASES["softmax"]} and df.samples.sum() == 7622
    ncu.command(["w"], tmp_path, NcuOptions(source_lines=False))
    assert ncu.extra_tables(tmp_path) == {}


def test_extra_tables_csv_fallback_without_ncu_report(tmp_path, monkeypatch):
    """No ncu_report module: export the source page and name the case from the raw page."""
    import shutil

    from harness.profilers import ncu as N
    from harness.experiment.spec import NcuOptions

    shutil.copy(FIX / "src_softmax.ncu-rep", tmp_path / "report.ncu-rep")
    shutil.copy(FIX.parent / "ncu" / "sections_only_softmax_raw.csv", tmp_path / "raw.csv")

    def no_module(_path, _raw_cases=None):
        raise ImportError("ncu_report not found")

    calls = []

    def fake_export(argv, log, timeout=None, stdout_path=None):
        import subprocess

        calls.append(argv)
        shutil.copy(FIX / "src_softmax_source.csv", stdout_path)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(N, "parse_report_lines", no_module)
    monkeypatch.setattr(N, "run_logged", fake_export)
    ncu = N.Ncu()
    ncu.command(["w"], tmp_path, NcuOptions(source_lines=True))
    df = ncu.extra_tables(tmp_path)["source_lines"]
    assert calls[0][calls[0].index("--page") + 1] == "source"
    assert calls[0][calls[0].index("--print-source") + 1] == "cuda,sass"
    assert set(df.case_id) == {CASES["softmax"]} and set(df.kernel) == {"_softmax_rows"}
    assert df.samples.sum() == 7622


def test_store_round_trip(tmp_path):
    from harness import store

    run = store.create_run(tmp_path, "x", {"experiment": {"name": "x"}})
    assert list(store.load_source_lines(run).columns) == store.SOURCE_LINE_COLUMNS
    df = S.parse_report_lines(FIX / "src_flash.ncu-rep")
    store.write_table(run, "source_lines", df)
    back = store.load_source_lines(run)
    assert back.equals(df)


# -- harness import ------------------------------------------------------------------------------

def test_import_ncu_rep_stores_source_lines(tmp_path):
    from harness import store
    from harness.profilers.importer import import_path

    run = import_path(FIX / "src_flash.ncu-rep", tmp_path)
    lines = store.load_source_lines(run)
    assert set(lines.case_id) == {CASES["flash"]} and lines.samples.sum() == 123243
    assert set(store.load_metrics(run).case_id) == {CASES["flash"]}
    assert list(store.load_cases(run).impl) == ["triton_flash"]


def test_import_source_page_csv(tmp_path):
    from harness import store
    from harness.errors import ImportFormatError
    from harness.profilers.importer import import_path

    run = import_path(FIX / "src_softmax_source.csv", tmp_path)
    lines = store.load_source_lines(run)
    assert set(lines.case_id) == {"_softmax_rows"}  # no NVTX on the source page: case = kernel
    assert list(store.load_cases(run).impl) == ["_softmax_rows"]
    assert store.load_manifest(run)["import_kind"] == "ncu-source"
    with pytest.raises(ImportFormatError, match="cuda,sass"):
        import_path(FIX / "src_softmax_source_cuda.csv", tmp_path)


# -- show ----------------------------------------------------------------------------------------

def test_show_hot_lines_and_json(tmp_path):
    from rich.console import Console

    from harness.present import show
    from harness.profilers.importer import import_path

    run = import_path(FIX / "src_flash.ncu-rep", tmp_path)
    con = Console(record=True, width=200)
    show.render(run, con)
    out = con.export_text()
    assert "hot lines " + CASES["flash"] in out
    assert "flash_fwd.py:55" in out and "29.8 %" in out and "barrier 64 %, wait 11 %" in out
    assert "[triton] return a + b" in out  # library lines tagged, brackets not eaten by rich
    assert "offs_d[None, :]" not in out or "[None, :]" in out
    case = show.to_json(run)["cases"][0]
    hot = case["source_lines"]
    assert [h["line"] for h in hot] == [55, 263, 99, 170, 87]
    assert hot[1]["library"] is True and hot[0]["stall_mix"]["barrier"] == 23445
    assert hot[0]["share"] == pytest.approx(0.2979, abs=1e-4)
    json.dumps(show.to_json(run))  # serialisable


# -- report --------------------------------------------------------------------------------------

def test_report_hot_lines_section(tmp_path):
    from harness.profilers.importer import import_path
    from harness.present.report import write_report

    run = import_path(FIX / "src_softmax.ncu-rep", tmp_path / "runs")
    write_report(run, tmp_path / "rep", fmt="both", png=False, store_arg=str(run.parent))
    md = (tmp_path / "rep" / "report.md").read_text()
    block = md.split("## Hot source lines", 1)[1].split("\n## ", 1)[0]
    assert "| `triton_softmax.py:31` | 45.5 % | long_scoreboard 93 %, not_selected 3 % |" in block
    assert "[triton] `return core.reduce(input, axis, _elementwise_max, keep_dims=keep_dims)`" \
        in block
    assert sum(l.startswith("| `") for l in block.splitlines()) == 5  # top 5 only
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "Hot source lines" in html and "<code>e = tl.exp(x)</code>" in html


def test_samples_without_line_info_make_no_rows():
    """A library kernel (cuDNN, cuBLAS) has no line info: its samples land on (\"\", 0), which
    points at nothing, so it gets no hot line (it used to show as `:0  100 %`)."""
    lines = {("", 0): {"samples": 90.0, "mix": {"barrier": 90.0}},
             ("/k/flash_fwd.py", 55): {"samples": 10.0, "mix": {"wait": 10.0}, "text": "x"}}
    rows = S._rows("c", "k", lines, 100.0)
    assert [(r["file"], r["line"], r["share"]) for r in rows] == [("/k/flash_fwd.py", 55, 0.1)]
    assert S._rows("c", "cudnn_kernel", {("", 0): lines[("", 0)]}, 90.0) == []


def test_backward_kernels_take_their_case_from_the_raw_page(tmp_path):
    """A backward's kernels run on autograd's thread: the report's per-thread NVTX state holds no
    case range for them (every flash_bwd run until 2026-11-27 stored its source lines with an
    empty case id). The raw page's process-scoped NVTX column names the case; the report's
    results are in its order. Captured with the PC-sampling metrics, not the whole section."""
    import lzma

    rep = tmp_path / "src_flash_bwd.ncu-rep"
    rep.write_bytes(lzma.decompress((FIX / "src_flash_bwd.ncu-rep.xz").read_bytes()))
    (tmp_path / "raw.csv").write_bytes((FIX / "src_flash_bwd_raw.csv").read_bytes())
    case = "triton_flash.B=16.H=16.N=1024.D=64.causal=false.mode=bwd.float16"
    assert set(S.parse_report_lines(rep).case_id) == {""}  # the report alone
    from harness.profilers.ncu import Ncu

    raw_cases = Ncu._raw_cases(tmp_path)
    assert raw_cases == [case] * 3
    df = S.parse_report_lines(rep, raw_cases)
    assert set(df.case_id) == {case}
    assert set(df.kernel) == {"_bwd_preprocess", "_bwd_dkdv_tma_kernel", "_bwd_dq_tma_kernel"}
    assert df.samples.sum() == 32301 + 19267 + 2983
    # and through the profiler's own path (the report in raw/ncu/, the raw page beside it)
    rep.rename(tmp_path / "report.ncu-rep")
    ncu = Ncu()
    ncu.source_lines = True
    got = ncu.extra_tables(tmp_path)["source_lines"]
    assert set(got.case_id) == {case} and len(got) == len(df)
    from harness.profilers import metrics as M

    top = df.sort_values("samples").iloc[-1]
    assert "/kernels/attention/flash_" in top.file and top.line > 0  # a Python line of ours
    assert set(json.loads(top.stall_mix)) <= set(M.STALL_REASONS) | {"warpgroup_arrive"}


def test_older_backward_runs_source_lines_get_their_case_on_load(tmp_path):
    """A committed flash_bwd run stored its source lines without a case (before the raw-page
    fix): loading them gives each kernel the one ncu case whose metrics hold it; a kernel two
    cases share stays without one."""
    import shutil

    import pandas as pd

    from harness import store

    run = Path(__file__).parent.parent / "runs/examples/20261126T144958Z-flash-attention-bwd-a7f6"
    stored = pd.read_parquet(run / "source_lines.parquet")
    assert set(stored.case_id) == {""}
    lines = store.load_source_lines(run)
    ncu = store.load_metrics(run)
    ncu = ncu[ncu.source == "ncu"]
    assert "" not in set(lines.case_id) and len(lines) == len(stored)
    for (case, kernel), _ in lines.groupby(["case_id", "kernel"]):
        assert ((ncu.case_id == case) & (ncu.kernel == kernel)).any(), (case, kernel)
    assert set(lines[lines.kernel == "_flash_bwd_gluon_kernel"].case_id) == {
        "triton_flash.B=4.H=16.N=4096.D=128.causal=false.mode=bwd.float16"}
    copy = tmp_path / run.name
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("raw"))
    m = store.load_metrics(copy)
    twin = m[(m.source == "ncu") & (m.kernel == "_bwd_preprocess")].assign(case_id="other")
    store.write_table(copy, "metrics", pd.concat([m, twin], ignore_index=True))
    again = store.load_source_lines(copy)
    assert set(again[again.kernel == "_bwd_preprocess"].case_id) == {""}
    assert "" not in set(again[again.kernel != "_bwd_preprocess"].case_id)
