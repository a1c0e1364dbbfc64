"""The judge's answer (ale.core.verdict) and the client (ale.judge.client): fail-closed on every path.

A scripted upstream (tests/llm_upstream.py) answers with errors, refusals, garbage, oversized and
deeply nested bodies and verdicts for another input; each gives an unfaithful result with the
outcome that names it, never an exception. The same client through the judge's own gateway
(ale.judge.gateway, a real ``python -m ale.gateway serve``) gives the same results, and its budget
holds."""

from __future__ import annotations

import contextlib
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fuzzing import fuzz_settings, hostile_json, json_values
from hypothesis import given
from hypothesis import strategies as st
from judge_helpers import chat_body, serve_judge, verdict_for
from llm_upstream import Turn, serve_upstream

from ale import catalog
from ale.core.judge_input import JudgeInput, build_input
from ale.core.parse import ParseError
from ale.core.signing import SignatureError
from ale.core.verdict import (
    MAX_REPLY_BYTES,
    ChatReply,
    VerdictError,
    failed,
    judged,
    parse_chat_reply,
    parse_verdict,
    request_body,
    sign_verdict,
    verify_verdict,
)
from ale.judge.client import Endpoint, EndpointError, Transport, ask
from ale.judge.gateway import REQUEST_PREFIX, JudgeGateway, budgets, relayed

TASK = catalog.get_task("reacher-jacobian")
CONTEXT = catalog.judge_context(TASK)
RUBRIC = CONTEXT.rubric
INPUT: JudgeInput = build_input([], CONTEXT, "run-verdict-tests")
DIGEST = INPUT.sha256


def _verdict(**changes: Any) -> dict[str, Any]:
    request = request_body("m", INPUT)
    verdict = verdict_for(request)
    verdict.update(changes)
    return verdict


def _reply(content: str | None, **kw: Any) -> ChatReply:
    return parse_chat_reply(chat_body(content, **kw))


# -- the request ----------------------------------------------------------------------------------


def test_the_request_is_the_system_prompt_then_the_input_and_its_digest() -> None:
    body = request_body("judge-model", INPUT)
    assert (body["model"], body["temperature"], body["stream"]) == ("judge-model", 0, False)
    system, user = body["messages"]
    assert system["role"] == "system"
    assert "faithfulness judge" in system["content"]
    assert user["content"] == INPUT.text.decode() + f"\ninput_sha256: {DIGEST}\n"


# -- reading the answer ---------------------------------------------------------------------------


def test_a_verdict_with_every_item_satisfied_is_faithful() -> None:
    result = judged(parse_verdict(_reply(json.dumps(_verdict())), RUBRIC, DIGEST), RUBRIC, "m")
    assert (result.outcome, result.faithful, result.input_sha256) == ("judged", True, DIGEST)
    assert [f.item for f in result.findings] == list(RUBRIC.ids)


def test_a_fenced_verdict_is_read() -> None:
    fenced = "```json\n" + json.dumps(_verdict()) + "\n```"
    assert parse_verdict(_reply(fenced), RUBRIC, DIGEST).faithful is True


def test_faithful_with_an_unsatisfied_item_is_unfaithful() -> None:
    verdict = _verdict()
    verdict["findings"][-1]["satisfied"] = False
    result = judged(parse_verdict(_reply(json.dumps(verdict)), RUBRIC, DIGEST), RUBRIC, "m")
    assert (result.outcome, result.faithful) == ("judged", False)
    assert result.rationale.startswith("judged faithful, but items are not satisfied (no-judge-steering)")


