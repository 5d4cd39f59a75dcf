"""Ops and their implementations, registered by the packages under `kernels/`.

An op folder's `__init__.py` builds one `Op` and registers implementations on it::

    op = Op("softmax", params=[Param("M", int), Param("N", int)], primary="gbps")

    @op.inputs
    def make_inputs(p, dtype, device, gen):       # -> tuple of tensors
        return (torch.randn(p.M, p.N, dtype=dtype, device=device, generator=gen),)

    @op.reference                                  # computed in the inputs' dtype
    def reference(x): return torch.softmax(x, dim=-1)

    @op.impl("triton", backend="triton", accepts_out=True, expected_kernels=1,
             tuners=triton_softmax._tuner)     # its launch-config fields become tunables
    def softmax_triton(x, *, out=None): ...

Nothing in `harness/` branches on an op or implementation name: the op object carries everything
the passes need (inputs, reference, flops/bytes, how to call an impl).
"""
from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from harness.errors import RegistryError
from harness.op_checks import import_error, op_problem

BACKENDS = ("torch", "compile", "triton", "library")
PRIMARY_METRICS = ("gbps", "tflops")


@dataclass(frozen=True)
class Param:
    """One parameter of an op's problem shape (e.g. `N: int`, `causal: bool`, `mode: fwd|bwd`)."""

    name: str
    type: type
    choices: tuple | None = None
    default: Any = None
    help: str = ""
    # True: the value only scales the problem (batch, rows, sequence length); every value runs
    # the same compiled kernels, so compile-ahead compiles a class of cases (the other params
    # and the dtype equal) in one worker. A hint for scheduling, never for correctness.
    size: bool = False

    def type_name(self) -> str:
        return {int: "integer", bool: "boolean", float: "number", str: "string"}[self.type]


