"""How big must a change be before the harness calls it real? The noise threshold of a pair.

Within-run sample noise is small next to run-to-run drift (clocks, placement, the allocator, the
other tenants of a shared GPU): two back-to-back runs of unchanged code differ by a few percent,
with a Mann-Whitney p far below 0.01. So a pair of cases is marked faster/slower only when its
bootstrap CI lies entirely beyond ±threshold, where

    threshold = max(floor, pair MDE)
    floor     = 99th percentile of |log ratio| over the A/A case pairs of this machine
                (or a conservative default: GPU 7 %, CPU 25 %, until there are enough of them;
                a small A/A sample may raise the floor above the default, only a large one
                may lower it)
    pair MDE  = 2 * sqrt((IQR_b/med_b)^2 / n_b + (IQR_c/med_c)^2 / n_c)   (the pair's own spread)

A/A pairs are consecutive runs in the same store of the same spec (spec hash) and the same code
on the same machine (GPU model or CPU host, driver, torch, triton). "Same code": per case, equal
`code_hash` (and equal `config`) where results carry those columns; otherwise both runs at the
same clean git commit. Case pairs that differ by more than the far-out fence (Q3 + 3 IQR of the
|log ratios|) and by more than twice the default floor are real differences that happen without
a code change (a torch.compile recompilation), not noise, and are left out; the text says so.

An implementation with MIN_IMPL_CASES A/A case pairs of its own gets its own floor, learned the
same way from its cases alone: on an H200 a library kernel moved 10-15 % between runs of the same
code on a few shapes while naive attention moved < 1 %, and one machine-wide floor either cries
wolf on the one or hides real changes of the other. The machine's floor is for the rest.

Implementations whose kernels are chosen per process by someone else (PEER_BACKENDS: a
library's heuristics, as SDPA's cuDNN; torch.compile's Inductor, which autotunes on the first
call) are another population: in A/A pairs of flash.yaml's N=4096 cases on one H200 (unchanged
code, 56 case pairs each) sdpa_cudnn moved up to 1.13x and torch_compile, its graphs seeded at
one shape, up to 1.12x, while every triton and eager-torch case stayed within the 7 % default
or was explained by the SM clock. So the two are learned apart, by the same rule: the machine's
floor from the other implementations' A/A cases (default 7 %), the peers' floor from the peers'
cases pooled (default PEER_DEFAULT_FLOOR, 15 %). Pooled, one pair of flash.yaml and one of
softmax.yaml (92 cases) learned 11.2 % for everything: the flash pair's own compare marked
torch_compile "1.12x faster", and our kernels' threshold had grown by half. A real 10 % change
of a Triton kernel is marked in a fresh store.

Ratios and thresholds are fractions (0.05 = 5 %); a threshold t is symmetric in log space: the
band is [1/(1+t), 1+t].
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from harness import store
from harness.errors import HarnessError
from harness.values import same_cell

# Measured on an H200 (2026-11-23, torch 2.11, triton 3.6): back-to-back runs of unchanged code
# and launch config differed by up to 5.2 % (softmax, a 36 us kernel, both dtypes alike) and
# 4.5 % (triton_flash at 0.66 ms) over 88 case pairs; the default sits above that with margin.
DEFAULT_FLOOR = {"cuda": 0.07, "cpu": 0.25}
PEER_BACKENDS = ("library", "compile")  # harness.registry backends whose kernel is chosen per
PEER_DEFAULT_FLOOR = {"cuda": 0.15, "cpu": 0.25}  # process by a library or compiler
# a floor at the q-th percentile of A/A differences marks 1 - q of unchanged cases by
# construction (the 95th: ~2 of 36 pairs per A/A comparison, the very complaint); the 99th
# marks about 1 in 100, and needs some 50 case pairs before its estimate settles
QUANTILE = 0.99
MIN_AA_PAIRS = 2  # A/A run pairs needed before a learned floor is trusted
MIN_AA_CASES = 50  # ... and case pairs (after outliers are left out)
# The 99th percentile of ~50 ratios is about their maximum, an estimate that lands below the true
# percentile close to half the time: until there are this many case pairs a learned floor may
# only raise the default (this machine is noisier), never lower it.
LOWER_DEFAULT_CASES = 200
MIN_IMPL_CASES = 30  # an implementation's own A/A case pairs before it gets its own floor
IMPL_MARGIN = 1.25  # the text names implementations whose floor is this far from the machine's
# machine fields that must agree for two runs' run-to-run noise to be the same noise
MACHINE_KEYS = ("device", "gpu_name", "driver", "torch", "triton")


@dataclass(frozen=True)
class NoiseFloor:
    """The between-run part of the noise threshold and where it came from."""
    value: float  # fraction: 0.031 = 3.1 %
    source: str  # learned | default | given
    n_pairs: int = 0  # A/A run pairs it was learned from (or found, when too few)
    n_cases: int = 0  # A/A case pairs used
    n_outliers: int = 0  # case pairs left out as real differences
    detail: str = ""  # why the default (e.g. "no A/A runs in runs/")
    per_impl: tuple = ()  # ((impl, floor), ...): implementations with a floor of their own
    peer: float = 0.0  # the floor of PEER_BACKENDS impls without their own (0: the machine's)
    peer_source: str = "default"  # learned (from the peers' pooled A/A cases) | default
    peer_cases: int = 0  # the peers' A/A case pairs
    peer_impls: tuple = ()  # the PEER_BACKENDS implementations seen in the A/A pairs

    def for_impl(self, impl: str | None, backend: str | None = None) -> float:
        """The floor for a case of `impl` (registered with `backend`): its own where it has one,
        else the peers' floor for a PEER_BACKENDS impl, else the machine's."""
        own = dict(self.per_impl).get(impl)
        if own is not None:
            return own
        if self.peer and backend in PEER_BACKENDS:
            return self.peer
        return self.value

    def _impl_text(self) -> str:
        def ref(impl: str) -> float:  # what the impl's floor would be without its own
            return self.peer if self.peer and impl in self.peer_impls else self.value

        far = [(i, v) for i, v in self.per_impl
               if max(v, ref(i)) > IMPL_MARGIN * min(v, ref(i))]
        if not far:
            return ""
        return "; own floor (its own A/A cases): " + ", ".join(f"{i} {v * 100:.1f}%"
                                                               for i, v in far)

    def _peer_text(self) -> str:
        if self.peer_source == "learned":
            return (f"; {self.peer * 100:.1f}% for library and torch.compile impls (from their "
                    f"{self.peer_cases} A/A cases)")
        if self.peer > self.value:
            return f"; {self.peer * 100:g}% for library and torch.compile impls"
        return ""

    @property
    def text(self) -> str:
        """`floor 3.1% from 4 A/A pairs` / `default floor 5% (no A/A runs in runs/)`."""
        if self.source == "learned":
            s = (f"floor {self.value * 100:.1f}% from {self.n_pairs} A/A pair"
                 f"{'s' if self.n_pairs != 1 else ''} ({self.n_cases} cases")
            return s + (f", {self.n_outliers} outliers left out)" if self.n_outliers else ")") \
                + self._peer_text() + self._impl_text()
        if self.source == "given":
            return f"floor {self.value * 100:g}% (given)"
        return f"default floor {self.value * 100:g}%" + (f" ({self.detail})" if self.detail
                                                        else "") + self._peer_text() \
            + self._impl_text()

    def as_dict(self) -> dict:
        return {"value": self.value, "source": self.source, "n_pairs": self.n_pairs,
                "n_cases": self.n_cases, "n_outliers": self.n_outliers, "text": self.text,
                "per_impl": dict(self.per_impl), "peer": self.peer,
                "peer_source": self.peer_source, "peer_cases": self.peer_cases}


def default_floor(device: str | None) -> float:
    return DEFAULT_FLOOR["cuda" if device == "cuda" else "cpu"]


def peer_floor(device: str | None) -> float:
    return PEER_DEFAULT_FLOOR["cuda" if device == "cuda" else "cpu"]


def machine_key(env: dict) -> tuple:
    """What makes two runs' noise the same noise; a CPU run's machine is also its host."""
    env = env or {}
    key = tuple(env.get(k) for k in MACHINE_KEYS)
    return key + ((env.get("hostname"), env.get("cpu")) if env.get("device") != "cuda" else ())


def pair_mde(base: np.ndarray, cand: np.ndarray) -> float:
    """The smallest relative change this pair's own spread can resolve (fraction):
    2 * sqrt((IQR_b/med_b)^2/n_b + (IQR_c/med_c)^2/n_c)."""
    def rel_var(x: np.ndarray) -> float:
        med = float(np.median(x))
        if not len(x) or med <= 0:
            return math.inf
        q1, q3 = np.percentile(x, [25, 75])
        return ((q3 - q1) / med) ** 2 / len(x)

    return 2 * math.sqrt(rel_var(np.asarray(base, float)) + rel_var(np.asarray(cand, float)))


def threshold(floor: float, base: np.ndarray, cand: np.ndarray) -> float:
    return max(floor, pair_mde(base, cand))


# -- A/A pairs in a store -------------------------------------------------------------------------

def _code_identity(m: dict) -> str | None:
    """The manifest's git state when it pins the code: a clean commit; None otherwise."""
    env = m.get("env") or {}
    return env["git_sha"] if env.get("git_sha") and env.get("git_dirty") is False else None


