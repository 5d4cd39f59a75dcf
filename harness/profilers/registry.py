"""The profilers a run can use. Each joins by registering its class (base.register) when its
module is imported; this module imports the built-in ones (ncu, nsys, the torch.profiler
fallback), so base, which every profiler imports, imports none of them back."""
from __future__ import annotations

from harness.profilers import base, ncu, nsys, torch_profiler  # noqa: F401  (they register)
from harness.profilers.base import Profiler


def profilers() -> dict[str, Profiler]:
    """Every registered profiler, instantiated."""
    return {name: cls() for name, cls in base._REGISTRY.items()}


def get(name: str) -> Profiler:
    return profilers()[name]