class Params(dict):
    """Read-only mapping of parameter values with attribute access (`p.N`)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setitem__(self, key, value):  # pragma: no cover - guard
        raise TypeError("Params are read-only")


Availability = Callable[[Params, str, str], "str | None"]  # (params, dtype, device) -> reason


def _tuner_map(tuners) -> dict[str, Any]:
    """`tuners=` of a registration -> {prefix: tuner}: one Tuner (its fields unprefixed) or a
    mapping {prefix: Tuner} ("" for the unprefixed one), e.g. {"": fwd, "dq": dq_tuner}."""
    if tuners is None:
        return {}
    if isinstance(tuners, Mapping):
        return dict(tuners)
    return {"": tuners}


@dataclass
class Impl:
    """One implementation of an op.

    `fn(*inputs, **op.call_kwargs(params), out=...)` returns the output tensor (or a tuple).
    `unavailable(params, dtype, device)` returns a reason string when it cannot run there.
    """

    name: str
    op: str
    fn: Callable
    backend: str
    accepts_out: bool = False
    unavailable: Availability | None = None
    expected_kernels: int | Callable[[Params], int] | None = None
    description: str = ""
    tuners: dict[str, Any] = field(default_factory=dict)  # prefix -> kernels._tuner.Tuner
    _autotuned: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def all_tuners(self) -> dict[str, Any]:
        """prefix -> what chooses a launch config: the registered Tuners, then the
        `triton.autotune` kernels reachable from `fn` (harness.tuning.autotune; found on first use,
        once the kernels' modules are imported)."""
        if self._autotuned is None:
            from harness.tuning.autotuned import autotuned_kernels

            self._autotuned = autotuned_kernels(self.fn, taken=self.tuners,
                                                module_wide=self.backend in ("triton", "library"))
        return {**self.tuners, **self._autotuned}

    def tunables(self) -> dict[str, tuple[Any, str]]:
        """Tunable name -> (Tuner, field): `BLOCK_M` for the unprefixed Tuner, `dq.BLOCK_M` for
        the one registered under prefix `dq`; an autotuned kernel's configs likewise."""
        out = {}
        for prefix, tuner in self.all_tuners().items():
            for f in tuner.fields:
                out[f"{prefix}.{f}" if prefix else f] = (tuner, f)
        return out

    def split_config(self, config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """{tunable: value} -> {tuner name: {field: value}} (what harness.tuning.forcing
        takes); names must be tunables (checked at spec load)."""
        tunables = self.tunables()
        out: dict[str, dict[str, Any]] = {}
        for name, value in config.items():
            tuner, f = tunables[name]
            out.setdefault(tuner.name, {})[f] = value
        return out

    def reason_unavailable(self, params: Params, dtype: str, device: str) -> str | None:
        if self.unavailable is None:
            return None
        return self.unavailable(params, dtype, device)

    def kernels_expected(self, params: Params) -> int | None:
        k = self.expected_kernels
        return k(params) if callable(k) else k


def _required(name: str):
    def missing(*_a, **_k):
        raise NotImplementedError(f"op does not define {name}()")

    missing.harness_missing = True
    return missing


class Op:
    """An operation: its parameters, inputs, fp32/fp64 reference, FLOP/byte counts, impls."""

    def __init__(
        self,
        name: str,
        params: Iterable[Param],
        *,
        dtypes: Iterable[str] = ("float16", "bfloat16", "float32"),
        primary: str = "gbps",
        description: str = "",
    ):
        if primary not in PRIMARY_METRICS:
            raise ValueError(f"primary must be one of {PRIMARY_METRICS}, got {primary!r}")
        self.name = name
        self.params: tuple[Param, ...] = tuple(params)
        self.dtypes = tuple(dtypes)
        self.primary = primary
        self.description = description
        self.impls: dict[str, Impl] = {}
        self._make_inputs: Callable = _required("inputs")
        self._reference: Callable = _required("reference")
        self._flops: Callable = lambda p: 0.0
        self._bytes: Callable = _required("bytes")
        self._call_kwargs: Callable = lambda p: {}
        self._make_out: Callable | None = None
        self._bind: Callable | None = None
        self._reference_bind: Callable | None = None

    # -- decorators used by kernels/* -------------------------------------------------------
    def inputs(self, fn):
        """`fn(params, torch_dtype, device, generator) -> tuple[Tensor, ...]`."""
        self._make_inputs = fn
        return fn

    def reference(self, fn):
        """`fn(*inputs, **call_kwargs)`: torch's own computation, in the inputs' dtype."""
        self._reference = fn
        return fn

    def flops(self, fn):
        """`fn(params) -> float`: analytic floating-point operations of one call."""
        self._flops = fn
        return fn

    def bytes(self, fn):
        """`fn(params, dtype_itemsize) -> float`: fewest DRAM bytes one call must move."""
        self._bytes = fn
        return fn

    def call_kwargs(self, fn):
        """`fn(params) -> dict`: keyword arguments every impl receives (e.g. causal=True)."""
        self._call_kwargs = fn
        return fn

    def output(self, fn):
        """`fn(inputs, params) -> Tensor`: an empty output buffer for impls with accepts_out."""
        self._make_out = fn
        return fn

    def binder(self, fn):
        """Override how a call is built: `fn(callable_fn, inputs, params, out) -> () -> result`.

        Used by ops whose measured region is not a plain call (e.g. the backward pass).
        It is applied to impls and to the reference alike. What `fn` runs itself (the forward
        of a measured backward) runs under harness.tuning.setup(): its Tuners time nothing.
        """
        self._bind = fn
        return fn

    def impl(
        self,
        name: str,
        *,
        backend: str,
        accepts_out: bool = False,
        unavailable: Availability | None = None,
        expected_kernels: int | Callable[[Params], int] | None = None,
        description: str = "",
        tuners=None,
    ):
        """Register `fn` as implementation `name`. `tuners`: the Tuner(s) its kernels choose
        launch configurations with (one, or {prefix: Tuner}): their fields are its tunables."""
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")

        def deco(fn):
            if name in self.impls:
                raise ValueError(f"op {self.name!r}: implementation {name!r} registered twice")
            self.impls[name] = Impl(
                name=name,
                op=self.name,
                fn=fn,
                backend=backend,
                accepts_out=accepts_out,
                unavailable=unavailable,
                expected_kernels=expected_kernels,
                description=description or (fn.__doc__ or "").strip().split("\n")[0],
                tuners=_tuner_map(tuners),
            )
            return fn

        return deco

    # -- what the harness calls -------------------------------------------------------------
    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def param_names(self) -> list[str]:
        return [p.name for p in self.params]

    def get_impl(self, name: str) -> Impl:
        try:
            return self.impls[name]
        except KeyError:
            raise RegistryError(
                f"Unknown impl {name!r} for op {self.name!r}. "
                f"Registered implementations: {', '.join(sorted(self.impls))}"
            ) from None

    def make_inputs(self, params: Params, dtype, device: str, generator) -> tuple:
        return tuple(self._make_inputs(params, dtype, device, generator))

    def kwargs(self, params: Params) -> dict:
        return dict(self._call_kwargs(params))

    def flop_count(self, params: Params) -> float:
        return float(self._flops(params))

    def byte_count(self, params: Params, itemsize: int) -> float:
        return float(self._bytes(params, itemsize))

    def make_out(self, inputs: tuple, params: Params):
        return None if self._make_out is None else self._make_out(inputs, params)

    def bind(self, fn: Callable, inputs: tuple, params: Params, out=None) -> Callable[[], Any]:
        """A zero-argument callable running `fn` on `inputs`: what timing and profilers call."""
        if self._bind is not None:
            from harness import tuning

            with tuning.setup():  # what the binder runs is set-up, not the measured call
                return self._bind(fn, inputs, params, out)
        kw = self.kwargs(params)
        if out is not None:
            kw["out"] = out
        return lambda: fn(*inputs, **kw)

    def bind_impl(self, impl: Impl, inputs: tuple, params: Params, out=None) -> Callable[[], Any]:
        return self.bind(impl.fn, inputs, params, out if impl.accepts_out else None)

    def run_reference(self, inputs: tuple, params: Params):
        return self.bind(self._reference, inputs, params)()


@dataclass
class Registry:
    ops: dict[str, Op] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)  # package -> import error
    origin: dict[str, str] = field(default_factory=dict)  # op name -> the module that added it
    modules: dict[str, str] = field(default_factory=dict)  # op -> the module that registered it

    def add(self, op: Op, origin: str = "?") -> Op:
        if op.name in self.ops:
            if self.ops[op.name] is op:  # the same object found again (imported elsewhere)
                return op
            raise RegistryError(f"op {op.name!r} is registered twice: by "
                                f"{self.origin.get(op.name, '?')} and by {origin}; rename one")
        self.ops[op.name] = op
        self.origin[op.name] = origin
        return op

    def get_op(self, name: str) -> Op:
        if name in self.ops:
            return self.ops[name]
        if name in self.broken:
            raise RegistryError(f"op {name!r} failed to import: {self.broken[name]}")
        raise RegistryError(
            f"Unknown op {name!r}. Registered ops: {', '.join(sorted(self.ops)) or '(none)'}"
        )


_REGISTRY: Registry | None = None


def registry() -> Registry:
    """The registry with every op under `kernels/` and in $HARNESS_OPS imported (once per
    process). A broken $HARNESS_OPS module raises RegistryError (one line); a broken kernels/
    folder is listed as broken and hides nothing else."""
    global _REGISTRY
    if _REGISTRY is None:
        reg = Registry()
        _discover(reg)
        _REGISTRY = reg
    return _REGISTRY


def _discover(reg: Registry) -> None:
    """Import every package under kernels/, then the modules named in $HARNESS_OPS
    (comma-separated module names or paths of .py files, e.g. ops outside this repository)."""
    import kernels

    for m in sorted(pkgutil.iter_modules(kernels.__path__), key=lambda m: m.name):
        if not m.ispkg or m.name.startswith("_"):
            continue
        try:
            module = importlib.import_module(f"kernels.{m.name}")
            ops = module_ops(module)
            problem = next((p for op in ops for p in [op_problem(op)] if p), None)
        except Exception as exc:  # a broken kernel folder must not hide the others
            reg.broken[m.name] = import_error(exc)
            continue
        if problem:
            reg.broken[m.name] = problem
            continue
        for op in ops:
            reg.add(op, f"kernels/{m.name}")
            reg.modules[op.name] = module.__name__
    for entry in [n.strip() for n in os.environ.get("HARNESS_OPS", "").split(",") if n.strip()]:
        _add_user_module(reg, entry)


def _add_user_module(reg: Registry, entry: str) -> None:
    """Import one $HARNESS_OPS entry and add its ops; whatever is wrong with it is one line."""
    where, name = f"HARNESS_OPS: {entry}", entry
    if entry.endswith(".py") or "/" in entry or os.sep in entry:
        path = Path(entry).expanduser()
        if not path.is_file():
            raise RegistryError(f"{where}: no such file")
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        name = path.stem
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise RegistryError(f"{where}: module {name!r} failed to import: "
                                f"{import_error(exc)}") from None
        raise RegistryError(f"{where}: no module named {name!r} (put its folder on PYTHONPATH, "
                            f"or give the path of its .py file)") from None
    except Exception as exc:
        raise RegistryError(f"{where}: module {name!r} failed to import: "
                            f"{import_error(exc)}") from None
    ops = module_ops(module)
    if not ops:
        raise RegistryError(f"{where}: module {name!r} registers no op (build one at module "
                            f"level: op = Op(name, params=[...]); see harness.registry)")
    for op in ops:
        problem = op_problem(op)
        if problem:
            raise RegistryError(f"{where}: {problem}")
        reg.add(op, f"module {name!r}")
        reg.modules[op.name] = module.__name__


def module_ops(module) -> list[Op]:
    """The module's `op`, or every Op at its top level (each object once)."""
    op = getattr(module, "op", None)
    if isinstance(op, Op):
        return [op]
    found: dict[int, Op] = {}
    for v in list(vars(module).values()):
        if isinstance(v, Op):
            found.setdefault(id(v), v)
    return list(found.values())


def get_op(name: str) -> Op:
    return registry().get_op(name)


def describe(reg: Registry) -> list[Mapping[str, Any]]:
    """Rows for `harness list`."""
    rows = []
    for name in sorted(reg.ops):
        op = reg.ops[name]
        for impl in op.impls.values():
            rows.append(
                {
                    "op": name,
                    "impl": impl.name,
                    "backend": impl.backend,
                    "params": ", ".join(p.name for p in op.params),
                    "tunables": ", ".join(impl.tunables()),
                    "description": impl.description,
                }
            )
    return rows