@pytest.mark.parametrize(
    ("content", "outcome"),
    [
        (json.dumps(_verdict(input_sha256="0" * 64)), "wrong_input"),
        (json.dumps(_verdict(findings=_verdict()["findings"][:-1])), "unparsable"),  # an item missing
        (json.dumps(_verdict(findings=[*_verdict()["findings"], _verdict()["findings"][0]])), "unparsable"),
        (json.dumps(_verdict(faithful="yes")), "unparsable"),
        (json.dumps({**_verdict(), "score": 10}), "unparsable"),  # a member the format does not name
        (json.dumps(_verdict()) + " and that is my verdict", "unparsable"),
        ("I think it is faithful.", "unparsable"),
        ("[" * 10_000 + "]" * 10_000, "unparsable"),  # nested deeper than the verdict's bound
        (json.dumps(_verdict(rationale="x" * (70 * 1024))), "unparsable"),  # over 64 KiB
        ("", "unparsable"),
        (None, "unparsable"),
    ],
)
def test_an_answer_that_is_not_the_verdict_gives_none(content: str | None, outcome: str) -> None:
    with pytest.raises(VerdictError) as caught:
        parse_verdict(_reply(content), RUBRIC, DIGEST)
    assert caught.value.outcome == outcome


@pytest.mark.parametrize("body", [chat_body(None, refusal="I cannot help"), chat_body("{}", finish="content_filter")])
def test_a_refusal_gives_no_verdict(body: bytes) -> None:
    with pytest.raises(VerdictError) as caught:
        parse_verdict(parse_chat_reply(body), RUBRIC, DIGEST)
    assert caught.value.outcome == "refusal"


@pytest.mark.parametrize(
    "body",
    [b"not json", b"{}", b'{"choices": []}', b'{"choices": [1]}', b'{"choices": [{"message": "x"}]}',
     b"[" * 100 + b"]" * 100, b"x" * (MAX_REPLY_BYTES + 1)],
)  # fmt: skip
def test_a_body_that_is_not_a_chat_completion_is_a_parse_error(body: bytes) -> None:
    with pytest.raises(ParseError):
        parse_chat_reply(body)


def test_long_prose_is_clipped_not_refused() -> None:
    verdict = _verdict(rationale="r" * 20_000)
    verdict["findings"][0]["evidence"] = "e" * 5000
    result = judged(parse_verdict(_reply(json.dumps(verdict)), RUBRIC, DIGEST), RUBRIC, "m")
    assert len(result.rationale) < 4100
    assert result.rationale.endswith("characters cut]")
    assert len(result.findings[0].evidence) < 1100


@pytest.mark.fuzz
@fuzz_settings
@given(st.one_of(hostile_json, json_values.map(lambda v: json.dumps(v).encode())))
def test_fuzz_parse_chat_reply_raises_only_parse_errors(raw: bytes) -> None:
    with contextlib.suppress(ParseError):
        parse_chat_reply(raw)


@pytest.mark.fuzz
@fuzz_settings
@given(
    st.one_of(
        hostile_json.map(lambda b: b.decode("utf-8", "replace")),
        json_values.map(json.dumps),
        st.builds(lambda v: json.dumps({**_verdict(), "findings": v}), json_values),
    )
)
def test_fuzz_parse_verdict_raises_only_verdict_errors(content: str) -> None:
    try:
        verdict = parse_verdict(_reply(content), RUBRIC, DIGEST)
    except VerdictError:
        return
    assert judged(verdict, RUBRIC, "m").outcome == "judged"


# -- signed verdicts ------------------------------------------------------------------------------


def test_a_signed_verdict_verifies_and_any_change_breaks_it() -> None:
    key = Ed25519PrivateKey.generate()
    entry = judged(parse_verdict(_reply(json.dumps(_verdict())), RUBRIC, DIGEST), RUBRIC, "m").entry()
    entry["signature"] = sign_verdict(key, TASK.spec.ref, entry)
    assert verify_verdict(TASK.spec.ref, entry) == entry["signature"]["key_id"]
    with pytest.raises(SignatureError):
        verify_verdict("pendulum-lqr@1.0.0", entry)  # another task
    with pytest.raises(SignatureError):
        verify_verdict(TASK.spec.ref, {**entry, "faithful": False})
    with pytest.raises(SignatureError):
        verify_verdict(TASK.spec.ref, {**entry, "signature": {**entry["signature"], "value": "AAAA"}})
    with pytest.raises(SignatureError):
        verify_verdict(TASK.spec.ref, {**entry, "signature": {"algorithm": "rsa"}})


