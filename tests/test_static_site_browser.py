"""The static leaderboard in a real browser: headless Chromium through Selenium and the system's
chromedriver, the export served by ``http.server`` under a sub-path (``/board/``).

Each page type loads without a console error or a failed request; the tabs, a submission link and
the chart variants navigate (also with JavaScript disabled: the site has none); every link of the
board page answers 200; text contrast meets WCAG AA; on a phone the page does not scroll sideways
(tables scroll in their own region). Screenshots of the board (desktop and phone) are saved to
``test-artifacts/`` (or ``$ALE_TEST_ARTIFACTS``).

Needs Debian's ``chromium`` and ``chromium-driver`` and the ``selenium`` package; skipped with the
reason when one is missing, unless ``ALE_SITE_TOOLS_REQUIRED=1`` (CI), which makes it a failure.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import site_fixtures as sf
from browser_tools import ARTIFACTS, need_browser, quit_driver
from browser_tools import driver as browser_driver

from ale_verify import export

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]

#: WCAG 2.x contrast of every visible text element against its effective background.
CONTRAST_JS = """
function parse(c) { const m = c.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
  const p = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; }
function lum(c) { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
  return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]); }
function background(el) { for (; el; el = el.parentElement) { const c = parse(getComputedStyle(el).backgroundColor);
  if (c && c[3] > 0) return c; } return [255, 255, 255, 1]; }
const bad = [];
for (const el of document.querySelectorAll('body *')) {
  if (el.closest('svg') || !el.getClientRects().length) continue;
  const text = Array.from(el.childNodes).filter(n => n.nodeType === 3).map(n => n.textContent).join('').trim();
  if (!text) continue;
  const s = getComputedStyle(el); if (s.visibility === 'hidden' || s.clip === 'rect(0px, 0px, 0px, 0px)') continue;
  const fg = parse(s.color), bg = background(el);
  const a = fg[3], mixed = [0, 1, 2].map(i => fg[i] * a + bg[i] * (1 - a));
  const l1 = lum(mixed), l2 = lum(bg), ratio = (Math.max(l1, l2) + 0.05) / (Math.min(l1, l2) + 0.05);
  const size = parseFloat(s.fontSize), large = size >= 24 || (size >= 18.66 && Number(s.fontWeight) >= 700);
  if (ratio < (large ? 3 : 4.5)) bad.push(`${el.tagName}.${el.className} "${text.slice(0, 30)}" ${ratio.toFixed(2)}`);
}
return bad;
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    need_browser()
    base = tmp_path_factory.mktemp("browser")
    ids = sf.fill_mix(base / "db.sqlite3")
    site = base / "site"
    export.export_site(base / "db.sqlite3", site, docs_dir=ROOT / "docs")
    with sf.SubPathServer(site, "/board/") as server:
        yield {"server": server, "site": site, "ids": ids}
    assert server.outside == [], f"requests outside the sub-path: {server.outside}"


@pytest.fixture(scope="module")
def browser(served: dict[str, Any]) -> Iterator[Any]:
    driver = browser_driver()
    try:
        yield driver
    finally:
        quit_driver(driver)


