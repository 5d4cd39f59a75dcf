"""Test set-up: Triton kernels run in the CPU interpreter (CI has no GPU)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


import subprocess  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def cpu_flash_run(tmp_path_factory):
    """A real CPU run of experiments/flash.yaml (smoke sweep, Triton interpreter; the SDPA
    peers are skipped: they need a CUDA device). Returns (run_dir, the run's stdout)."""
    root = tmp_path_factory.mktemp("cpu_flash")
    env = {**os.environ, "TRITON_INTERPRET": "1", "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "harness", "run", "experiments/flash.yaml",
                           "--store", str(root), "--device", "cpu"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (run,) = [p for p in root.iterdir() if (p / "manifest.json").exists()]
    return run, proc.stdout
