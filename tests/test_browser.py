"""A new user's walk through the app in Debian chromium: generate, compare, K-Flat, acceptance, history, annotate.

Screenshots of every view go to a temporary folder whose path is printed (pytest -s shows it).
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import duckdb
import pytest

from app.tabs.common import DEFAULT_MAX_NEW
from engine import generate, load_drafter
from storage import drafter_label, open_history
from tests.browser import open_page  # skips this module without playwright or chromium

pytestmark = [pytest.mark.browser, pytest.mark.slow]
PROMPT = "What is 12 plus 7? Explain step by step."
# Markup that would run script if any text reached the page unescaped (including template syntax).
HOSTILE = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script> ${window.__xss=3} {{x}} & say hi'


@pytest.fixture(scope="module")
def page(app_server):
    with open_page(app_server[0]) as page:
        yield page


@pytest.fixture(scope="module")
def shots():
    folder = Path(tempfile.mkdtemp(prefix="draftscope-shots-"))
    print(f"\nscreenshots: {folder}")
    return folder


# An element's own text, without what Gradio's progress overlay inside it shows ("processing | 0.1s"); with busy
# set, '' while that overlay is showing (a run's status reads "stored as run" for its ar reference before the
# drafter's run ends).
OWN_TEXT = ("([s, busy]) => { const e = document.querySelector(s); if (!e) return ''; "
            "const trackers = [...e.querySelectorAll('[data-testid=status-tracker]')]; "
            "if (busy && trackers.some(t => !t.classList.contains('hide'))) return ''; const c = e.cloneNode(true); "
            "c.querySelectorAll('[data-testid=status-tracker]').forEach(x => x.remove()); return c.textContent; }")


def wait_text(page, selector: str, text: str, old: str = "", ended: bool = False) -> None:
    """Wait until the element's own text shows `text` (and is no longer exactly `old`); ended: and its event ended."""
    page.wait_for_function(f"([s, t, o, b]) => {{ const x = ({OWN_TEXT})([s, b]); return x.includes(t) && x !== o; }}",
                           arg=[selector, text, old, ended])


def click_and_wait(page, button: str, status: str, text: str) -> None:
    """Click a button and wait for a new status showing `text` once the click's event has ended."""
    old = page.evaluate(OWN_TEXT, [status, False])
    page.click(button)
    wait_text(page, status, text, old, ended=True)


def shot(page, path: Path) -> None:
    """Screenshot once no Gradio event is pending (status trackers hidden)."""
    page.wait_for_function("[...document.querySelectorAll('[data-testid=status-tracker]')]"
                           ".every(e => e.classList.contains('hide'))")
    page.wait_for_timeout(300)
    page.screenshot(path=path, full_page=True)


# True when every text of element `c` ends inside the box of the element selected by `s` (nothing cut off).
TEXT_IN_VIEW = """(c, s) => {
  const right = document.querySelector(s).getBoundingClientRect().right;
  const walk = document.createTreeWalker(c, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    const r = document.createRange();
    r.selectNodeContents(n);
    if (r.getBoundingClientRect().right > right) return false;
  }
  return true;
}"""


def open_tab(page, name: str) -> None:
    page.get_by_role("tab", name=name).click()


@pytest.fixture(scope="module")
def generated(page, target) -> dict[str, str]:
    """One run of PROMPT with the drafter the app preselects; the preselected drafter, the label the history gives
    its runs, and the shown text."""
    open_tab(page, "Generate")
    page.fill("#gen-prompt textarea", PROMPT)
    page.fill("#gen-max input", "48")
    page.fill("#gen-temperature input", "0")
    drafter = page.input_value("#gen-drafter input")
    k = int(page.input_value("#gen-k input"))
    click_and_wait(page, "#gen-run", "#gen-status", "stored as run")
    loaded = load_drafter(drafter, target, k=k)
    expected = generate(target, PROMPT, loaded, max_new_tokens=48).text
    return {"drafter": drafter, "stored": drafter_label(loaded.name, loaded.checkpoint),
            "text": page.locator("#gen-text .ds-plain-text").text_content(), "expected": expected}


