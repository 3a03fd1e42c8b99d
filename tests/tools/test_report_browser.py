"""The report's first screen in a real browser (issue #40): headless Chromium (Playwright) opens a
report built from a toy study's tables at 1400 x 900 px; the answer's table and its sentences lie
in the first screen, the rest is folded (<details> closed). The screenshot goes to
outputs/browser-test/ for humans. Needs /usr/bin/chromium and playwright (``.ci/browser-deps``)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from study.runner import test_report_answer as toy  # the toy study's tables (tests/study/runner)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
SHOTS = REPO / "outputs" / "browser-test"
WIDTH, HEIGHT = 1400, 900


def test_the_first_screen_holds_the_table_and_the_sentences(tmp_path):
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"{CHROMIUM} is missing (run .ci/browser-deps: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="run .ci/browser-deps: pip install playwright")
    from studylib.study.runner import report

    out = tmp_path / "outputs" / "toy"
    for d in ("tables", "figures", "notebooks"):
        (out / d).mkdir(parents=True)
    g = toy._headline(out)
    toy._per_seed_losses(out, g)
    toy._map(out)
    toy._law_paper(out)
    (out / "figures" / "token_budget_gaps.png").write_bytes(toy._PNG)
    html = report.write_report(toy._notebooks(out), out / "report.html", title="Study toy")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
        page.goto(html.as_uri())
        box = page.evaluate("""() => {
            const h = document.getElementById('The-answer');
            const after = (el) => h.compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING;
            const table = [...document.querySelectorAll('table')].find(after);
            const lead = [...document.querySelectorAll('p')].find(p => after(p) && p.textContent.startsWith('At the headline'));
            const details = [...document.querySelectorAll('details')].filter(after);
            const r = (el) => { const b = el.getBoundingClientRect(); return [b.top, b.bottom]; };
            return {table: r(table), lead: r(lead), open: details.filter(d => d.open).length, n: details.length,
                    first_details: r(details[0])};
        }""")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(tmp_path / "report_first_screen.png"))
        browser.close()
    shutil.copy(tmp_path / "report_first_screen.png", SHOTS / "report_first_screen.png")
    assert 0 <= box["table"][0] and box["table"][1] <= HEIGHT, box  # the whole table on the first screen
    assert box["lead"][1] <= HEIGHT, box  # and the sentences
    assert box["n"] >= 3 and box["open"] == 0, box  # the rest folded
