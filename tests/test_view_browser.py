"""``ale view``'s page in headless Chromium (Selenium and the system's chromedriver, as
tests/test_static_site_browser.py drives the board).

Pages of bundles every offline check passes (tests/view_fixtures.py): a real run grown with 2,500
ordinary events, the same with every hostile payload, and one with synthetic ``llm_request``
events of the gateway (rendered from the model: no v1 bundle may hold them yet). The page opens
from ``file://`` without a request or a console error; the timeline's filters, pages and order, an
event's data, a long output, the lanes and the transcript's links work and give the model's counts;
no payload ever runs; the gateway's calls show their tokens; ``--serve`` serves the same page.

Needs Debian's ``chromium`` and ``chromium-driver`` and ``selenium``; skipped with the reason when
one is missing, unless ``ALE_SITE_TOOLS_REQUIRED=1`` (CI), which makes it a failure.
"""

from __future__ import annotations

import json
import math
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import view_fixtures as vf
from browser_tools import ARTIFACTS, need_browser, quit_driver
from browser_tools import driver as browser_driver

from ale.core.trajectory import iter_events
from ale.runner import view, view_model
from ale.runner.inspect import report_json

pytestmark = pytest.mark.browser

PAGE = 100  # rows a page of the page's lists holds (view.js)


@attrs.frozen
class Page:
    path: Path
    model: view_model.RunView

    @property
    def url(self) -> str:
        return self.path.as_uri()


@attrs.frozen
class Pages:
    run: vf.RealRun
    ordinary: Page
    hostile: Page
    gateway: Page


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Pages:
    need_browser()
    folder = tmp_path_factory.mktemp("view-browser")
    run = vf.real_run(folder / "run", "--model", vf.HOSTILE_MODEL)
    grower = vf.Grower(run.files())

    def page(name: str, extra: list[vf.Extra]) -> Page:
        bundle = vf.write_bundle(run, grower.build(extra), folder / f"{name}.ale")
        assert view.view_command(bundle, run.key, out=folder / f"{name}.html") == 0  # what `ale view` runs
        return Page(folder / f"{name}.html", view.view_of(view.load(bundle, run.key)))

    report = view.load(run.bundle, run.key)
    events = [e for _, e in iter_events(report.docs.events)]
    at = next(i for i, e in enumerate(events) if e["kind"] == "agent_finished")
    calls = vf.chained([*vf.gateway_events(12), ("trusted_network_proxy", "policy_changed", {"policy": "closed"})])
    gateway_model = view_model.build(report, events[:at] + calls + events[at:], report_json(report))
    view.write_private(folder / "gateway.html", view.render(gateway_model, source="gateway.ale"))
    return Pages(
        run,
        page("ordinary", vf.ordinary(2500)),
        page("hostile", vf.hostile() + vf.ordinary(20)),
        Page(folder / "gateway.html", gateway_model),
    )


@pytest.fixture(scope="module")
def browser(pages: Pages) -> Iterator[Any]:
    driver = browser_driver(performance_log=True, page_load_timeout=60)
    try:
        yield driver
    finally:
        quit_driver(driver)


def _console_errors(driver: Any) -> list[str]:
    return [f"{e['level']}: {e['message']}" for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]


def _requests(driver: Any) -> list[str]:
    """What was requested since the last call (the browser's own chrome:// pages left out)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            url, document = message["params"]["request"]["url"], message["params"].get("documentURL", "")
            if not document.startswith(("chrome://", "chrome-untrusted://", "devtools://")):  # its new-tab page
                urls.append(url)
    return urls


def _click(driver: Any, element: Any) -> None:
    """Click ``element`` where it is not under the page's sticky header."""
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()


def _open(driver: Any, page: Page) -> None:
    driver.get_log("browser")
    driver.get_log("performance")
    driver.get(page.url)
    assert driver.execute_script("return document.documentElement.dataset.ready") == "true"


def _js(driver: Any, script: str, *args: Any) -> Any:
    return driver.execute_script(script, *args)


def _matching(driver: Any, list_id: str) -> int:
    return int(_js(driver, f"return document.getElementById('{list_id}').dataset.matching"))


def _rows(driver: Any) -> list[Any]:
    return driver.find_elements("css selector", "#tl-table tbody tr.row")


