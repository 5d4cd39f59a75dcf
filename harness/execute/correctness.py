"""Correctness of one implementation against the op's reference (DESIGN.md rule 7).

For each trial: fresh random inputs; the impl's output buffer pre-filled with NaN (or, for impls
that allocate their own output, the caching allocator pre-poisoned with NaN); a high-precision
reference (fp32 for half types, fp64 for fp32) and torch's own result in the same dtype.

    torch_err = max |torch(dtype) - ref_hi|
    tol       = tol_factor * torch_err + ulp(dtype) * max |ref_hi|
    pass      = every element written, finite where ref_hi is, and max |out - ref_hi| <= tol

An all-zeros, all-NaN or partially written output fails; so does a wrong shape.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch

from harness.registry import Impl, Op, Params

EPS = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7, torch.float32: 2.0 ** -23,
       torch.float64: 2.0 ** -52}
REF_SECONDS = [0.0]  # wall time spent computing references (harness self-profiling)
TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass(frozen=True)
class CorrectnessResult:
    correct: bool
    max_abs_err: float
    rel_err: float
    tol: float
    torch_err: float
    trials: int
    seed: int
    error: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _upcast(x, dtype):
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.detach().to(dtype)
    return x


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def poison_allocator(device: str, nbytes: int) -> None:
    """Hand the caching allocator NaN-filled blocks so an impl's torch.empty() starts poisoned."""
    if device != "cuda" or nbytes <= 0:
        return
    n = (nbytes + 1) // 2
    for _ in range(2):
        t = torch.full((n,), float("nan"), dtype=torch.float16, device=device)
        del t


def compare(out, ref_hi, ref_lo, dtype: torch.dtype, tol_factor: float) -> tuple[dict, str | None]:
    """Error figures for one trial and the reason it fails (None when it passes)."""
    outs, his, los = _as_tuple(out), _as_tuple(ref_hi), _as_tuple(ref_lo)
    if len(outs) != len(his):
        return {}, f"returned {len(outs)} outputs, reference has {len(his)}"
    worst = {"max_abs_err": 0.0, "rel_err": 0.0, "tol": 0.0, "torch_err": 0.0}
    reason = None
    for i, (o, h, lo) in enumerate(zip(outs, his, los)):
        name = f"output {i}" if len(outs) > 1 else "output"
        if not isinstance(o, torch.Tensor):
            return worst, f"{name} is {type(o).__name__}, not a tensor"
        if tuple(o.shape) != tuple(h.shape):
            return worst, f"{name} has shape {tuple(o.shape)}, reference {tuple(h.shape)}"
        unwritten, nonfinite, err, ref_mag, torch_err, denom, rel = _figures(o, h, lo)
        tol = tol_factor * torch_err + EPS[dtype] * max(ref_mag, 1e-30)
        if nonfinite:
            err = rel = math.inf
        else:
            rel = rel / (denom or 1.0)
        if err > worst["max_abs_err"] or i == 0:
            worst.update(max_abs_err=err, tol=tol, torch_err=torch_err)
        worst["rel_err"] = max(worst["rel_err"], rel)
        if reason is None:
            if unwritten:
                reason = (f"{name}: {unwritten} of {o.numel()} elements are NaN where the "
                          "reference is finite (never written over the NaN poison, or NaN "
                          "computed)")
            elif nonfinite:
                reason = f"{name}: {nonfinite} non-finite elements where the reference is finite"
            elif err > tol:
                reason = (f"{name}: max abs error {err:.3g} > tolerance {tol:.3g} "
                          f"({tol_factor:g}x torch's own error {torch_err:.3g} + 1 ulp)")
    return worst, reason


def _figures(o: torch.Tensor, h: torch.Tensor, lo: torch.Tensor) -> list:
    """compare's figures of one output, in float64 over the elements where the reference is
    finite: [unwritten (NaN) count, non-finite count, max |o - h|, max |h|, max |lo - h|,
    ||h||, ||o - h||], read back in one transfer. Masking by `where`, not boolean indexing,
    which waits for the GPU and gathers a copy: with a read per figure and three indexings,
    compare took 3.7 s of flash.yaml's 27 s check pass on an H100 (`--profile-harness`)."""
    if o.numel() == 0:
        return [0, 0, 0.0, 0.0, 0.0, 0.0, 0.0]
    hd, od, ld = h.detach().double(), o.detach().double(), lo.detach().double()
    fin = torch.isfinite(hd)
    zero = hd.new_zeros(())
    d = torch.where(fin, od - hd, zero)
    figures = torch.stack([
        (torch.isnan(od) & fin).sum().double(), (~torch.isfinite(od) & fin).sum().double(),
        d.abs().max(), torch.where(fin, hd.abs(), zero).max(),
        torch.where(fin, (ld - hd).abs(), zero).max(),
        torch.linalg.vector_norm(torch.where(fin, hd, zero)), torch.linalg.vector_norm(d)])
    unwritten, nonfinite, *rest = figures.tolist()
    return [int(unwritten), int(nonfinite), *rest]


