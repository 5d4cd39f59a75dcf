"""Cached loaders and view logic for the dashboard; the pages only lay out widgets and charts.

Everything is read through `harness.store` (the only module that knows the file layout) and
`harness.analysis`. Loaders are cached with `st.cache_data`, keyed on the run directory and a
stamp of its entries' mtimes, so a run that is still being written shows its newest state.

Store roots: the user's store (default `runs/`) and the committed examples (`runs/examples/`,
real GPU runs), given to the app as `streamlit run dashboard/app.py -- --store DIR ...` or in
the environment variable KERNEL_LAB_STORES (os.pathsep-separated).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import streamlit as st

from harness import store
from harness.analysis.summary import summary_frame
from harness.profilers.metrics import short_kernel_name
from harness.experiment.spec import DTYPE_SHORT
from harness.errors import HarnessError
from harness.values import finite as _num

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES_ROOT = REPO_ROOT / "runs" / "examples"
ENV_STORES = "KERNEL_LAB_STORES"
ENV_NO_EXAMPLES = "KERNEL_LAB_NO_EXAMPLES"
NONE = ""  # the "no second run" choice of the selection widgets


# -- store roots -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Root:
    path: str
    example: bool


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="dashboard/app.py", allow_abbrev=False, add_help=False)
    ap.add_argument("--store", action="append", default=None)
    ap.add_argument("--no-examples", action="store_true")
    return ap.parse_known_args(argv)[0]


def store_roots(argv: list[str] | None = None, environ: dict | None = None) -> list[Root]:
    """The store roots: `--store` args, else $KERNEL_LAB_STORES, else `runs`; plus the examples."""
    environ = os.environ if environ is None else environ
    a = parse_args(list(argv or []))
    paths = a.store or [p for p in environ.get(ENV_STORES, "").split(os.pathsep) if p] or ["runs"]
    no_examples = a.no_examples or environ.get(ENV_NO_EXAMPLES, "") not in ("", "0")
    ex = EXAMPLES_ROOT.resolve()
    if not no_examples and EXAMPLES_ROOT.is_dir():
        paths = [*paths, str(EXAMPLES_ROOT)]
    roots, seen = [], set()
    for p in paths:
        rp = Path(p).expanduser().resolve()
        if rp in seen:
            continue
        seen.add(rp)
        roots.append(Root(str(rp), rp == ex))
    return roots


def stamp(path: str | Path) -> str:
    """A digest of the names, sizes and mtimes of a directory's entries ("" when it cannot be
    read): changes whenever a file is renamed in. A short string, so that the caches hash it
    at once (hashing the entries themselves, run by run, cost the runs table a second a rerun)."""
    try:
        entries = []
        for e in os.scandir(path):
            st_ = e.stat()
            entries.append((e.name, st_.st_mtime_ns, st_.st_size))
    except OSError:
        return ""
    return hashlib.blake2b(repr(sorted(entries)).encode(), digest_size=16).hexdigest()


# -- one run ---------------------------------------------------------------------------------------

@dataclass
class RunData:
    """Everything a page needs about one run; `error` set when the run cannot be read."""
    path: str
    run_id: str
    error: str | None = None
    detail: str | None = None  # traceback of an unexpected failure, for an expander
    manifest: dict = field(default_factory=dict)
    summary: pd.DataFrame = field(default_factory=pd.DataFrame)
    metrics: pd.DataFrame = field(default_factory=pd.DataFrame)
    calibration: dict | None = None
    example: bool = False  # a committed example run (real GPU capture shipped with the repo)

    @property
    def gpu(self) -> str | None:
        return (self.manifest.get("env") or {}).get("gpu_name")

    @property
    def is_cpu(self) -> bool:
        return self.manifest.get("device") != "cuda"

    @property
    def title(self) -> str:
        exp = self.manifest.get("experiment") or {}
        where = self.gpu or "CPU"
        tag = " · example run (committed with the repository)" if self.example else ""
        return f"{exp.get('name', '?')} · op {exp.get('op', '?')} · {where} · {self.run_id}{tag}"


def _read_run(path: str, cal_roots: tuple[str, ...]) -> RunData:
    rd = RunData(path=path, run_id=Path(path).name,
                 example=Path(path).resolve().parent == EXAMPLES_ROOT.resolve())
    try:
        rd.manifest = store.load_manifest(path)
        rd.example = rd.example or bool(rd.manifest.get("example"))
        rd.metrics = store.load_metrics(path)
        rd.summary = summary_frame(path, rd.metrics)
    except HarnessError as exc:  # StoreError: bad manifest, unreadable parquet
        rd.error = str(exc)
        return rd
    except Exception as exc:  # a malformed table: shown on this run's card, the app goes on
        rd.error = f"{path}: unreadable run ({type(exc).__name__}: {exc})"
        rd.detail = traceback.format_exc()
        return rd
    if not len(rd.summary):
        status = rd.manifest.get("status")
        rd.error = (f"{path}: no cases recorded (status {status!r}; the cases table is missing "
                    "or empty: a half-written run?)")
        return rd
    rd.calibration = store.run_calibration(path, *cal_roots)
    return rd


@st.cache_data(show_spinner=False, max_entries=64)
def _cached_run(path: str, stamp: str, cal_roots: tuple[str, ...]) -> RunData:
    return _read_run(path, cal_roots)


def _cal_roots(roots: list[Root] | None) -> tuple[str, ...]:
    return tuple(r.path for r in roots or [])


def load_run(path: str, roots: list[Root] | None = None) -> RunData:
    return _cached_run(str(path), stamp(path), _cal_roots(roots))


def error_card(run_id: str, message: str, detail: str | None = None) -> None:
    """The card an unreadable run gets in place of its content; the rest of the app goes on."""
    with st.container(border=True):
        st.error(f"**{run_id}** cannot be shown: {message}", icon=":material/error:")
        if detail:
            with st.expander("traceback"):
                st.code(detail, language="text")


def selected_run(key: str = "run_a") -> RunData:
    """The run chosen in the sidebar; stops the page with a card when there is none or it is
    unreadable."""
    path = st.session_state.get(key) or NONE
    if not path:
        st.info("No runs in the stores yet. Make one with "
                "`python -m harness run experiments/softmax.yaml`.")
        st.stop()
    rd = load_run(path, st.session_state.get("roots"))
    if rd.error:
        error_card(rd.run_id, rd.error, rd.detail)
        st.stop()
    return rd


# -- the run page ----------------------------------------------------------------------------------


def _flags(x) -> list[str]:
    if isinstance(x, str) and x:
        try:
            v = json.loads(x)
        except json.JSONDecodeError:
            return [x]
        return v if isinstance(v, list) else [str(v)]
    return list(x) if isinstance(x, (list, tuple)) else []


def case_label(params: dict) -> str:
    return " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                    for k, v in (params or {}).items())


def summary_table(df: pd.DataFrame, cpu: bool, manifest: dict | None = None) -> pd.DataFrame:
    """The run's summary for people: one row per case, numbers rounded, empty columns dropped."""
    out = pd.DataFrame({
        "impl": df.impl, "case": df.params.apply(case_label),
        "dtype": df.dtype.map(lambda d: DTYPE_SHORT.get(d, d)),
        "status": df.status, "correct": df.get("correct"),
        "median ms": df.get("median_ms"),
        "spread %": [(_num(h) - _num(lo)) / 2 / _num(m) * 100
                     if _num(m) and _num(h) is not None and _num(lo) is not None else None
                     for m, lo, h in zip(df.get("median_ms"), df.get("p20_ms"), df.get("p80_ms"))],
    })
    if not cpu:  # interpreter timings say nothing about speed
        for col, name in (("speedup_vs_baseline", "speedup"), ("gbps", "GB/s"),
                          ("tflops", "TFLOP/s"), ("pct_of_roof", "% roof"), ("bound", "bound"),
                          ("limiter", "limit (ncu)")):
            if col in df:
                out[name] = df[col]
    for col, name in (("dram_throughput_pct", "DRAM %"), ("excess_traffic", "traffic x min"),
                      ("achieved_occupancy_pct", "occ %"),
                      ("top_stall", "top stall"), ("kernel_count", "kernels"),
                      ("verdict", "verdict")):
        if col in df:
            out[name] = df[col]
    out["flags"] = df.get("flags", pd.Series([None] * len(df))).apply(
        lambda v: "; ".join(_flags(v)))
    from harness.present.show import config_cells

    cols = [c for c in ("op", "impl", "base_impl", "config", "config_source") if c in df]
    # the launch config, where it varies
    configs = config_cells(df[cols].to_dict("records"), manifest)
    if configs is not None:
        out[configs[0]] = configs[1]
    if "code_hash" in df and df["code_hash"].dropna().nunique() > 1:
        out["code"] = df["code_hash"]
    out = out.dropna(axis=1, how="all")
    return out.round(4)


