"""Worker bytecode: kept under a private prefix where the environment forbids writing it."""
import os
import subprocess
import sys

from harness.execute.executors.process import worker_env


def test_worker_env_moves_bytecode_under_the_private_prefix(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.delenv("HARNESS_PYCACHE", raising=False)
    env = worker_env("cpu")
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "kernel-lab" / "pycache")


def test_worker_env_respects_the_user(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "mine"))
    assert worker_env("cpu")["PYTHONPYCACHEPREFIX"] == str(tmp_path / "mine")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX")
    monkeypatch.setenv("HARNESS_PYCACHE", "0")
    env = worker_env("cpu")
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and "PYTHONPYCACHEPREFIX" not in env
    monkeypatch.delenv("HARNESS_PYCACHE")
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE")
    assert "PYTHONPYCACHEPREFIX" not in worker_env("cpu")  # bytecode is written as usual


def test_a_worker_process_writes_its_bytecode_there_once(monkeypatch, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "kl_probe_mod.py").write_text("X = 1\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.delenv("HARNESS_PYCACHE", raising=False)
    env = worker_env("cpu")
    env["PYTHONPATH"] = f"{src}{os.pathsep}{env['PYTHONPATH']}"
    subprocess.run([sys.executable, "-c", "import kl_probe_mod"], env=env, check=True)
    written = list((tmp_path / "cache" / "kernel-lab" / "pycache").rglob("kl_probe_mod*.pyc"))
    assert len(written) == 1
    assert not (src / "__pycache__").exists()  # nothing beside the sources


def test_the_driver_process_does_the_same(tmp_path):
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "XDG_CACHE_HOME": str(tmp_path)}
    env.pop("PYTHONPYCACHEPREFIX", None)
    env.pop("HARNESS_PYCACHE", None)
    code = ("import sys; from harness.execute import pycache; pycache.apply_here(); "
            "print(sys.pycache_prefix, sys.dont_write_bytecode)")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, text=True,
                         capture_output=True).stdout.split()
    assert out == [str(tmp_path / "kernel-lab" / "pycache"), "False"]


def test_worker_env_pins_one_triton_cache(monkeypatch, tmp_path):
    """Every worker gets TRITON_CACHE_DIR set (Triton's own default unless the user set one):
    unset, a worker's first torch.compile kernel moves Triton's cache to Inductor's folder for
    the rest of the process, and the check pass missed what compile-ahead had compiled."""
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITON_HOME", str(tmp_path))
    assert worker_env("cpu")["TRITON_CACHE_DIR"] == str(tmp_path / ".triton" / "cache")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    assert worker_env("cpu")["TRITON_CACHE_DIR"] == str(tmp_path / "mine")