def _count(model: view_model.RunView, **where: str) -> int:
    tl = model.timeline
    total = 0
    for i in range(len(tl)):
        if "producer" in where and tl.producers[tl.producer[i]] != where["producer"]:
            continue
        if "kind" in where and tl.kinds[tl.kind[i]] != where["kind"]:
            continue
        total += 1
    return total


def _select(driver: Any, element_id: str, value: str) -> None:
    _js(driver, "const s = document.getElementById(arguments[0]); s.value = arguments[1]; "
        "s.dispatchEvent(new Event('change'));", element_id, value)  # fmt: skip


def _set_find(driver: Any, element_id: str, text: str) -> None:
    """Type ``text`` into a search box and press Enter (the list is then filtered at once, and the
    search typing started is not run again after it)."""
    _js(driver, """const f = document.getElementById(arguments[0]); f.value = arguments[1];
                   f.dispatchEvent(new Event('input'));
                   f.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'}));""", element_id, text)  # fmt: skip


def _wait_count(driver: Any, list_id: str, expected: int) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 10).until(lambda d: _matching(d, list_id) == expected)


# -- the page -------------------------------------------------------------------------------------------


def test_page_opens_from_file_without_a_request_or_a_console_error(browser: Any, pages: Pages) -> None:
    page = pages.ordinary
    _open(browser, page)
    assert browser.find_element("css selector", "h1").text == page.model.report["run_id"]
    assert _console_errors(browser) == []
    assert set(_requests(browser)) <= {page.url}
    assert _js(browser, "return performance.getEntriesByType('resource').length") == 0
    assert (
        _js(browser, "return document.querySelectorAll('script[src], link[rel=stylesheet], img, iframe').length") == 0
    )
    assert _matching(browser, "tl-count") == len(page.model.timeline)
    assert _matching(browser, "tr-count") == len(page.model.transcript)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "view.png").write_bytes(browser.get_screenshot_as_png())


def test_timeline_filters_give_the_models_counts(browser: Any, pages: Pages) -> None:
    page = pages.ordinary
    model = page.model
    _open(browser, page)
    total = len(model.timeline)
    agent = browser.find_element("css selector", 'input.tl-producer[value="3"]')
    _click(browser, agent)
    assert _matching(browser, "tl-count") == total - _count(model, producer="untrusted_agent")
    _click(browser, agent)
    assert _matching(browser, "tl-count") == total
    kinds = list(model.timeline.kinds)
    _select(browser, "tl-kind", str(kinds.index("stdout")))
    stdout = _count(model, kind="stdout")
    assert _matching(browser, "tl-count") == stdout > 500
    assert {r.find_elements("css selector", "td")[4].text for r in _rows(browser)} == {"stdout"}
    _set_find(browser, "tl-find", "LOSS 0.001")  # case-insensitive, in the text
    expected = sum(1 for i in range(total) if model.timeline.kinds[model.timeline.kind[i]] == "stdout"
                   and "loss 0.001" in model.timeline.text[i].lower())  # fmt: skip
    _wait_count(browser, "tl-count", expected)
    assert 0 < expected < stdout
    _select(browser, "tl-kind", "-1")
    _set_find(browser, "tl-find", 'env-3"')  # in the data
    _wait_count(
        browser, "tl-count", sum(1 for d in model.timeline.detail if isinstance(d, dict) and d.get("env_id") == "env-3")
    )
    _set_find(browser, "tl-find", "")
    _select(browser, "tl-task", "-1")
    assert _matching(browser, "tl-count") == model.timeline.task.count(-1)
    text = browser.find_element("id", "tl-count").text
    untasked = model.timeline.task.count(-1)
    assert text == f"Showing 1–{untasked} of {untasked} matching events (of {total:,})."


