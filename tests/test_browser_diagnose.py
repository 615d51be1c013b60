"""The Diagnose tab in Debian chromium on the embedded pair: run the doctor, read its table, plot and Markdown, and
find the report in the history."""

from __future__ import annotations

import shutil

import pytest

from experiments.doctor import CHECKS
from storage import open_history

pytestmark = [pytest.mark.browser, pytest.mark.slow]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]

sync_api = pytest.importorskip("playwright.sync_api", reason="python playwright is missing: pip install playwright "
                                                              "(never `playwright install`)")
if not shutil.which(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium", allow_module_level=True)


@pytest.fixture(scope="module")
def page(app_server):
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(600_000)  # a doctor run on two shared CPU cores takes minutes
        page.goto(app_server[0])
        yield page
        browser.close()


def test_the_diagnose_tab_runs_the_doctor_and_stores_its_report(page, app_server):
    page.get_by_role("tab", name="Diagnose").click()
    assert page.input_value("#diag-drafter input") in ("dflash", "eagle3")
    page.fill("#diag-limit input", "2")
    page.fill("#diag-max-new input", "12")
    page.click("#diag-run")
    # each check is named while it runs, not only "processing"
    page.wait_for_function("() => /check [0-9]+\\/9: [a-z_]+/.test(document.body.innerText)")
    page.wait_for_function("() => (document.querySelector('#diag-status')?.innerText || '')"
                           ".includes('stored as report')")
    status = page.inner_text("#diag-status")
    table = page.inner_text("#diag-table")
    for check in CHECKS:
        assert check in table
    assert "not applicable" in table and "per-position acceptance" in table
    assert "tau_est: 1 + the mean accepted run" in status  # what each tau column is
    # one line per measured arm in the per-position plot
    page.wait_for_function("() => document.querySelectorAll('#diag-plot .scatterlayer .trace').length >= 4")
    assert "### drafter doctor" in page.inner_text("#diag-md")
    [stored] = open_history(app_server[1]).list_doctor_reports()
    assert stored["report_id"] in status
    report = open_history(app_server[1]).get_doctor_report(stored["report_id"])
    assert {r["check"] for r in report["rows"]} == set(CHECKS) and len(report["settings"]["prompts"]) == 2