def test_generate_shows_accepted_rejected_and_bonus(page, shots, generated):
    assert generated["drafter"] in ("dflash", "eagle3", "ngram")  # the best drafter that loads, preselected
    # the plain output reads exactly as the engine's text for the same prompt and settings
    assert generated["text"] == generated["expected"] and generated["expected"].strip()
    view = page.locator("#gen-view .ds-blocks")
    assert view.locator(".tok.acc").count() > 0 and view.locator(".tok.rej").count() > 0
    assert view.locator(".tok.bonus").count() > 0 and view.locator(".ds-step").count() > 1
    title = view.locator(".tok.rej").first.get_attribute("title")
    assert "p (target)" in title and "q (drafter)" in title and "target top-5" in title
    assert view.locator(".tok.rej").first.evaluate("e => getComputedStyle(e).textDecorationLine") == "line-through"
    # one rejection per step at most; the drafts after it are unverified, drawn apart (not struck through)
    assert view.locator(".tok.rej").count() <= view.locator(".ds-step").count()
    assert view.locator(".tok.unv").count() > 0
    assert view.locator(".tok.unv").first.evaluate("e => getComputedStyle(e).textDecorationLine") == "none"
    assert "unverified (after the rejection)" in view.locator(".tok.unv").first.get_attribute("title")
    assert "tau" in page.inner_text("#gen-stats")
    shot(page, shots / "1-generate.png")


def test_temperature_typed_below_zero_is_refused_and_runs_nothing(page, app_server):
    open_tab(page, "Generate")
    runs = len(open_history(app_server[1]).list_runs())
    page.fill("#gen-prompt textarea", "Name a colour.")
    page.fill("#gen-temperature input", "-1")
    try:
        click_and_wait(page, "#gen-run", "#gen-status", "error: temperature must be a number in 0..2 (0 = greedy)")
        assert page.input_value("#gen-temperature input") == "-1"  # kept as typed, not clamped to greedy
        assert len(open_history(app_server[1]).list_runs()) == runs
        # the status line says it, as for every bad input: no toast-only message, no unexplained "Error" badges
        for output in ("#gen-view", "#gen-stats", "#gen-text", "#gen-run-id"):
            assert "Error" not in page.inner_text(output), output
    finally:  # the page is the module's: leave it greedy
        page.fill("#gen-temperature input", "0")


# Records every text #gen-status shows (a MutationObserver sees each update, however briefly it is on screen).
RECORD_STATUS = """() => { window.__statuses = []; const s = document.querySelector('#gen-status');
  new MutationObserver(() => window.__statuses.push(s.innerText)).observe(s, {subtree: true, childList: true,
                                                                           characterData: true}); }"""


def test_a_long_prompt_shows_its_prefill_progress(page):
    """A prompt of ~1,600 tokens prefills in 64-token chunks: the status counts them with an ETA, then the run ends."""
    open_tab(page, "Generate")
    page.fill("#gen-prompt textarea", "Summarise these notes. " + " ".join(
        f"Note {i}: the launch moved to week {i % 7}." for i in range(120)))
    page.fill("#gen-max input", "4")
    page.evaluate(RECORD_STATUS)
    click_and_wait(page, "#gen-run", "#gen-status", "stored as run")
    statuses = page.evaluate("window.__statuses")
    progress = [t for t in statuses if re.search(r"prefilling [0-9,]+ prompt tokens: chunk [0-9]+/26, about [0-9]+ s "
                                                 r"left", t)]
    assert progress, statuses


