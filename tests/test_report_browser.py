"""The HTML report in real headless Chromium: no console errors, no page errors, no network,
and the plotly charts actually render. A full-page screenshot goes to test-artifacts/."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.present.report import write_report

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "runs"
H200 = "20261122T021915Z-softmax-6059"
CPU = "20261122T023001Z-softmax-7840"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} missing (apt-get install chromium; tests/run.sh does it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def open_report(browser, html: Path):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    console, errors, requests = [], [], []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: errors.append(str(e)))

    def route(r):  # the report must work offline: anything but the file itself is a failure
        if not r.request.url.startswith("file://"):
            requests.append(r.request.url)
            return r.abort()
        return r.continue_()

    page.route("**/*", route)
    page.goto(html.as_uri())
    page.wait_for_load_state("load")
    return page, console, errors, requests


def test_gpu_report_renders_charts_without_errors(browser, tmp_path):
    write_report(FIXTURES / H200, tmp_path, fmt="html", png=False,
                 store_arg="tests/fixtures/runs")
    page, console, errors, requests = open_report(browser, tmp_path / "report.html")
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=20_000)
    assert page.locator(".js-plotly-plot").count() >= 3
    # rendered, not just present: bars, markers and roof lines drawn as SVG
    assert page.locator("#chart-speedup_vs_shape .bars path").count() >= 12
    assert page.locator("#chart-roofline .scatterlayer .trace").count() >= 4
    assert page.locator("#chart-stall_bars .bars path").count() >= 6
    page.get_by_text("ncu-counted intensity").click()  # the toggle works without errors
    page.wait_for_timeout(300)
    art = ROOT / "test-artifacts"
    art.mkdir(exist_ok=True)
    page.screenshot(path=str(art / "report_h200_softmax.png"), full_page=True)
    page.close()
    bad = [c for c in console if c.startswith(("error", "warning"))]
    assert not bad and not errors, (bad, errors)
    assert not requests, f"the report fetched from the network: {requests}"


def test_cpu_report_opens_cleanly(browser, tmp_path):
    write_report(FIXTURES / CPU, tmp_path, fmt="html", png=False)
    page, console, errors, requests = open_report(browser, tmp_path / "report.html")
    assert page.locator("text=CPU run.").count() == 1
    assert page.locator("table").count() >= 3
    page.close()
    assert not [c for c in console if c.startswith("error")] and not errors and not requests


def test_screenshot_tool_available():
    """Fail loudly (not skip) when the CI image lost chromium: the two tests above would skip."""
    if shutil.which("chromium") is None and not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed: the browser tests cannot run")