def _usable(m: dict) -> bool:
    return store.effective_status(m) in ("complete", "partial") and bool(m.get("spec_hash"))


def aa_run_pairs(roots, env: dict) -> list[tuple[Path, Path]]:
    """Consecutive runs (oldest first) of one spec on the machine of `env`, under the roots,
    whose code may be the same: same spec hash and same clean commit, or (results carrying
    `code_hash` values) same spec hash, decided per case by `aa_log_ratios`."""
    want = machine_key(env)
    groups: dict[tuple, list[Path]] = {}
    for row in store.list_runs(*roots):
        if row.get("error"):
            continue
        try:
            m = store.load_manifest(row["path"])
        except HarnessError:
            continue
        if not _usable(m) or machine_key(m.get("env") or {}) != want:
            continue
        code = "code_hash" if _has_code_hashes(row["path"]) else _code_identity(m)
        if code is None:
            continue
        groups.setdefault((m["spec_hash"], code), []).append(Path(row["path"]))
    return [(a, b) for runs in groups.values() for a, b in zip(runs, runs[1:])]


_HASHED_CACHE: dict[tuple, bool] = {}


def _has_code_hashes(run_dir) -> bool:
    """Whether the run's results carry a code_hash for at least one case (cached per process
    while the table does not change)."""
    key = (str(Path(run_dir).resolve()), _stamp(run_dir))
    if key not in _HASHED_CACHE:
        _HASHED_CACHE[key] = _read_has_code_hashes(run_dir)
    return _HASHED_CACHE[key]


