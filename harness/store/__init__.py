"""The run store: the only module that knows the on-disk layout.

    <root>/<run_id>/manifest.json      schema_version, experiment, spec hash, env, status, passes
    <root>/<run_id>/cases.parquet      case_id, op, impl, role, params (JSON), dtype, status, error
    <root>/<run_id>/results.parquet    correctness + timing + derived throughput/speedup per case
    <root>/<run_id>/samples.parquet    raw timing samples: case_id, i, ms
    <root>/<run_id>/metrics.parquet    long format: case_id, source, kernel, name, value, unit
    <root>/<run_id>/source_lines.parquet  warp-stall samples per kernel source line (ncu)
    <root>/<run_id>/ab.parquet         `harness ab`'s interleaved rounds (the pair's head run)
    <root>/<run_id>/parts/<pass>.jsonl append-only records written by workers as they go
                                       (<pass>.<shard>.jsonl: one file per concurrent worker)
    <root>/<run_id>/tuner_picks.json   launch configs the Tuners timed, reused by later workers
                                       (tuner_picks.<shard>.json: one file per concurrent worker)
    <root>/<run_id>/raw/               profilers' own files and logs
    <root>/.calibration/<gpu>.json     measured ceilings per GPU (harness calibrate)
    <root>/.trees/<name>-<sha>/        a commit's source tree, materialised for `harness ab`

Every file is written to a temporary name and renamed into place, so a reader never sees half a
file; parts/*.jsonl are appended line by line and a torn last line is ignored on read.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from harness.errors import StoreError

MANIFEST_LOCK = threading.RLock()  # update_manifest: one read-change-write at a time

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
TABLES = ("cases", "results", "samples", "metrics", "source_lines", "ab")

# impl: the candidate's name (a registered impl, a named config, or a variant `impl[k=v,...]`);
# base_impl: the registered impl it runs; forced_config: JSON {tunable: value} it fixes, or null
CASE_COLUMNS = ["case_id", "op", "impl", "role", "params", "dtype", "status", "error",
                "base_impl", "forced_config"]
# provenance: config = JSON {tuner: {field: value}} of the launch configs used; config_source =
# forced | tuned | autotune | single | interpreter (harness.tuning); code_hash = 12 hex of the
# impl's module + reachable triton.jit sources; compiled = JSON list per Triton kernel launched
# (GPU only: kernel, registers, spills, shared_bytes, num_warps, num_stages, constexprs)
RESULT_COLUMNS = [
    "case_id", "correct", "max_abs_err", "rel_err", "tol", "torch_err", "median_ms", "p20_ms",
    "p80_ms", "iqr_ms", "n_samples", "rel_stderr", "clock", "tflops", "gbps", "peak_mem_bytes",
    "speedup_vs_baseline", "expected_kernels", "flags", "config", "config_source", "code_hash",
    "compiled", "sm_clock_timed_mhz", "process_medians_ms",
]
# process: which of the time pass's worker processes took the sample (0, 1, ...; runs stored
# before the time pass used several have no such column). process_medians_ms above: JSON list
# of each process's median, in process order: the case's own between-process spread
SAMPLE_COLUMNS = ["case_id", "i", "ms", "process"]
METRIC_COLUMNS = ["case_id", "source", "kernel", "name", "value", "unit"]
# warp-stall PC samples per kernel source line (ncu SourceCounters): share of the kernel's
# samples, stall_mix = JSON {reason: samples}, library = a line of Triton's own package
SOURCE_LINE_COLUMNS = ["case_id", "kernel", "file", "line", "text", "samples", "share",
                       "stall_mix", "library"]
# `harness ab` (the head run of the pair only): its interleaved rounds, one row per round of a
# case: which version went first (base | head), each version's burst median (ms) and the SM
# clock read while the round ran (MHz; None without NVML)
AB_COLUMNS = ["case_id", "round", "first", "base_ms", "head_ms", "clock_mhz"]
COLUMNS = {"cases": CASE_COLUMNS, "results": RESULT_COLUMNS, "samples": SAMPLE_COLUMNS,
           "metrics": METRIC_COLUMNS, "source_lines": SOURCE_LINE_COLUMNS, "ab": AB_COLUMNS}


# -- atomic file helpers -----------------------------------------------------------------------

def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: Path, obj: Any) -> None:
    _atomic_write_bytes(Path(path), (json.dumps(obj, indent=2, sort_keys=True, default=str)
                                     + "\n").encode())


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


# -- run ids and directories -------------------------------------------------------------------

def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "run"


def new_run_id(name: str, now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return f"{now:%Y%m%dT%H%M%SZ}-{_slug(name)}-{secrets.token_hex(2)}"


def create_run(root: str | Path, name: str, manifest: dict) -> Path:
    """Make `<root>/<run_id>/` (never reusing an id) and write its first manifest."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        run_id = new_run_id(name)
        run_dir = root / run_id
        try:
            run_dir.mkdir()
            break
        except FileExistsError:
            continue
    else:  # pragma: no cover - 100 collisions of 16 random bits in the same second
        raise StoreError(f"{root}: could not allocate a new run id")
    (run_dir / "parts").mkdir()
    (run_dir / "raw").mkdir()
    write_manifest(run_dir, {**manifest, "run_id": run_id, "schema_version": SCHEMA_VERSION})
    return run_dir


