"""The Diagnose tab in Debian chromium on the embedded pair: run the doctor, read its table, plot and Markdown, and
find the report in the history."""

from __future__ import annotations

import pytest

from experiments.doctor import CHECKS
from storage import open_history
from tests.browser import open_page  # skips this module without playwright or chromium

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def page(app_server):
    with open_page(app_server[0]) as page:
        yield page


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