def _console_errors(driver: Any) -> list[str]:
    return [f"{e['level']}: {e['message']}" for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


def _load(driver: Any, url: str) -> None:
    driver.get(url)
    assert driver.execute_script("return document.readyState") == "complete"


def _full_screenshot(driver: Any, path: Path, width: int, *, mobile: bool = False) -> None:
    """A screenshot of the whole page at ``width`` CSS pixels (DevTools device metrics)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    metrics = {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": mobile}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {**metrics, "height": min(int(height), 6000)})
    path.write_bytes(driver.get_screenshot_as_png())
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_every_page_type_loads_without_console_errors(browser: Any, served: dict[str, Any]) -> None:
    base, ids = served["server"].base, served["ids"]
    pages = [
        "index.html", "reproduction.html", "open.html",
        f"submissions/{ids['validated']}.html", f"submissions/{ids['revoked_top']}.html",
        f"submissions/{ids['xss']}.html", f"submissions/{ids['nothing_covered']}.html",
        "tasks/index.html", "tasks/pendulum-lqr.html", "tasks/cartpole-balance.html",
        "docs/index.html", "docs/formats.html", "docs/leaderboard-export.html", "schemas/index.html",
    ]  # fmt: skip
    browser.get_log("browser")  # drop anything earlier
    for page in pages:
        _load(browser, base + page)
        assert browser.find_element("css selector", "h1").text.strip(), page
        assert browser.execute_script("return document.styleSheets.length") == 1, page
        assert browser.execute_script("return document.styleSheets[0].cssRules.length") > 50, page  # CSS loaded
        assert browser.execute_script("return document.querySelectorAll('script').length") == 0, page
        assert _console_errors(browser) == [], page
        assert browser.execute_script("return document.documentElement.lang") == "en"
    # Hostile names render as text.
    _load(browser, base + f"submissions/{ids['xss']}.html")
    assert browser.find_element("css selector", "h1").text.startswith(sf.XSS_NAME)


def test_tabs_and_submission_links_navigate(browser: Any, served: dict[str, Any]) -> None:
    base = served["server"].base
    _load(browser, base + "index.html")
    for label, page in (("Reproduction", "reproduction.html"), ("Open-ended", "open.html"), ("Overall", "index.html")):
        browser.find_element("link text", label).click()
        assert browser.current_url == base + page
        current = browser.find_element("css selector", '.tabs a[aria-current="page"]')
        assert current.text == label
    first = browser.find_element("css selector", "table.board tbody th.agent a")
    name, href = first.text, first.get_attribute("href")
    first.click()
    assert browser.current_url == href
    assert href.startswith(base + "submissions/")
    assert browser.find_element("css selector", "h1").text.startswith(name)
    task = browser.find_element("css selector", "table.breakdown tbody th a")
    task_title = task.text
    task.click()  # to the task's page, and back to the board through the breadcrumb
    assert browser.current_url == base + f"tasks/{task_title.partition('@')[0]}.html"
    browser.find_element("link text", "Leaderboard").click()
    assert browser.current_url == base + "index.html"
    assert _console_errors(browser) == []


def test_chart_variants_switch_without_javascript(served: dict[str, Any]) -> None:
    base = served["server"].base
    driver = browser_driver(javascript=False)
    try:
        _load(driver, base + "index.html")
        assert driver.find_element("id", "top-both").is_displayed()
        assert not driver.find_element("id", "top-score").is_displayed()
        for variant in ("score", "pass", "both"):
            visible = next(s for s in driver.find_elements("css selector", ".chart") if s.is_displayed())
            visible.find_element("css selector", f'.chart-switch a[href="#top-{variant}"]').click()
            shown = [s.get_attribute("id") for s in driver.find_elements("css selector", ".chart") if s.is_displayed()]
            assert shown == [f"top-{variant}"]
            svg = driver.find_element("css selector", f"#top-{variant} svg")
            assert svg.get_attribute("role") == "img"
            assert svg.size["height"] > 200
            # each score bar draws its run's 95% interval, inside the chart; a pass rate has none
            whiskers = svg.find_elements("css selector", "path.ci-bar")
            assert len(whiskers) == (
                0 if variant == "pass" else len(svg.find_elements("css selector", "rect.bar-score"))
            )
            box = svg.rect
            for w in whiskers:
                r = w.rect
                assert r["height"] >= 7
                assert box["x"] <= r["x"]
                assert r["x"] + r["width"] <= box["x"] + box["width"] + 1
        driver.find_element("link text", "Reproduction").click()  # plain links: no script needed
        assert driver.current_url == base + "reproduction.html"
        assert _console_errors(driver) == []
    finally:
        quit_driver(driver)


def test_every_link_on_the_board_resolves(browser: Any, served: dict[str, Any]) -> None:
    base = served["server"].base
    _load(browser, base + "index.html")
    urls = browser.execute_script(
        "return Array.from(document.querySelectorAll('[href], [src]')).map(e => e.href || e.src)"
    )
    assert len(urls) > 40
    for url in sorted(set(urls)):
        assert url.startswith(base), url  # relative links stay under the sub-path
        with urllib.request.urlopen(url.partition("#")[0], timeout=10) as resp:
            assert resp.status == 200, url


def test_contrast_and_phone_layout(browser: Any, served: dict[str, Any]) -> None:
    base, ids = served["server"].base, served["ids"]
    for page in ("index.html", f"submissions/{ids['revoked_top']}.html", "tasks/hopper-hop.html", "docs/verifier.html"):
        _load(browser, base + page)
        assert browser.execute_script(CONTRAST_JS) == [], page
    _load(browser, base + "index.html")
    _full_screenshot(browser, ARTIFACTS / "board.png", 1366)
    _full_screenshot(browser, ARTIFACTS / "board-phone.png", 390, mobile=True)
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True}
    )
    try:
        for page in ("index.html", f"submissions/{ids['validated']}.html", "tasks/reacher-jacobian.html"):
            _load(browser, base + page)
            overflow = browser.execute_script(
                "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            assert overflow <= 0, f"{page} scrolls sideways by {overflow}px on a phone"
        _load(browser, base + "index.html")
        region = browser.find_element("css selector", ".table-scroll")
        assert browser.execute_script("return arguments[0].scrollWidth > arguments[0].clientWidth", region)
        # What ranks comes first: on a phone the first row's rank, score and pass rate are on screen
        # and its agent begins on it, without scrolling the table sideways (score and pass rate used
        # to be pushed off by model and effort).
        visible = browser.execute_script(
            """const row = document.querySelector('table.board tbody tr:not(.divider)');
            const right = document.documentElement.clientWidth;
            const cells = [...row.children];
            return [...cells.slice(0, 3).map(c => c.getBoundingClientRect().right <= right),
                    cells[3].getBoundingClientRect().left < right];"""
        )
        assert visible == [True, True, True, True], visible
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    assert (ARTIFACTS / "board.png").stat().st_size > 10_000