def write_manifest(run_dir: Path, manifest: dict) -> None:
    write_json(Path(run_dir) / MANIFEST, manifest)


def update_manifest(run_dir: Path, **changes) -> dict:
    """Read, change and write the manifest, one thread of this process at a time (the runner
    plans its profiler passes in a thread while its measure passes end)."""
    with MANIFEST_LOCK:
        m = load_manifest(run_dir)
        m.update(changes)
        write_manifest(run_dir, m)
        return m


def load_manifest(run_dir: str | Path) -> dict:
    path = Path(run_dir) / MANIFEST
    if not path.exists():
        raise StoreError(f"{run_dir}: not a run directory (no {MANIFEST})")
    try:
        m = read_json(path)
    except json.JSONDecodeError as exc:
        raise StoreError(f"{path}: corrupt manifest ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(m, dict) or "schema_version" not in m:
        raise StoreError(f"{path}: not a kernel-lab manifest (no schema_version)")
    if m["schema_version"] > SCHEMA_VERSION:
        raise StoreError(f"{path}: schema_version {m['schema_version']} is newer than this "
                         f"harness understands ({SCHEMA_VERSION}); upgrade kernel-lab")
    return m


def resolve_run(ref: str | Path, root: str | Path = "runs") -> Path:
    """A run id (looked up under `root`, unique prefixes allowed) or a run directory path."""
    p = Path(ref)
    if (p / MANIFEST).exists():
        return p
    root = Path(root)
    if (root / str(ref) / MANIFEST).exists():
        return root / str(ref)
    if root.is_dir():
        hits = sorted(d for d in root.iterdir() if d.name.startswith(str(ref)) and
                      (d / MANIFEST).exists())
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise StoreError(f"run {ref!r} is ambiguous under {root}: "
                             f"{', '.join(h.name for h in hits[:5])}")
    raise StoreError(f"run {ref!r} not found (looked for a run directory at {p} and a run id "
                     f"under {root}/)")


def driver_record() -> dict:
    """Who runs this run: recorded at start so a reader can tell a SIGKILLed run from a live one."""
    import socket

    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.now(timezone.utc).isoformat()}