# -- the client against a scripted upstream -------------------------------------------------------


def _ask(base: str, *, key: str | None = None, sleeps: list[float] | None = None) -> Any:
    return ask(Transport(base, key, timeout=10), "m", INPUT, RUBRIC, sleep=([] if sleeps is None else sleeps).append)


def test_the_client_gives_the_judges_verdict() -> None:
    with serve_judge() as judge:
        exchange = _ask(judge.base)
    assert (exchange.result.outcome, exchange.result.faithful, exchange.requests) == ("judged", True, 1)
    assert exchange.input_tokens == 1000
    assert exchange.output_tokens == 100


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_no_endpoint_is_an_error_after_one_retry() -> None:
    sleeps: list[float] = []
    exchange = _ask(f"http://127.0.0.1:{_free_port()}/v1", sleeps=sleeps)
    assert (exchange.result.outcome, exchange.result.faithful, exchange.requests) == ("error", False, 2)
    assert sleeps == [2.0]
    assert "could not be reached" in exchange.result.rationale


@pytest.mark.parametrize(
    ("turns", "outcome", "requests", "said"),
    [
        ([Turn(status=500), Turn(status=503)], "error", 2, "HTTP 503"),
        ([Turn(status=500), Turn(raw=chat_body("{}"))], "unparsable", 2, "verdict"),  # a retry, then garbage
        ([Turn(status=401, error="bad key")], "error", 1, "bad key"),  # no retry for a 4xx
        ([Turn(status=429, error="the run's budget is exhausted")], "error", 1, "budget"),
        ([Turn(raw=chat_body(None, refusal="I won't judge this"))], "refusal", 1, "won't"),
        ([Turn(raw=b"<html>gateway timeout</html>", content_type="text/html")], "unparsable", 1, "Chat Completions"),
        ([Turn(raw=b"{" + b" " * MAX_REPLY_BYTES + b"}")], "error", 1, "over"),
        ([Turn(raw=chat_body("[" * 5000 + "]" * 5000))], "unparsable", 1, "nested"),
        ([Turn(raw=chat_body(json.dumps(_verdict(input_sha256="f" * 64))))], "wrong_input", 1, "not " + DIGEST),
        ([Turn(text="faithful, obviously")], "unparsable", 1, "not valid JSON"),
    ],
)
def test_every_failure_of_the_judge_is_unfaithful(turns: list[Turn], outcome: str, requests: int, said: str) -> None:
    with serve_upstream(script=turns) as up:
        exchange = _ask(up.openai_base)
    assert (exchange.result.outcome, exchange.result.faithful, exchange.requests) == (outcome, False, requests)
    assert said in exchange.result.rationale
    assert exchange.result.input_sha256 == DIGEST


def test_the_key_goes_as_a_bearer_token() -> None:
    with serve_upstream(script=[Turn(raw=chat_body(json.dumps(_verdict())))], api_key="sk-judge") as up:
        assert _ask(up.openai_base, key="sk-judge").result.faithful is True
        assert up.requests[0].headers["authorization"] == "Bearer sk-judge"
    with serve_upstream(script=[], api_key="sk-judge") as up:
        assert _ask(up.openai_base, key="wrong").result.outcome == "error"


@pytest.mark.parametrize(
    "url", ["ftp://host/v1", "http://user:pw@host/v1", "https://host/v1?key=1", "https://host:99999", "/v1"]
)
def test_a_base_url_the_judge_cannot_use_is_refused(url: str) -> None:
    with pytest.raises(EndpointError):
        Endpoint.parse(url)