class ReferenceCache:
    """The references of the shape in flight, shared by all its implementations.

    Every implementation of one shape is checked on the same fresh inputs (seeded per run, shape
    and trial), so the fp32/fp64 and same-dtype references are computed once per (shape, trial)
    instead of once per implementation. Only one shape is held at a time (cases come grouped by
    shape), so memory stays bounded by one shape's outputs.
    """

    def __init__(self):
        self.key = None
        self.entries: dict[int, tuple] = {}
        self.hits = 0

    def get(self, key, trial: int, compute):
        if key != self.key:
            self.key, self.entries = key, {}
        if trial in self.entries:
            self.hits += 1
        else:
            self.entries[trial] = compute()
        return self.entries[trial]


def check(op: Op, impl: Impl, params: Params, dtype_name: str, device: str, *,
          trials: int = 2, seed: int = 0, tol_factor: float = 2.0,
          cache: ReferenceCache | None = None) -> CorrectnessResult:
    """Run `impl` on `trials` fresh random inputs; compare each result with the reference.

    The references are computed from the freshly drawn inputs before the implementation runs
    (an implementation that writes into its inputs cannot move them); with `cache`, they are
    reused by the other implementations of the same (params, dtype, seed).
    """
    dtype = TORCH_DTYPES[dtype_name]
    hi = torch.float64 if dtype == torch.float32 else torch.float32
    key = (op.name, tuple(sorted(params.items())), dtype_name, device, seed)
    worst: dict | None = None
    for t in range(trials):
        gen = torch.Generator(device=device)
        gen.manual_seed(seed + 7919 * t)
        inputs = op.make_inputs(params, dtype, device, gen)

        def references():
            t_ref = time.perf_counter()
            lo = tuple(r.detach() if isinstance(r, torch.Tensor) else r
                       for r in _as_tuple(op.run_reference(inputs, params)))
            hi_ = tuple(r.detach() if isinstance(r, torch.Tensor) else r for r in _as_tuple(
                op.run_reference(tuple(_upcast(x, hi) for x in inputs), params)))
            if device == "cuda":
                torch.cuda.synchronize()
            REF_SECONDS[0] += time.perf_counter() - t_ref
            return lo, hi_

        ref_lo, ref_hi = cache.get(key, t, references) if cache is not None else references()
        out_buf = op.make_out(inputs, params) if impl.accepts_out else None
        if out_buf is not None:
            out_buf.fill_(float("nan"))
        else:
            poison_allocator(device, 2 * sum(x.numel() * x.element_size() for x in inputs
                                             if isinstance(x, torch.Tensor)))
        out = op.bind_impl(impl, inputs, params, out_buf)()
        if out_buf is not None and out is None:
            out = out_buf
        if device == "cuda":
            torch.cuda.synchronize()
        out = tuple(o.detach().clone() if isinstance(o, torch.Tensor) else o
                    for o in _as_tuple(out))
        figures, reason = compare(out, ref_hi, ref_lo, dtype, tol_factor)
        del inputs, out, ref_lo, ref_hi, out_buf
        if worst is None or _ratio(figures) >= _ratio(worst):
            worst = figures
        if reason is not None:
            return _result(False, worst, t + 1, seed, f"trial {t}: {reason}")
    return _result(True, worst or {}, trials, seed, None)


def _ratio(f: dict) -> float:
    return f.get("max_abs_err", 0.0) / max(f.get("tol", 0.0), 1e-300)


def _result(ok: bool, f: dict, trials: int, seed: int, error: str | None) -> CorrectnessResult:
    return CorrectnessResult(ok, f.get("max_abs_err", math.nan), f.get("rel_err", math.nan),
                             f.get("tol", math.nan), f.get("torch_err", math.nan), trials, seed,
                             error)


def check_impl(op: Op, impl_name: str, params, dtype_name: str = "float32",
               device: str = "cpu", *, config: dict | None = None, trials: int = 2,
               seed: int = 0, tol_factor: float = 2.0) -> CorrectnessResult:
    """`check` of the registered impl `impl_name` as a worker runs it (for a kernel's own
    tests): the tunables in `config` forced, its `triton.autotune` kernels steered (in the
    interpreter: their first config, or the forced one, and no benchmarking)."""
    from harness import tuning
    from harness.tuning.autotune import steering

    impl = op.get_impl(impl_name)
    unknown = [k for k in (config or {}) if k not in impl.tunables()]
    if unknown:
        raise ValueError(f"config: {unknown[0]!r} is not a tunable of impl {impl_name!r} "
                         f"(tunables: {', '.join(impl.tunables()) or '(none)'})")
    p = params if isinstance(params, Params) else Params(params)
    with tuning.forcing(impl.split_config(config or {})), steering(impl):
        return check(op, impl, p, dtype_name, device, trials=trials, seed=seed,
                     tol_factor=tol_factor)