def _read_has_code_hashes(run_dir) -> bool:
    import pyarrow.parquet as pq

    path = Path(run_dir) / "results.parquet"
    try:
        if not path.exists() or "code_hash" not in pq.read_schema(path).names:
            return False
        col = pq.read_table(path, columns=["code_hash"]).column("code_hash").to_pylist()
    except Exception:  # an unreadable table: not an A/A candidate (load_results says why)
        return False
    return any(isinstance(v, str) and v for v in col)


def _ok_medians(run_dir: Path) -> pd.DataFrame:
    cases = store.load_cases(run_dir)
    cases = cases[[c for c in ("case_id", "status", "impl", "op", "base_impl")
                   if c in cases.columns]]
    res = store.load_results(run_dir)
    df = cases.merge(res, on="case_id", how="inner")
    df = df[(df.status == "ok") & pd.to_numeric(df.median_ms, errors="coerce").gt(0)]
    return df.set_index("case_id")


def aa_log_ratios(a: Path, b: Path) -> np.ndarray:
    """|log(median_a / median_b)| over the same-code cases of an A/A pair (see aa_ratios)."""
    return aa_ratios(a, b).to_numpy(dtype=float)


# (run a, run b, their tables' mtimes) -> aa_ratios: a finished run's tables do not change, and
# learning a floor reads every A/A pair of the store (a report, the since block, each dashboard
# page); a long-lived process (the dashboard, a test session) reads each pair once
_AA_CACHE: dict[tuple, pd.Series] = {}
_AA_CACHE_MAX = 4096


