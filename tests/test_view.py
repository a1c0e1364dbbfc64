"""``ale view`` without a browser: the page's data model (ale.runner.view_model), the HTML it renders,
the command line and ``--serve``. The page in headless Chromium: tests/test_view_browser.py.

One real run (``ale run cartpole-balance --episodes 5``) is the base; tests/view_fixtures.py grows it
with ordinary and hostile events into bundles every offline check passes. The gateway's
``llm_request`` events are synthetic (docs/gateway.md's fields), fed to the model directly.
"""

from __future__ import annotations

import html
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import html5lib
import pytest
import view_fixtures as vf
from fuzzing import fuzz_settings, json_values
from hypothesis import given
from hypothesis import strategies as st
from trajectory_helpers import RunBuilder

from ale.core import grammar
from ale.core.trajectory import iter_events
from ale.runner import view, view_model
from ale.runner.inspect import report_json

ROOT = Path(__file__).resolve().parents[1]
TASK = vf.TASK


def ale(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ALE_RECIPIENT", "CI")}
    return subprocess.run(
        [sys.executable, "-m", "ale.runner.cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> vf.RealRun:
    return vf.real_run(tmp_path_factory.mktemp("view-run"), "--model", vf.HOSTILE_MODEL, "--effort", vf.HOSTILE_EFFORT)


@pytest.fixture(scope="module")
def grown(base: vf.RealRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real run with 300 ordinary events and every hostile payload in its agent phase."""
    files = vf.Grower(base.files()).build(vf.ordinary(300) + vf.hostile())
    return vf.write_bundle(base, files, tmp_path_factory.mktemp("view-grown") / "grown.ale")


@pytest.fixture(scope="module")
def grown_view(grown: Path, base: vf.RealRun) -> view_model.RunView:
    return view.view_of(view.load(grown, base.key))


def events_of(*extra: vf.Extra) -> list[dict[str, Any]]:
    return vf.chained(extra)


# -- text ---------------------------------------------------------------------------------------------


def test_visible_shows_control_and_bidi_characters_as_symbols() -> None:
    assert view_model.visible("plain\ttext\nok") == "plain\ttext\nok"
    assert view_model.visible("\x00\x07\x1b[31m\x7f") == "\u2400\u2407\u241b[31m\u2421"
    assert view_model.visible("a\u202eb\u2066c\x85") == "a\u27e8U+202E\u27e9b\u27e8U+2066\u27e9c\u27e8U+0085\u27e9"
    assert view_model.visible("lone \ud800") == "lone \ufffd"


def test_clip_says_how_many_characters_it_cut() -> None:
    assert view_model.clip("abc", 3) == "abc"
    assert view_model.clip("abcdef", 2) == "ab... [4 characters cut by the viewer]"


@pytest.mark.parametrize("hostile", vf.HOSTILE_STRINGS)
def test_script_json_has_no_angle_bracket_or_ampersand_and_reads_back(hostile: str) -> None:
    value = {"text": hostile, hostile: [hostile, {"x": hostile}]}
    text = view_model.script_json(value)
    assert not set(text) & {"<", ">", "&", "\u2028", "\u2029"}
    assert json.loads(text) == value


def test_script_json_escapes_what_html_calls_a_parse_error() -> None:
    value = ["\x7f", "\x80\x9f", "\ufdd0\ufdef\ufffe\uffff", "\U0001fffe\U0010ffff", "é ° \u00a0 \uffef 😀"]
    text = view_model.script_json(value)
    expected = r'["\u007f","\u0080\u009f","\ufdd0\ufdef\ufffe\uffff","\ud83f\udffe\udbff\udfff",'
    assert text == expected + '"é ° \u00a0 \uffef 😀"]'
    assert json.loads(text) == value


# -- summaries ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "data", "expected"),
    [
        ("agent_finished", {"task": TASK, "exit_status": 0, "stopped_for": "", "wall_time_s": 1.5, "env_steps": 0,
                            "oom_kills": 0}, f"{TASK}: exit 0, 1.5 s"),
        ("agent_finished", {"task": TASK, "exit_status": None, "stopped_for": "wall_time", "wall_time_s": 60,
                            "env_steps": 12, "oom_kills": 2}, f"{TASK}: exit null, stopped for wall_time, 60 s, "
                                                              "12 env steps, 2 OOM kills"),
        ("rpc", {"endpoint": "agent", "method": "Step", "code": "OK", "duration_ms": 0.25, "env_id": "e1"},
         "agent Step -> OK in 0.25 ms env e1"),
        ("episode_end", {"session_id": "s", "index": 3, "length": 200, "aborted": True, "abort_reason": "policy_error"},
         "s #3: length 200, aborted: policy_error"),
        ("shell_command", {"command": "python train.py", "exit_status": 1}, "$ python train.py -> exit 1"),
        ("message", {"role": "assistant", "text": "hi"}, "assistant: hi"),
        ("api_usage", {"model": "m", "input_tokens": 5, "output_tokens": 2}, "m: 5 in, 2 out (the agent's own claim)"),
        ("llm_request", {"method": "POST", "path": "/v1/messages", "status": 200, "model": "claude", "decision":
                         "allowed", "reason": None, "usage": {"input_tokens": 10, "output_tokens": 4},
                         "duration_ms": 120.5}, "POST /v1/messages -> 200 claude allowed, 10 in, 4 out, 120.5 ms"),
        ("llm_request", {"method": "GET", "path": "/etc/passwd", "status": 403, "model": None, "decision": "denied",
                         "reason": "path_not_allowed", "usage": {"input_tokens": 0, "output_tokens": 0},
                         "duration_ms": 0.5}, "GET /etc/passwd -> 403 denied (path_not_allowed), 0.5 ms"),
        ("run_started", {"run_id": "r", "tasks": ["a@1", "b@1"], "agent": {"name": "x"}, "runtime": "local",
                         "sandbox": "bwrap"}, "run r: a@1 b@1; agent x; runtime local/bwrap"),
    ],
)  # fmt: skip
def test_summary_of_a_known_kind(kind: str, data: dict[str, Any], expected: str) -> None:
    assert view_model.summary(kind, data) == expected


def test_summary_of_any_other_kind_lists_its_members_but_the_columns() -> None:
    data = {"task": TASK, "evaluator_seq": 7, "a": [1, 2], "b": "x", "c": None, "d": {"e": 1.5}}
    assert view_model.summary("something_new", data) == 'a=[1,2], b=x, c=null, d={"e":1.5}'


def test_summary_of_members_with_the_wrong_types_does_not_fail() -> None:
    data = {"task": ["not", "a", "string"], "exit_status": {"x": 1}, "wall_time_s": "soon", "usage": "none"}
    assert view_model.summary("agent_finished", data) == 'not a string: exit {"x":1}, soon s'
    assert view_model.summary("llm_request", {"usage": "none"}).startswith("null null -> null")


# -- the timeline ----------------------------------------------------------------------------------------


def test_timeline_phase_and_task_follow_the_grammar() -> None:
    stream = RunBuilder().open_task().body(3).close_task(episodes=1).finish().stream()
    events = [e for _, e in iter_events(stream)]
    tl = view_model.build_timeline(events, [TASK])
    by_kind = {tl.kinds[k]: (tl.phases[p], tl.task[i]) for i, (k, p) in enumerate(zip(tl.kind, tl.phase, strict=True))}
    assert by_kind["run_started"] == ("run", -1)
    assert by_kind["task_started"] == ("task", 0)
    assert by_kind["agent_started"] == ("agent", 0)
    assert by_kind["note"] == ("agent", 0)
    assert by_kind["episode_end"] == ("artifact", 0)
    assert by_kind["task_finished"] == ("run", 0)  # the task it closes
    assert by_kind["run_finished"] == ("finished", -1)
    assert tl.tasks == (TASK,)
    assert tl.producers[:4] == view_model.PRODUCERS[:4]
    assert tl.seq == tuple(range(len(events)))


def test_timeline_events_outside_the_grammar_keep_the_phase() -> None:
    events = events_of(
        ("trusted_harness", "run_started", {"tasks": [TASK], "run_id": "r", "nonce": None}),
        *vf.gateway_events(2),
        ("trusted_harness", "task_started", {"task": TASK}),
        ("untrusted_agent", "thinking", {"text": "refused wherever it comes"}),
        ("trusted_harness", "agent_finished", {"task": TASK}),  # out of order: refused, the phase stays
        *vf.gateway_events(1),
    )
    tl = view_model.build_timeline(events, [TASK])
    assert [tl.phases[p] for p in tl.phase] == ["run", "run", "run", "task", "task", "task", "task"]
    assert tl.producers[tl.producer[1]] == "trusted_network_proxy"


def test_timeline_orders_by_wall_time_then_producer_sequence() -> None:
    events = events_of(*(("untrusted_agent", "note", {"text": str(i)}) for i in range(4)))
    events[0]["wall_time"] = events[3]["wall_time"]  # the first is as late as the last
    events[2]["wall_time"] = events[1]["wall_time"]
    tl = view_model.build_timeline(events)
    assert tl.by_time == (1, 2, 0, 3)
    assert tl.time_us[1] == 0
    assert tl.start_us == view_model.wall_micros(events[1]["wall_time"])


def test_timeline_keeps_a_text_events_text_and_other_events_data() -> None:
    events = events_of(
        ("untrusted_agent", "stdout", {"text": "hello \x1b[1mworld"}),
        ("untrusted_agent", "note", {"text": "n", "extra": 1}),
        ("trusted_evaluator", "rpc", {"endpoint": "agent", "method": "Reset", "code": "OK"}),
    )
    tl = view_model.build_timeline(events)
    assert tl.text[0] == "hello \u241b[1mworld"
    assert tl.detail[0] is None
    assert tl.detail[1] == {"text": "n", "extra": 1}
    assert tl.text[1] == "text=n, extra=1"
    assert tl.detail[2] == {"endpoint": "agent", "method": "Reset", "code": "OK"}


def test_timeline_cuts_a_long_text_and_long_data() -> None:
    events = events_of(
        ("untrusted_agent", "stdout", {"text": "x" * (view_model.TEXT_CHARS + 10)}),
        ("untrusted_agent", "message", {"role": "a", "text": "y" * view_model.DETAIL_CHARS}),
    )
    tl = view_model.build_timeline(events)
    assert tl.text[0].endswith("... [10 characters cut by the viewer]")
    assert isinstance(tl.detail[1], str)
    assert tl.detail[1].startswith('{"role":"a","text":"yyy')
    assert tl.detail[1].endswith("characters cut by the viewer]")
    assert len(tl.text[1]) < view_model.SUMMARY_CHARS + 50


def test_timeline_past_the_page_budget_keeps_summaries_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(view_model, "PAGE_BUDGET_CHARS", 50)
    events = events_of(*(("untrusted_agent", "message", {"role": "a", "text": f"m{i} " * 10}) for i in range(5)))
    tl = view_model.build_timeline(events)
    assert tl.detail[0] == {"role": "a", "text": "m0 " * 10}
    assert tl.detail[1:] == (view_model.NOT_KEPT,) * 4
    assert tl.not_kept == 4
    assert tl.text[4] == "a: " + "m4 " * 10


def test_wall_micros_reads_the_trajectory_form_only() -> None:
    assert view_model.wall_micros("2025-11-30T04:28:38.123456Z") == 1_764_476_918_123_456
    for bad in ("2025-11-30T04:28:38Z", "2025-13-30T04:28:38.123456Z", 17, None, "x" * 27):
        assert view_model.wall_micros(bad) is None


# -- the transcript --------------------------------------------------------------------------------------


def _transcript(*extra: vf.Extra) -> tuple[view_model.Timeline, tuple[view_model.Entry, ...]]:
    events = events_of(*extra)
    tl = view_model.build_timeline(events)
    return tl, view_model.build_transcript(events, tl)


def test_transcript_groups_consecutive_lines_of_one_stream() -> None:
    out = ("untrusted_agent", "stdout", {"text": "o"})
    err = ("untrusted_agent", "stderr", {"text": "e"})
    rpc = ("trusted_evaluator", "rpc", {"endpoint": "agent", "method": "Step", "code": "OK"})
    cmd = ("untrusted_agent", "shell_command", {"command": "make", "exit_status": 0})
    _tl, entries = _transcript(out, out, rpc, out, err, err, out, cmd, out)
    assert [(e.type, e.lines) for e in entries] == [
        ("output", (0, 1, 3)),  # the evaluator's RPC is not in the transcript and does not split it
        ("output", (4, 5)),
        ("output", (6,)),
        ("event", ()),
        ("output", (8,)),
    ]
    assert entries[3].event == 7
    assert entries[3].title == "exit status 0"
    assert entries[3].body == "$ make"


def test_transcript_blocks_hold_at_most_block_lines() -> None:
    _, entries = _transcript(*(("untrusted_agent", "stdout", {"text": str(i)}) for i in range(1201)))
    assert [len(e.lines) for e in entries] == [500, 500, 201]


def test_transcript_holds_the_agents_events_the_harness_notes_and_llm_calls_only() -> None:
    _, entries = _transcript(
        ("trusted_harness", "run_started", {"tasks": [TASK], "run_id": "r"}),
        ("trusted_harness", "agent_started", {"task": TASK, "command": ["python", "a.py"]}),
        ("trusted_evaluator", "rpc", {"endpoint": "agent"}),
        ("untrusted_agent", "message", {"role": "assistant", "text": "thinking out loud\nline 2"}),
        ("untrusted_agent", "tool_call", {"tool": "shell", "input": {"cmd": "ls"}}),
        ("untrusted_agent", "api_usage", {"model": "m", "input_tokens": 1, "output_tokens": 2}),
        *vf.gateway_events(1),
        ("trusted_network_proxy", "policy_changed", {"policy": "closed"}),
        ("trusted_harness", "agent_finished", {"task": TASK, "exit_status": 0}),
    )
    assert [e.event for e in entries] == [1, 3, 4, 5, 6, 8]
    message, tool, usage, call = entries[1:5]
    assert (message.title, message.body) == ("assistant", "thinking out loud\nline 2")
    assert (tool.title, tool.body) == ("shell", '{\n  "cmd": "ls"\n}')
    assert usage.title == "m: 1 in, 2 out (the agent's own claim)"
    assert usage.body == ""
    assert call.title.startswith("POST /v1/chat/completions -> 200 claude-test allowed")


# -- the gateway's calls ---------------------------------------------------------------------------------


def test_llm_request_view_has_method_path_model_status_tokens_and_duration() -> None:
    calls = [view_model.llm_call(i, data) for i, (_, _, data) in enumerate(vf.gateway_events(10))]
    first, denied = calls[1], calls[4]
    assert (first.request_id, first.method, first.path, first.model, first.status, first.decision) == (
        "gw-2", "POST", "/v1/chat/completions", "gpt-test", 200, "allowed"
    )  # fmt: skip
    assert (first.input_tokens, first.output_tokens, first.cached_input_tokens) == (101, 11, 1)
    assert (first.duration_ms, first.ttfb_ms, first.stream, first.bytes_in, first.bytes_out) == (
        13.5,
        3.25,
        True,
        101,
        2001,
    )
    assert (denied.status, denied.decision, denied.reason, denied.input_tokens, denied.ttfb_ms) == (
        403, "denied", "policy_closed", 0, None
    )  # fmt: skip
    totals = view_model.llm_totals(calls)
    assert (totals.calls, totals.allowed, totals.denied) == (10, 8, 2)
    allowed = [c for c in calls if c.decision == "allowed"]
    assert totals.input_tokens == sum(100 + int(c.request_id[3:]) - 1 for c in allowed)
    assert [(m.model, m.calls) for m in totals.by_model] == [("gpt-test", 6), ("claude-test", 4)]


def test_llm_request_members_of_the_wrong_type_read_as_unknown() -> None:
    call = view_model.llm_call(0, {"status": "200", "usage": {"input_tokens": -5, "output_tokens": 1.5},
                                   "duration_ms": True, "model": {"x": "<b>"}, "stream": "yes"})  # fmt: skip
    assert (call.status, call.input_tokens, call.output_tokens, call.duration_ms, call.stream) == (
        None,
        0,
        0,
        None,
        None,
    )
    assert call.model == '{"x":"<b>"}'
    assert call.method == ""
    assert view_model.llm_call(1, {"usage": ["not", "an", "object"]}).input_tokens == 0


def test_llm_calls_of_a_view_come_from_the_gateways_llm_request_events(
    base: vf.RealRun, grown_view: view_model.RunView
) -> None:
    report = view.load(base.bundle, base.key)
    events = [e for _, e in iter_events(report.docs.events)]
    finished = next(i for i, e in enumerate(events) if e["kind"] == "run_finished")
    extra = vf.chained([*vf.gateway_events(7), ("trusted_network_proxy", "policy_changed", {"policy": "open"})])
    model = view_model.build(report, events[:finished] + extra + events[finished:], report_json(report))
    assert [c.event for c in model.llm] == list(range(finished, finished + 7))
    assert model.llm_totals.calls == 7
    assert model.llm_totals.denied == 1
    assert grown_view.llm == ()
    assert grown_view.llm_totals.calls == 0


def test_gateway_events_in_a_checked_bundle(base: vf.RealRun, tmp_path: Path) -> None:
    """Once the grammar has the gateway's kinds (docs/gateway.md), a bundle holding them passes the
    checks and its calls are on the page."""
    if "llm_request" not in grammar.KINDS["trusted_network_proxy"]:
        pytest.skip("this tree's grammar has no gateway events yet (docs/formats.md, the grammar)")
    started = {"upstreams": [{"name": "openai", "api": "openai", "host": "api.openai.com"}], "policy": "open",
               "budgets": {"requests": None, "input_tokens": None, "output_tokens": None}}  # fmt: skip
    extra = [("trusted_network_proxy", "gateway_started", started), *vf.gateway_events(6)]
    bundle = vf.write_bundle(base, vf.Grower(base.files()).build(extra), tmp_path / "gateway.ale")
    model = view.view_of(view.load(bundle, base.key))
    assert [c.request_id for c in model.llm] == [f"gw-{i}" for i in range(1, 7)]
    assert (model.llm_totals.calls, model.llm_totals.denied) == (6, 1)
    assert sum(1 for e in model.transcript if model.timeline.kinds[model.timeline.kind[e.event]] == "llm_request") == 6
    page = view.render(model, source=bundle.name)
    assert 'id="llm-table"' in page


# -- a real bundle ---------------------------------------------------------------------------------------


def test_view_of_a_real_bundle_is_what_inspect_reports(base: vf.RealRun) -> None:
    report = view.load(base.bundle, base.key)
    model = view.view_of(report)
    assert model.report == report_json(report)
    tl = model.timeline
    assert len(tl) == report.manifest.trajectory.events
    counts = {tl.producers[p]: tl.producer.count(p) for p in set(tl.producer)}
    assert counts == report.chain.per_producer
    assert [r["task"] for r in model.results] == [TASK]
    assert len(model.results[0]["result"]["episodes"]) == 5
    practice = [b for b in model.batches if b.official is False]
    official = [b for b in model.batches if b.official is True]
    assert practice
    assert all(b.state == "done" and b.episodes_done == b.num_episodes for b in practice)
    assert [b.num_episodes for b in official] == [5]
    assert {b.task for b in model.batches} == {TASK}


def test_grown_bundle_passes_the_checks_and_keeps_every_event(grown: Path, grown_view: view_model.RunView) -> None:
    tl = grown_view.timeline
    assert len(tl) == grown_view.report["trajectory"]["events"] > 300 + len(vf.hostile())
    kinds = {tl.kinds[k] for k in tl.kind}
    assert {"stdout", "stderr", "shell_command", "message", "tool_call", "tool_result", "note", "rpc"} <= kinds
    outputs = [e for e in grown_view.transcript if e.type == "output"]
    assert sum(len(e.lines) for e in outputs) == sum(1 for k in tl.kind if tl.kinds[k] in view_model.OUTPUT_KINDS)


# -- the page --------------------------------------------------------------------------------------------


def _page(model: view_model.RunView) -> str:
    return view.render(model, source="run.ale")


def _scripts(page: str) -> list[tuple[str, str]]:
    return re.findall(r"<script([^>]*)>(.*?)</script>", page, flags=re.S)


def test_page_is_valid_html_with_its_style_script_and_data_inline(grown_view: view_model.RunView) -> None:
    page = _page(grown_view)
    parser = html5lib.HTMLParser(strict=True, namespaceHTMLElements=False)
    document = parser.parse(page)
    assert document.find(".//title").text.startswith(grown_view.report["run_id"])
    scripts = _scripts(page)
    assert [attrs for attrs, _ in scripts] == [' type="application/json" id="ale-view-data"', ""]
    assert "</" not in scripts[0][1]
    assert "<" not in scripts[0][1]
    data = json.loads(scripts[0][1])
    assert data["timeline"]["text"] == list(grown_view.timeline.text)
    assert not re.search(r"""(?:src|href)=["'](?!#|data:)""", page)  # nothing to load, every link in the page
    assert page.count("<link ") == 1
    assert 'rel="icon" href="data:,"' in page


def test_page_csp_allows_only_its_own_style_and_script(grown_view: view_model.RunView) -> None:
    page = _page(grown_view)
    csp = html.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1))
    style = re.search(r"<style>(.*?)</style>", page, flags=re.S).group(1)
    script = _scripts(page)[1][1]
    assert csp == view.content_security_policy(style, script)
    assert "default-src 'none'" in csp
    assert "unsafe" not in csp
    assert "connect-src" not in csp


def test_page_of_the_same_bundle_is_the_same(grown: Path, base: vf.RealRun) -> None:
    first = _page(view.view_of(view.load(grown, base.key)))
    assert _page(view.view_of(view.load(grown, base.key))) == first


def test_hostile_payloads_are_text_in_the_page_never_markup(grown_view: view_model.RunView) -> None:
    page = _page(grown_view)
    document = html5lib.parse(page, namespaceHTMLElements=False)
    allowed = {"html", "head", "meta", "title", "link", "style", "body", "a", "header", "div", "span", "nav", "ul",
               "li", "main", "section", "h1", "h2", "h3", "h4", "p", "strong", "dl", "dt", "dd", "code", "table",
               "thead", "tbody", "tr", "th", "td", "details", "summary", "svg", "rect", "article", "label", "select",
               "option", "input", "ol", "canvas", "fieldset", "legend", "noscript", "footer", "script"}  # fmt: skip
    for element in document.iter():
        assert element.tag.rpartition("}")[2] in allowed, element.tag
        for name, value in element.attrib.items():
            assert not name.lower().startswith("on"), (element.tag, name)
            assert "javascript:" not in value.lower(), (element.tag, name, value)
    assert len(document.findall(".//script")) == 2
    # Outside the data (where they are JSON strings), the payloads appear only escaped: the declared
    # model and effort are written by the template.
    outside = page.replace(_scripts(page)[0][1], "")
    assert "__ale_pwned" in outside
    assert "onerror=alert(12)" in outside
    for raw in ("<script>window", "<img", "</title><", "\u202e", "\x1b"):
        assert raw not in outside, raw
    assert "&lt;script&gt;window.__ale_pwned = 11&lt;/script&gt;" in outside


def test_view_js_never_writes_markup_or_code() -> None:
    script = (ROOT / "ale/runner/templates/view.js").read_text()
    words = ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(", "srcdoc",
             'setAttribute("on', 'setAttribute("href', ".href", ".src", "createContextualFragment")  # fmt: skip
    for word in words:
        assert word not in script, word


def test_templates_are_package_data() -> None:
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["ale"]
    for path in sorted((ROOT / "ale/runner/templates").iterdir()):
        relative = path.relative_to(ROOT / "ale").as_posix()
        assert any(Path(relative).match(pattern) for pattern in package_data), relative


# -- the command -----------------------------------------------------------------------------------------


def test_view_writes_the_page_beside_the_bundle_readable_by_its_owner_only(base: vf.RealRun, tmp_path: Path) -> None:
    bundle = tmp_path / "run.ale"
    bundle.write_bytes(base.bundle.read_bytes())
    proc = ale("view", str(bundle), "--identity", str(base.key))
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "run.html"
    assert proc.stdout.strip() == str(out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert "ale-view-data" in out.read_text()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_view_out_names_the_file(base: vf.RealRun, tmp_path: Path) -> None:
    out = tmp_path / "sub" / "page.html"
    out.parent.mkdir()
    proc = ale("view", str(base.bundle), "--identity", str(base.key), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_view_of_a_bundle_that_fails_verification_writes_nothing(base: vf.RealRun, tmp_path: Path) -> None:
    files = base.files()
    files["score_breakdown.json"] = files["score_breakdown.json"].replace(b'"final":1', b'"final":0.5', 1)
    tampered = vf.write_bundle(base, files, tmp_path / "tampered.ale")
    proc = ale("view", str(tampered), "--identity", str(base.key))
    assert proc.returncode == 1
    assert "fails verification (integrity_mismatch)" in proc.stderr
    assert "no view was written" in proc.stderr
    assert not (tmp_path / "tampered.html").exists()


def test_view_with_another_identity_fails_decryption(base: vf.RealRun, tmp_path: Path) -> None:
    import pyrage

    other = tmp_path / "other.key"
    other.write_text(f"{pyrage.x25519.Identity.generate()}\n")
    proc = ale("view", str(base.bundle), "--identity", str(other), "--out", str(tmp_path / "x.html"))
    assert proc.returncode == 1
    assert "decrypt_failed" in proc.stderr
    assert not (tmp_path / "x.html").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--identity", "/nonexistent/key"], "cannot read the identity file"),
        (["--out", "/nonexistent/dir/page.html"], "cannot write /nonexistent/dir/page.html"),
        (["--serve", "--port", "70000"], "--port 70000 is not a TCP port"),
        (["--runner-public-key", "not-base64"], "is not a runner public key"),
    ],
)
def test_view_errors_the_user_can_fix_are_one_line_and_status_2(
    base: vf.RealRun, args: list[str], message: str
) -> None:
    cmd = ["view", str(base.bundle), "--identity", str(base.key), *args]
    proc = ale(*cmd)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("ale: error: ")
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_view_of_a_missing_bundle(base: vf.RealRun, tmp_path: Path) -> None:
    proc = ale("view", str(tmp_path / "none.ale"), "--identity", str(base.key))
    assert proc.returncode == 2
    assert "cannot read" in proc.stderr


def test_view_help_names_its_options() -> None:
    proc = ale("view", "--help")
    assert proc.returncode == 0
    for option in ("--identity", "--out", "--serve", "--port", "--runner-public-key"):
        assert option in proc.stdout
    assert "view" in ale("--help").stdout


# -- --serve ---------------------------------------------------------------------------------------------


@pytest.fixture
def served(base: vf.RealRun, tmp_path: Path) -> Iterator[tuple[vf.Served, Path]]:
    out = tmp_path / "page.html"
    serving = vf.start_serving(str(base.bundle), "--identity", str(base.key), "--out", str(out))
    try:
        yield serving, out
    finally:
        if serving.proc.poll() is None:
            serving.proc.kill()
            serving.proc.communicate()


def _get(url: str, host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _listening_addresses(port: int) -> set[str]:
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.rsplit(":", 1)
                if int(hex_port, 16) == port and state == "0A":  # LISTEN
                    found.add(address)
    return found


def test_serve_binds_to_loopback_serves_the_written_page_and_stops_on_ctrl_c(served: tuple[vf.Served, Path]) -> None:
    serving, out = served
    assert serving.url.startswith("http://127.0.0.1:")
    assert _listening_addresses(serving.port) == {"0100007F"}  # 127.0.0.1 only, no IPv6, no 0.0.0.0
    status, headers, body = _get(serving.url)
    assert status == 200
    assert body == out.read_bytes()
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert headers["Content-Security-Policy"].startswith("default-src 'none'")
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Cache-Control"] == "no-store"
    assert _get(serving.url + "index.html")[2] == body
    assert _get(serving.url + "favicon.ico")[0] == 404
    assert _get(serving.url + "../../etc/passwd")[0] == 404
    serving.proc.send_signal(signal.SIGINT)
    _, stderr = serving.proc.communicate(timeout=15)
    assert serving.proc.returncode == 0, stderr
    assert "ale view: stopped" in stderr
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", serving.port), timeout=2):
        pass


def test_serve_refuses_another_host_name(served: tuple[vf.Served, Path]) -> None:
    """A page of another site that rebinds its name to 127.0.0.1 cannot read the view."""
    serving, _ = served
    assert _get(serving.url, host=f"attacker.example:{serving.port}")[0] == 421
    assert _get(serving.url, host=f"localhost:{serving.port}")[0] == 200


def test_serve_sigterm_right_after_the_url_stops_cleanly(served: tuple[vf.Served, Path]) -> None:
    """The URL was printed before the SIGTERM handler was in place: a SIGTERM just after it killed
    the server (status -15) instead of stopping it."""
    serving, _ = served
    serving.proc.send_signal(signal.SIGTERM)
    serving.proc.communicate(timeout=15)
    assert serving.proc.returncode == 0


def test_serve_without_out_writes_no_file(base: vf.RealRun, tmp_path: Path) -> None:
    bundle = tmp_path / "run.ale"
    bundle.write_bytes(base.bundle.read_bytes())
    serving = vf.start_serving(str(bundle), "--identity", str(base.key))
    try:
        assert _get(serving.url)[0] == 200
    finally:
        serving.proc.send_signal(signal.SIGINT)
        serving.proc.communicate(timeout=15)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.ale"]


# -- fuzz ------------------------------------------------------------------------------------------------

_producers = st.sampled_from([*view_model.PRODUCERS, "someone_else"])
_kinds = st.sampled_from([*grammar.KINDS["trusted_harness"], *view_model.TEMPLATES, "stdout", "x", "llm_request"])
_data = st.one_of(st.dictionaries(st.text(max_size=8), json_values, max_size=6), json_values)
_event = st.fixed_dictionaries(
    {"producer": _producers, "kind": _kinds, "data": _data},
    optional={"wall_time": st.one_of(st.text(max_size=30), st.integers()), "seq": json_values,
              "producer_sequence": json_values},
)  # fmt: skip


@pytest.mark.fuzz
@fuzz_settings
@given(st.lists(_event, max_size=30))
def test_fuzz_view_model_of_any_events(events: list[dict[str, Any]]) -> None:
    """Events of any shape (as a future or hostile producer might write them) never break the model,
    and the page's data stays inert JSON."""
    tl = view_model.build_timeline(events, [TASK])
    entries = view_model.build_transcript(events, tl)
    calls = [view_model.llm_call(i, e["data"] if isinstance(e["data"], dict) else {}) for i, e in enumerate(events)]
    totals = view_model.llm_totals(calls)
    assert len(tl) == len(events)
    assert sorted(tl.by_time) == list(range(len(events)))
    assert totals.calls == len(events)
    lines = [i for e in entries for i in e.lines]
    assert lines == sorted(lines)
    text = view_model.script_json({"timeline": tl.text, "detail": tl.detail, "titles": [e.title for e in entries]})
    assert "<" not in text
    assert ">" not in text
    json.loads(text)
