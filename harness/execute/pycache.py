"""Bytecode for the harness's many short-lived Python processes.

A run starts a dozen Python processes (compile-ahead, check, time, each profiler); each imports
torch and most call torch.compile. Container images often set PYTHONDONTWRITEBYTECODE (the lent
H200 image does, and ships no .pyc), so every one of those processes compiled the same ~2,000
module sources to bytecode again: 4.6 s of torch.compile's first call per process on the H200
(tools/device/compile_probe.py profile). Where the environment forbids writing bytecode beside the
sources, the harness keeps it under a private prefix instead (PYTHONPYCACHEPREFIX), so only the
first process on a machine pays. Nothing is written into site-packages; a user's own
PYTHONPYCACHEPREFIX wins; HARNESS_PYCACHE=0 leaves the environment as it is.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "kernel-lab" / "pycache"


def _wanted(env: dict) -> bool:
    return (env.get("HARNESS_PYCACHE", "1") != "0" and not env.get("PYTHONPYCACHEPREFIX")
            and bool(env.get("PYTHONDONTWRITEBYTECODE")))


def apply_to_env(env: dict[str, str]) -> dict[str, str]:
    """A worker's environment: bytecode under `cache_dir()` where the environment forbade it."""
    if _wanted(env):
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(cache_dir())
    return env


def apply_here() -> None:
    """The same for this (driver) process, before it imports torch."""
    if sys.flags.dont_write_bytecode and _wanted(dict(os.environ)) and sys.pycache_prefix is None:
        sys.pycache_prefix = str(cache_dir())
        sys.dont_write_bytecode = False