def _stamp(run_dir: Path) -> tuple:
    out = []
    for name in ("manifest.json", "cases.parquet", "results.parquet"):
        try:
            st = (Path(run_dir) / name).stat()
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def aa_ratios(a: Path, b: Path) -> pd.Series:
    """|log(median_a / median_b)| indexed by impl, over the cases of an A/A run pair that ran the
    same code: a case whose both runs stored a `code_hash` counts when the hashes (and launch
    configs) match; one without counts when both runs were made from the same clean commit.
    Cached per process while neither run's tables change."""
    key = (str(Path(a).resolve()), str(Path(b).resolve()), _stamp(a), _stamp(b))
    hit = _AA_CACHE.get(key)
    if hit is None:
        if len(_AA_CACHE) >= _AA_CACHE_MAX:
            _AA_CACHE.clear()
        hit = _AA_CACHE[key] = _aa_ratios(Path(a), Path(b))
    out = hit.copy()
    out.attrs["peers"] = set(hit.attrs.get("peers", set()))
    return out


def _aa_ratios(a: Path, b: Path) -> pd.Series:
    ra, rb = _ok_medians(a), _ok_medians(b)
    ga, gb = (_code_identity(store.load_manifest(d)) for d in (a, b))
    same_commit = ga is not None and ga == gb

    def hashed(r, c) -> str | None:
        v = r.at[c, "code_hash"] if "code_hash" in r.columns else None
        return v if isinstance(v, str) and v else None

    def config(r, c):
        return r.at[c, "config"] if "config" in r.columns else None

    same = []
    for c in ra.index.intersection(rb.index):
        ha, hb = hashed(ra, c), hashed(rb, c)
        if ha is not None and hb is not None:
            if ha == hb and same_cell(config(ra, c), config(rb, c)):
                same.append(c)
        elif same_commit:
            same.append(c)
    common = pd.Index(same)
    x = ra.loc[common, "median_ms"].astype(float) / rb.loc[common, "median_ms"].astype(float)
    impl = ra.loc[common, "impl"] if "impl" in ra.columns else pd.Series("", index=common)
    out = pd.Series(np.abs(np.log(x.to_numpy(dtype=float))), index=impl.to_numpy(), dtype=float)
    out.attrs["peers"] = _peer_impls(ra.loc[common], store.load_manifest(a))
    return out


def _peer_impls(rows: pd.DataFrame, manifest: dict | None = None) -> set[str]:
    """The implementations among `rows` (cases with impl, op, base_impl) with a PEER_BACKENDS
    backend, by the run's op card or else this checkout's registry (one neither knows counts
    as ours)."""
    from harness import op_card

    if "impl" not in rows.columns or "op" not in rows.columns:
        return set()
    out = set()
    for r in rows.drop_duplicates("impl").itertuples():
        if op_card.backend(manifest, r.op, r.impl, getattr(r, "base_impl", None)) \
                in PEER_BACKENDS:
            out.add(r.impl)
    return out