def test_a_second_user_is_told_what_holds_the_device_and_for_how_long(page):
    """While one user's run holds the device, a second user's page says what runs and about how long it has left,
    also while the second user's own run waits for it; the first user is not told about their own run."""
    open_tab(page, "Generate")
    page.fill("#gen-prompt textarea", "Count from 1 to 500, separated by commas.")
    page.fill("#gen-max input", "400")
    other = page.context.browser.new_page(viewport={"width": 1400, "height": 1000})  # a session of its own
    try:
        other.set_default_timeout(600_000)
        other.goto(page.url)
        page.click("#gen-run")
        other.wait_for_function("() => /another run holds the device: Generate, running [0-9]+ s; .*tokens, at most "
                                "about [0-9]+ s left/.test(document.querySelector('#ds-device')?.innerText || '')")
        assert page.inner_text("#ds-device").strip() == ""  # the run's own user
        other.fill("#gen-prompt textarea", "Name a colour.")
        other.fill("#gen-max input", "4")
        other.click("#gen-run")
        other.wait_for_timeout(2500)  # two refreshes of the line while the second run is queued
        assert "another run holds the device: Generate" in other.inner_text("#ds-device")
        page.click("#gen-stop")
        wait_text(page, "#gen-status", "stopped after", ended=True)
        wait_text(other, "#gen-status", "stored as run", ended=True)
        other.wait_for_function("() => (document.querySelector('#ds-device')?.innerText || '').trim() === ''")
    finally:
        other.close()
        page.fill("#gen-max input", str(DEFAULT_MAX_NEW))  # the page is the module's: leave its default


def test_markup_in_prompt_stays_text(page, shots):
    open_tab(page, "Generate")
    page.fill("#gen-prompt textarea", HOSTILE)
    page.fill("#gen-max input", "8")
    click_and_wait(page, "#gen-run", "#gen-status", "stored as run")
    wait_text(page, "#gen-view .ds-prompt", "<img src=x")
    assert "${window.__xss=3} {{x}} & say hi" in page.inner_text("#gen-view .ds-prompt")
    assert page.evaluate("window.__xss") is None
    shot(page, shots / "2-generate-markup.png")


def test_compare(page, shots, generated):
    open_tab(page, "Generate")
    page.fill("#gen-prompt textarea", PROMPT)
    k = page.input_value("#gen-k input")  # the preselected drafter's default K
    open_tab(page, "Compare")  # starts from Generate's prompt and defaults
    page.wait_for_function("p => document.querySelector('#cmp-prompt textarea')?.value === p", arg=PROMPT)
    assert page.input_value("#cmp-max input") == str(DEFAULT_MAX_NEW)
    assert page.input_value("#cmp-k textarea, #cmp-k input") == ""  # empty: each drafter's default K
    assert page.get_by_label(generated["drafter"], exact=True).is_checked()
    page.fill("#cmp-max input", "48")
    click_and_wait(page, "#cmp-run", "#cmp-status", "2 runs")
    assert "ar" in page.inner_text("#cmp-head-0") and f"{generated['drafter']} K={k}" in page.inner_text("#cmp-head-1")
    assert page.locator("#cmp-view-1 .ds-blocks .tok.rej").count() > 0
    ar_text, drafter_text = (page.locator(f"#cmp-text-{i} .ds-plain-text").text_content() for i in (0, 1))
    assert ar_text.strip() and drafter_text == ar_text  # greedy: the drafter's output reads as ar's
    shot(page, shots / "3-compare.png")


def test_kflat_sweep_keeps_its_result_and_times_drafting(page, shots, generated):
    open_tab(page, "K-Flat")
    # the acceptance comes from the checkpoint just run, and the sweep times that drafter
    page.wait_for_function("([d, a]) => document.querySelector('#kf-drafter input')?.value === d && "
                           "document.querySelector('#kf-acc input')?.value === a",
                           arg=[generated["drafter"], generated["stored"]])
    drafter = generated["drafter"]
    page.fill("#kf-ks textarea, #kf-ks input", "1,2,4")
    page.click("#kf-run")
    page.wait_for_function("() => document.body.innerText.includes('K=2: compiling, then timing')")  # per K
    wait_text(page, "#kf-status", "stored")
    page.wait_for_selector("#kf-plot .js-plotly-plot .scatterlayer .trace")
    page.wait_for_selector("#kf-speedup .js-plotly-plot .scatterlayer .trace")
    shot(page, shots / "4-kflat.png")  # waits until every event (the plots' redraw too) has finished
    status = page.inner_text("#kf-status")
    assert "stored" in status and "draft" in status  # the sweep's result is still there after the redraw
    assert f"with {drafter}'s draft time" in page.inner_text("#kf-speedup")  # the legend of the prediction


