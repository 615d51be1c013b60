"""The browser the UI tests drive: Debian chromium through playwright (never `playwright install`). Importing this
skips the importing test module where either is missing (CI refuses to start without them: tests/conftest.py)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator

import pytest

from tests.conftest import CHROMIUM

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]

sync_api = pytest.importorskip("playwright.sync_api", reason="python playwright is missing: pip install playwright "
                                                              "(never `playwright install`)")
if not shutil.which(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium", allow_module_level=True)


@contextlib.contextmanager
def open_page(url: str) -> Iterator:
    """A 1400x1000 page at url in a fresh headless chromium. Its deadlines for condition waits are 10 minutes:
    compiles and doctor runs take minutes on two loaded cores."""
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(600_000)
        page.goto(url)
        yield page
        browser.close()
