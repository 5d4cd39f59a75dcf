"""What explains a pair's change, from the two results rows and the metrics that moved: the
launch config, the compiled kernels (registers, spills, shared memory), occupancy, DRAM,
kernels per call, the top stall, the SM clock and the code hash (`evidence`); and which
autotuned kernels chose differently (`autotune_note`). harness.analysis.compare attaches it to
every pair; since and the reports show it."""
from __future__ import annotations

import json
import math

from harness.analysis.diff import clock_moved, clock_ratio
from harness.values import finite as _num

# ncu/nsys metrics worth naming as evidence (canonical names) -> (label, format)
EVIDENCE_METRICS = {
    "block_size": ("block", "{:.0f}"), "grid_size": ("grid", "{:.0f}"),
    "registers_per_thread": ("regs", "{:.0f}"), "shared_mem_per_block_bytes": ("smem", "{:.0f} B"),
    "achieved_occupancy_pct": ("occupancy", "{:.0f}%"),
    "dram_throughput_pct": ("DRAM", "{:.0f}%"), "kernel_count": ("kernels/call", "{:.0f}"),
}
LAUNCH = ("block_size", "grid_size")  # named only when the results carry no `config`
COMPILED = ("registers_per_thread", "shared_mem_per_block_bytes")  # ... no `compiled`
# fields of the results' `compiled` records (one per launched Triton kernel) -> short labels
COMPILED_LABELS = {"registers": "regs", "n_regs": "regs", "spills": "spills", "n_spills": "spills",
                   "shared_bytes": "smem", "shared": "smem", "num_warps": "warps",
                   "num_stages": "stages", "launches": "launches"}


def _record(v):
    """A results cell holding a dict (or its JSON) -> dict; a plain value -> itself; None."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, str):
        try:
            parsed = json.loads(v)
        except json.JSONDecodeError:
            return v
        return parsed if parsed is not None else None
    return dict(v) if hasattr(v, "keys") else v


def _flat(d: dict, prefix: str = "") -> dict:
    """{tuner: {field: value}} -> {"tuner.field": value} (a flat dict stays as it is)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(a, b) -> str | None:
    """What changed in the launch configs (None when unknown on a side or equal). Configs are
    the results' JSON {tuner: {field: value}}; per tuner, one or two changed fields are named
    (`config BLOCK_N 64 → 128, num_stages 3 → 2`), more as whole tuples
    (`config (BLOCK_M, BLOCK_N, num_warps, num_stages) (128, 64, 8, 3) → (64, 32, 4, 2)`); the
    tuner's short name leads when the case has several (`dq.num_stages 2 → 3`)."""
    a, b = _record(a), _record(b)
    if a is None or b is None or a == b:
        return None
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return f"config {a} → {b}"
    if not all(isinstance(v, dict) for v in (*a.values(), *b.values())):
        a, b = {"": a}, {"": b}
    tuners = list(dict.fromkeys([*a, *b]))
    parts = []
    for t in tuners:
        x, y = a.get(t) or {}, b.get(t) or {}
        fields = list(dict.fromkeys([*x, *y]))
        moved = [f for f in fields if x.get(f) != y.get(f)]
        if not moved:
            continue
        lead = f"{t.rsplit('.', 1)[-1]}." if len(tuners) > 1 and t else ""
        if len(moved) <= 2:
            parts += [f"{lead}{f} {_v(x.get(f))} → {_v(y.get(f))}" for f in moved]
        else:
            def tup(d):
                return "(" + ", ".join(_v(d.get(f)) for f in fields) + ")"
            parts.append(f"{lead}({', '.join(fields)}) {tup(x)} → {tup(y)}")
    return "config " + ", ".join(parts) if parts else None


def _v(v) -> str:
    return "-" if v is None else str(v)