def problems_table(df: pd.DataFrame) -> pd.DataFrame:
    """Cases that are not plainly fine: failed/errored/skipped, incorrect, or flagged."""
    rows = []
    cols = [c for c in ("case_id", "status", "correct", "error", "flags") if c in df]
    for r in df[cols].to_dict("records"):  # of 70-odd columns, the five it reads
        flags = _flags(r.get("flags"))
        incorrect = r.get("correct") is False or r.get("correct") == 0
        if r.get("status") != "ok" or incorrect or flags:
            rows.append({"case_id": r["case_id"], "status": r.get("status"),
                         "correct": r.get("correct"), "error": r.get("error") or "",
                         "flags": "; ".join(flags)})
    return pd.DataFrame(rows, columns=["case_id", "status", "correct", "error", "flags"])


def git_cell(row: dict) -> str:
    """A run's commit as the tables show it: 8 hex digits, `*` when the tree was dirty."""
    sha = row.get("git_sha")
    if not sha:
        return "-"
    return sha[:8] + ("*" if row.get("git_dirty") else "")


def run_facts(rd: RunData) -> dict[str, str]:
    m, env = rd.manifest, rd.manifest.get("env") or {}
    facts = {"status": str(m.get("status")), "device": rd.gpu or f"CPU ({env.get('cpu', '?')})",
             "cases": str(len(rd.summary)),
             "correct": f"{int(rd.summary['correct'].map(lambda v: v is True).sum())}"
                        f"/{len(rd.summary)}",
             "git": git_cell(env) if env else "-"}
    for k in ("torch", "triton", "cuda", "driver"):
        if env.get(k):
            facts[k] = str(env[k])
    return facts