def test_the_endpoint_origin_has_no_path_and_no_default_port() -> None:
    assert Endpoint.parse("https://api.openai.com/v1/").origin == "https://api.openai.com"
    assert Endpoint.parse("http://127.0.0.1:8080/v1").origin == "http://127.0.0.1:8080"


# -- through the judge's own gateway --------------------------------------------------------------


def _through_gateway(
    tmp: Path, base: str, limits: dict[str, int], key: str | None = None, name: str = "judge"
) -> tuple[Any, Any]:
    session = JudgeGateway(tmp, "run-gw-test", base, key, limits, name=name)
    try:
        sock = session.start()
        transport = Transport("http://localhost/judge", session.placeholder, unix_socket=sock, timeout=20)
        exchange = ask(transport, "m", INPUT, RUBRIC, sleep=lambda _s: None)
    finally:
        session.stop()
        session.close()
    return exchange, session


def test_through_the_gateway_the_judge_is_asked_with_the_real_key_and_recorded(tmp_path: Path) -> None:
    with serve_judge() as judge:
        exchange, session = _through_gateway(tmp_path, judge.base, budgets(len(INPUT.text), 2), key="sk-real")
    assert (exchange.result.outcome, exchange.result.faithful) == ("judged", True)
    assert exchange.request_ids == ("gw-1",)
    events = session.events()
    assert [e["kind"] for e in events if isinstance(e, dict)] == ["gateway_started", "llm_request", "gateway_stopped"]
    raw = session.events_path.read_bytes()
    assert b"sk-real" not in raw
    assert session.placeholder.encode() not in raw
    kind, data, _, _ = relayed(events[1], "reacher-jacobian@1.0.0")  # type: ignore[misc,arg-type]
    assert (kind, data["request_id"], data["gateway"]) == ("llm_request", REQUEST_PREFIX + "gw-1", "judge")


def test_the_gateway_holds_the_judges_own_budget(tmp_path: Path) -> None:
    with serve_upstream(script=[Turn(status=500), Turn(status=500)]) as up:
        limits = {"requests": 1, "input_tokens": 10**6, "output_tokens": 10**6}
        exchange, session = _through_gateway(tmp_path, up.openai_base, limits)
        assert len(up.requests) == 1  # the retry was refused by the gateway, not sent
    assert (exchange.result.outcome, exchange.requests) == ("error", 2)
    assert "budget" in exchange.result.rationale
    kinds = [e["kind"] for e in session.events() if isinstance(e, dict)]
    assert "budget_exhausted" in kinds


def test_a_gateway_that_cannot_start_says_why(tmp_path: Path) -> None:
    session = JudgeGateway(tmp_path, "run", "http://example.com/v1", None, budgets(10, 2))  # plain http, not loopback
    from ale.judge.gateway import GatewayError

    with pytest.raises(GatewayError, match="loopback"):
        session.start()
    session.close()


def test_failed_keeps_the_digest_and_is_unfaithful() -> None:
    result = failed("error", "x" * 10_000, model="m", input_sha256=DIGEST)
    assert (result.faithful, result.input_sha256, result.findings) == (False, DIGEST, ())
    assert len(result.rationale) < 4100


@pytest.mark.fuzz
@fuzz_settings
@given(st.dictionaries(st.sampled_from(["kind", "wall_time", "monotonic", "seq", "request_id", "x"]), json_values))
def test_fuzz_relayed_takes_any_gateway_line(line: dict[str, Any]) -> None:
    """A judge gateway line of any shape is relayed as a well-formed event or refused with a reason."""
    out = relayed(line, "reacher-jacobian@1.0.0")
    if isinstance(out, str):
        return
    kind, data, wall, mono = out
    assert isinstance(kind, str)
    assert data["task"] == "reacher-jacobian@1.0.0"
    assert data["gateway"] == "judge"
    assert 0 <= wall < 253_402_300_800
    assert mono == mono  # finite (NaN is refused)


