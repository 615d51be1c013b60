"""A new user's walk through the app in Debian chromium: generate, compare, K-Flat, acceptance, history, annotate.

Screenshots of every view go to a temporary folder whose path is printed (pytest -s shows it).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import duckdb
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]
PROMPT = "What is 12 plus 7? Explain step by step."
BEST: dict[str, str] = {}  # the drafter the app preselects (the best that loads), read by later tests
# Markup that would run script if any text reached the page unescaped (including template syntax).
HOSTILE = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script> ${window.__xss=3} {{x}} & say hi'


sync_api = pytest.importorskip("playwright.sync_api", reason="python playwright is missing: pip install playwright "
                                                              "(never `playwright install`)")
if not shutil.which(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium", allow_module_level=True)


@pytest.fixture(scope="module")
def page(app_server):
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(60_000)
        page.goto(app_server[0])
        yield page
        browser.close()


@pytest.fixture(scope="module")
def shots():
    folder = Path(tempfile.mkdtemp(prefix="draftscope-shots-"))
    print(f"\nscreenshots: {folder}")
    return folder


def wait_text(page, selector: str, text: str, old: str = "") -> None:
    """Wait until the element shows `text` (and no longer shows exactly `old`)."""
    page.wait_for_function("([s, t, o]) => { const x = document.querySelector(s)?.innerText || ''; "
                           "return x.includes(t) && x !== o; }", arg=[selector, text, old])


def click_and_wait(page, button: str, status: str, text: str) -> None:
    """Click a button and wait for a new status showing `text`."""
    old = page.inner_text(status)
    page.click(button)
    wait_text(page, status, text, old)


def shot(page, path: Path) -> None:
    """Screenshot once no Gradio event is pending (status trackers hidden)."""
    page.wait_for_function("[...document.querySelectorAll('[data-testid=status-tracker]')]"
                           ".every(e => e.classList.contains('hide'))")
    page.wait_for_timeout(300)
    page.screenshot(path=path, full_page=True)


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


def test_generate_shows_accepted_rejected_and_bonus(page, shots):
    page.fill("#gen-prompt textarea", PROMPT)
    page.fill("#gen-max input", "48")
    BEST["drafter"] = page.input_value("#gen-drafter input")
    assert BEST["drafter"] in ("dflash", "eagle3", "ngram")  # the best drafter that loads, preselected
    click_and_wait(page, "#gen-run", "#gen-status", "stored as run")
    view = page.locator("#gen-view .ds-blocks")
    assert view.locator(".tok.acc").count() > 0 and view.locator(".tok.rej").count() > 0
    assert view.locator(".tok.bonus").count() > 0 and view.locator(".ds-step").count() > 1
    title = view.locator(".tok.rej").first.get_attribute("title")
    assert "p (target)" in title and "q (drafter)" in title and "target top-5" in title
    assert view.locator(".tok.rej").first.evaluate("e => getComputedStyle(e).textDecorationLine") == "line-through"
    assert "tau" in page.inner_text("#gen-stats")
    shot(page, shots / "1-generate.png")


def test_markup_in_prompt_stays_text(page, shots):
    page.fill("#gen-prompt textarea", HOSTILE)
    page.fill("#gen-max input", "8")
    click_and_wait(page, "#gen-run", "#gen-status", "stored as run")
    wait_text(page, "#gen-view .ds-prompt", "<img src=x")
    assert "${window.__xss=3} {{x}} & say hi" in page.inner_text("#gen-view .ds-prompt")
    assert page.evaluate("window.__xss") is None
    shot(page, shots / "2-generate-markup.png")


def test_compare(page, shots):
    open_tab(page, "Compare")
    page.fill("#cmp-prompt textarea", PROMPT)
    click_and_wait(page, "#cmp-run", "#cmp-status", "2 runs")
    assert "ar" in page.inner_text("#cmp-head-0") and BEST["drafter"] in page.inner_text("#cmp-head-1")
    assert page.locator("#cmp-view-1 .ds-blocks .tok.rej").count() > 0
    shot(page, shots / "3-compare.png")


def test_kflat_plot(page, shots):
    open_tab(page, "K-Flat")
    page.fill("#kf-ks textarea, #kf-ks input", "1,2,4")
    click_and_wait(page, "#kf-run", "#kf-status", "stored")
    page.wait_for_selector("#kf-plot .js-plotly-plot .scatterlayer .trace")
    page.wait_for_selector("#kf-speedup .js-plotly-plot")
    shot(page, shots / "4-kflat.png")


def test_acceptance_plots(page, shots):
    open_tab(page, "Acceptance")
    page.wait_for_selector("#acc-survival .js-plotly-plot .scatterlayer .trace")
    shot(page, shots / "5-acceptance.png")


def test_history_replays_the_run(page, shots):
    open_tab(page, "History")
    page.fill("#hist-text textarea, #hist-text input", "12 plus 7")
    page.click("#hist-search")
    row = page.locator("#hist-table [role=row]").filter(has_text=BEST["drafter"]).first
    row.locator("[role=gridcell]").nth(1).click()
    page.wait_for_selector("#hist-view .ds-blocks .tok.rej")
    assert "12 plus 7" in page.inner_text("#hist-view .ds-prompt")
    shot(page, shots / "6-history.png")


def test_annotate_and_export(page, shots):
    open_tab(page, "Annotate")
    page.wait_for_selector("#ann-view .tok.rej.pick")
    token = page.locator("#ann-view .tok.rej.pick").first
    step, pos = token.get_attribute("data-step"), token.get_attribute("data-pos")
    token.click()
    page.wait_for_function("t => document.querySelector('#ann-token input')?.value.startsWith(t)",
                           arg=f"step {step} · pos {pos} ·")
    page.fill("#ann-note textarea", "drafter guessed the wrong number")
    click_and_wait(page, "#ann-save", "#ann-status", "stored")
    page.wait_for_selector("#ann-view .tok.ann")
    wait_text(page, "#ann-table", "drafter guessed the wrong number")
    shot(page, shots / "7-annotate.png")

    page.fill("#ann-folder textarea, #ann-folder input", "browser-export")
    click_and_wait(page, "#ann-export", "#ann-exported", "rejections.jsonl")
    paths = [Path(p) for p in page.locator("#ann-exported code").all_inner_texts()]
    assert sorted(p.name for p in paths) == ["annotations.parquet", "conversations.jsonl", "rejections.jsonl"]
    by_name = {p.name: p for p in paths}
    (record,) = [json.loads(line) for line in by_name["rejections.jsonl"].read_text().splitlines()]
    assert (record["step_idx"], record["draft_pos"]) == (int(step), int(pos))
    assert record["note"] == "drafter guessed the wrong number" and record["drafter"] == BEST["drafter"]
    assert json.loads(by_name["conversations.jsonl"].read_text().splitlines()[0])["conversations"]
    assert duckdb.sql(f"SELECT note FROM '{by_name['annotations.parquet']}'").fetchall() == [(record["note"],)]
    page.wait_for_selector("#ann-files a, #ann-files .file-name, #ann-files td")
    shot(page, shots / "8-export.png")
