"""Retake docs/img/dashboard.png: the real dashboard over the committed example runs, in
headless Chromium.

    python tools/dashboard_screenshot.py [--page roofline] [--run RUN_ID] [--out PATH]

Serves `python -m harness dashboard --port 0` from this checkout (the sidebar names its runs/
and runs/examples/ folders: take it from a checkout at a neutral path), waits for the page's
first plotly chart to draw its points, saves a 1400x860 screenshot and stops the server. Needs
playwright and Debian's chromium (`bash tests/run.sh` installs both). About a minute on a
2-core machine.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("KERNEL_LAB_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def serve() -> tuple[subprocess.Popen, str]:
    """Start the dashboard; return the process and the URL it printed."""
    proc = subprocess.Popen([sys.executable, "-m", "harness", "dashboard", "--port", "0"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        m = re.search(r"dashboard: (http://127\.0\.0\.1:\d+)", line)
        if m:
            return proc, m.group(1)
        if time.monotonic() > deadline:
            break
    stop(proc)
    raise SystemExit("the dashboard did not print its URL")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the launcher and its streamlit child
        proc.wait(timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page", default="roofline")
    ap.add_argument("--run", default="20261124T161243Z-flash-attention-fwd-337b")
    ap.add_argument("--out", default=str(ROOT / "docs" / "img" / "dashboard.png"))
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright

    proc, url = serve()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 860})
            page.goto(f"{url}/{a.page}?run={a.run}", wait_until="domcontentloaded",
                      timeout=120_000)
            page.locator(".js-plotly-plot .scatterlayer .point").first.wait_for(
                state="visible", timeout=180_000)
            page.wait_for_timeout(3000)  # plotly's transition, streamlit's last rerun
            page.screenshot(path=a.out)
            browser.close()
    finally:
        stop(proc)
    print(f"{a.out}: {Path(a.out).stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
