"""nsys stats parsers on REAL CSVs captured on an H200 (Nsight Systems 2025.3.1 bundled with
Nsight Compute): the softmax experiment's nsys pass (36 cases). stats_cuda_api_trace.csv is
trimmed to the API calls that start inside a harness NVTX range (the full file is 4.7 MB)."""
from pathlib import Path

import pytest

from harness.profilers.nsys import Nsys, parse_stats_dir, range_case, read_stats_csv
from harness.profilers.torch_profiler import kernels_to_metrics

FIX = Path(__file__).parent / "fixtures" / "nsys"


@pytest.fixture(scope="module")
def df():
    return parse_stats_dir(FIX)


def total(df, case, name):
    sel = df[(df.case_id == case) & (df.kernel == "") & (df.name == name)]
    assert len(sel) == 1
    return sel.value.iloc[0]


def test_every_case_gets_its_kernels(df):
    cases = set(df.case_id)
    assert len(cases) == 36
    assert total(df, "triton.M=4096.N=32768.float16", "kernel_count") == 2
    assert total(df, "triton.M=8192.N=8192.float16", "kernel_count") == 1
    assert total(df, "torch.M=8192.N=8192.float16", "kernel_count") == 1


def test_kernel_rows_and_times(df):
    k = df[(df.case_id == "triton.M=4096.N=32768.float16") & (df.name == "kernel_time_us")]
    assert dict(zip(k.kernel, k.value)) == pytest.approx(
        {"_softmax_normalise": 133.728, "_softmax_partials": 133.343})
    assert total(df, "triton.M=4096.N=32768.float16", "gpu_time_us") == pytest.approx(267.071)


def test_range_and_api_times(df):
    case = "triton.M=4096.N=32768.float16"
    assert total(df, case, "range_wall_us") == pytest.approx(343.384)
    assert total(df, case, "api_time_us") == pytest.approx(238.958, rel=1e-6)
    assert total(df, case, "launch_api_us") == pytest.approx(12.962, rel=1e-3)
    assert total(df, case, "launch_api_us") < total(df, case, "api_time_us")


def test_kernels_outside_ranges_are_not_counted(df):
    # warm-up launches (FillFunctor for the L2 flush, randn) have no range in nvtx_kern_sum
    rows = read_stats_csv(FIX / "stats_nvtx_kern_sum.csv")
    outside = [r for r in rows if not r["NVTX Range"]]
    assert outside and all("FillFunctor" not in k for k in df.kernel)


def test_range_names():
    assert range_case("harness:triton.M=1.N=2.float16") == "triton.M=1.N=2.float16"
    assert range_case(":outer") == "outer"


def test_missing_report_is_an_empty_frame(tmp_path):
    assert parse_stats_dir(tmp_path).empty


def test_command(tmp_path):
    argv = Nsys().command(["python", "-m", "harness"], tmp_path, None)
    assert argv[1:4] == ["profile", "-t", "cuda,nvtx"] and argv[-3:] == ["python", "-m", "harness"]


def test_torch_profiler_fallback_table():
    df = kernels_to_metrics({"c1": [{"name": "k", "time_us": 3.0}, {"name": "k", "time_us": 2.0},
                                    {"name": "j", "time_us": 1.0}]})
    t = df[df.kernel == ""].set_index("name").value
    assert t["kernel_count"] == 3 and t["gpu_time_us"] == 6.0 and t["distinct_kernels"] == 2
    assert set(df.source) == {"torch_profiler"}


# -- a backward run: kernels launched by autograd's device thread ----------------------------------
# tests/fixtures/nsys_bwd/: the nsys pass of `flash_bwd.yaml --cases '*N=4096.D=128.causal=false*
# float16'` (12 cases) on an H200, untrimmed. The backward runs on autograd's own thread
# (`pt_autograd_0` in cuda_api_trace), outside the main thread's NVTX push/pop range.

BWD = Path(__file__).parent / "fixtures" / "nsys_bwd"
TF_BWD = "triton_flash.B=4.H=16.N=4096.D=128.causal=false.mode=bwd.float16"


def test_a_backward_case_gets_the_kernels_of_autograds_thread(tmp_path):
    threads = {r.get("Thread Name") for r in read_stats_csv(BWD / "stats_cuda_api_trace.csv")}
    assert {"python3", "pt_autograd_0"} <= threads
    df = parse_stats_dir(BWD)
    assert len(set(df.case_id)) == 12
    k = df[(df.case_id == TF_BWD) & (df.name == "kernel_time_us")]
    assert dict(zip(k.kernel, k.value)) == pytest.approx(
        {"_bwd_preprocess": 34.241, "_bwd_dkdv_kernel": 2816.393, "_bwd_dq_kernel": 1488.005})
    assert total(df, TF_BWD, "kernel_count") == 3
    assert total(df, "naive.B=4.H=16.N=4096.D=128.causal=false.mode=bwd.float16",
                 "kernel_count") == 7
    # nsys' own projection (no per-kernel GPU trace, e.g. an imported stats folder) sees none
    import shutil
    for f in BWD.glob("*.csv"):
        if "gpu_trace" not in f.name:
            shutil.copy(f, tmp_path)
    proj = parse_stats_dir(tmp_path)
    assert TF_BWD not in set(proj[proj.name == "kernel_count"].case_id)


def test_without_a_gpu_trace_the_projection_is_used():
    """The softmax capture predates cuda_gpu_trace: its kernels come from nvtx_kern_sum (the
    tests above). On an H200 forward run both ways gave the same kernels and times per case."""
    from harness.profilers.nsys import _kernels_by_window
    assert _kernels_by_window(FIX) is None
    by = _kernels_by_window(BWD)
    assert sum(n for n, _ in by[TF_BWD].values()) == 3