# -- since the previous run (analysis.since) -------------------------------------------------------

@st.cache_data(show_spinner=False, max_entries=32)
def _cached_since(path: str, stamps: tuple):
    from harness.analysis.since import since_data

    return since_data(path)


def since(rd: RunData):
    """The run's since-last-run block (analysis.since.Since), None when its manifest records no
    pair. Cached on the run, its previous run and the store root (new A/A runs move the floor)."""
    prev = (rd.manifest.get("against") or {}).get("path") or ""
    return _cached_since(rd.path, (stamp(rd.path), stamp(prev) if prev else "",
                                   stamp(Path(rd.path).parent)))


def since_impl_table(s) -> pd.DataFrame:
    return pd.DataFrame([{"implementation": i.impl, "paired cases": i.n,
                          "geo-mean before/now": None if i.geo_ratio is None
                          else round(i.geo_ratio, 3),
                          "marks": ", ".join(f"{v} {k}" for k, v in i.counts.items())}
                         for i in s.impls])


def md_escape(text: str) -> str:
    """Literal text inside st.markdown/st.caption (no stray emphasis from `*` or `_`)."""
    return "".join("\\" + ch if ch in "*_`[]<>" else ch for ch in str(text))


# -- roofline / stalls -----------------------------------------------------------------------------

