"""The calibration's copy curve: a memory-bound case is also placed against a copy of its own
byte count (roofline.Ceilings.copy_gbps_at), which the report, the console table and the
verdicts use so that a 20 us kernel is not told it is far from a 1 GiB copy's rate.

The curve below is a test input for the interpolation and the wording (round numbers, not a
measurement); the real one is measured by `harness calibrate` on the GPU."""
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from harness.present import report_context
from harness.analysis.roofline import Ceilings, place
from harness.analysis.verdict import assess
from harness.registry import Params, get_op

FIX = Path(__file__).parent / "fixtures"
CAL = json.loads((FIX / "runs" / ".calibration" / "nvidia-h200.json").read_text())
MB = 2 ** 20
CURVE = [[8 * MB, 1000.0], [32 * MB, 2000.0], [128 * MB, 3000.0], [1024 * MB, 4000.0]]


def ceil(curve=CURVE):
    return Ceilings.from_calibration({**CAL, "copy_curve": curve})


def test_copy_rate_at_a_size_is_interpolated_in_log_bytes():
    c = ceil()
    assert c.copy_gbps_at(32 * MB) == 2000.0
    assert c.copy_gbps_at(64 * MB) == pytest.approx(2500.0)  # halfway between 32 and 128 MiB
    assert c.copy_gbps_at(16 * MB) == pytest.approx(1500.0)
    assert c.copy_gbps_at(4096 * MB) == 4000.0  # beyond the largest: the largest
    assert c.copy_gbps_at(4 * MB) is None  # below the smallest: not measured
    assert c.copy_gbps_at(None) is None and c.copy_gbps_at(0) is None
    # an older calibration (no curve) places as before
    old = Ceilings.from_calibration(CAL)
    assert old.copy_curve == () and old.copy_gbps_at(64 * MB) is None
    # unsorted, and junk points dropped
    assert ceil([CURVE[2], [0, 5.0], CURVE[0], [16 * MB, None]]).copy_curve == (
        (8.0 * MB, 1000.0), (128.0 * MB, 3000.0))


def test_placement_carries_the_same_size_copy_fraction_for_memory_bound_cases():
    c = ceil()
    nbytes = 64 * MB  # a copy of this size: 2500 GB/s here
    ms = nbytes / 2000e9 * 1e3  # the kernel moves it at 2000 GB/s
    p = place(nbytes * 0.5, nbytes, ms, "float16", c)  # 0.5 FLOP/B: memory-bound
    assert p.bound == "memory"
    assert p.pct_of_roof == pytest.approx(2000 / CAL["copy_gbps"], rel=1e-3)
    assert p.size_copy_pct == pytest.approx(0.8)
    hot = place(nbytes * 1000, nbytes, ms, "float16", c)  # compute-bound: no copy fraction
    assert hot.bound == "compute" and hot.size_copy_pct is None
    assert place(nbytes * 0.5, nbytes, ms, "float16", Ceilings.from_calibration(CAL)
                 ).size_copy_pct is None


def test_a_small_kernel_at_a_same_size_copys_rate_is_done():
    """layernorm M=16384 N=1024 fp16 (64 MiB + 4 KiB): 74% of the 1 GiB copy rate, but at
    the rate a copy of 64 MiB gets -> done, and the text gives both numbers."""
    op = get_op("layernorm")
    p = Params(M=16384, N=1024, mode="fwd")
    nbytes = op.byte_count(p, 2)
    same = ceil().copy_gbps_at(nbytes)
    row = {"case_id": "triton.M=16384.N=1024.mode=fwd.float16", "dtype": "float16",
           "median_ms": nbytes / (0.95 * same * 1e9) * 1e3}
    judged, placed = assess(row, op.flop_count(p), nbytes, ceil(), True)
    assert placed.size_copy_pct == pytest.approx(0.95)
    assert "(95% of a copy of the same bytes)" in judged.text
    assert judged.lever.startswith("at the memory roof: done")
    # without the curve the same case is short of the roof
    judged, _ = assess(row, op.flop_count(p), nbytes, Ceilings.from_calibration(CAL), True)
    assert judged.lever is None or not judged.lever.startswith("at the memory roof")
    # and well short of a same-size copy: not done either
    slow = {**row, "median_ms": row["median_ms"] * 1.5}
    judged, placed = assess(slow, op.flop_count(p), nbytes, ceil(), True)
    assert placed.size_copy_pct == pytest.approx(0.95 / 1.5)
    assert judged.lever is None or not judged.lever.startswith("at the memory roof")