def choose(page, dropdown: str, option: str) -> None:
    page.click(f"{dropdown} input")
    page.get_by_role("option", name=option, exact=True).click()
    page.wait_for_function("([d, o]) => document.querySelector(d + ' input')?.value === o", arg=[dropdown, option])


KS_ARE = "([v]) => document.querySelector('#kf-ks textarea, #kf-ks input')?.value === v"


def test_kflat_defaults_fit_the_timed_drafter_and_a_refused_k_runs_nothing(page):
    open_tab(page, "K-Flat")
    # through verify-only first: the walk may have left dflash chosen (its default) and a K list typed
    choose(page, "#kf-drafter", "(none: verify only)")
    page.wait_for_function(KS_ARE, arg=["1,2,4,8,16,32,64"])
    choose(page, "#kf-drafter", "dflash")
    page.wait_for_function(KS_ARE, arg=["1,2,4,7"])
    page.fill("#kf-ks textarea, #kf-ks input", "1,2,4,8")
    click_and_wait(page, "#kf-run", "#kf-status", "K for dflash must be a whole number in 1..7")
    assert "compiling" not in page.inner_text("body")


def test_two_sweeps_a_moment_apart_are_both_listed_and_drawn(page):
    open_tab(page, "K-Flat")
    choose(page, "#kf-drafter", "(none: verify only)")  # its K list lands after the choice: typed only then
    page.wait_for_function(KS_ARE, arg=["1,2,4,8,16,32,64"])
    page.fill("#kf-ks textarea, #kf-ks input", "1,2")
    page.fill("#kf-rep input", "1")
    ids = []
    for _ in range(2):
        old = page.evaluate(OWN_TEXT, ["#kf-status", False])
        page.click("#kf-run")  # done when the status names a sweep not seen before, or an error
        # the status's own text once its event ended: an earlier test's error under the progress bar is not it
        page.wait_for_function(f"([ids, o]) => {{ const t = ({OWN_TEXT})(['#kf-status', true]);"
                               " const m = t.match(/sweep (\\S+) on .* stored/);"
                               " return (m && !ids.includes(m[1])) || (t.includes('error') && t !== o); }",
                               arg=[ids, old])
        status = page.evaluate(OWN_TEXT, ["#kf-status", False])
        assert "error" not in status, status
        ids.append(status.split("sweep ")[1].split(" ")[0])
    # both selected, each label ending in its own id's tail: told apart in the list and the legend
    listed = "ids => ids.every(i => document.querySelector('#kf-sweeps').innerText.includes(i.slice(-4)))"
    page.wait_for_function(listed, arg=ids)
    page.wait_for_function("() => document.querySelectorAll('#kf-plot .scatterlayer .trace').length >= 2")


def test_acceptance_plots(page, shots, generated):  # a finished run to plot
    open_tab(page, "Acceptance")
    page.wait_for_selector("#acc-survival .js-plotly-plot .scatterlayer .trace")
    shot(page, shots / "5-acceptance.png")


def test_history_replays_the_run(page, shots, generated):
    open_tab(page, "History")
    page.fill("#hist-text textarea, #hist-text input", "12 plus 7")
    page.click("#hist-search")
    row = page.locator("#hist-table [role=row]").filter(has_text=generated["drafter"]).first
    row.locator("[role=gridcell]").nth(1).click()
    page.wait_for_selector("#hist-view .ds-blocks .tok.rej")
    assert "12 plus 7" in page.inner_text("#hist-view .ds-prompt")
    assert page.locator("#hist-view .ds-plain-text").text_content() == generated["text"]
    headers = [h.strip() for h in page.locator("#hist-table thead th").all_inner_texts()]
    assert {"T", "annotations", "run_id"} <= set(headers) and "notes" not in headers
    run_id = row.locator("[role=gridcell]").nth(headers.index("run_id"))
    assert len(run_id.inner_text().strip()) == 36 and run_id.evaluate(TEXT_IN_VIEW, "#hist-table")  # no scrolling
    prompt = row.locator("[role=gridcell]").nth(headers.index("prompt"))
    assert "12 plus 7" in prompt.inner_text() and prompt.evaluate(TEXT_IN_VIEW, "#hist-table")
    shot(page, shots / "6-history.png")


