"""Pure scheduling: which GPUs, how long each case should take, which shard does which case.

Nothing here starts a process or touches a device, so every rule is unit-tested on the CPU:

    parse_gpus("all" | "N" | "0,2", present)   -> the GPU indices a run uses (HarnessError if
                                                  fewer are present than asked)
    estimate_s(case, op, timing, device, prev) -> expected seconds of one (check + time) case
    shard(case_ids, cost, n, group_of, family_of)
                                               -> n lists, longest first, greedy onto the least
                                                  loaded shard (LPT: within 4/3 of optimal);
                                                  a shape's cases together (`longest_first`),
                                                  a family's shapes together where it pays
    case_timeout_s(est, timing)                -> the watchdog limit of one (pass, case)
    shard_by_impl(case_ids, impl_of, cost, n)   -> n lists for the profiler passes: an
                                                  implementation's cases stay together (its
                                                  compile / warm-up is paid in one process)
    (the profiler passes' processes onto the GPUs together: profiler_deal)
    warm_shards(case_ids, n, unit_of, backend_of)
                                               -> n lists for the compile-ahead workers: a
                                                  compile class in one worker, torch.compile's
                                                  classes on as few workers as pay off, LPT
    compile_workers(cpus, n_cases, n_gpus, gpu_mib) -> how many compile-ahead workers
"""
from __future__ import annotations

import json
import math
from collections import Counter

from harness.errors import HarnessError

# Rough device rates for a first estimate when no previous run of the case is known; only the
# ORDER of cases matters for longest-first, and the watchdog's floor dwarfs these numbers.
EST_BYTES_PER_S = {"cuda": 1.0e12, "cpu": 2.0e8}   # the interpreter is ~1000x slower
EST_FLOPS_PER_S = {"cuda": 5.0e13, "cpu": 1.0e9}
WATCHDOG_FLOOR_S = 120.0    # first-call compilation / autotune can take tens of seconds
WATCHDOG_FACTOR = 4.0


def parse_gpus(requested: str, present: list[dict]) -> list[int]:
    """`--gpus all|N|i,j,...` against the GPUs nvidia-smi lists (`present`, in index order)."""
    text = str(requested).strip()
    n = len(present)
    if n == 0:
        raise HarnessError(f"--gpus {text}: no NVIDIA GPU on this host (nvidia-smi lists none); "
                           "drop --gpus to run on the CPU")
    if text == "all":
        idx = list(range(n))
    elif text.isdigit():
        want = int(text)
        if want < 1:
            raise HarnessError(f"--gpus {text}: give a count >= 1, 'all' or indices like 0,2")
        if want > n:
            raise HarnessError(f"--gpus {text}: this host has {n} GPU{'s' * (n != 1)}")
        idx = list(range(want))
    else:
        try:
            idx = [int(x) for x in text.split(",") if x.strip() != ""]
        except ValueError:
            raise HarnessError(f"--gpus {text!r}: expected 'all', a count or indices like "
                               "0,2") from None
        bad = [i for i in idx if i < 0 or i >= n]
        if bad or not idx:
            raise HarnessError(f"--gpus {text}: no GPU {bad[0] if bad else ''} on this host "
                               f"(indices 0..{n - 1})")
        if len(set(idx)) != len(idx):
            raise HarnessError(f"--gpus {text}: an index is repeated (one worker per GPU)")
    models = {present[i].get("gpu_name") for i in idx}
    if len(models) > 1:
        raise HarnessError(f"--gpus {text}: the GPUs are of different models "
                           f"({', '.join(sorted(str(m) for m in models))}); one run times one "
                           "model: run once per model (e.g. --gpus 0,1 then --gpus 2,3)")
    return idx


def estimate_s(params: dict, dtype: str, op, timing, device: str,
               prev_median_ms: float | None = None, trials: int = 2) -> float:
    """Expected seconds for one case's check + time passes (ordering and watchdog default).

    A previous run's median wins over the analytic FLOP/byte estimate."""
    from harness.registry import Params
    from harness.store.results import ITEMSIZE

    if prev_median_ms is not None and math.isfinite(prev_median_ms) and prev_median_ms > 0:
        call_s = prev_median_ms / 1e3
    else:
        p = Params(params)
        try:
            by = op.byte_count(p, ITEMSIZE.get(dtype, 4)) or 0.0
            fl = op.flop_count(p) or 0.0
        except Exception:  # an op without counts for this case: order it last, not fail
            by = fl = 0.0
        call_s = max(by / EST_BYTES_PER_S[device], fl / EST_FLOPS_PER_S[device])
    budget_s = (timing.warmup_ms + timing.rep_ms) / 1e3
    return budget_s + (timing.min_samples + trials + 5) * call_s


