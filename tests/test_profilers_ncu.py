"""ncu parsers on REAL output captured on an H200 (Nsight Compute 2025.3.1, torch 2.11,
triton 3.6): the softmax experiment's ncu pass, 6 cases / 7 kernels.

Fixtures (tests/fixtures/capture.sh says how they were made):
  softmax_raw.csv      `ncu --import rep --csv --page raw --print-units base`, complete
  softmax_details.csv  `--page details --print-units base --print-details all`, kernels 2, 3, 6
  softmax3.ncu-rep.xz  a 3-case / 4-kernel report (xz-compressed) and softmax3_raw.csv, its export
  live_raw.csv         a live `ncu --csv --page raw` log: ==PROF== and @@harness lines included"""
import lzma
from pathlib import Path

import pandas as pd
import pytest

from harness.profilers import ncu_parse as P
from harness.profilers.ncu import Ncu, check_log
from harness.experiment.spec import NcuOptions

FIX = Path(__file__).parent / "fixtures" / "ncu"
TRITON_8K = "triton.M=8192.N=8192.float16"
TRITON_LONG = "triton.M=4096.N=32768.float16"  # the split-row path: two kernels


@pytest.fixture(scope="module")
def raw():
    return P.parse_raw_csv((FIX / "softmax_raw.csv").read_text())


def value(df, case, kernel, name):
    sel = df[(df.case_id == case) & (df.kernel == kernel) & (df.name == name)]
    assert len(sel) == 1, (case, kernel, name, len(sel))
    return sel.value.iloc[0]


def test_raw_page_golden_values(raw):
    # values as printed in the CSV (thousands separators, base units)
    assert value(raw, TRITON_8K, "_softmax_rows", "duration_us") == pytest.approx(65.92)
    assert value(raw, TRITON_8K, "_softmax_rows", "registers_per_thread") == 48
    assert value(raw, TRITON_8K, "_softmax_rows", "achieved_occupancy_pct") == pytest.approx(59.79)
    assert value(raw, TRITON_8K, "_softmax_rows", "theoretical_occupancy_pct") == 62.5
    assert value(raw, TRITON_8K, "_softmax_rows", "stall_long_scoreboard") == pytest.approx(7.60)
    assert value(raw, TRITON_8K, "_softmax_rows", "grid_size") == 8192  # "8,192"
    assert value(raw, TRITON_8K, "_softmax_rows", "block_size") == 256
    assert value(raw, TRITON_8K, "_softmax_rows", "shared_mem_per_block_bytes") == 1056
    assert value(raw, TRITON_8K, "_softmax_rows", "sm_clock_hz") == pytest.approx(1.958e9, rel=1e-3)


def test_every_kernel_is_mapped_to_its_case_through_nvtx(raw):
    kernels = raw.groupby("case_id").kernel.nunique().to_dict()
    assert kernels == {
        "torch.M=4096.N=32768.float16": 1, "torch_compile.M=4096.N=32768.float16": 1,
        TRITON_LONG: 2, "torch.M=8192.N=8192.float16": 1,
        "torch_compile.M=8192.N=8192.float16": 1, TRITON_8K: 1}
    assert "" not in set(raw.case_id)


def test_multi_kernel_case_keeps_both_kernels(raw):
    assert value(raw, TRITON_LONG, "_softmax_partials", "registers_per_thread") == 37
    assert value(raw, TRITON_LONG, "_softmax_normalise", "registers_per_thread") == 28
    assert value(raw, TRITON_LONG, "_softmax_partials", "duration_us") == pytest.approx(131.904)
    assert value(raw, TRITON_LONG, "_softmax_normalise", "duration_us") == pytest.approx(135.296)


def test_occupancy_limiter_names_the_binding_resource(raw):
    sel = raw[(raw.case_id == TRITON_8K) & (raw.name == "occupancy_limiter")]
    assert sel.unit.iloc[0] == "registers" and sel.value.iloc[0] == 5


def test_flop_count_and_every_stall_reason_present(raw):
    names = set(raw[raw.case_id == TRITON_8K].name)
    from harness.profilers.metrics import STALL_REASONS

    assert {f"stall_{r}" for r in STALL_REASONS} <= names
    # 3 FLOP/element analytically (8192^2 * 3 = 2.0e8); ncu counts FADD/FMUL/FFMA (x2) = 3.8e8
    assert value(raw, TRITON_8K, "_softmax_rows", "flop_count") == pytest.approx(383778816, rel=1e-6)


