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


def shared_once(tmp_path_factory, name: str, make) -> Path:
    """`make(folder)` once per test session, even across pytest-xdist's worker processes (a
    lock in the temp folder they share): the folder, filled by whichever process came first."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # pytest-of-<user>/pytest-N/: shared by the workers of one session
    folder = base / f"shared-{name}"
    with FileLock(str(folder) + ".lock"):
        done = folder / ".done"
        if not done.exists():
            folder.mkdir(parents=True, exist_ok=True)
            make(folder)
            done.touch()
    return folder


def cpu_smoke_run(tmp_path_factory, name: str, argv: list[str]) -> tuple[Path, str]:
    """A real CPU run (`python -m harness run ARGV --device cpu`, Triton interpreter) made once
    per session: (run_dir, its stdout)."""
    def make(root: Path) -> None:
        env = {**os.environ, "TRITON_INTERPRET": "1", "COLUMNS": "200"}
        proc = subprocess.run([sys.executable, "-m", "harness", "run", *argv,
                               "--store", str(root / "runs"), "--device", "cpu"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        (root / "stdout.txt").write_text(proc.stdout)

    root = shared_once(tmp_path_factory, name, make)
    (run,) = [p for p in (root / "runs").iterdir() if (p / "manifest.json").exists()]
    return run, (root / "stdout.txt").read_text()


@pytest.fixture(scope="session")
def cpu_flash_run(tmp_path_factory):
    """A real CPU run of experiments/flash.yaml (smoke sweep, Triton interpreter; the SDPA
    peers are skipped: they need a CUDA device). Returns (run_dir, the run's stdout)."""
    return cpu_smoke_run(tmp_path_factory, "cpu_flash", ["experiments/flash.yaml"])


@pytest.fixture(scope="session")
def cpu_softmax_run(tmp_path_factory):
    """A real CPU run of experiments/softmax.yaml's smoke sweep, its eager and small Triton
    cases (kept short): (run_dir, the run's stdout), made once per session."""
    return cpu_smoke_run(tmp_path_factory, "cpu_softmax",
                         ["experiments/softmax.yaml", "--cases", "torch.*,triton.*.N=100.*"])


@pytest.fixture
def test_ops(monkeypatch):
    """The test op module (tests/harness_test_ops.py: `scale2` and its impls) registered, in
    this process and in the workers it starts."""
    monkeypatch.setenv("HARNESS_OPS", "harness_test_ops")
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    import harness.registry as reg
    monkeypatch.setattr(reg, "_REGISTRY", None)  # rediscovered with the test op
    yield


@pytest.fixture
def h200_and_a_later_copy(tmp_path):
    """`make(name)` -> (before, after): the real H200 softmax run of tests/fixtures/runs and a
    copy of it named `name`, made a day later, both in tmp_path."""
    from harness import store

    h200 = "20261122T021915Z-softmax-6059"

    def make(name: str) -> tuple[Path, Path]:
        import shutil

        before, after = tmp_path / h200, tmp_path / name
        shutil.copytree(ROOT / "tests" / "fixtures" / "runs" / h200, before)
        shutil.copytree(before, after)
        m = store.load_manifest(after)
        store.write_manifest(after, {**m, "run_id": after.name,
                                     "created_utc": "2026-11-23T00:00:00+00:00"})
        return before, after
    return make