def case_timeout_s(est_s: float, timing) -> float:
    """The watchdog limit of one (pass, case): the YAML's, else generous over the estimate."""
    own = getattr(timing, "case_timeout_s", None)
    if own:
        return float(own)
    return max(WATCHDOG_FLOOR_S, WATCHDOG_FACTOR * est_s)


def longest_first(case_ids: list[str], cost: dict[str, float],
                  group_of: dict[str, str] | None = None) -> list[str]:
    """Stable: equal costs keep the experiment's order. With `group_of` (case -> shape), whole
    shapes longest first (by their summed cost), then a shape's cases longest first: the check
    pass computes one shape's reference for all its implementations (its cache holds the last
    shape), so cases of one shape must run back to back. Ordered by case alone, a second
    flash_bwd.yaml run (costs from the first run's times) recomputed the reference for every
    implementation: 44 s of its 80 s check pass."""
    order = {c: i for i, c in enumerate(case_ids)}
    if not group_of:
        return sorted(case_ids, key=lambda c: (-cost.get(c, 0.0), order[c]))
    total: dict[str, float] = {}
    first: dict[str, int] = {}
    for c in case_ids:
        g = group_of.get(c, c)
        total[g] = total.get(g, 0.0) + cost.get(c, 0.0)
        first.setdefault(g, order[c])

    def key(c):
        g = group_of.get(c, c)
        return (-total[g], first[g], -cost.get(c, 0.0), order[c])
    return sorted(case_ids, key=key)


GROUPS_PER_SHARD = 4  # fewer shapes than this per shard: shard by case (keep the GPUs busy)
# a deal of whole families may load a shard this much more than the deal of shapes (estimated)
FAMILY_SLACK = 0.05


def shard(case_ids: list[str], cost: dict[str, float], n: int,
          group_of: dict[str, str] | None = None,
          family_of: dict[str, str] | None = None) -> list[list[str]]:
    """Longest-first greedy assignment onto n shards (each shard keeps longest-first order).
    With `group_of`, whole shapes are assigned (their cases stay on one GPU, back to back)
    when there are at least GROUPS_PER_SHARD shapes per shard; a sweep of few shapes and many
    implementations (a config grid) is sharded by case.

    With `family_of` (case -> its shape's params that are not sizes, and its dtype: the cases
    whose implementations run the same compiled kernels), whole families are assigned when
    there are at least GROUPS_PER_SHARD of them per shard and no shard's estimate comes out
    over FAMILY_SLACK above the deal of shapes: each GPU's processes then load the compiled
    kernels and graphs of its own families only. On two H100s a flash.yaml check process met
    7 of the 8 torch.compile graphs, 0.8-0.9 s on average at a graph's first case (0.02 s
    after), and a Triton class's first case took 0.2 s more. On the check and time seconds of
    three cold one-GPU runs, the deal of shapes gave one GPU 46.2-51.4 s and the other
    38.8-45.6 s (its estimate halves a causal shape's FLOPs, not its seconds); the deal of
    families 43.2-48.7 s and 41.9-48.3 s. On two H200s the time passes then ended 0.3 and
    2.1 s apart (3.7 and 6.0 s by shapes), the runs' totals the same (docs/scaling.md)."""
    if n < 1:
        raise ValueError("n must be >= 1")
    if n == 1:
        return [longest_first(case_ids, cost, group_of)]
    if family_of:
        by_shape = shard(case_ids, cost, n, group_of)
        by_family = _whole(case_ids, cost, n, family_of, group_of)
        if by_family is not None and _most(by_family, cost) <= (1 + FAMILY_SLACK) * _most(
                by_shape, cost):
            return by_family
        return by_shape
    if group_of and (whole := _whole(case_ids, cost, n, group_of, group_of)) is not None:
        return whole
    shards: list[list[str]] = [[] for _ in range(n)]
    load = [0.0] * n
    for c in longest_first(case_ids, cost):
        k = min(range(n), key=lambda i: (load[i], len(shards[i]), i))
        shards[k].append(c)
        load[k] += cost.get(c, 0.0)
    return shards


