"""harness.execute.quick_exit: a harness process ends with its status, its output and its
atexit work done, and without the interpreter's teardown (HARNESS_QUICK_EXIT=0: the ordinary
exit)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.execute.quick_exit import exit_code

ROOT = Path(__file__).resolve().parents[1]

# a process that leaves output buffered, an atexit callback, a non-daemon thread still working
# and an object whose finaliser only the interpreter's teardown runs
SCRIPT = """
import atexit, sys, threading, time
from harness.execute.quick_exit import quick_exit

class Torn:
    def __del__(self):
        sys.stdout.write("torn down\\n")
        sys.stdout.flush()

keep = Torn()
atexit.register(lambda: sys.stdout.write("atexit ran\\n"))
threading.Thread(target=lambda: (time.sleep(0.3), sys.stdout.write("thread done\\n"))).start()
sys.stdout.write("buffered, no newline flush")
quick_exit({code})
"""


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT.format(code=code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def test_the_status_output_threads_and_atexit_survive_and_the_teardown_is_skipped():
    p = _run("3")
    assert p.returncode == 3
    assert p.stdout.startswith("buffered, no newline flush")
    assert p.stdout.index("thread done") < p.stdout.index("atexit ran")
    assert "torn down" not in p.stdout  # the interpreter's teardown did not run


def test_off_it_is_the_interpreters_own_exit():
    p = _run("3", HARNESS_QUICK_EXIT="0")
    assert p.returncode == 3
    assert "atexit ran" in p.stdout and "thread done" in p.stdout
    assert "torn down" in p.stdout


def test_an_executor_never_shut_down_does_not_hold_the_process():
    """Its idle workers are threads that are not daemons: the interpreter's exit lets them go
    (threading's exit hooks) before it waits for them, and so does quick_exit."""
    script = ("from concurrent.futures import ThreadPoolExecutor\n"
              "from harness.execute.quick_exit import quick_exit\n"
              "pool = ThreadPoolExecutor(2)\n"
              "print(pool.submit(lambda: 'worked').result())\n"
              "quick_exit(4)\n")
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (p.returncode, p.stdout) == (4, "worked\n")


def _script(text: str, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.run([sys.executable, "-c", text], cwd=ROOT, text=True, timeout=60,
                          env={**env, "PYTHONPATH": str(ROOT)}, **kw)


def test_output_that_cannot_be_written_is_reported_and_the_status_is_120():
    """stdout on a full disk (/dev/full): as Python's own exit, an 'Exception ignored' line
    and status 120, not a silent 0."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        p = _script("import sys\nfrom harness.execute.quick_exit import quick_exit\n"
                    "sys.stdout.write('lost\\n' * 3)\nquick_exit(0)\n", stdout=full,
                    stderr=subprocess.PIPE)
    assert p.returncode == 120
    assert "Exception ignored while flushing" in p.stderr


def test_signal_handlers_set_in_python_are_the_default_again_before_the_c_exit():
    """A SIGTERM handler like the CLI's, SIGINT's KeyboardInterrupt: set back to SIG_DFL, so a
    signal while the C library's exit runs ends the process by that signal."""
    p = _script("import signal\n"
                "from harness.execute import quick_exit as q\n"
                "signal.signal(signal.SIGTERM, lambda *a: None)\n"
                "q._default_signals()\n"
                "print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,"
                " signal.getsignal(signal.SIGINT) is signal.SIG_DFL)\n", capture_output=True)
    assert p.stdout.split() == ["True", "True"], p.stderr


def test_ctrl_c_while_waiting_for_threads_keeps_the_status():
    """Ctrl-C while the exit waits for a thread: reported and ignored, as Python's exit does;
    the process still ends with main's status and runs its atexit callbacks."""
    p = _script("import atexit, os, signal, threading, time\n"
                "from harness.execute.quick_exit import quick_exit\n"
                "atexit.register(lambda: print('atexit ran', flush=True))\n"
                "def late():\n"
                "    time.sleep(0.3)\n"
                "    os.kill(os.getpid(), signal.SIGINT)\n"
                "    time.sleep(0.5)\n"
                "threading.Thread(target=late).start()\n"
                "quick_exit(3)\n", capture_output=True)
    assert p.returncode == 3, p.stderr
    assert "atexit ran" in p.stdout
    assert "Exception ignored while waiting for the threads" in p.stderr


@pytest.mark.parametrize("code, status, err", [("None", 0, ""), ("True", 1, ""),
                                               ("'bad input'", 1, "bad input")])
def test_a_code_ends_the_process_as_system_exit_would(code, status, err):
    p = _run(code)
    assert p.returncode == status
    assert p.stderr.strip() == err


def test_exit_code_is_system_exits():
    assert [exit_code(c) for c in (None, 0, 2, 130, True, "message")] == [0, 0, 2, 130, 1, 1]


def test_the_cli_ends_through_it_with_its_status(tmp_path):
    """`python -m harness`: a bad experiment file is exit 2 and one error line, as before."""
    p = subprocess.run([sys.executable, "-m", "harness", "run", str(tmp_path / "nope.yaml")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().startswith("error: ") and "nope.yaml" in p.stderr
