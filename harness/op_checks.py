"""What a registered op can get wrong, as one line each (harness.registry raises them as
RegistryError for $HARNESS_OPS modules and lists them as broken for kernels/ folders).

    import_error(exc)          the last line of a failed import's traceback, with the file:line
                               in the user's code it came from
    op_problem(op)             a missing inputs()/reference()/bytes(), or an impl that cannot
                               take the op's inputs (signature_problem)

Nothing here imports harness.registry: ops and impls are read by attribute.
"""
from __future__ import annotations

import inspect
import sysconfig
import traceback
from pathlib import Path

HARNESS_DIR = str(Path(__file__).resolve().parent)


def import_error(exc: BaseException) -> str:
    """The last line of an import's traceback, with the file:line in the user's code it came
    from (the deepest frame outside Python's, the installed packages' and the harness's files)."""
    text = traceback.format_exception_only(type(exc), exc)[-1].strip()
    where = None
    if isinstance(exc, SyntaxError) and exc.filename:
        where = (exc.filename, exc.lineno)
    else:
        skip = tuple(p for p in {sysconfig.get_paths().get("stdlib"),
                                 sysconfig.get_paths().get("purelib"),
                                 sysconfig.get_paths().get("platlib"), HARNESS_DIR} if p)
        for fs in traceback.extract_tb(exc.__traceback__):
            if not fs.filename.startswith("<") and not fs.filename.startswith(skip):
                where = (fs.filename, fs.lineno)
    return f"{text} ({Path(where[0]).name}:{where[1]})" if where else text


def op_problem(op) -> str | None:
    """Why an op cannot be run as registered (one line), else None: a missing inputs() or
    reference(), an impl whose signature cannot take the op's inputs."""
    for attr, what in (("_make_inputs", "inputs"), ("_reference", "reference"),
                       ("_bytes", "bytes")):
        if getattr(getattr(op, attr), "harness_missing", False):
            return f"op {op.name!r} defines no {what}() (decorate a function with @op.{what})"
    for impl in op.impls.values():
        problem = signature_problem(op, impl)
        if problem:
            return f"op {op.name!r}: {problem}"
    return None


def signature_problem(op, impl) -> str | None:
    """Why `impl.fn` cannot be called as the op calls it, with the inputs its reference takes
    (the reference's parameters without defaults) and `out=` when it accepts one; None when it
    can, or when the reference's signature does not say (*args, a custom binder)."""
    if op._bind is not None:
        return None
    try:
        ref, sig = inspect.signature(op._reference), inspect.signature(impl.fn)
    except (TypeError, ValueError):
        return None
    params = list(ref.parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    n = sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            and p.default is p.empty)
    kw = {p.name: None for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty}
    if impl.accepts_out:
        kw["out"] = None
    try:
        sig.bind(*range(n), **kw)
    except TypeError as exc:
        return (f"impl {impl.name!r}: {_fn_name(impl.fn)}{sig} cannot take the op's inputs as "
                f"its reference {_fn_name(op._reference)}{ref} does"
                f"{' (and out=, accepts_out=True)' if impl.accepts_out else ''}: {exc}")
    return None


def _fn_name(fn) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__