def autotune_note(rows: list[dict], base_rows: dict, cand_rows: dict, limit: int = 3
                  ) -> str | None:
    """`the autotuner chose differently than in the earlier run in 2 cases: triton N=4096 fp16
    (config BLOCK_SIZE 1024 → 2048); …` for the pairs where a `triton.autotune` kernel picked
    (config_source autotune on a side) another config; None where none did. Said whether or
    not the time moved: an autotuner choosing anew each run is where run-to-run changes of
    unchanged code come from."""
    moved = []
    for row in rows:
        rb, rc = base_rows[row["base_case_id"]], cand_rows[row["cand_case_id"]]
        if "autotune" not in (rb.get("config_source"), rc.get("config_source")):
            continue
        diff = config_diff(rb.get("config"), rc.get("config"))
        if diff:
            moved.append(f"{row['key']} ({diff})")
    if not moved:
        return None
    return (f"the autotuner chose differently than in the earlier run in {len(moved)} "
            f"case{'s' if len(moved) != 1 else ''}: {'; '.join(moved[:limit])}"
            + (f" … and {len(moved) - limit} more" if len(moved) > limit else ""))


def _kernels(v) -> list[dict] | None:
    """The `compiled` record as a list of per-kernel dicts; None when nothing was recorded
    (a CPU run records [])."""
    v = _record(v)
    if isinstance(v, dict):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(k, dict) for k in v):
        return None
    return v


def compiled_diff(a, b) -> list[str] | None:
    """`regs 186 → 168`, `spills 0 → 4`, `smem 16384 → 32768` from the results' `compiled`
    records, kernel by kernel (named when there are several); None when a side has none (the
    ncu metrics stand in)."""
    ka, kb = _kernels(a), _kernels(b)
    if ka is None or kb is None:
        return None
    out = []
    if len(ka) != len(kb):
        out.append(f"compiled kernels {len(ka)} → {len(kb)}")
    if len(ka) == 1 and len(kb) == 1:
        pairs = [("", ka[0], kb[0])]
    else:
        by_name = {str(k.get("kernel")): k for k in kb}
        pairs = [(f"{k.get('kernel')} ", k, by_name[str(k.get("kernel"))]) for k in ka
                 if str(k.get("kernel")) in by_name]
    for prefix, x, y in pairs:
        for k in dict.fromkeys([*x, *y]):
            va, vb = _num(x.get(k)), _num(y.get(k))
            if va is None or vb is None or va == vb or isinstance(x.get(k), bool):
                continue
            out.append(f"{prefix}{COMPILED_LABELS.get(k, k)} {va:g} → {vb:g}")
    return out


def evidence(rb: dict, rc: dict, moved_rows: list[dict]) -> list[str]:
    """What explains a change: launch config, registers/spills/shared memory, occupancy, DRAM,
    kernels per call, top stall (`moved_rows`: the pair's records of the metrics `compare`
    found moved), and the code hash."""
    out = []
    cfg = config_diff(rb.get("config"), rc.get("config"))
    has_cfg = _record(rb.get("config")) is not None and _record(rc.get("config")) is not None
    if cfg:
        out.append(cfg)
    comp = compiled_diff(rb.get("compiled"), rc.get("compiled"))
    out += comp or []
    moved = {r["name"]: r for r in moved_rows}
    for name in [*EVIDENCE_METRICS, "top_stall"]:  # launch, compiled, occupancy, DRAM, ...
        r = moved.get(name)
        if r is None or (name in LAUNCH and has_cfg) or (name in COMPILED and comp is not None):
            continue
        if name == "top_stall":
            out.append(f"top stall {r['base'] or '-'} → {r['cand'] or '-'}")
        else:
            label, fmt = EVIDENCE_METRICS[name]
            out.append(f"{label} {fmt.format(r['base'])} → {fmt.format(r['cand'])}")
    if clock_moved(clock_ratio(rb, rc)):
        out.append(f"SM clock {_num(rb.get('sm_clock_timed_mhz')):.0f} → "
                   f"{_num(rc.get('sm_clock_timed_mhz')):.0f} MHz")
    ha, hb = rb.get("code_hash"), rc.get("code_hash")
    if isinstance(ha, str) and isinstance(hb, str):
        out.append("code changed" if ha != hb else "same code")
    return out