def _pid_alive(pid: int, started: str | None = None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    began = _process_start(pid)
    if began is not None and started:  # a recycled pid: that process began after the driver
        try:
            return began <= datetime.fromisoformat(started).timestamp() + 2.0
        except ValueError:
            return True
    return True


def _process_start(pid: int) -> float | None:
    """Unix time a process started (Linux /proc), None where that cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                     if line.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def effective_status(m: dict) -> str | None:
    """The manifest's status, except that a `running` run whose driver process is gone (killed
    with SIGKILL, OOM, a power cut) is `interrupted` (resumable). Only a driver on this host can
    be checked; a run driven from another host keeps its recorded status."""
    import socket

    status = m.get("status")
    drv = m.get("driver") or {}
    if status != "running" or not drv.get("pid") or drv.get("host") != socket.gethostname():
        return status
    return "running" if _pid_alive(int(drv["pid"]), drv.get("started")) else "interrupted"


def list_runs(*roots: str | Path) -> list[dict]:
    """One row per run directory under the roots; unreadable runs come back with `error`."""
    rows = []
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        for d in sorted(root.iterdir()):
            if not d.is_dir() or d.name.startswith("."):
                continue
            if not (d / MANIFEST).exists() and not (d / "cases.parquet").exists():
                continue
            row = {"run_id": d.name, "path": str(d), "root": str(root), "error": None}
            try:
                m = load_manifest(d)
                row.update(
                    experiment=m.get("experiment", {}).get("name"),
                    op=m.get("experiment", {}).get("op"),
                    created=m.get("created_utc"),
                    status=effective_status(m),
                    gpu=(m.get("env") or {}).get("gpu_name"),
                    git_sha=(m.get("env") or {}).get("git_sha"),
                    git_dirty=(m.get("env") or {}).get("git_dirty"),
                    device=m.get("device"),
                    example=bool(m.get("example")),
                )
            except StoreError as exc:
                row["error"] = str(exc)
            rows.append(row)
    rows.sort(key=lambda r: (r.get("created") or "", r["run_id"]))
    return rows


# -- tables --------------------------------------------------------------------------------------

def write_table(run_dir: Path, name: str, df: pd.DataFrame) -> None:
    if name not in COLUMNS:
        raise ValueError(f"unknown table {name!r}")
    cols = COLUMNS[name]
    df = df.copy()
    for c in cols:
        if c not in df.columns:
            df[c] = None
    extra = [c for c in df.columns if c not in cols]
    df = df[cols + extra].reset_index(drop=True)
    path = Path(run_dir) / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _load_table(run_dir: str | Path, name: str) -> pd.DataFrame:
    path = Path(run_dir) / f"{name}.parquet"
    if not path.exists():
        return pd.DataFrame(columns=COLUMNS[name])
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise StoreError(f"{path}: unreadable parquet ({type(exc).__name__}: {exc})") from None


def check_tables(run_dir: str | Path, *names: str) -> None:
    """Raise StoreError for a table among `names` whose parquet footer cannot be read (a torn
    or foreign file). Reads the footers only: cheap enough for every run of a store, where
    loading the tables is not; a table damaged inside a valid footer shows on its load."""
    import pyarrow.parquet as pq

    for name in names:
        path = Path(run_dir) / f"{name}.parquet"
        if not path.exists():
            continue
        try:
            pq.read_metadata(path)
        except Exception as exc:  # pyarrow raises several types for a corrupt file
            raise StoreError(f"{path}: unreadable parquet ({type(exc).__name__}: {exc})"
                             ) from None


def load_cases(run_dir) -> pd.DataFrame:
    return _load_table(run_dir, "cases")


def case_status_counts(run_dir: str | Path) -> dict[str, int]:
    """{status: cases} of a run, from cases.parquet's status column alone: where the footer's
    statistics say every row group holds one status, from the footer only. What a listing of
    many runs needs, without loading them ({} when the table is missing or empty)."""
    import pyarrow.parquet as pq

    path = Path(run_dir) / "cases.parquet"
    if not path.exists():
        return {}
    try:
        pf = pq.ParquetFile(path)
        meta = pf.metadata
        if meta.num_rows == 0:
            return {}
        col = meta.schema.names.index("status")
        one = set()
        for i in range(meta.num_row_groups):
            stats = meta.row_group(i).column(col).statistics
            if (stats is None or not stats.has_min_max or stats.null_count != 0
                    or stats.min != stats.max or not getattr(stats, "is_min_value_exact", True)):
                break
            one.add(stats.min)
        else:
            if len(one) == 1:
                return {one.pop(): meta.num_rows}
        counts = pf.read(columns=["status"]).column("status").value_counts()
        return {c["values"]: c["counts"] for c in counts.to_pylist()}
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise StoreError(f"{path}: unreadable parquet ({type(exc).__name__}: {exc})") from None


def shapes(run_dir) -> dict[str, str]:
    """case_id -> shape_id: the cases that share inputs (and a reference) across impls."""
    cases = load_cases(run_dir)
    if "shape_id" not in cases.columns:
        return {}
    return dict(zip(cases.case_id, cases.shape_id))


def load_results(run_dir) -> pd.DataFrame:
    return _load_table(run_dir, "results")


def load_samples(run_dir) -> pd.DataFrame:
    return _load_table(run_dir, "samples")


def load_metrics(run_dir) -> pd.DataFrame:
    return _load_table(run_dir, "metrics")


def load_ab(run_dir) -> pd.DataFrame:
    """`harness ab`'s rounds (AB_COLUMNS; empty for any other run)."""
    return _load_table(run_dir, "ab")


def tree_dir(root: str | Path, name: str, sha: str) -> Path:
    """Where `harness ab` keeps commit `sha` of repository `name` (its sources, extracted)."""
    return Path(root) / ".trees" / f"{_slug(name)}-{sha[:12]}"


def load_source_lines(run_dir) -> pd.DataFrame:
    """case_id, kernel, file, line, text, samples, share, stall_mix (JSON), library; most
    sampled lines first per kernel. A line stored without a case (a backward's kernel, before
    2026-11-27) takes the one ncu case whose metrics hold its kernel, where exactly one does."""
    df = _load_table(run_dir, "source_lines")
    blank = df.case_id == ""
    if blank.any():
        m = _load_table(run_dir, "metrics").query("source == 'ncu' and case_id != ''")
        one = {k: c[0] for k, c in m.groupby("kernel").case_id.unique().items() if len(c) == 1}
        df.loc[blank, "case_id"] = df.loc[blank, "kernel"].map(one).fillna("")
    return df


