"""End to end: `python -m harness dashboard` served for real, loaded in headless Chromium.

Opens the Roofline page of the committed example run, checks that plotly drew the roofline
(points per impl and the calibrated ceilings) and saves a screenshot under test-artifacts/.
Without chromium the test skips locally and fails when $CI is set.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from dash_helpers import ROOT

from dashboard.launch import free_port

CHROMIUM = Path(os.environ.get("KERNEL_LAB_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = ROOT / "test-artifacts"


def _require_browser():
    why = None
    if not CHROMIUM.exists():
        why = f"{CHROMIUM} not found (apt-get install -y chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            why = "the playwright package is not installed (pip install -e '.[test]')"
    if why and os.environ.get("CI"):
        pytest.fail(f"browser test cannot run in CI: {why}")
    if why:
        pytest.skip(why)


def _wait_healthy(proc: subprocess.Popen, port: int, log: Path, timeout: float = 90) -> None:
    url = f"http://127.0.0.1:{port}/_stcore/health"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"dashboard exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200 and r.read().strip() == b"ok":
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.3)
    pytest.fail(f"dashboard not healthy after {timeout}s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the launcher and its streamlit child
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
def test_roofline_page_in_headless_chromium(tmp_path, example_run):
    _require_browser()
    from playwright.sync_api import sync_playwright

    port = free_port()
    log = tmp_path / "dashboard.log"
    user_store = tmp_path / "runs"
    user_store.mkdir()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "harness", "dashboard", "--store", str(user_store), "--port",
             str(port)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_healthy(proc, port, log)
        assert f"http://127.0.0.1:{port}" in log.read_text()  # the launcher printed the URL
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1100})
                page_errors: list[str] = []
                page.on("pageerror", lambda e: page_errors.append(str(e)))
                page.goto(f"http://127.0.0.1:{port}/roofline?run={example_run.name}",
                          wait_until="domcontentloaded", timeout=60_000)
                chart = page.locator(".js-plotly-plot").first
                chart.wait_for(state="visible", timeout=60_000)
                page.locator(".js-plotly-plot .scatterlayer .point").first.wait_for(
                    state="visible", timeout=30_000)
                traces = page.evaluate(
                    "() => document.querySelector('.js-plotly-plot').data"
                    ".map(t => ({name: t.name, mode: t.mode}))")
                names = {t["name"] for t in traces}
                assert {"torch", "torch_compile", "triton"} <= names, traces
                assert any(n.startswith("DRAM") for n in names), traces
                assert any("tensor" in n for n in names), traces
                assert page.locator(".js-plotly-plot .scatterlayer .point").count() >= 30
                assert page.get_by_role("heading", name="Roofline").first.is_visible()
                assert not page_errors, page_errors
                page.wait_for_timeout(500)  # let plotly finish its transition
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "dashboard-roofline.png"), full_page=True)
            finally:
                browser.close()
    finally:
        _stop(proc)
    assert (ARTIFACTS / "dashboard-roofline.png").stat().st_size > 10_000