def test_details_page_gives_the_raw_page_values(raw):
    det = P.parse_details_csv((FIX / "softmax_details.csv").read_text())
    assert set(det.case_id) == {TRITON_8K, TRITON_LONG}
    a = raw.set_index(["case_id", "kernel", "name"]).value
    b = det.set_index(["case_id", "kernel", "name"]).value
    both = pd.concat([a, b], axis=1, keys=["raw", "details"], join="inner")
    assert len(both) >= 100
    # the CSV pages print 2 decimals for ratios: equal up to that rounding
    diff = (both.raw - both.details).abs()
    assert (diff <= both.raw.abs() * 1e-3 + 0.006).all(), both[diff > both.raw.abs() * 1e-3 + 0.006]


def test_live_log_with_prof_and_application_lines():
    text = (FIX / "live_raw.csv").read_text()
    assert "==PROF== Connected" in text and "@@harness" in text  # a real, noisy live log
    df = P.parse_raw_csv(text)
    assert df.groupby("case_id").kernel.nunique().to_dict() == {
        "triton.M=8192.N=8192.float16": 1, "triton.M=256.N=262144.float16": 2}
    assert value(df, "triton.M=8192.N=8192.float16", "_softmax_rows",
                 "registers_per_thread") > 0


SECTIONS_ONLY = {  # file: case, kernel, DRAM %, SM clock (Hz) as printed in the CSV
    "sections_only_softmax_raw.csv": (TRITON_8K, "_softmax_rows", 80.27, 1951702927.22),
    "sections_only_flash_raw.csv": (
        "triton_flash.B=4.H=16.N=4096.D=128.causal=false.mode=fwd.float16", "_flash_fwd_kernel",
        4.86, 1780681184.16)}


@pytest.mark.parametrize("name", sorted(SECTIONS_ONLY))
def test_sections_only_capture_gives_dram_throughput_and_sm_clock(name):
    """ncu 2025 with sections only writes gpu__dram_throughput... (SpeedOfLight) and no
    dram__throughput...; SM Frequency is gpc__cycles_elapsed.avg.per_second there."""
    case, kernel, dram, clock = SECTIONS_ONLY[name]
    text = (FIX / name).read_text()
    assert "dram__throughput.avg.pct_of_peak_sustained_elapsed" not in text  # the bug's input
    df = P.parse_raw_csv(text)
    assert value(df, case, kernel, "dram_throughput_pct") == pytest.approx(dram)
    assert value(df, case, kernel, "sm_clock_hz") == pytest.approx(clock)


def test_sections_only_ncu_rep_gives_dram_throughput_like_its_csv():
    rep = P.parse_report(FIX / "sections_only_softmax.ncu-rep")
    csv = P.parse_raw_csv((FIX / "sections_only_softmax_raw.csv").read_text())
    assert value(rep, TRITON_8K, "_softmax_rows", "dram_throughput_pct") == pytest.approx(80.267,
                                                                                        abs=1e-3)
    a = csv.set_index(["case_id", "kernel", "name"]).value
    b = rep.set_index(["case_id", "kernel", "name"]).value
    both = pd.concat([a, b], axis=1, keys=["csv", "rep"], join="inner")
    assert len(both) == len(a) == len(b)
    assert {"dram_throughput_pct", "sm_clock_hz"} <= set(both.index.get_level_values("name"))
    diff = (both.csv - both.rep).abs()
    assert (diff <= both.rep.abs() * 1e-3 + 0.006).all(), both[diff > both.rep.abs() * 1e-3 + 0.006]


def test_dram_throughput_prefers_dram_name_over_its_gpu_alias():
    rows = P.canonical_rows("c", "k", {"dram__throughput.avg.pct_of_peak_sustained_elapsed": 70.0,
                                       "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": 71.0})
    assert [r[4] for r in rows if r[3] == "dram_throughput_pct"] == [70.0]
    rows = P.canonical_rows("c", "k", {"gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": 71.0})
    assert [r[4] for r in rows if r[3] == "dram_throughput_pct"] == [71.0]


def test_numbers_units_and_na():
    assert P.num("1,980,000") == 1980000.0
    assert P.num("3,196,575,731.74") == pytest.approx(3196575731.74)
    for na in ("n/a", "(!) n/a", "no data", ""):
        assert P.num(na) is None
    assert P.num("PolicySpread") == "PolicySpread"
    assert P.to_base(17.312, "us") == pytest.approx(17312.0)


def test_foreign_csv_is_rejected():
    with pytest.raises(ValueError):
        P.parse_raw_csv("a,b,c\n1,2,3\n")
    with pytest.raises(ValueError):
        P.parse_details_csv((FIX / "softmax_raw.csv").read_text())


