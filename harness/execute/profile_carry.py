"""Profiles carried over: a profiler pass does not profile again a case whose profile cannot
have changed since the previous run of its experiment.

In the loop a user edits one implementation and runs the experiment again; the profiler passes
then profiled every case again, the baseline's and the peers' too (flash.yaml's next run on an
H100: ncu 26.6 s, of which naive 7.1 s and torch_compile 5.8 s; nsys 19.3 s for 280 cases). A
case's profile is taken over from the latest earlier run of the experiment (`source`: the
profiler's rows of the metrics table, and of the tables it writes beside it, Profiler.tables:
ncu's source lines) when all of these agree:

- the run: the device, the GPU model, driver, torch and triton (previous.GPU_KEYS) and cuDNN;
  the profiler itself (`tool`: its executable and version, as its availability check reads
  them; a version it cannot read carries nothing); the pass's options in the experiment; the
  harness's profiler code (`code`: a hash of harness/profilers/, which turns reports into
  metrics, and of the worker's profiled call); and the op's own code (`op_code`: the modules
  that make its inputs and bind its calls), recorded per pass in the manifest's
  `profiler_wall_s`;
- the case: its id, its status `ok` in both runs, its `code_hash` (the source of the
  implementation and every Triton kernel it reaches), its launch config and what it compiled
  to (`compiled`: kernels, registers, spills, constexprs; recorded in both runs, and for a
  Triton implementation naming its kernels); a torch.compile case (or one of a backend this
  code does not know) also the same host and kernel cache folders, where Inductor's kernels
  and its config choices live; and the earlier run profiled it (its rows are there) in a pass
  that ended `done`.

The pass then profiles only the other cases (none: no profiler process starts), and says so:
`done: 6 of 7 cases carried from <run>` (the manifest's `profiler_wall_s.<pass>.carried`).
The check and time passes run every case: a case's times are always this run's (nsys's own
kernel times of a carried case are the earlier run's). `run --reprofile` profiles every case.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from harness import store
from harness.errors import HarnessError
from harness.execute.previous import GPU_KEYS, earlier_runs
from harness.values import same_cell

RUN_KEYS = ("tool", "code", "op_code", "options", "cudnn")  # of the pass's record: the same
CASE_KEYS = ("code_hash", "config", "compiled")  # of the case's results row: all the same
# the store tables a profiler may write beside the metrics (Profiler.tables): their loaders
LOADERS = {"source_lines": store.load_source_lines}


def profiler_code() -> str:
    """12 hex chars over the sources of harness/profilers/ (the commands and the parsers that
    make metrics) and of the worker's profiled call (what runs inside the range)."""
    import inspect

    from harness.execute.worker import Worker

    h = hashlib.sha256()
    folder = Path(__file__).resolve().parent.parent / "profilers"
    for path in sorted(folder.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    for fn in (Worker._warm_then_range, Worker.do_profile, Worker.do_torch_profiler):
        h.update(inspect.getsource(fn).encode())
    return h.hexdigest()[:12]


def op_code(op) -> str | None:
    """12 hex chars over the sources of the modules that make the op's inputs and bind its
    calls (an input's layout or distribution changed there changes every profile); None when
    they cannot be read."""
    import inspect
    import sys

    names = sorted({getattr(f, "__module__", None) for f in (
        getattr(op, a, None) for a in ("_make_inputs", "_call_kwargs", "_make_out", "_bind"))
        if callable(f)} - {None})
    h = hashlib.sha256()
    try:
        for name in names:
            h.update(name.encode())
            h.update(inspect.getsource(sys.modules[name]).encode())
    except (KeyError, OSError, TypeError):
        return None
    return h.hexdigest()[:12]


def pass_record(tool: str, options, op=None) -> dict:
    """What a pass records (in `profiler_wall_s.<pass>`) for a later run to carry from it."""
    return {"tool": tool, "code": profiler_code(), "op_code": op_code(op) if op else None,
            "options": _options(options), "cudnn": _cudnn()}


def _cudnn() -> int | None:
    """cuDNN's version (library kernels: it can change apart from torch's own)."""
    import sys

    torch = sys.modules.get("torch")
    try:
        return int(torch.backends.cudnn.version()) if torch is not None else None
    except Exception:
        return None


def plan(run_dir: Path, prof_name: str, prof, tool: str, options, op,
         cases: list[str]) -> tuple[dict, "Carry | None"]:
    """(this pass's record, Carry or None). Best effort: whatever goes wrong here, the pass
    profiles every case."""
    try:
        record = pass_record(tool, options, op)
    except Exception:  # a record that cannot be made: nothing carried now or from it
        return {}, None
    try:
        prev = previous(run_dir, prof_name, record)
        ids = carried_cases(run_dir, prev, prof.source, cases, op) if prev is not None else []
        if not ids:
            return record, None
        rows, tables = carried_rows(prev, prof.source, ids, tuple(getattr(prof, "tables", ())))
    except Exception:
        return record, None
    return record, Carry(prev, ids, len(cases), rows, tables)


@dataclass
class Carry:
    """What a pass takes over: from run `prev`, the cases `ids` of its `total`, their metrics
    `rows` and their rows of the other `tables`."""
    prev: Path
    ids: list[str]
    total: int
    rows: pd.DataFrame
    tables: dict[str, pd.DataFrame]

    @property
    def state(self) -> str:
        return f"done: {len(self.ids)} of {self.total} cases carried from {self.prev.name}"


def _options(options) -> dict:
    dump = getattr(options, "model_dump", None)
    if dump is not None:
        return json.loads(json.dumps(dump(mode="json"), default=str))
    return json.loads(json.dumps(vars(options) if hasattr(options, "__dict__") else {},
                                 default=str))


def previous(run_dir: Path, prof_name: str, record: dict) -> Path | None:
    """The latest earlier run of the experiment whose `prof_name` pass ended `done` with the
    same tool, code and options on the same GPU and software; None when the latest earlier
    run that ran the pass differs (an older one is not looked for: its cases would have to be
    unchanged across the runs between)."""
    m = store.load_manifest(run_dir)
    if m.get("reprofile") or m.get("device") != "cuda":
        return None
    env = m.get("env") or {}
    for prev in earlier_runs(run_dir):
        if prev.name >= Path(run_dir).name:  # a newer run (this one resumed late)
            continue
        try:
            pm = store.load_manifest(prev)
        except HarnessError:
            return None
        state = (pm.get("passes") or {}).get(prof_name)
        if not isinstance(state, str) or state.startswith("skipped"):
            continue  # it did not run the pass: the one before may have
        old = (pm.get("profiler_wall_s") or {}).get(prof_name) or {}
        same = (state.startswith("done") and not state.startswith("done (")
                and all((pm.get("env") or {}).get(k) == env.get(k) for k in GPU_KEYS)
                and record.get("op_code") is not None
                and "version unknown" not in str(record.get("tool"))
                and all(old.get(k) == record.get(k) for k in RUN_KEYS))
        return prev if same else None
    return None


def carried_cases(run_dir: Path, prev: Path, source: str, cases: list[str],
                  op=None) -> list[str]:
    """The cases of `cases` whose `source` profile `prev` holds and whose code, config and
    compiled kernels are those of this run (status ok in both; see the module doc)."""
    try:
        now, old = store.load_results(run_dir), store.load_results(prev)
        cnow, cold = store.load_cases(run_dir), store.load_cases(prev)
        metrics = store.load_metrics(prev)
        m_now, m_old = store.load_manifest(run_dir), store.load_manifest(prev)
    except HarnessError:
        return []
    if not len(metrics) or any(k not in t.columns for k in CASE_KEYS for t in (now, old)):
        return []
    have = set(metrics.case_id[metrics.source == source])
    ok_now = set(cnow.case_id[cnow.status == "ok"])
    ok_old = set(cold.case_id[cold.status == "ok"])
    rows_now = now.set_index("case_id").to_dict("index")
    rows_old = old.set_index("case_id").to_dict("index")
    impl = {r.case_id: (getattr(r, "base_impl", None) or r.impl) for r in cnow.itertuples()}
    # what the compile backend built (Inductor's kernels, its config choices) lives in the
    # host's kernel caches: the same host and cache folders, as compile-ahead asks
    host = (m_now.get("env") or {}).get("hostname")
    same_caches = (host is not None and host == (m_old.get("env") or {}).get("hostname")
                   and m_now.get("kernel_caches") == m_old.get("kernel_caches"))
    out = []
    for c in cases:
        a, b = rows_now.get(c), rows_old.get(c)
        if not (c in have and c in ok_now and c in ok_old and a is not None and b is not None
                and all(isinstance(a.get(k), str) and a.get(k) for k in ("code_hash", "compiled"))
                and all(same_cell(a.get(k), b.get(k)) for k in CASE_KEYS)):
            continue
        backend = _backend(op, impl.get(c))
        if backend == "triton" and a["compiled"].strip() in ("[]", ""):
            continue  # a Triton impl whose kernels were not identified: unknown
        if backend not in ("triton", "torch", "library") and not same_caches:
            continue  # compile (or an unknown backend): its kernels are the host's caches'
        out.append(c)
    return out


def _backend(op, impl) -> str | None:
    try:
        return op.get_impl(impl).backend
    except Exception:  # no op, or an impl it no longer has
        return None


def carried_rows(prev: Path, source: str, case_ids: list[str],
                 tables: tuple[str, ...] = ()) -> tuple[pd.DataFrame, dict]:
    """(`source`'s metrics rows of `case_ids` in `prev`, {table: its rows of them} for the
    `tables` this profiler writes)."""
    keep = set(case_ids)
    metrics = store.load_metrics(prev)
    rows = metrics[(metrics.source == source) & metrics.case_id.isin(keep)]
    out = {}
    for name in tables:
        t = LOADERS[name](prev)
        if len(t) and "case_id" in t.columns:
            out[name] = t[t.case_id.isin(keep)].reset_index(drop=True)
    return rows.reset_index(drop=True), out
