"""Fixtures for the dashboard tests (helpers in dash_helpers.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
from dash_helpers import copy_run, gpu_example

from dashboard import data
from harness import store


@pytest.fixture(scope="session")
def example_run() -> Path:
    return gpu_example()


@pytest.fixture(scope="session")
def example_runs() -> list[Path]:
    """Every committed example run (oldest first)."""
    runs = [Path(r["path"]) for r in store.list_runs(data.EXAMPLES_ROOT) if not r.get("error")]
    assert runs, f"no readable example run under {data.EXAMPLES_ROOT}"
    return runs


@pytest.fixture
def user_store(tmp_path) -> Path:
    root = tmp_path / "runs"
    root.mkdir()
    return root


@pytest.fixture
def faster_copy(example_run, user_store) -> Path:
    return copy_run(example_run, user_store, faster_impl="triton")


@pytest.fixture(scope="session")
def cpu_run(cpu_softmax_run) -> Path:
    """A real CPU run of the softmax experiment (Triton interpreter, smoke sweep; the eager and
    the small Triton cases, to keep it short; made once per session, tests/conftest.py)."""
    return cpu_softmax_run[0]
