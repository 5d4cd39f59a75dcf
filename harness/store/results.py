"""Parts (what workers appended) -> the store's tables, with derived throughput and speedups.

    status of a case: pending | ok | failed (incorrect) | error (raised/crashed) | skipped
                      | timeout (killed by the watchdog; treated like error)
    speedup_vs_baseline = baseline median / case median, for cases of the same shape_id where
                          both are correct; NaN otherwise (failing cases never get a speedup)
    timing                             the samples of every process of the time pass pooled
                                       (parts time, time_p2, ...): median, spread and counts
                                       over all of them; process_medians_ms the JSON list of
                                       each process's own median (its between-process spread)
    config, config_source, code_hash   from the time record (else the check record)
    compiled                           JSON list from the time record (GPU: one entry per
                                       Triton kernel launched; [] in the interpreter)
"""
from __future__ import annotations

import json
import math

import pandas as pd

from harness import store
from harness.registry import Op, Params
from harness.experiment.spec import Case

ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4}


def cases_frame(cases: list[Case]) -> pd.DataFrame:
    return pd.DataFrame([
        {"case_id": c.case_id, "op": c.op, "impl": c.impl, "role": c.role,
         "params": json.dumps(c.params_dict), "dtype": c.dtype, "shape_id": c.shape_id,
         "status": "pending", "error": None, "base_impl": c.registered_impl,
         "forced_config": json.dumps(dict(c.config)) if c.config else None}
        for c in cases
    ])


def _status(check: dict | None, timed: dict | None) -> tuple[str, str | None]:
    recs = [r for r in (check, timed) if r]
    if not recs:
        return "pending", None
    for r in recs:  # an error in check makes time 'skipped': report the error
        if r["status"] in ("error", "timeout"):
            return r["status"], r.get("error")
    for r in recs:
        if r["status"] == "skipped":
            return "skipped", r.get("error")
    if check and check["status"] == "failed":
        return "failed", check.get("error")
    if check is None or timed is None:
        return "pending", None
    return "ok", None


def consolidate(run_dir, op: Op) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Build cases / results / samples tables from parts; write them; return them."""
    cases = store.load_cases(run_dir)
    checks = {r["case_id"]: r for r in store.read_parts(run_dir, "check")}
    times = {r["case_id"]: r for r in store.read_parts(run_dir, "time")}
    repeats = [{r["case_id"]: r for r in store.read_parts(run_dir, part)}
               for part in store.time_parts(store.time_processes(run_dir))[1:]]
    results, samples = [], []
    statuses, errors = [], []
    for c in cases.itertuples():
        chk, tim = checks.get(c.case_id), times.get(c.case_id)
        status, err = _status(chk, tim)
        statuses.append(status)
        errors.append(err)
        params = Params(json.loads(c.params))
        row = {"case_id": c.case_id, "correct": None}
        if chk and chk["status"] in ("ok", "failed"):
            row.update({k: chk.get(k) for k in ("correct", "max_abs_err", "rel_err", "tol",
                                                "torch_err", "expected_kernels")})
        if tim and tim["status"] == "ok":
            recs = [tim] + [r for r in (rep.get(c.case_id) for rep in repeats)
                            if r and r.get("status") == "ok" and r.get("samples")]
            row.update(_pooled(recs))
            row["peak_mem_bytes"] = tim.get("peak_mem_bytes")
            samples.extend({"case_id": c.case_id, "i": i, "ms": float(v), "process": p}
                           for i, (p, v) in enumerate((r.get("process", k), v)
                                                      for k, r in enumerate(recs)
                                                      for v in r["samples"]))
            med = row["median_ms"]
            if med and med > 0:
                fl = op.flop_count(params)
                by = op.byte_count(params, ITEMSIZE[c.dtype])
                row["tflops"] = fl / (med * 1e-3) / 1e12 if fl else None
                row["gbps"] = by / (med * 1e-3) / 1e9 if by else None
        row.update(_provenance(chk, tim))
        results.append(row)
    cases = cases.assign(status=statuses, error=errors, **_where(cases, checks, times))
    res = pd.DataFrame(results)
    res = _speedups(cases, res)
    store.write_table(run_dir, "cases", cases)
    store.write_table(run_dir, "results", res)
    store.write_table(run_dir, "samples", pd.DataFrame(samples, columns=store.SAMPLE_COLUMNS))
    return cases, store.load_results(run_dir), store.load_samples(run_dir)


def _pooled(recs: list[dict]) -> dict:
    """Median, spread and counts of the samples of every process of the time pass (records
    in process order), each process's own median, and the median of their SM clocks."""
    import numpy as np

    if len(recs) == 1:  # one process (a run of an earlier harness; ab): its summary as is
        r = recs[0]
        out = {k: r.get(k) for k in ("median_ms", "p20_ms", "p80_ms", "iqr_ms", "n_samples",
                                     "rel_stderr", "clock", "sm_clock_timed_mhz")}
        out["process_medians_ms"] = json.dumps([r.get("median_ms")])
        return out
    x = np.asarray([float(v) for r in recs for v in r["samples"]], dtype=float)
    q20, q25, q50, q75, q80 = np.quantile(x, [0.2, 0.25, 0.5, 0.75, 0.8])
    rse = float(x.std(ddof=1) / math.sqrt(x.size) / x.mean()) if x.size > 1 and x.mean() > 0 \
        else math.inf
    clocks = [float(r["sm_clock_timed_mhz"]) for r in recs
              if isinstance(r.get("sm_clock_timed_mhz"), (int, float))]
    return {"median_ms": float(q50), "p20_ms": float(q20), "p80_ms": float(q80),
            "iqr_ms": float(q75 - q25), "n_samples": int(x.size), "rel_stderr": rse,
            "clock": recs[0].get("clock"),
            "sm_clock_timed_mhz": float(np.median(clocks)) if clocks else None,
            "process_medians_ms": json.dumps([float(np.median(r["samples"])) for r in recs])}