def test_a_gateway_events_file_with_garbage_lines_reads_them_as_reasons(tmp_path: Path) -> None:
    session = JudgeGateway(tmp_path, "run", "http://127.0.0.1:9/v1", None, budgets(10, 2))
    session.events_path.write_bytes(b'{"kind":"gateway_started","wall_time":1,"monotonic":2}\nnot json\n[1]\n')
    first, second, third = session.events()
    assert isinstance(first, dict)
    assert isinstance(second, str)
    assert "not valid JSON" in second
    assert third == "not a JSON object"


def test_each_tasks_judge_gateway_reads_back_only_its_own_log(tmp_path: Path) -> None:
    """Regression: the second task's gateway appended to the first's log, so its relay repeated the
    first task's requests (and the grammar refused the repeated request ids)."""
    with serve_judge() as judge:
        first = _through_gateway(tmp_path, judge.base, budgets(len(INPUT.text), 2), name="judge-a")[1]
        second = _through_gateway(tmp_path, judge.base, budgets(len(INPUT.text), 2), name="judge-b")[1]
        again = _through_gateway(tmp_path, judge.base, budgets(len(INPUT.text), 2), name="judge-b")[1]
    for session in (first, second, again):
        kinds = [e["kind"] for e in session.events() if isinstance(e, dict)]
        assert kinds == ["gateway_started", "llm_request", "gateway_stopped"]


def test_a_key_that_is_no_header_value_is_an_error_not_a_crash() -> None:
    with serve_judge() as judge:
        exchange = _ask(judge.base, key="sk-bad\nInjected: header")
    assert (exchange.result.outcome, exchange.requests) == ("error", 1)
    assert "not a valid header value" in exchange.result.rationale
    assert "sk-bad" not in exchange.result.rationale


def test_unreadable_judge_gateway_line_is_an_unreadable_gateway_event_not_a_refused_event(tmp_path: Path) -> None:
    """A line of the judge gateway's log that cannot be read is recorded as the agent gateway's
    unreadable lines are (``unreadable_gateway_event``, here with ``"gateway": "judge"``), not as a
    ``refused_event`` (which says the grammar refused an event, and nothing was refused)."""
    from ale.judge.phase import _relay
    from ale.runner.recorder import LineQueue, Recorder
    from ale.schemas import validator

    session = JudgeGateway(tmp_path, "run", "http://127.0.0.1:9/v1", None, budgets(10, 2))
    session.events_path.write_bytes(
        b'{"kind":"gateway_started","wall_time":1,"monotonic":2,"seq":1}\nnot json\n[1]\n{"kind":7}\n'
    )
    queue = LineQueue()
    rec = Recorder(tmp_path / "unused", queue)
    rec.emit("trusted_harness", "run_started", {"nonce": None, "run_id": "r", "tasks": [CONTEXT.ref]})
    _relay(session, rec, CONTEXT.ref)
    events = [json.loads(line) for line in queue.pending]
    kinds = [e["kind"] for e in events]
    assert kinds == ["run_started", "gateway_started", *["unreadable_gateway_event"] * 3]
    assert "refused_event" not in kinds
    unreadable = [e["data"] for e in events if e["kind"] == "unreadable_gateway_event"]
    assert [set(d) for d in unreadable] == [{"task", "gateway", "reason"}] * 3
    assert {d["gateway"] for d in unreadable} == {"judge"}
    assert {d["task"] for d in unreadable} == {CONTEXT.ref}
    assert "not valid JSON" in unreadable[0]["reason"]
    assert [d["reason"] for d in unreadable[1:]] == ["not a JSON object", "no kind"]
    schema = validator("trajectory_event")
    for event in events[2:]:  # the unreadable lines' events (the others are stand-ins, not complete data)
        schema.validate(event)
    session.close()