def _whole(case_ids: list[str], cost: dict[str, float], n: int, key_of: dict[str, str],
           group_of: dict[str, str] | None) -> list[list[str]] | None:
    """Whole groups (`key_of`: shapes or families) onto n shards, longest first, each shard's
    cases longest first by shape (`group_of`); None where there are fewer than
    GROUPS_PER_SHARD groups per shard."""
    groups: dict[str, list[str]] = {}
    for c in case_ids:
        groups.setdefault(key_of.get(c, c), []).append(c)
    if len(groups) < GROUPS_PER_SHARD * n:
        return None
    weight = {g: sum(cost.get(c, 0.0) for c in ids) for g, ids in groups.items()}
    return [longest_first([c for g in gs for c in groups[g]], cost, group_of)
            for gs in shard(list(groups), weight, n)]


def _most(shards: list[list[str]], cost: dict[str, float]) -> float:
    return max((sum(cost.get(c, 0.0) for c in s) for s in shards), default=0.0)


def non_size_values(params: str, size: set[str]) -> tuple:
    """A case's params (its JSON) that are not sizes (Param.size), sorted, each value as JSON:
    what, with the dtype, keys the cases that run the same compiled kernels (compile-ahead's
    classes, the GPUs' families)."""
    return tuple(sorted((k, json.dumps(v)) for k, v in json.loads(params).items()
                        if k not in size))


def case_costs(cases, op, timing, device: str, prev: dict[str, float] | None = None,
               trials: int = 2) -> dict[str, float]:
    """estimate_s for every row of a cases frame; `prev` maps case_id -> previous median ms."""
    prev = prev or {}
    return {r.case_id: estimate_s(json.loads(r.params), r.dtype, op, timing, device,
                                  prev.get(r.case_id), trials)
            for r in cases.itertuples()}


PROFILE_SETUP_S = 5.0  # a profiler process's per-implementation start-up (import, compile, tune)


def shard_by_impl(case_ids: list[str], impl_of: dict[str, str], cost: dict[str, float],
                  n: int, setup: float = PROFILE_SETUP_S) -> list[list[str]]:
    """Longest-first greedy assignment of implementations onto n shards (cases keep their
    given order inside a shard); an implementation costs its cases plus a start-up (`setup`).
    An implementation heavier than a fair share (the total over n) is cut into as many pieces
    as it has fair shares, its cases dealt longest first onto the lightest piece; each piece
    pays the start-up again, but one implementation no longer sets the pass's tail (on a
    two-H200 host, torch.compile's whole nsys share on one GPU did)."""
    groups: dict[str, list[str]] = {}
    for c in case_ids:
        groups.setdefault(impl_of.get(c, c), []).append(c)
    weight = {g: setup + sum(cost.get(c, 0.0) for c in ids) for g, ids in groups.items()}
    fair = sum(weight.values()) / max(1, n)
    pieces: dict[tuple[str, int], list[str]] = {}
    for g, ids in groups.items():
        k = min(n, len(ids), math.ceil(weight[g] / fair - 1e-9)) if n > 1 and fair > 0 else 1
        if k <= 1:
            pieces[(g, 0)] = ids
            continue
        bins: list[list[str]] = [[] for _ in range(k)]
        load = [setup] * k
        for c in sorted(ids, key=lambda c: -cost.get(c, 0.0)):
            j = min(range(k), key=load.__getitem__)
            bins[j].append(c)
            load[j] += cost.get(c, 0.0)
        pieces.update({(g, j): b for j, b in enumerate(bins)})
    names = {f"{g}#{j}": (g, j) for g, j in pieces}
    piece_weight = {name: setup + sum(cost.get(c, 0.0) for c in pieces[key])
                    for name, key in names.items()}
    order = shard(list(names), piece_weight, n)
    pos = {c: i for i, c in enumerate(case_ids)}
    return [sorted((c for name in names_on for c in pieces[names[name]]), key=pos.__getitem__)
            for names_on in order]