WHERE = ("gpu", "host", "gpu_name", "sm_clock_mhz", "gpu_temp_c")
PROVENANCE = ("config", "config_source", "code_hash")


def _provenance(check: dict | None, timed: dict | None) -> dict:
    """The launch config and code a case ran with: the time record's (what the numbers are
    of), else the check record's; `compiled` only from a time record that has it."""
    out = {}
    for k in PROVENANCE:
        for rec in (timed, check):
            if rec and rec.get(k) is not None:
                out[k] = rec[k]
                break
    if timed and timed.get("compiled") is not None:
        out["compiled"] = json.dumps(timed["compiled"])
    return out


def _where(cases: pd.DataFrame, checks: dict, times: dict) -> dict[str, list]:
    """Which GPU of which host ran each case (its timing, else its check), and that GPU's state."""
    cols: dict[str, list] = {k: [] for k in WHERE}
    for cid in cases.case_id:
        rec = times.get(cid) or checks.get(cid) or {}
        for k in WHERE:
            cols[k].append(rec.get(k))
    return cols


def gpu_models(cases: pd.DataFrame) -> list[str]:
    """The distinct GPU models that ran a run's cases ([] for CPU runs and old runs)."""
    if "gpu_name" not in cases.columns:
        return []
    return sorted({str(v) for v in cases.gpu_name if isinstance(v, str) and v})


def _speedups(cases: pd.DataFrame, res: pd.DataFrame) -> pd.DataFrame:
    if "median_ms" not in res.columns:
        res["median_ms"] = None
    merged = cases[["case_id", "shape_id", "role", "status"]].merge(res, on="case_id")
    base = merged[(merged.role == "baseline") & (merged.status == "ok")]
    base_ms = dict(zip(base.shape_id, base.median_ms))
    sp = []
    for r in merged.itertuples():
        b = base_ms.get(r.shape_id)
        ok = r.status == "ok" and r.median_ms is not None and not _nan(r.median_ms)
        sp.append(b / r.median_ms if ok and b and not _nan(b) else math.nan)
    res = res.copy()
    res["speedup_vs_baseline"] = sp
    return res


def _nan(x) -> bool:
    try:
        return math.isnan(float(x))
    except (TypeError, ValueError):
        return True