def test_ncu_report_reader_matches_the_csv(tmp_path):
    path = tmp_path / "softmax3.ncu-rep"
    path.write_bytes(lzma.decompress((FIX / "softmax3.ncu-rep.xz").read_bytes()))
    rep = P.parse_report(path)
    csv = P.parse_raw_csv((FIX / "softmax3_raw.csv").read_text())
    assert set(rep.case_id) == {"triton.M=8192.N=8192.float16", "triton.M=256.N=262144.float16",
                                "torch.M=256.N=262144.float16"}
    assert rep[rep.case_id == "triton.M=256.N=262144.float16"].kernel.nunique() == 2
    a = csv.set_index(["case_id", "kernel", "name"]).value
    b = rep.set_index(["case_id", "kernel", "name"]).value
    both = pd.concat([a, b], axis=1, keys=["csv", "rep"], join="inner")
    assert len(both) == len(a) == len(b)
    diff = (both.csv - both.rep).abs()
    assert (diff <= both.rep.abs() * 1e-3 + 0.006).all(), both[diff > both.rep.abs() * 1e-3 + 0.006]


def test_command_is_an_argv_with_safe_clock_and_nvtx_filter(tmp_path):
    argv = Ncu().command(["python", "-m", "harness", "worker"], tmp_path, NcuOptions())
    assert argv[argv.index("--clock-control") + 1] == "none"
    assert argv[argv.index("--nvtx-include") + 1] == "regex:harness@.+/"
    assert argv[argv.index("--cache-control") + 1] == "all"
    assert argv[-4:] == ["python", "-m", "harness", "worker"]
    assert argv.count("--section") == len(NcuOptions().sections) == 0  # --metrics has them all
    metrics = argv[argv.index("--metrics") + 1].split(",")
    from harness.profilers import metrics as M

    assert all(raw in metrics for raw, _, _ in M.NCU_METRICS.values())


def test_source_lines_ask_for_pc_sampling_not_the_whole_section(tmp_path, monkeypatch):
    from harness.profilers.ncu import SOURCE_ENV, SOURCE_SAMPLING

    monkeypatch.delenv(SOURCE_ENV, raising=False)
    on = NcuOptions(source_lines=True)
    argv = Ncu().command(["python"], tmp_path, on)
    metrics = argv[argv.index("--metrics") + 1].split(",")
    assert set(SOURCE_SAMPLING) <= set(metrics) and "--section" not in argv
    assert argv[argv.index("--import-source") + 1] == "yes"
    # named in the YAML, or asked for by environment: the whole section, once
    for opts in (NcuOptions(source_lines=True, sections=["SourceCounters"]), on):
        if opts is on:
            monkeypatch.setenv(SOURCE_ENV, "section")
        argv = Ncu().command(["python"], tmp_path, opts)
        assert argv.count("SourceCounters") == 1
        assert not set(SOURCE_SAMPLING) & set(argv[argv.index("--metrics") + 1].split(","))
    off = Ncu().command(["python"], tmp_path, NcuOptions(source_lines=False))
    assert "--import-source" not in off
    assert not set(SOURCE_SAMPLING) & set(off[off.index("--metrics") + 1].split(","))


def test_log_problems():
    perm = ("==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM - The user does not have "
            "permission to access NVIDIA GPU Performance Counters on the target device 0.")
    assert "NVreg_RestrictProfilingToAdminUsers=0" in check_log(perm)
    assert "matched no range" in check_log("==WARNING== No kernels were profiled.\n")
    assert check_log("==PROF== Disconnected from process 1\n") is None


def test_ranges_are_process_scoped_so_a_backward_case_keeps_its_kernels():
    """flash_bwd on an H200: with thread-scoped ranges (ncu's default) ncu printed 'No kernels
    were profiled': autograd launches the backward from its own thread. The fixture is the raw
    page of the same run with `--nvtx-push-pop-scope process`."""
    argv = Ncu().command(["python"], Path("/tmp"), NcuOptions())
    assert argv[argv.index("--nvtx-push-pop-scope") + 1] == "process"
    df = P.parse_raw_csv((FIX / "flash_bwd_n4096_d128_6impls_raw.csv").read_text())
    kernels = df.groupby("case_id").kernel.nunique().to_dict()
    case = "triton_flash.B=4.H=16.N=4096.D=128.causal=false.mode=bwd.float16"
    assert kernels[case] == 3 and len(kernels) == 6
    assert value(df, case, "_bwd_dkdv_kernel", "duration_us") == pytest.approx(2817.728)