def test_labels_say_what_they_are(page, generated):
    """The header names the GGUF expansion; a template box with nothing to set is locked; History's headers fit,
    ar has no K, the run list names each run's id; plots carry their figure titles, not Gradio's "Plot"."""
    header = page.inner_text("#ds-header")
    assert "Q4_1 GGUF weights expanded to float32" in header, header
    open_tab(page, "Generate")
    assert page.locator("#gen-template textarea, #gen-template input").first.is_disabled()
    assert "nothing to set" in page.inner_text("#gen-template")
    open_tab(page, "History")
    page.fill("#hist-text textarea, #hist-text input", "12 plus 7")
    page.click("#hist-search")
    page.wait_for_selector("#hist-table [role=row] >> text=ar")
    headers = [h.strip() for h in page.locator("#hist-table thead th").all_inner_texts()]
    assert "acc. rate" in headers and all("\n" not in h for h in headers), headers
    cells = page.evaluate("() => [...document.querySelectorAll('#hist-table [role=row]')].map(r => "
                          "[...r.querySelectorAll('[role=gridcell]')].map(c => c.innerText.trim()))")
    ar_rows = [r for r in cells if len(r) == len(headers) and r[headers.index("drafter")] == "ar"]
    assert ar_rows and all(r[headers.index("K")] in ("", "-") for r in ar_rows), cells[:3]
    page.click("#hist-run input")
    option = page.get_by_role("option").first.inner_text()
    assert re.search(r"· …[0-9a-f-]{8}$", option) and " K=0" not in option, option
    page.keyboard.press("Escape")
    open_tab(page, "K-Flat")
    for plot in ("#kf-plot", "#kf-speedup"):
        assert "Plot" not in page.inner_text(plot).split("\n")[:1], page.inner_text(plot)[:80]


def wait_picked(page, step: str, pos: str) -> None:
    """Wait until the token dropdown shows (step, pos) and the view outlines that token, and only it."""
    page.wait_for_function("t => document.querySelector('#ann-token input')?.value.startsWith(t)",
                           arg=f"step {step} · pos {pos} ·")
    page.wait_for_function("p => { const t = [...document.querySelectorAll('#ann-view .picked')]; "
                           "return t.length === 1 && t[0].dataset.pick === p; }", arg=f"{step}:{pos}")


