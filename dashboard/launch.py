"""`python -m harness dashboard`: serve the dashboard on 127.0.0.1 over the store.

Starts `streamlit run dashboard/app.py` (through dashboard/serve.py, which imports the pages'
modules and reads the runs table while a browser loads the app) as a subprocess (argument
list), passing the store roots after `--` (the app also reads them from $KERNEL_LAB_STORES),
prints the URL, and waits.
"""
from __future__ import annotations

import argparse
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

from harness.errors import HarnessError

HELP = "browse runs in the Streamlit dashboard (runs, roofline, stalls, compare, history)"
APP = Path(__file__).resolve().parent / "app.py"
SERVE = Path(__file__).resolve().parent / "serve.py"
DEFAULT_PORT = 8501


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", action="append", default=None, metavar="DIR",
                   help="store root to show (repeatable; default: runs/). The committed "
                        "examples in runs/examples/ are shown beside it")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port on 127.0.0.1 (default {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--no-examples", action="store_true",
                   help="leave out the committed example runs")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_port(port: int) -> None:
    """Fail early when something listens on the port (SO_REUSEADDR as the server sets it, so
    connections of a just-stopped server in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise HarnessError(f"dashboard: port {port} on 127.0.0.1 is in use; pass --port N "
                               "(or --port 0 for a free one)") from None


def command(stores: list[str], port: int, no_examples: bool = False) -> list[str]:
    """The streamlit argv (through dashboard/serve.py, which warms the pages' work):
    bound to 127.0.0.1, headless, no telemetry, no file watcher (for live reload while editing
    the dashboard use `streamlit run dashboard/app.py`); the store roots after `--`."""
    argv = [sys.executable, str(SERVE), "run", str(APP),
            "--server.address", "127.0.0.1", "--server.port", str(port),
            "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--client.toolbarMode", "minimal", "--server.fileWatcherType", "none", "--"]
    for s in stores:
        argv += ["--store", str(Path(s).expanduser().resolve())]
    if no_examples:
        argv.append("--no-examples")
    return argv


def main(args, console) -> int:
    import importlib.util

    if importlib.util.find_spec("streamlit") is None:
        raise HarnessError("dashboard: streamlit is not installed (pip install -e . installs it)")
    stores = args.store or ["runs"]
    for s in stores:
        if Path(s).exists() and not Path(s).is_dir():
            raise HarnessError(f"dashboard: --store {s} is not a directory")
    port = free_port() if args.port == 0 else args.port
    if not 0 < port < 65536:
        raise HarnessError(f"dashboard: --port must be 1-65535 (or 0), got {args.port}")
    _check_port(port)
    argv = command(stores, port, args.no_examples)
    console.print(f"[dim]$ {shlex.join(argv)}[/]", highlight=False, soft_wrap=True)
    console.print(f"dashboard: [bold]http://127.0.0.1:{port}[/] over "
                  f"{', '.join(stores)}{'' if args.no_examples else ' + runs/examples'} "
                  "(Ctrl-C stops it)")
    proc = subprocess.Popen(argv)

    def _stop(signum, frame):  # SIGTERM to us: take the server down too, then exit
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
