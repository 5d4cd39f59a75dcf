"""What reading a stored run needs to know of its op, kept in the run's manifest (`op_card`).

`show`, `compare`, `report` and the dashboard read a run's tables; three facts come from the op's
code: its primary metric (TFLOP/s or GB/s), each implementation's backend (the noise floor's
peers) and the prefix its Tuners' fields take (`dq.BLOCK_M`). Asking the registry for them
imports every op under kernels/, with torch and Triton: 3-5 s of an 8.8 s `show` of a
280-case run on a 2-core machine. So a run records them when it starts (`card`, from the op it
measures: a `harness ab` base run's from its commit), and the readers below take them from
there. A run from before the card, or an implementation it does not list: the registry, as
before.
"""
from __future__ import annotations

KEY = "op_card"


def card(op) -> dict:
    """{"primary": ..., "impls": {impl: {"backend": ..., "tuners": {tuner name: prefix}}}}."""
    impls = {}
    for name, impl in op.impls.items():
        try:
            tuners = _prefixes(impl.all_tuners())
        except Exception:  # what the registry cannot list, a reader asks it for again
            tuners = None
        impls[name] = {"backend": impl.backend, "tuners": tuners}
    return {"primary": op.primary, "impls": impls}


def of(manifest: dict | None) -> dict:
    c = (manifest or {}).get(KEY)
    return c if isinstance(c, dict) else {}


def _impl(c: dict, impl) -> dict | None:
    got = (c.get("impls") or {}).get(impl) if isinstance(impl, str) else None
    return got if isinstance(got, dict) else None


def primary(manifest: dict) -> str:
    """The run's primary metric ("tflops" or "gbps")."""
    got = of(manifest).get("primary")
    if isinstance(got, str):
        return got
    from harness.registry import registry

    try:
        return registry().get_op(manifest["experiment"]["op"]).primary
    except Exception:  # an op no longer registered still shows its run
        return "gbps"


def tuners(manifest: dict | None, op: str, impl: str) -> dict[str, str] | None:
    """{tuner name: prefix} of an implementation; None where neither the card nor the
    registry knows it."""
    got = _impl(of(manifest), impl)
    if got is not None and isinstance(got.get("tuners"), dict):
        return got["tuners"]
    from harness.registry import registry

    try:
        found = registry().get_op(op).impls[impl].all_tuners()
    except Exception:  # an op or impl no longer registered
        return None
    return _prefixes(found)


def _prefixes(tuners: dict) -> dict[str, str]:
    """{prefix: Tuner} -> {tuner name: prefix}; a name under two prefixes keeps the first."""
    out: dict[str, str] = {}
    for prefix, t in tuners.items():
        out.setdefault(t.name, prefix)
    return out


def backend(manifest: dict | None, op: str, impl: str, base_impl=None) -> str | None:
    """The backend of an implementation (a config variant's: its base impl's); None where
    neither the card nor this process's registry has it (the noise floor then treats it as
    ours)."""
    name = base_impl if isinstance(base_impl, str) and base_impl else impl
    got = _impl(of(manifest), name)
    if got is not None and isinstance(got.get("backend"), str):
        return got["backend"]
    from harness.registry import get_op

    try:
        return get_op(op).get_impl(name).backend
    except Exception:  # an op or impl this checkout does not have
        return None