def test_timeline_pages_and_orders(browser: Any, pages: Pages) -> None:
    page = pages.ordinary
    tl = page.model.timeline
    _open(browser, page)
    pages_count = math.ceil(len(tl) / PAGE)
    assert browser.find_element("css selector", "#tl-pager span").text == f" of {pages_count:,}".strip()
    assert len(_rows(browser)) == PAGE
    first = [r.find_element("css selector", "button.open").text for r in _rows(browser)]
    assert first == [str(tl.seq[i]) for i in tl.by_time[:PAGE]]  # wall-time order
    _click(browser, browser.find_element("css selector", "#tl-pager button[data-go=last]"))
    rows = _rows(browser)
    assert len(rows) == len(tl) - PAGE * (pages_count - 1)
    assert rows[-1].find_element("css selector", "button.open").text == str(tl.seq[tl.by_time[-1]])
    _select(browser, "tl-order", "chain")
    assert [r.find_element("css selector", "button.open").text for r in _rows(browser)][:3] == ["0", "1", "2"]
    _click(browser, browser.find_element("css selector", "#tl-pager button[data-go=next]"))
    assert _rows(browser)[0].find_element("css selector", "button.open").text == str(PAGE)
    assert browser.find_element("css selector", "#tl-pager input").get_attribute("value") == "2"


def test_an_events_data_opens_and_closes(browser: Any, pages: Pages) -> None:
    page = pages.ordinary
    tl = page.model.timeline
    _open(browser, page)
    _set_find(browser, "tl-find", 'train.py --seed 3"')  # in the data only, as JSON
    _wait_count(browser, "tl-count", 1)
    row = _rows(browser)[0]
    button = row.find_element("css selector", "button.open")
    _click(browser, button)
    assert button.get_attribute("aria-expanded") == "true"
    shown = browser.find_element("css selector", "#tl-table tr.detail pre").text
    i = int(row.get_attribute("data-i"))
    assert json.loads(shown) == tl.detail[i] == {"command": "python train.py --seed 3", "exit_status": 0}
    _click(browser, button)
    assert browser.find_elements("css selector", "#tl-table tr.detail") == []


def test_search_on_enter_is_not_redrawn_when_typing_pauses(browser: Any, pages: Pages) -> None:
    """Enter searched at once and then the pause in typing searched again, redrawing the list and
    closing the event the user had opened meanwhile."""
    _open(browser, pages.ordinary)
    _set_find(browser, "tl-find", 'train.py --seed 12"')
    _wait_count(browser, "tl-count", 1)
    button = browser.find_element("css selector", "#tl-table button.open")
    _click(browser, button)
    _js(browser, "return new Promise(done => setTimeout(done, 400))")  # past the pause (150 ms)
    assert button.get_attribute("aria-expanded") == "true"
    assert len(browser.find_elements("css selector", "#tl-table tr.detail")) == 1


def test_a_long_output_is_collapsed_until_asked(browser: Any, pages: Pages) -> None:
    _open(browser, pages.ordinary)
    _set_find(browser, "tr-find", "plan 4:")
    _wait_count(browser, "tr-count", 1)
    entry = browser.find_element("css selector", "#tr-list li")
    pre = entry.find_element("css selector", "pre")
    body = "plan 4:\n" + "try again\n" * 30
    assert pre.get_attribute("textContent") == "\n".join(body.split("\n")[:12])
    more = entry.find_element("css selector", "button.more")
    assert more.text == f"Show all {len(body.split(chr(10)))} lines ({len(body)} characters)"
    _click(browser, more)
    assert pre.get_attribute("textContent") == body
    assert more.get_attribute("aria-expanded") == "true"
    _click(browser, more)
    assert pre.get_attribute("textContent").count("\n") == 11


def test_output_lines_of_one_stream_are_one_block(browser: Any, pages: Pages) -> None:
    model = pages.ordinary.model
    _open(browser, pages.ordinary)
    blocks = [e for e in model.transcript if e.type == "output" and len(e.lines) > 1]
    assert blocks, "the ordinary events hold consecutive stdout lines"
    first = blocks[0]
    _set_find(browser, "tr-find", model.timeline.text[first.lines[0]])
    _wait_count(browser, "tr-count", 1)
    entry = browser.find_element("css selector", "#tr-list li.output")
    assert entry.find_element("css selector", ".head strong").text == f"stdout · {len(first.lines)} lines"
    assert entry.find_element("css selector", "pre").get_attribute("textContent") == "\n".join(
        model.timeline.text[i] for i in first.lines
    )


def test_the_transcript_leads_to_the_event_in_the_timeline(browser: Any, pages: Pages) -> None:
    model = pages.ordinary.model
    _open(browser, pages.ordinary)
    _click(browser, browser.find_element("css selector", "#tr-pager button[data-go=last]"))
    entry = browser.find_elements("css selector", "#tr-list li")[-1]
    _click(browser, entry.find_element("css selector", ".head button"))
    marked = browser.find_element("css selector", "#tl-table tr.marked")
    i = int(marked.get_attribute("data-i"))
    assert i == model.transcript[-1].event
    assert marked.find_element("css selector", "button.open").get_attribute("aria-expanded") == "true"
    assert _matching(browser, "tl-count") == len(model.timeline)  # the filters were cleared


