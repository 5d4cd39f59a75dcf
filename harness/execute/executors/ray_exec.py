"""Ray tasks run the per-case worker; the driver gathers their records into the store.

`--ray local` starts a Ray instance on this machine (`ray.init()`); `--ray ADDRESS` joins a
cluster (`ray.init(address=ADDRESS)`, code shipped with `runtime_env.working_dir`). The cases
are sharded longest-first onto the cluster's slots (its GPUs for a CUDA run, `num_gpus=1` per
task; its CPUs for a CPU smoke run). Each task copies the run's manifest, cases and check
records into a node-local temporary run directory, on a GPU compiles its JIT-compiling cases
ahead there (harness.execute.executors.warm, a few processes on its GPU; with `--ray local` not
those the previous run on this host compiled with the same code), runs `process.run_shard` (the
same worker, watchdog and crash handling as the local executor), and returns its part records,
host and GPU; the driver appends them to parts/<pass>.ray.jsonl. A task lost with its node
leaves its cases without records: they are submitted again (up to MAX_ROUNDS times). Ray is
optional: `pip install -e '.[ray]'`.
"""
from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

from harness import store
from harness.errors import HarnessError
from harness.execute.executors.base import Executor
from harness.execute.executors.process import (PROJECT_ROOT, measure_parts, time_processes, todo,
                                       worker_env)
from harness.execute.executors.schedule import shard

MAX_ROUNDS = 3
SHIPPED_ENV = ("HARNESS_OPS", "PYTHONPATH", "HARNESS_GIT_SHA", "HARNESS_GIT_DIRTY",
               "HARNESS_TEST_SLOW_S")


def _ray():
    try:
        import ray
    except ImportError:
        raise HarnessError("--ray needs Ray: pip install -e '.[ray]'") from None
    return ray


def _warm(run_dir: Path, warm: list[str], device: str, limits: dict[str, float]) -> dict:
    """Compile-ahead inside a task (harness.execute.executors.warm): its JIT-compiling cases `warm`
    called once by a few processes on the task's GPU, so that its check pass finds the node's
    kernel caches warm. Best effort; {"workers": 0, ...} when there is nothing to do."""
    from harness.execute.executors.warm import compile_ahead, compile_units
    from harness.registry import get_op

    if device != "cuda" or not warm:
        return {"workers": 0, "cases": 0, "wall_s": 0.0}
    op = get_op(store.load_manifest(run_dir)["experiment"]["op"])
    from harness.machine.env import query_gpus

    # this node's GPU, not the driver's (whose env the run's manifest holds)
    mib = [g["gpu_memory_mib"] for g in query_gpus()
           if isinstance(g.get("gpu_memory_mib"), (int, float))]
    return compile_ahead(run_dir, warm, device=device, limits=limits, gpus=[None],
                         on_event=lambda ev: None, units=compile_units(run_dir, op, warm),
                         gpu_mib=min(mib) if mib else 0)


def _task(files: dict[str, bytes], case_ids: list[str], device: str,
          limits: dict[str, float], warm: list[str] | None = None) -> dict:
    """Runs on a Ray worker: a node-local run dir, compile-ahead of `warm`, the usual shard
    loop, records back."""
    from harness.execute.executors.process import run_shard

    gpu = None
    if device == "cuda":
        import ray

        ids = ray.get_gpu_ids()
        gpu = int(ids[0]) if ids else None
    with tempfile.TemporaryDirectory(prefix="harness-ray-") as tmp:
        run_dir = Path(tmp) / "run"
        for name, data in files.items():
            path = run_dir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        (run_dir / "raw").mkdir(exist_ok=True)
        log = store.raw_dir(run_dir, "logs") / "measure.log"
        env = None
        if gpu is not None:  # Ray already set CUDA_VISIBLE_DEVICES for the task
            env = {**worker_env(device), "HARNESS_GPU": str(gpu)}
        warmed = _warm(run_dir, list(warm or []), device, limits)
        run_shard(run_dir, case_ids, device=device, limits=limits, log_path=log,
                  on_event=lambda ev: None, env=env)
        records = {p: [r for r in store.read_parts(run_dir, p) if r["case_id"] in case_ids]
                   for p in measure_parts(time_processes(run_dir))}
        return {"host": socket.gethostname(), "gpu": gpu, "records": records, "warm": warmed,
                "picks": store.load_tuner_picks(run_dir),
                "log": log.read_text(errors="replace")[-20000:]}