MAX_COMPILE_WORKERS = 8  # per GPU; Triton's precompile runs up to 8 threads in each
CORES_PER_COMPILE_WORKER = 2
# GPU memory per compile-ahead worker: each keeps to its part of MEMORY_SHARE (warm.py). A case
# that needs more fails there and is the check pass's: flash_bwd's torch.compile cases at
# N=16384 (8.4 GiB timed, more in a compile-only call) ran out of an H100 worker's 8.95 GiB
# share at 8 workers, after their graph was built (the class's next cases loaded it)
COMPILE_WORKER_GPU_MIB = 9 * 1024


def compile_workers(cpus: int | None, n_cases: int, n_gpus: int = 1,
                    gpu_mib: float | None = None) -> int:
    """Compile-ahead processes: one per CORES_PER_COMPILE_WORKER CPU cores, at most
    MAX_COMPILE_WORKERS per GPU and one per COMPILE_WORKER_GPU_MIB of a GPU's memory
    (`gpu_mib`, when known), and n_cases. Measured on one H100 (16 cores; flash.yaml cold,
    fresh caches each, one call): 4 workers compiled in 33.4 s, 6 in 20.6 s, 8 in 18.8 s
    (the whole run 162.9, 151.4 and 146.9 s): the workers wait on one another's ptxas and on
    the GPU as much as on a core."""
    per_gpu = MAX_COMPILE_WORKERS
    if isinstance(gpu_mib, (int, float)) and gpu_mib > 0:  # nvidia-smi may say "[N/A]"
        per_gpu = min(per_gpu, max(1, int(gpu_mib // COMPILE_WORKER_GPU_MIB)))
    by_cores = max(1, (cpus or 1) // CORES_PER_COMPILE_WORKER)
    return max(0, min(per_gpu * max(1, n_gpus), by_cores, n_cases))


def workers_per_gpu(n_workers: int, n_gpus: int) -> int:
    """The most compile-ahead workers any one GPU hosts (worker i runs on GPU i % n_gpus)."""
    return -(-n_workers // max(1, n_gpus)) if n_workers else 0


# compile-ahead's cost model (H200, flash.yaml cold, 4 workers side by side): a process's first
# torch.compile case took 14-17 s (Dynamo's and Inductor's first use; the graph itself ~3 s),
# each later graph 2.4-4.9 s, a Triton kernel class with all its Tuner candidates 1.4-2.6 s
# (the first of a process 4-5 s), a case whose class the process had compiled 0.01-0.05 s.
WARM_SETUP_S = {"compile": 14.0}  # paid once by each process that compiles for this backend
WARM_UNIT_S = {"compile": 3.5}    # one compile class (a graph; a kernel and its candidates)
WARM_UNIT_DEFAULT_S = 2.3
WARM_REPEAT_S = 0.05              # a case whose class its process already compiled


def warm_shards(case_ids: list[str], n: int, unit_of: dict[str, object] | None = None,
                backend_of: dict[str, str | None] | None = None) -> list[list[str]]:
    """At most `n` lists of `case_ids` for the compile-ahead workers, each in the given (check)
    order; empty lists dropped.

    `unit_of[case]` names the case's compile class (cases of one class compile the same
    kernels: harness.execute.executors.warm.compile_units), `backend_of[case]` its implementation's
    backend. A class stays in one worker, so no two workers compile the same kernels; the
    classes of a backend with a per-process setup cost (WARM_SETUP_S: torch.compile's first
    graph) go to as few workers as keep the longest worker shortest, the rest fill the least
    loaded workers, largest first (LPT; of equally loaded ones, the one with the fewest classes
    of the same implementation). Sorted by key, neighbouring classes of a setup backend (the
    same params in another dtype) go to the same worker. Without `unit_of` every case is its
    own class."""
    if n < 1:
        raise ValueError("n must be >= 1")
    unit_of = unit_of or {}
    backend_of = backend_of or {}
    units: dict[object, list[str]] = {}
    for c in case_ids:
        units.setdefault(unit_of.get(c, ("case", c)), []).append(c)

    def backend(u) -> str | None:
        return backend_of.get(units[u][0])

    def weight(u) -> float:
        return (WARM_UNIT_S.get(backend(u), WARM_UNIT_DEFAULT_S)
                + WARM_REPEAT_S * (len(units[u]) - 1))

    n = min(n, len(units))
    load = [0.0] * n
    bins: list[list[object]] = [[] for _ in range(n)]
    total = sum(weight(u) for u in units)
    for b, setup in sorted(WARM_SETUP_S.items()):
        mine = [u for u in units if backend(u) == b]
        if not mine:
            continue
        w = sum(weight(u) for u in mine)
        # k workers pay the setup: the slowest of them ends near setup + w / k, the others'
        # share of everything near (total + k * setup) / n; the fewest k at the best makespan
        k = min(range(1, min(n, len(mine)) + 1),
                key=lambda k: (max(setup + w / k, (total + k * setup) / n), k))
        hosts = sorted(range(n), key=load.__getitem__)[:k]
        # neighbouring classes (sorted by key: the same params in another dtype) share work in
        # one process (Dynamo's trace, Inductor's caches): each host takes a contiguous run
        mine.sort(key=repr)
        done = 0.0
        for j, i in enumerate(hosts):
            load[i] += setup
            while mine and (j == k - 1 or done + weight(mine[0]) / 2 <= w * (j + 1) / k):
                u = mine.pop(0)
                bins[i].append(u)
                load[i] += weight(u)
                done += weight(u)
        total += k * setup
    placed = {u for b_ in bins for u in b_}
    # the rest, largest first onto the least loaded worker; of equally loaded ones, the one with
    # the fewest classes of the same implementation (a class key's first item): the model weighs
    # every Triton class alike, but an implementation's classes cost alike and implementations
    # do not (two H100s, flash.yaml: triton_flash's classes 7.3-8.6 s a process's first and
    # 3.4-5.5 s its second, fused_mha's 5.6-7.1 and 2.1-3.3 s). Ties went to the lowest worker,
    # so each of eight workers took two classes of one implementation, and a triton_flash pair
    # (11.1-16.2 s) or a fused_mha pair that took a third class was the phase's longest worker
    same = [Counter() for _ in range(n)]
    for u in sorted((u for u in units if u not in placed), key=weight, reverse=True):
        impl, low = _impl(u), min(load)
        i = min((i for i in range(n) if load[i] - low < 1e-9),
                key=lambda i: (same[i][impl], i))
        bins[i].append(u)
        load[i] += weight(u)
        same[i][impl] += 1
    pos = {c: i for i, c in enumerate(case_ids)}
    shards = [sorted((c for u in b_ for c in units[u]), key=pos.__getitem__) for b_ in bins]
    return [s for s in shards if s]


def _impl(unit) -> object:
    """A compile class's implementation: its key's first item (compile_units), else None."""
    return unit[0] if isinstance(unit, tuple) and unit and unit[0] != "case" else None


def warm_plans(shards: list[list[str]], unit_of: dict[str, object] | None = None,
               backend_of: dict[str, str | None] | None = None) -> list[list[str]]:
    """What each compile-ahead worker is given (harness.execute.executors.warm): its own shard
    (warm_shards) class by class (a class's cases together, the classes in the order they come),
    then the classes of the other workers it may take over once it is done (work stealing:
    a worker claims a class before compiling it, and skips one another worker claimed first),
    the others' last classes first, taken round the other workers in turn, the longest shard
    first; never a class of a backend with a per-process setup (WARM_SETUP_S) that the worker
    does not pay already. The cost model that deals the shards is a guess (a Triton class
    with nine candidates takes longer than one with three, and machines differ): stealing
    evens out what it gets wrong."""
    unit_of = unit_of or {}
    backend_of = backend_of or {}

    def classes(shard: list[str]) -> list[list[str]]:
        by: dict[object, list[str]] = {}
        for c in shard:
            by.setdefault(unit_of.get(c, ("case", c)), []).append(c)
        return list(by.values())

    groups = [classes(s) for s in shards]
    plans = []
    for i, own in enumerate(groups):
        pays = {backend_of.get(g[0]) for g in own}
        tails = sorted((list(reversed(g)) for j, g in enumerate(groups) if j != i),
                       key=len, reverse=True)
        steal = []
        while any(tails):
            for t in tails:
                if t:
                    g = t.pop(0)
                    b = backend_of.get(g[0])
                    if b not in WARM_SETUP_S or b in pays:
                        steal.append(g)
        plans.append([c for g in own + steal for c in g])
    return plans