def test_counted_dram_rate_is_judged_against_a_same_size_copy():
    from test_verdict import rows

    from harness.analysis.verdict import judge

    row = rows("layernorm_raw.csv")["triton.M=8192.N=4096.mode=fwd.float16"]
    plain = judge(row, None, None, Ceilings.from_calibration(CAL))
    assert plain.lever.startswith("more bytes in flight")  # 80% of the 1 GiB rate: not done
    dram = row["dram_bytes_read"] + row["dram_bytes_write"]
    rate = dram / row["ncu_duration_us"] / 1e3
    near = [[dram / 4, rate * 0.8], [dram * 4, rate * 1.05]]  # a copy of its size: ~1.0x rate
    j = judge(row, None, None, ceil(near))
    assert "of a copy of the same bytes (80% of the 1 GiB copy rate)" in j.lever
    assert j.lever.startswith("at the memory roof: done")


def test_report_table_has_the_same_size_copy_column_only_when_measured():
    base = {"case_id": "triton.M=1.N=2.float16", "impl": "triton", "role": "candidate",
            "params": {"M": 1, "N": 2}, "dtype": "float16", "status": "ok",
            "median_ms": 0.02, "gbps": 3000.0, "pct_of_roof": 71.0, "verdict": "memory-bound",
            "speedup_vs_baseline": math.nan}
    df = pd.DataFrame([{**base, "pct_of_size_copy": 96.4}])
    t = report_context.cases_table(df, cpu=False, primary="gbps", baseline="torch")
    assert "% of same-size copy" in t["columns"]
    i = t["columns"].index("% of same-size copy")
    assert t["rows"][0][i] == "96%"
    t = report_context.cases_table(pd.DataFrame([base]), cpu=False, primary="gbps",
                                   baseline="torch")
    assert "% of same-size copy" not in t["columns"]


def test_real_h200_curve_and_a_layernorm_run_placed_on_it():
    """A run captured on an H200 (runs/examples/...-layernorm-db33, its manifest holds the
    calibration it was judged against): the copy rate climbs with size (a 64 MiB copy is well
    short of the 1 GiB rate), and the stored `pct_of_size_copy` of each memory-bound case is its
    GB/s over the curve at its own bytes."""
    from harness import store
    from harness.store.results import ITEMSIZE

    run = Path(__file__).parent.parent / "runs" / "examples" / "20261123T192831Z-layernorm-db33"
    cal = store.load_manifest(run)["calibration"]
    c = Ceilings.from_calibration(cal)
    sizes = [b for b, _ in c.copy_curve]
    rates = [g for _, g in c.copy_curve]
    assert sizes == sorted(sizes) and rates == sorted(rates)  # faster with size, every step
    assert c.copy_gbps_at(64 * MB) < 0.8 * c.copy_gbps  # 32 MiB each way: far from 1 GiB's
    res = store.load_results(run).set_index("case_id")
    op = get_op("layernorm")
    for cid in ("triton.M=16384.N=1024.mode=fwd.float16", "triton.M=8192.N=4096.mode=fwd.float16"):
        r = res.loc[cid]
        nbytes = op.byte_count(Params(M=int(cid.split("M=")[1].split(".")[0]),
                                      N=int(cid.split("N=")[1].split(".")[0]), mode="fwd"),
                               ITEMSIZE["float16"])
        want = nbytes / (r.median_ms * 1e-3) / 1e9 / c.copy_gbps_at(nbytes) * 100
        assert r.pct_of_size_copy == pytest.approx(want, rel=1e-6)
        assert r.pct_of_size_copy > r.pct_of_roof  # the same-size copy is the lower bar