# -- parts: durable per-pass records appended by workers (harness.store.parts) ----------------

from harness.store.parts import (REPEAT_PREFIX, _json_default, append_part,  # noqa: E402,F401
                                 clear_parts, parts_path, read_parts, repeat_index, time_parts)

GPU_TIME_PROCESSES = 2  # the time pass's worker processes on a GPU unless the YAML says


def time_processes(run_dir) -> int:
    """How many worker processes the run's time pass spreads each case over: its experiment's
    timing.processes, else GPU_TIME_PROCESSES on a GPU and 1 on the CPU (interpreter timings
    are never judged: a second process there would cost time and tell nothing)."""
    m = load_manifest(run_dir)
    timing = (m.get("experiment") or {}).get("timing") or {}
    if timing.get("processes"):
        return int(timing["processes"])
    return GPU_TIME_PROCESSES if m.get("device") == "cuda" else 1


# -- tuner picks: launch configs timed by one worker, reused by the next -----------------------

def tuner_picks_path(run_dir: Path, shard: str | None = None) -> Path:
    """tuner_picks.json, or tuner_picks.<shard>.json for one of several concurrent workers."""
    name = "tuner_picks.json" if shard is None else f"tuner_picks.{shard}.json"
    return Path(run_dir) / name


def load_tuner_picks(run_dir: Path) -> dict[str, dict[str, dict]]:
    """{tuner: {repr(key): {"config": {...}, "source": ...}}} over all pick files (the
    unsharded file first, then the shards' in name order; a later file wins a clash)."""
    run_dir = Path(run_dir)
    files = sorted(run_dir.glob("tuner_picks.*.json")) if run_dir.is_dir() else []
    main = tuner_picks_path(run_dir)
    out: dict[str, dict[str, dict]] = {}
    for path in ([main] if main.exists() else []) + files:
        try:
            data = read_json(path)
        except (json.JSONDecodeError, OSError):  # a torn file: its picks are timed again
            continue
        for tuner, by_key in (data if isinstance(data, dict) else {}).items():
            if isinstance(by_key, dict):
                out.setdefault(tuner, {}).update(by_key)
    return out


def save_tuner_picks(run_dir: Path, picks: dict[str, dict[str, dict]],
                     shard: str | None = None) -> None:
    """Merge `picks` into this writer's own pick file (atomic rename; one writer per file)."""
    if not picks:
        return
    path = tuner_picks_path(run_dir, shard)
    old: dict = {}
    if path.exists():
        try:
            old = read_json(path)
        except json.JSONDecodeError:
            old = {}
    for tuner, by_key in picks.items():
        old.setdefault(tuner, {}).update(by_key)
    write_json(path, old)


def raw_dir(run_dir: Path, *sub: str) -> Path:
    p = Path(run_dir, "raw", *sub)
    p.mkdir(parents=True, exist_ok=True)
    return p


# -- calibration cache -----------------------------------------------------------------------------

def _gpu_key(gpu_name: str) -> str:
    return _slug(gpu_name or "unknown")


def save_calibration(root: str | Path, gpu_name: str, data: dict) -> Path:
    path = Path(root) / ".calibration" / f"{_gpu_key(gpu_name)}.json"
    write_json(path, {**data, "gpu_name": gpu_name, "schema_version": SCHEMA_VERSION})
    return path


def load_calibration(gpu_name: str | None, *roots: str | Path) -> dict | None:
    if not gpu_name:
        return None
    for root in roots:
        path = Path(root) / ".calibration" / f"{_gpu_key(gpu_name)}.json"
        if path.exists():
            try:
                return read_json(path)
            except json.JSONDecodeError:
                return None
    return None


def run_calibration(run_dir: str | Path, *roots: str | Path) -> dict | None:
    """The ceilings a run is judged against: those measured on its own machine (snapshot in
    the manifest), else the cached ones for its GPU under its store root or `roots`."""
    m = load_manifest(run_dir)
    if m.get("calibration"):
        return m["calibration"]
    if m.get("device") != "cuda":
        return None
    gpu = (m.get("env") or {}).get("gpu_name")
    return load_calibration(gpu, Path(run_dir).parent, *roots)



def params_of(row_params: str) -> dict:
    return json.loads(row_params) if isinstance(row_params, str) else dict(row_params or {})