def test_annotate_and_export(page, shots, app_server, generated):
    open_tab(page, "Annotate")
    page.wait_for_selector("#ann-view .tok.rej.pick")
    tokens = page.locator("#ann-view .tok.rej.pick")
    assert tokens.count() >= 2
    first = tokens.first.get_attribute("data-step"), tokens.first.get_attribute("data-pos")
    wait_picked(page, *first)  # the dropdown's default is outlined
    token = tokens.last  # not the default: its pick must reach the server and come back as the dropdown's value
    step, pos = token.get_attribute("data-step"), token.get_attribute("data-pos")
    assert (step, pos) != first
    with page.expect_request(lambda r: "/queue/join" in r.url):
        token.click()
    wait_picked(page, step, pos)
    page.fill("#ann-note textarea", "first thought")
    click_and_wait(page, "#ann-save", "#ann-status", "stored")
    wait_text(page, "#ann-table", "first thought")

    page.click("#ann-token input")  # choosing from the list outlines the choice in the view
    page.get_by_role("option").first.click()
    wait_picked(page, *first)
    token.click()  # the same token again: saving updates its one annotation
    wait_picked(page, step, pos)
    page.fill("#ann-note textarea", "drafter guessed the wrong number")
    click_and_wait(page, "#ann-save", "#ann-status", "stored")
    page.wait_for_selector(f"#ann-view .tok.ann[data-pick='{step}:{pos}']")
    wait_text(page, "#ann-table", "drafter guessed the wrong number")
    (stored,) = open_history(app_server[1]).list_annotations()
    assert (stored["step_idx"], stored["draft_pos"], stored["note"]) == (int(step), int(pos),
                                                                         "drafter guessed the wrong number")
    shot(page, shots / "7-annotate.png")

    page.fill("#ann-folder textarea, #ann-folder input", "browser-export")
    click_and_wait(page, "#ann-export", "#ann-exported", "rejections.jsonl")
    paths = [Path(p) for p in page.locator("#ann-exported code").all_inner_texts()]
    assert sorted(p.name for p in paths) == ["annotations.parquet", "conversations.jsonl", "rejections.jsonl"]
    by_name = {p.name: p for p in paths}
    (record,) = [json.loads(line) for line in by_name["rejections.jsonl"].read_text().splitlines()]
    assert (record["step_idx"], record["draft_pos"]) == (int(step), int(pos))
    assert record["note"] == "drafter guessed the wrong number" and record["drafter"] == generated["drafter"]
    assert json.loads(by_name["conversations.jsonl"].read_text().splitlines()[0])["conversations"]
    assert duckdb.sql(f"SELECT note FROM '{by_name['annotations.parquet']}'").fetchall() == [(record["note"],)]
    page.wait_for_selector("#ann-files a, #ann-files .file-name, #ann-files td")
    shot(page, shots / "8-export.png")


def test_right_to_left_tokens_keep_the_steps_in_order(page):
    """Each step and token is its own bidi isolate: Arabic drafts do not reorder the step numbers around them."""
    from app.render import CSS, block_view

    words = ["مرحبا", " بك", " في", " 12", " العالم", " 3"]
    steps = [{"index": i, "position": 2 * i, "drafted": [1], "accepted": 1, "bonus": 2, "p": [0.9], "q": [0.9],
              "top5_ids": [[1], [2]], "top5_p": [[0.9], [0.9]], "emitted": [1, 2], "drafted_text": [w],
              "bonus_text": " "} for i, w in enumerate(words)]
    view = page.context.browser.new_page()  # a page of its own in the module's browser
    view.set_content(f"<style>{CSS}</style>{block_view(steps)}")
    xs = view.evaluate("[...document.querySelectorAll('.ds-idx')].map(e => e.getBoundingClientRect().x)")
    view.close()
    assert len(xs) == len(words) and xs == sorted(xs), xs


def test_byte_pieces_render_as_whole_characters(page, target):
    """Emoji split over byte-piece tokens, drafted in one block: the view shows each character once, whole, and no
    replacement character; the bare pieces are thin markers that say what they are."""
    from app.render import CSS, block_view

    text = "🚀🌍✨ ok"
    ids = target.tokenizer.encode(text, add_special_tokens=False)
    anchor, drafted = ids[0], ids[1:]
    step = {"index": 0, "position": 0, "drafted": drafted, "accepted": len(drafted), "bonus": anchor,
            "p": [0.9] * len(drafted), "q": [0.9] * len(drafted), "emitted": drafted + [anchor],
            "drafted_text": target.piece_texts(drafted, [anchor]), "bonus_text": target.piece_texts([anchor], ids)[0]}
    view = page.context.browser.new_page()
    view.set_content(f"<style>{CSS}</style>{block_view([step])}")
    shown = view.inner_text(".ds-blocks")
    titles = view.eval_on_selector_all(".tok", "ts => ts.filter(t => t.querySelector('.piece')).map(t => t.title)")
    view.close()
    assert "\ufffd" not in shown and text in shown.replace("·", "")  # the first emoji completes in the block
    assert titles and all("byte piece" in t for t in titles)