def learn_floor(roots, env: dict, *, quantile: float = QUANTILE) -> NoiseFloor:
    """The floor for runs on the machine of `env`, learned from the A/A pairs under the roots:
    the machine's from the cases of non-peer implementations, the peers' (PEER_BACKENDS) from
    theirs, each by `_learn`'s rule against its own default."""
    roots = [Path(r) for r in dict.fromkeys(str(r) for r in roots)]
    device = (env or {}).get("device")
    default, peer_default = default_floor(device), peer_floor(device)
    where = ", ".join(f"{r}/" for r in roots) or "the store"
    per_pair = []
    peers: set[str] = set()
    for a, b in aa_run_pairs(roots, env):
        r = aa_ratios(a, b)
        peers |= r.attrs.get("peers", set())
        r = r[np.isfinite(r.to_numpy(dtype=float))]
        if len(r):  # a pair with no case of the same code in common calibrates nothing
            per_pair.append(r)
    n_pairs = len(per_pair)
    if not n_pairs:
        return NoiseFloor(default, "default", detail=f"no A/A runs in {where}",
                          peer=peer_default)
    ratios = pd.concat(per_pair)
    is_peer = np.isin(ratios.index.to_numpy(dtype=object), list(peers))
    ours, theirs = ratios[~is_peer], ratios[is_peer]
    value, source, detail, kept_ours, out = _learn(ours, default, n_pairs, where, quantile)
    pvalue, psource, _, kept_theirs, pout = _learn(theirs, peer_default, n_pairs, where,
                                                   quantile)
    per_impl = (_impl_floors(kept_ours, min(value, default), quantile)
                + _impl_floors(kept_theirs, min(pvalue, peer_default), quantile))
    return NoiseFloor(value, source, n_pairs, len(kept_ours), out + pout, detail=detail,
                      per_impl=tuple(sorted(per_impl)), peer=pvalue, peer_source=psource,
                      peer_cases=len(kept_theirs), peer_impls=tuple(sorted(peers)))


def _learn(ratios: pd.Series, default: float, n_pairs: int, where: str,
           quantile: float = QUANTILE) -> tuple[float, str, str, pd.Series, int]:
    """(floor, learned|default, why, the ratios kept, outliers) from one population's A/A
    |log ratios|: `default` while there are fewer than MIN_AA_PAIRS pairs or MIN_AA_CASES case
    pairs, and while a floor below `default` rests on fewer than LOWER_DEFAULT_CASES."""
    x = ratios.to_numpy(dtype=float)
    cut = _outlier_cut(x, default)
    kept = ratios[ratios <= cut]
    out = int((ratios > cut).sum())
    if n_pairs < MIN_AA_PAIRS or len(kept) < MIN_AA_CASES:
        return default, "default", (f"{n_pairs} A/A pair{'s' if n_pairs != 1 else ''} with "
                                    f"{len(kept)} cases in {where}; needs {MIN_AA_PAIRS} pairs "
                                    f"and {MIN_AA_CASES} cases"), kept, out
    value = float(np.expm1(np.quantile(kept.to_numpy(dtype=float), quantile)))
    if value < default and len(kept) < LOWER_DEFAULT_CASES:
        return default, "default", (f"learned {value * 100:.1f}% from {n_pairs} A/A pairs with "
                                    f"{len(kept)} cases in {where}; lowers the default from "
                                    f"{LOWER_DEFAULT_CASES} cases"), kept, out
    return value, "learned", "", kept, out


def _impl_floors(kept: pd.Series, bound: float, quantile: float) -> tuple:
    """((impl, floor), ...) for implementations with MIN_IMPL_CASES A/A case pairs: their own
    quantile, never below `bound` (the lower of the machine's floor and the default) before
    LOWER_DEFAULT_CASES of their own case pairs: a small sample's 99th percentile lands low."""
    out = []
    for impl, x in kept.groupby(level=0):
        if impl and len(x) >= MIN_IMPL_CASES:
            v = float(np.expm1(np.quantile(x.to_numpy(dtype=float), quantile)))
            out.append((str(impl), v if len(x) >= LOWER_DEFAULT_CASES else max(v, bound)))
    return tuple(sorted(out))


def _outlier_cut(x: np.ndarray, default: float) -> float:
    """|log ratios| beyond both the far-out fence and twice the default floor are outliers."""
    if len(x) < 4:
        return math.inf
    q1, q3 = np.quantile(x, [0.25, 0.75])
    return max(q3 + 3 * (q3 - q1), math.log1p(2 * default))


def floor_for(*run_dirs, floor: float | None = None) -> NoiseFloor:
    """The floor for comparing these runs: `floor` when given, else learned from the A/A pairs
    in their stores on the machine of the last run."""
    if floor is not None:
        return NoiseFloor(float(floor), "given")
    dirs = [Path(d) for d in run_dirs]
    env = store.load_manifest(dirs[-1]).get("env") or {}
    return learn_floor([d.parent for d in dirs], env)