def test_clicking_the_lanes_goes_to_that_moment(browser: Any, pages: Pages) -> None:
    tl = pages.ordinary.model.timeline
    _open(browser, pages.ordinary)
    lanes = _js(browser, """const c = document.getElementById('lanes'); const r = c.getBoundingClientRect();
        const plot = parseFloat(c.dataset.plot), span = parseFloat(c.dataset.span);
        const x = r.left + 170 + 0.9 * (plot - 1);
        c.dispatchEvent(new MouseEvent('click', {clientX: x, clientY: r.top + 8, bubbles: true}));
        return [plot, span];""")  # fmt: skip
    target = 0.9 * lanes[1]
    j = next(j for j, i in enumerate(tl.by_time) if tl.time_us[i] >= target - lanes[1] / lanes[0])
    marked = browser.find_element("css selector", "#tl-table tr.marked")
    i = int(marked.get_attribute("data-i"))
    assert abs(tl.by_time.index(i) - j) <= len(tl) / lanes[0] + 1  # within one pixel of the lanes
    assert tl.time_us[i] >= target - 2 * lanes[1] / lanes[0]
    page_shown = int(browser.find_element("css selector", "#tl-pager input").get_attribute("value"))
    assert page_shown == tl.by_time.index(i) // PAGE + 1 > 1


def test_text_contrast_meets_wcag_aa(browser: Any, pages: Pages) -> None:
    from test_static_site_browser import CONTRAST_JS  # the board's own check

    for page in (pages.ordinary, pages.gateway):
        _open(browser, page)
        _click(browser, browser.find_element("css selector", "#tl-table button.open"))
        assert _js(browser, CONTRAST_JS) == [], page.path.name