class RayExecutor(Executor):
    kind = "ray"

    def __init__(self, address: str):
        self.address = address
        self.ray = _ray()
        self.hosts: set[str] = set()
        self.gpus: set[int] = set()
        self.warmed = {"workers": 0, "cases": 0, "wall_s": 0.0}  # compile-ahead in the tasks

    def describe(self) -> dict:
        return {"kind": self.kind, "address": self.address, "gpus": sorted(self.gpus),
                "hosts": sorted(self.hosts) or [socket.gethostname()]}

    def _init(self) -> None:
        ray = self.ray
        if ray.is_initialized():
            return
        env_vars = {k: os.environ[k] for k in SHIPPED_ENV if k in os.environ}
        if self.address == "local":
            env_vars["PYTHONPATH"] = os.pathsep.join(
                [str(PROJECT_ROOT)] + ([env_vars["PYTHONPATH"]] if "PYTHONPATH" in env_vars
                                       else []))
            ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False,
                     log_to_driver=False, runtime_env={"env_vars": env_vars})
        else:  # the code travels with the job; a node needs only Python + the dependencies
            env_vars.pop("PYTHONPATH", None)
            ray.init(address=self.address, log_to_driver=False, runtime_env={
                "working_dir": str(PROJECT_ROOT), "env_vars": env_vars,
                "excludes": ["runs/", "reports/", ".git/", "tests/fixtures/", ".venv/"]})

    def slots(self, device: str) -> int:
        res = self.ray.cluster_resources()
        n = int(res.get("GPU", 0)) if device == "cuda" else int(res.get("CPU", 1))
        if device == "cuda" and n == 0:
            raise HarnessError(f"--ray {self.address}: the Ray cluster has no GPU "
                               "(use --device cpu for a CPU smoke run)")
        return max(1, n)

    def measure(self, run_dir, case_ids, cost, limits, device, on_event) -> None:
        ray = self.ray
        run_dir = Path(run_dir)
        self._init()
        opts = {"num_gpus": 1, "num_cpus": 1} if device == "cuda" else {"num_cpus": 1}
        remote = ray.remote(max_retries=0, **opts)(_task)
        log = store.raw_dir(run_dir, "logs") / "measure.ray.log"
        warm = set(self.warm_ids(run_dir, case_ids, device))
        parts = measure_parts(time_processes(run_dir))
        for _ in range(MAX_ROUNDS):
            left = self._left(run_dir, parts, case_ids)
            if not left:
                return
            files = self._files(run_dir)
            pending = {remote.remote(files, ids, device, limits,
                                     [c for c in ids if c in warm]): ids
                       for ids in shard(left, cost, min(self.slots(device), len(left)),
                                       store.shapes(run_dir)) if ids}
            for ids in pending.values():
                for c in ids:
                    on_event({"event": "start", "name": "check", "case_id": c})
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                ids = pending.pop(ready[0])
                try:
                    out = ray.get(ready[0])
                except KeyboardInterrupt:
                    raise
                except Exception as exc:  # a lost node / task: its cases go round again
                    with open(log, "a") as f:
                        f.write(f"[task for {len(ids)} cases failed: {type(exc).__name__}: "
                                f"{exc}]\n")
                    continue
                self._gather(run_dir, out, log, on_event)
        if self._left(run_dir, parts, case_ids):
            raise HarnessError(f"--ray: cases still without results after {MAX_ROUNDS} rounds "
                               f"of tasks; see {log}")

    @staticmethod
    def _left(run_dir: Path, parts: tuple[str, ...], case_ids: list[str]) -> list[str]:
        """The cases still without a record in a part they need: check and time, and the later
        time processes' parts when their first timing was ok (process.run_shard)."""
        timed = {r["case_id"] for r in store.read_parts(run_dir, "time") if r["status"] == "ok"}
        need = {p: set(todo(run_dir, p, case_ids)) for p in parts}
        return [c for c in case_ids
                if any(c in need[p] for p in (parts if c in timed else parts[:2]))]

    def warm_ids(self, run_dir: Path, case_ids: list[str], device: str) -> list[str]:
        """The cases the tasks compile ahead (timing.compile_ahead, a GPU run): the unchecked
        cases of implementations that JIT-compile, less, with `--ray local` (this host's
        caches), those the previous run here compiled with the same code."""
        from harness.experiment import spec
        from harness.execute.executors.warm import warm_cases
        from harness.registry import get_op

        m = store.load_manifest(run_dir)
        exp = spec.Experiment.model_validate(m["experiment"])
        if device != "cuda" or not exp.timing.compile_ahead:
            return []
        ids, _ = warm_cases(run_dir, get_op(exp.op), todo(run_dir, "check", case_ids),
                            this_host=self.address == "local")
        return ids

    def _files(self, run_dir: Path) -> dict[str, bytes]:
        files = {name: (run_dir / name).read_bytes()
                 for name in (store.MANIFEST, "cases.parquet")}
        for p in measure_parts(time_processes(run_dir)):  # done: a resumed run skips them
            recs = store.read_parts(run_dir, p)
            files[f"parts/{p}.jsonl"] = "".join(
                store.json.dumps(r, default=store._json_default) + "\n" for r in recs).encode()
        picks = store.load_tuner_picks(run_dir)  # launch configs already timed: not again
        if picks:
            files[store.tuner_picks_path(Path("."), None).name] = store.json.dumps(picks).encode()
        return files

    def _gather(self, run_dir: Path, out: dict, log: Path, on_event) -> None:
        self.hosts.add(out["host"])
        w = out.get("warm") or {}
        if w.get("workers"):  # tasks compile side by side: the longest is the span
            self.warmed = {"workers": self.warmed["workers"] + w["workers"],
                           "cases": self.warmed["cases"] + w["cases"],
                           "wall_s": max(self.warmed["wall_s"], w["wall_s"])}
            store.update_manifest(run_dir, compile_ahead={**self.warmed, "in_tasks": True})
        if out["gpu"] is not None:
            self.gpus.add(out["gpu"])
        with open(log, "a") as f:
            f.write(f"--- task on {out['host']} (gpu {out['gpu']})\n{out['log']}\n")
        store.save_tuner_picks(run_dir, out.get("picks") or {}, shard="ray")
        for p, recs in out["records"].items():
            done = {r["case_id"] for r in store.read_parts(run_dir, p)}
            for rec in recs:
                if rec["case_id"] in done:
                    continue  # shipped to the task as already done
                rec = {**rec, "host": rec.get("host") or out["host"], "executor": "ray"}
                store.append_part(run_dir, p, rec, shard="ray")
                on_event({"event": "done", "name": p, "case_id": rec["case_id"],
                          "status": rec["status"]})
