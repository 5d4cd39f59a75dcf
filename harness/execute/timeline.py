"""When each phase of a run ran: the manifest's `pass_spans_s`, {phase: [start, end]} in
seconds from the run's start, and `show`'s `timeline` line.

`pass_wall_s` says how long each pass took; with passes that overlap (the checks beside
compile-ahead, the profiler processes started while the time pass ends, --gpus lanes) the
walls do not add up to the total, and only the spans say what the run waited on. Phases:
`compile` (compile-ahead with the checks beside it), `check`, `time` (and `check@gpu1`,
`time@gpu1` per GPU with --gpus), one per profiler process from its turn to its end
(`ncu`, `nsys`, `ncu@gpu0`: its report written), its report's export (`ncu export`), and
`finish` (the tables, the calibration, the validity notes).
"""
from __future__ import annotations

import threading
import time


class Timeline:
    """Phase spans of one invocation (threads of the runner add to it)."""

    def __init__(self, t0: float | None = None) -> None:
        self.t0 = time.monotonic() if t0 is None else t0
        self._spans: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def add(self, name: str, start: float, end: float | None = None) -> None:
        """Phase `name` ran from `start` to `end` (time.monotonic; now when None); a phase
        added again spans both."""
        end = time.monotonic() if end is None else end
        with self._lock:
            s = self._spans.get(name)
            self._spans[name] = [min(s[0], start), max(s[1], end)] if s else [start, end]

    def record(self) -> dict[str, list[float]]:
        """{phase: [start s, end s]} from the run's start (unordered: the manifest sorts its
        keys; timeline_line orders the phases by start)."""
        with self._lock:
            return {k: [round(a - self.t0, 2), round(b - self.t0, 2)]
                    for k, (a, b) in self._spans.items()}


def timeline_line(spans: dict[str, list[float]]) -> str:
    """`timeline (s): compile 0.0-27.7 · check 10.2-69.8 · ...` in order of start (`show`,
    after the walls)."""
    order = sorted(spans.items(), key=lambda kv: (kv[1][0], kv[0]))
    return "timeline (s): " + " · ".join(f"{k} {a:.1f}-{b:.1f}" for k, (a, b) in order)


def profiler_line(walls: dict[str, dict]) -> str | None:
    """`profiler processes (s from each turn): ncu to its first case 0.0, after its last 0.7 ·
    nsys@gpu1 (120 cases) to its first case 6.3, ...`: what each profiler process spent besides
    its cases (the manifest's `profiler_wall_s`, ProfilerPass.phases): before its first case
    it loaded what it had not loaded while it waited (`set up X after its turn`: it had not
    even started up when its turn came), after its last the profiler wrote its report. A
    pass whose processes ran nothing (every profile carried from an earlier run) has no such
    figures and is left out; None when nothing is left (`show`, after the timeline)."""
    parts = []
    for name, rec in sorted(walls.items()):
        if not isinstance(rec, dict):
            continue
        for p in rec.get("processes") or [rec]:  # a pass of one process: its own record
            if "to_first_case_s" not in p:
                continue
            label = name if p.get("gpu") is None else \
                f"{name}@gpu{p['gpu']} ({p.get('cases')} cases)"
            bits = [f"to its first case {p['to_first_case_s']:.1f}"]
            if (p.get("ready_s") or 0) >= 0.05:  # its turn came before it had set itself up
                bits.insert(0, f"set up {p['ready_s']:.1f} after its turn")
            if "after_last_s" in p:
                bits.append(f"after its last {p['after_last_s']:.1f}")
            parts.append(f"{label} " + ", ".join(bits))
    return "profiler processes (s from each turn): " + " · ".join(parts) if parts else None


def plan_line(plan: dict | None, spans: dict[str, list[float]]) -> str | None:
    """`profilers' plan (at 50.3 s): GPU 0 done at ~75.4 s, ended 81.6 · GPU 1 ...`: when the
    deal of the profiler processes onto the GPUs (the manifest's `profiler_plan`) expected
    each GPU's last one to end, against when it did (its last `<pass>@gpu<i>` span); None
    without a plan (one GPU)."""
    if not isinstance(plan, dict) or not plan.get("gpus"):
        return None
    parts = []
    for g in plan["gpus"]:
        ended = [b for k, (_a, b) in spans.items() if k.endswith(f"@gpu{g['gpu']}")
                 and k.split("@")[0] in (g.get("cases") or {})]
        parts.append(f"GPU {g['gpu']} done at ~{g['end_s']:.1f} s"
                     + (f", ended {max(ended):.1f}" if ended else ""))
    return f"profilers' plan (at {plan['at_s']:.1f} s): " + " · ".join(parts)