def test_phone_width_does_not_scroll_sideways(browser: Any, pages: Pages) -> None:
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True}
    )
    try:
        _open(browser, pages.ordinary)
        overflow = _js(browser, "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"the page scrolls sideways by {overflow}px on a phone"
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


# -- hostile content ------------------------------------------------------------------------------------


def _expand_everything(driver: Any, list_id: str, pager_id: str) -> list[str]:
    """Every page of a list, with every data row and every "show all" opened: the texts shown."""
    pages = int(_js(driver, f"return document.querySelector('#{pager_id} input').max"))
    shown: list[str] = []
    for number in range(1, pages + 1):
        _js(driver, f"""const i = document.querySelector('#{pager_id} input'); i.value = '{number}';
                        i.dispatchEvent(new Event('change'));""")  # fmt: skip
        shown += _js(driver, f"""const list = document.getElementById('{list_id}');
            list.querySelectorAll('button.open, button.more').forEach(b => b.click());
            return Array.from(list.querySelectorAll('pre, td.text')).map(p => p.textContent);""")  # fmt: skip
    return shown


def test_hostile_payloads_render_as_text_and_never_run(browser: Any, pages: Pages) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    _open(browser, pages.hostile)
    shown = _expand_everything(browser, "tr-list", "tr-pager")
    details = _expand_everything(browser, "tl-table", "tl-pager")
    assert _js(browser, "return typeof window.__ale_pwned") == "undefined"
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - raises when no dialog is open
    assert _console_errors(browser) == []  # no CSP violation either: nothing tried to run
    assert set(_requests(browser)) <= {pages.hostile.url}
    bad = _js(
        browser,
        """return Array.from(document.querySelectorAll('*')).flatMap(e =>
        Array.from(e.attributes).filter(a => a.name.startsWith('on') || /^\\s*javascript:/i.test(a.value)
          || (a.name === 'href' && !a.value.startsWith('#') && a.value !== 'data:,'))
          .map(a => e.tagName + ' ' + a.name));""",
    )
    assert bad == []
    assert (
        _js(
            browser,
            "return document.querySelectorAll('img, iframe, object, embed, svg [onload], a[href^=javascript]').length",
        )
        == 0
    )
    for payload in vf.HOSTILE_STRINGS[:7]:
        assert payload in shown, payload
    assert "\u2400\u2401\u2407\u2408\u240b\u240c\u241b[31mred\u241b[0m\u2421\u27e8U+0085\u27e9" in "".join(shown)
    assert "\u27e8U+202E\u27e9gnp.exe" in "".join(shown)
    assert vf.HOSTILE_MODEL in browser.find_element("css selector", ".lede").text
    cells = [d for d in details if d.startswith("AAAA")]
    assert sorted(len(c) for c in cells)[0] == 401  # the row's summary cell: 400 characters and an ellipsis
    assert any(d.endswith("<script>window.__ale_pwned=10") and len(d) > 64000 for d in cells)  # the data, whole
    assert any(d.count('"k"') > 20 and "<script>window.__ale_pwned = 9</script>" in d for d in details)


# -- the gateway's calls --------------------------------------------------------------------------------


def test_gateway_calls_show_their_tokens(browser: Any, pages: Pages) -> None:
    model = pages.gateway.model
    _open(browser, pages.gateway)
    assert _console_errors(browser) == []
    assert _matching(browser, "llm-count") == 12
    rows = browser.find_elements("css selector", "#llm-table tbody tr.row")
    assert len(rows) == 12
    cells = [c.text for c in rows[1].find_elements("css selector", "td")]
    call = model.llm[1]
    assert cells[0] == "gw-2"
    assert cells[2:] == ["POST", "/v1/chat/completions", "gpt-test", "200", "allowed", "101", "11", "1", "13.5", "3.25"]
    assert cells[1] == _js(browser, "return arguments[0].querySelector('td.when').textContent", rows[1]) != ""
    assert call.input_tokens == 101
    denied = [c.text for c in rows[4].find_elements("css selector", "td")]
    assert denied[5:7] == ["403", "denied (policy_closed)"]
    totals = browser.find_element("id", "llm-totals").text
    t = model.llm_totals
    for figure in (f"{t.calls:,}", f"{t.allowed:,} / {t.denied:,}", f"{t.input_tokens:,}", f"{t.output_tokens:,}"):
        assert figure in totals
    models = [r.text for r in browser.find_elements("css selector", "#llm-models tbody tr")]
    assert models[0].startswith("gpt-test 8")
    assert models[1].startswith("claude-test 4")
    _select(browser, "llm-decision", "denied")
    assert _matching(browser, "llm-count") == t.denied == 2
    _select(browser, "llm-decision", "")
    _click(browser, browser.find_element("css selector", "#llm-table tbody tr.row button.open"))
    detail = json.loads(browser.find_element("css selector", "#llm-table tr.detail pre").text)
    assert detail["messages"] == [{"role": "user", "content": "question 0"}]
    assert detail["response"]["text"] == "answer 0"
    gateway_entries = browser.find_elements("css selector", "#tr-list li.gateway")
    assert len(gateway_entries) == 12
    labels = [label.text.split()[0] for label in browser.find_elements("css selector", "fieldset.producers label")]
    assert labels == ["trusted_harness", "trusted_evaluator", "trusted_network_proxy", "untrusted_agent"]


def test_page_without_llm_calls_says_so(browser: Any, pages: Pages) -> None:
    _open(browser, pages.ordinary)
    assert "records no LLM call" in browser.find_element("id", "llm-none").text
    assert browser.find_elements("id", "llm-table") == []
    assert _console_errors(browser) == []


# -- --serve --------------------------------------------------------------------------------------------


def test_served_page_is_the_same_and_asks_for_nothing_else(browser: Any, pages: Pages) -> None:
    run = pages.run
    serving = vf.start_serving(str(run.bundle), "--identity", str(run.key))
    try:
        browser.get_log("browser")
        browser.get_log("performance")
        browser.get(serving.url)
        assert _js(browser, "return document.documentElement.dataset.ready") == "true"
        assert browser.find_element("css selector", "h1").text == run.bundle.stem
        assert _console_errors(browser) == []
        assert _requests(browser) == [serving.url]
    finally:
        serving.proc.send_signal(signal.SIGINT)
        _, stderr = serving.proc.communicate(timeout=15)
    assert serving.proc.returncode == 0
    requests = [
        line for line in stderr.splitlines() if line.startswith("ale view: GET") or line.startswith("ale view: HEAD")
    ]
    assert requests == ["ale view: GET '/' -> 200"], stderr
