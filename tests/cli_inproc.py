"""`python -m harness ARGS` run in this test process: the same `harness.cli.main`, the same
worker subprocesses, stdout/stderr captured, without paying a second Python + torch import
(~3 s of CPU) per command.

What a subprocess gave for free is restored by hand around each call: the environment (the
caller's extra variables for the call; anything the verb sets, e.g. `--profile-harness`,
undone), the working directory, sys.argv (a run records its command line), the SIGTERM handler
(`run` installs one), and the op registry (rebuilt when HARNESS_OPS differs, so a test op never
leaks into another test). Tests that signal or kill the driver itself (Ctrl-C, SIGKILL) start
a real subprocess instead.
"""
from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_cli(args, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run the CLI in-process; a CompletedProcess (returncode, stdout, stderr) as
    subprocess.run(..., capture_output=True, text=True) would give."""
    import harness.registry as reg
    from harness.cli import main

    args = [str(a) for a in args]
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    saved_term = signal.getsignal(signal.SIGTERM)
    saved_registry = reg._REGISTRY
    if env is not None:
        os.environ.clear()
        os.environ.update({k: str(v) for k, v in env.items()})
    reg._REGISTRY = None  # rebuilt for this call's HARNESS_OPS (cheap: the modules are cached)
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        os.chdir(cwd)
        sys.argv = ["harness", *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(args)
            except SystemExit as exc:  # argparse: --help, usage errors
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    finally:
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        signal.signal(signal.SIGTERM, saved_term)
        os.environ.clear()
        os.environ.update(saved_env)
        reg._REGISTRY = saved_registry
    return subprocess.CompletedProcess(["harness", *args], code, out.getvalue(), err.getvalue())