def has_ncu(rd: RunData) -> bool:
    return bool(len(rd.metrics)) and bool((rd.metrics.source == "ncu").any())


def roofline_points(df: pd.DataFrame, intensity: str) -> pd.DataFrame:
    """The cases as roofline points: analytic intensity from the op's counts, or ncu-counted."""
    out = df[["case_id", "impl", "dtype"]].copy()
    out["case"] = df.params.apply(case_label)
    tfl, gbps = df.get("tflops"), df.get("gbps")
    if intensity == "counted":
        out["intensity"] = df.get("counted_intensity")
        out["TFLOP/s"] = df.get("ncu_tflops")
        out["GB/s"] = df.get("ncu_dram_gbps")
    else:
        out["intensity"] = [(_num(t) or 0) * 1e3 / _num(g) if _num(g) else None
                            for t, g in zip(tfl, gbps)] if tfl is not None else None
        out["TFLOP/s"], out["GB/s"] = tfl, gbps
    for col in ("pct_of_roof", "bound"):
        if col in df:
            out[col] = df[col]
    return out.dropna(subset=["intensity"]).round(4)


# -- history ---------------------------------------------------------------------------------------

HISTORY_METRICS = {"median_ms": "median ms", "gbps": "GB/s", "tflops": "TFLOP/s",
                   "speedup_vs_baseline": "speedup vs baseline", "pct_of_roof": "% of roof"}


def history_frame(runs: pd.DataFrame, roots: list[Root], op: str, gpu: str) -> pd.DataFrame:
    """Every case of `op` across the readable runs on `gpu` ("CPU" for CPU runs), oldest run
    first, with an x label per run."""
    parts = []
    sel = runs[(runs.op == op) & (runs.gpu == gpu) & (runs.problem == "")].iloc[::-1]
    for r in sel.itertuples():
        rd = load_run(r.path, roots)
        if rd.error:
            continue
        d = rd.summary.copy()
        d["shape"] = d.params.apply(case_label) + " " + d.dtype
        d["run_id"], d["created"], d["git"], d["source"] = r.run_id, r.created, r.git, r.source
        d["gpu"] = r.gpu
        d["x"] = f"{r.git if r.git != '-' else 'no git'} · {r.created[5:]} · {r.run_id[-4:]}"
        parts.append(d)
    if not parts:
        return pd.DataFrame(columns=["impl", "shape", "x", "run_id"])
    return pd.concat(parts, ignore_index=True)


# -- timeline --------------------------------------------------------------------------------------

def kernel_rows(metrics: pd.DataFrame, case_order: list[str] | None = None
                ) -> tuple[str | None, pd.DataFrame, pd.DataFrame]:
    """(source, per-kernel rows, per-case totals) from nsys rows, else torch.profiler rows;
    kernel rows in `case_order` (the run's case order), then launch-table order."""
    for source in ("nsys", "torch_profiler"):
        m = metrics[metrics.source == source] if len(metrics) else metrics
        if len(m):
            break
    else:
        return None, pd.DataFrame(), pd.DataFrame()
    k = m[m.kernel != ""].pivot_table(index=["case_id", "kernel"], columns="name",
                                      values="value", aggfunc="first").reset_index()
    k.columns.name = None
    k.insert(2, "short_name", k.kernel.apply(short_kernel_name))
    order = {c: i for i, c in enumerate(dict.fromkeys([*(case_order or []), *m.case_id]))}
    k = k.sort_values("case_id", key=lambda s: s.map(order), kind="stable").reset_index(drop=True)
    tot = m[m.kernel == ""].pivot_table(index="case_id", columns="name", values="value",
                                        aggfunc="first")
    tot.columns.name = None
    return source, k, tot
