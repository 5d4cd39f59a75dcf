"""parts/: the durable per-pass records workers append (one JSON line per case), read back
by the driver and every reader of a run in progress. Re-exported by harness.store."""
from __future__ import annotations

import json
import os
from pathlib import Path


def parts_path(run_dir: Path, pass_name: str, shard: str | None = None) -> Path:
    """parts/<pass>.jsonl, or parts/<pass>.<shard>.jsonl for one of several concurrent writers
    (each process appends only to its own file, so records of any size never interleave)."""
    name = pass_name if shard is None else f"{pass_name}.{shard}"
    return Path(run_dir) / "parts" / f"{name}.jsonl"


def _part_files(run_dir: Path, pass_name: str) -> list[Path]:
    base = parts_path(run_dir, pass_name)
    shards = sorted(base.parent.glob(f"{pass_name}.*.jsonl")) if base.parent.is_dir() else []
    return ([base] if base.exists() else []) + [p for p in shards if p.exists()]


REPEAT_PREFIX = "time_p"  # parts/time_p2.jsonl ...: the time pass's later worker processes


def time_parts(processes: int) -> tuple[str, ...]:
    """The parts holding a case's timings: `time` (the time pass's first process), then
    `time_p2` ... `time_p<processes>`."""
    return ("time", *(f"{REPEAT_PREFIX}{k}" for k in range(2, int(processes) + 1)))


def repeat_index(part: str | None) -> int:
    """Which of the time pass's processes wrote `part`: 0 for `time` (or none), k - 1 for
    `time_p<k>`."""
    if part and part.startswith(REPEAT_PREFIX) and part[len(REPEAT_PREFIX):].isdigit():
        return int(part[len(REPEAT_PREFIX):]) - 1
    return 0


def append_part(run_dir: Path, pass_name: str, record: dict, shard: str | None = None) -> None:
    path = parts_path(run_dir, pass_name, shard)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, default=_json_default) + "\n"
    with open(path, "a") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def _json_default(o):
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def read_parts(run_dir: Path, pass_name: str) -> list[dict]:
    """Records of one pass over all its part files; the last record per case wins (a case is
    in one shard at a time; files are read oldest first); a torn trailing line is skipped."""
    out: dict[str, dict] = {}
    files = sorted(_part_files(run_dir, pass_name), key=lambda p: p.stat().st_mtime_ns)
    for path in files:
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "case_id" in rec:
                out[rec["case_id"]] = rec
    return list(out.values())


def clear_parts(run_dir: Path, pass_name: str) -> None:
    """Forget a pass's records (a profiler pass is redone whole: it makes one report)."""
    for path in _part_files(run_dir, pass_name):
        path.unlink(missing_ok=True)
