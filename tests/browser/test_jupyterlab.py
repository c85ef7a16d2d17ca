"""What a person sees: JupyterLab in a real Chromium (Debian's), driven by Playwright.

The notebook is run through the UI (Shift+Enter); the test reads the rendered dashboard.
Set HVD_MAGICS_SCREENSHOT=docs/jupyterlab-dashboard.png to refresh the README's screenshot.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import ROOT
from tests.standalone import _free_port

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

CELLS = [
    "%load_ext hvd_magics",
    "%%horovod np=-2\n"
    "import time\n"
    "from hvd_magics import progress\n"
    "for epoch in range(1, 4):\n"
    "    for step, _ in enumerate(progress.track(range(20), epoch=epoch, epochs=3, batch_size=16), 1):\n"
    "        time.sleep(0.08)\n"
    "        progress.report(step, loss=1.0 / (epoch * step))\n"
    "    print(f'Epoch {epoch}/3')\n"
    "'finished'",
]


@pytest.fixture()
def jupyterlab(tmp_path):
    notebook = {"cells": [{"cell_type": "code", "metadata": {}, "execution_count": None,
                           "outputs": [], "source": src} for src in CELLS],
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                            "language": "python"}},
                "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "dashboard.ipynb").write_text(json.dumps(notebook))
    port, token = _free_port(), secrets.token_hex(16)
    log = open(tmp_path / "jupyterlab.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
         "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={tmp_path}", "--LabApp.news_url=", "--ServerApp.open_browser=False"],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise RuntimeError(f"JupyterLab did not start; see {tmp_path / 'jupyterlab.log'}")
            time.sleep(0.5)
    yield f"{base}/lab/tree/dashboard.ipynb?token={token}"
    server.terminate()
    server.wait(timeout=30)


def test_the_dashboard_shows_ranks_moves_and_ends_with_timing(jupyterlab, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(jupyterlab)
        try:
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
            page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_text("Run All Cells", exact=True).click()
            page.wait_for_selector("text=rank 1", timeout=60_000)
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"))
            raise
        rows = page.locator(".widget-hprogress")
        rows.first.wait_for(timeout=60_000)
        assert rows.count() == 2

        def bar_width() -> float:
            return float(page.locator(".widget-hprogress .progress-bar").first
                         .evaluate("e => parseFloat(e.style.width) || 0"))

        page.wait_for_function("() => [...document.querySelectorAll('.widget-html')]"
                               ".some(e => e.textContent.includes('running'))", timeout=60_000)
        page.wait_for_selector(".widget-html .hvd-charts svg polyline", timeout=60_000)
        first = bar_width()
        page.wait_for_function(  # the bar moves while the job runs
            "first => parseFloat(document.querySelector('.widget-hprogress .progress-bar')"
            ".style.width || '0') !== first", arg=first, timeout=60_000)
        assert bar_width() != first
        page.wait_for_selector(".hvd-epochs", timeout=90_000)
        assert page.locator("text=done").count() >= 1
        assert page.locator(".hvd-epochs tr").count() == 4  # header + 3 epochs
        assert page.locator(".widget-hprogress .progress-bar-success").count() == 2
        # the charts are drawn once: by the record shown at the end (kept in the saved notebook),
        # the dashboard having drawn them while the job ran (checked above)
        assert page.locator(".hvd-run-record .hvd-charts svg polyline").count() >= 3
        assert page.locator(".widget-html .hvd-charts").count() == 0
        news = page.get_by_role("button", name="No")  # JupyterLab's "Jupyter news?" prompt
        if news.count():
            news.first.click()
            page.get_by_text("Jupyter news").wait_for(state="detached", timeout=10_000)
        shot = os.environ.get("HVD_MAGICS_SCREENSHOT")
        page.screenshot(path=str(ROOT / shot) if shot else str(tmp_path / "dashboard.png"),
                        full_page=True)
        browser.close()
