"""The gateway process over real HTTP: the official SDKs as clients (through a TCP relay, as in the
sandbox), the local test upstream behind it, and everything it records read back from its events."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import signal
import socket
import stat
import struct
import termios
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import trio
import trio.testing
from gateway_process import (
    PLACEHOLDER,
    Gateway,
    GatewayFailed,
    anthropic_upstream,
    openai_upstream,
    run_gateway,
)
from llm_upstream import ToolCall, Turn, Upstream, Usage, serve_upstream

from ale.gateway.transport import READY_RUN, Hangups, RawStream

KEY = f"sk-ale-real-{uuid.uuid4().hex}"
OPENAI_AUTH = {"authorization": f"Bearer {PLACEHOLDER}"}
ANTHROPIC_AUTH = {"x-api-key": PLACEHOLDER, "anthropic-version": "2023-06-01"}
USER = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def up() -> Iterator[Upstream]:
    with serve_upstream(api_key=KEY) as upstream:
        yield upstream


@pytest.fixture(scope="module")
def gw(up: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    folder = tmp_path_factory.mktemp("gw")
    with run_gateway(folder, [openai_upstream(up, key=KEY), anthropic_upstream(up, key=KEY)]) as gateway:
        yield gateway
    assert gateway.returncode == 0
    assert KEY not in gateway.stdout + gateway.stderr
    assert KEY not in gateway.events_path.read_text()


@pytest.fixture(scope="module")
def port(gw: Gateway) -> Iterator[int]:
    with gw.relay() as relay_port:
        yield relay_port


def oai(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/openai", api_key=PLACEHOLDER, max_retries=0)


def ant(port: int) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}/anthropic", api_key=PLACEHOLDER, max_retries=0)


def recorded_since(gw: Gateway, mark: int, count: int) -> list[dict[str, Any]]:
    return gw.wait_requests(mark + count)[mark : mark + count]


# -- the SDKs, plain and streaming -----------------------------------------------------------------


def test_openai_sdk_chat_plain_and_stream_record_usage_with_cached_tokens(up: Upstream, gw: Gateway, port: int) -> None:
    mark = gw.settled()
    client = oai(port)
    up.push(Turn(text="plain answer", usage=Usage(120, 7, 100)), Turn(text="streamed answer", usage=Usage(130, 9, 64)))
    reply = client.chat.completions.create(model="gpt-test", messages=USER)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "plain answer"
    assert reply.usage is not None
    assert reply.usage.prompt_tokens_details is not None
    assert reply.usage.prompt_tokens_details.cached_tokens == 100
    chunks = list(
        client.chat.completions.create(
            model="gpt-test",
            messages=USER,
            stream=True,
            stream_options={"include_usage": True},  # type: ignore[arg-type]
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "streamed answer"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 9
    plain, stream = recorded_since(gw, mark, 2)
    assert plain["usage"] == {"input_tokens": 120, "output_tokens": 7, "cached_input_tokens": 100}
    assert stream["usage"] == {"input_tokens": 130, "output_tokens": 9, "cached_input_tokens": 64}
    assert (plain["stream"], stream["stream"]) == (False, True)
    for event in (plain, stream):
        assert event["decision"] == "allowed"
        assert event["status"] == 200
        assert event["upstream"] == "openai"
        assert event["path"] == "/v1/chat/completions"
        assert event["model"] == "gpt-test"
        assert event["usage_source"] == "upstream"
        assert event["bytes_out"] > 0
        assert event["ttfb_ms"] is not None
        assert event["duration_ms"] >= event["ttfb_ms"]
    assert plain["response"]["text"] == "plain answer"
    assert stream["response"]["text"] == "streamed answer"


def test_chat_stream_without_include_usage_still_records_usage_and_the_agent_gets_no_extra_chunk(
    up: Upstream, gw: Gateway, port: int
) -> None:
    mark = gw.settled()
    up.push(Turn(text="counted anyway", usage=Usage(50, 4, 0)))
    chunks = list(oai(port).chat.completions.create(model="m", messages=USER, stream=True))  # type: ignore[arg-type]
    assert all(c.choices for c in chunks), "the usage chunk the gateway asked for reached the agent"
    assert all(c.usage is None for c in chunks)
    (event,) = recorded_since(gw, mark, 1)
    assert event["usage"]["input_tokens"] == 50
    assert event["usage"]["output_tokens"] == 4
    assert up.requests[-1].json["stream_options"] == {"include_usage": True}


def test_openai_sdk_responses_plain_and_stream_record_usage(up: Upstream, gw: Gateway, port: int) -> None:
    mark = gw.settled()
    client = oai(port)
    up.push(Turn(text="responses plain", usage=Usage(80, 5, 40)), Turn(text="responses stream", usage=Usage(90, 6, 0)))
    assert client.responses.create(model="gpt-test", input="hi").output_text == "responses plain"
    with client.responses.stream(model="gpt-test", input="hi") as stream:
        for _ in stream:
            pass
        assert stream.get_final_response().output_text == "responses stream"
    plain, streamed = recorded_since(gw, mark, 2)
    assert plain["usage"] == {"input_tokens": 80, "output_tokens": 5, "cached_input_tokens": 40}
    assert streamed["usage"] == {"input_tokens": 90, "output_tokens": 6, "cached_input_tokens": 0}
    assert plain["path"] == streamed["path"] == "/v1/responses"
    assert plain["messages"] == [{"role": "user", "content": "hi"}]
    assert streamed["response"]["text"] == "responses stream"
    assert streamed["response"]["stop"] == "completed"


def test_openai_sdk_lists_and_retrieves_models(gw: Gateway, port: int) -> None:
    mark = gw.settled()
    client = oai(port)
    assert [m.id for m in client.models.list()] == ["test-model", "test-model-mini"]
    assert client.models.retrieve("test-model").id == "test-model"
    listed, retrieved = recorded_since(gw, mark, 2)
    assert (listed["path"], retrieved["path"]) == ("/v1/models", "/v1/models/test-model")
    assert retrieved["model"] == "test-model"
    assert listed["usage"] == {"input_tokens": 0, "output_tokens": 0, "cached_input_tokens": 0}


def test_anthropic_sdk_messages_plain_and_stream_record_usage_with_cache_reads(
    up: Upstream, gw: Gateway, port: int
) -> None:
    mark = gw.settled()
    client = ant(port)
    up.push(Turn(text="claude plain", usage=Usage(300, 11, 200)), Turn(text="claude stream", usage=Usage(310, 12, 0)))
    message = client.messages.create(model="claude-test", max_tokens=100, messages=USER)  # type: ignore[arg-type]
    assert message.content[0].text == "claude plain"  # type: ignore[union-attr]
    with client.messages.stream(model="claude-test", max_tokens=100, messages=USER) as stream:  # type: ignore[arg-type]
        assert "".join(stream.text_stream) == "claude stream"
    plain, streamed = recorded_since(gw, mark, 2)
    # the wire says input_tokens 100 and cache_read_input_tokens 200: the gateway records every prompt token
    assert plain["usage"] == {"input_tokens": 300, "output_tokens": 11, "cached_input_tokens": 200}
    assert streamed["usage"] == {"input_tokens": 310, "output_tokens": 12, "cached_input_tokens": 0}
    assert plain["upstream"] == streamed["upstream"] == "anthropic"
    assert plain["path"] == "/v1/messages"
    assert streamed["response"] == {"text": "claude stream", "tool_calls": [], "stop": "end_turn"}


def test_anthropic_sdk_count_tokens_and_models(gw: Gateway, port: int) -> None:
    mark = gw.settled()
    client = ant(port)
    assert client.messages.count_tokens(model="claude-test", messages=USER).input_tokens > 0  # type: ignore[arg-type]
    assert [m.id for m in client.models.list()] == ["test-model", "test-model-mini"]
    assert client.models.retrieve("test-model").id == "test-model"
    counted, listed, retrieved = recorded_since(gw, mark, 3)
    assert counted["path"] == "/v1/messages/count_tokens"
    assert listed["path"].startswith("/v1/models")
    assert retrieved["path"] == "/v1/models/test-model"
    assert counted["usage"]["input_tokens"] == 0  # counting tokens uses none


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_are_recorded_for_every_api(up: Upstream, gw: Gateway, port: int, stream: bool) -> None:
    calls = [ToolCall("write_file", {"path": "policy.py", "text": "x = 1"}, id="call_w"), ToolCall("finish", {})]
    mark = gw.settled()
    up.push(*(Turn(text="", tool_calls=calls) for _ in range(3)))
    tools = [{"type": "function", "function": {"name": "write_file", "parameters": {"type": "object"}}}]
    if stream:
        list(oai(port).chat.completions.create(model="m", messages=USER, tools=tools, stream=True))  # type: ignore[arg-type]
        with oai(port).responses.stream(model="m", input="go") as events:
            for _ in events:
                pass
        with ant(port).messages.stream(model="m", max_tokens=100, messages=USER) as events:  # type: ignore[arg-type]
            for _ in events:
                pass
    else:
        oai(port).chat.completions.create(model="m", messages=USER, tools=tools)  # type: ignore[arg-type]
        oai(port).responses.create(model="m", input="go")
        ant(port).messages.create(model="m", max_tokens=100, messages=USER)  # type: ignore[arg-type]
    chat, responses, messages = recorded_since(gw, mark, 3)
    for event in (chat, responses, messages):
        recorded = event["response"]["tool_calls"]
        assert [c["name"] for c in recorded] == ["write_file", "finish"], event
        assert json.loads(recorded[0]["arguments"]) == {"path": "policy.py", "text": "x = 1"}
        assert recorded[0]["id"] == "call_w"
    assert chat["response"]["stop"] == "tool_calls"
    assert messages["response"]["stop"] == "tool_use"


# -- keys and credentials ------------------------------------------------------------------------------


def test_the_real_key_reaches_the_upstream_and_the_placeholder_never_does(up: Upstream, gw: Gateway) -> None:
    start = len(up.requests)
    client = gw.client()
    client.post("/openai/chat/completions", json={"model": "m", "messages": USER}, headers=OPENAI_AUTH)
    client.post(
        "/anthropic/v1/messages", json={"model": "m", "max_tokens": 5, "messages": USER}, headers=ANTHROPIC_AUTH
    )
    openai_request, anthropic_request = up.requests[start:]
    assert openai_request.headers["authorization"] == f"Bearer {KEY}"
    assert "x-api-key" not in openai_request.headers
    assert anthropic_request.headers["x-api-key"] == KEY
    assert "authorization" not in anthropic_request.headers
    for request in (openai_request, anthropic_request):
        assert PLACEHOLDER not in json.dumps(request.headers)


def test_credential_and_unknown_headers_are_not_forwarded(up: Upstream, gw: Gateway) -> None:
    start = len(up.requests)
    headers = {
        **OPENAI_AUTH, "x-api-key": PLACEHOLDER, "cookie": "session=1", "openai-organization": "org-x",
        "openai-project": "proj", "x-forwarded-for": "10.0.0.1", "proxy-authorization": "Basic eA==",
        "x-stainless-lang": "python", "user-agent": "agent/1.0", "api-key": "azure",
    }  # fmt: skip
    gw.client().post("/openai/chat/completions", json={"model": "m", "messages": USER}, headers=headers)
    sent = up.requests[start].headers
    for name in (
        "cookie",
        "openai-organization",
        "openai-project",
        "x-forwarded-for",
        "proxy-authorization",
        "api-key",
    ):
        assert name not in sent, name
    assert sent["x-stainless-lang"] == "python"
    assert sent["user-agent"] == "agent/1.0"
    assert sent["accept-encoding"] == "identity"
    assert sent["host"] == up.url.removeprefix("http://")


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer wrong"}, {"x-api-key": "wrong"}, {"authorization": PLACEHOLDER}],
    ids=["none", "wrong-bearer", "wrong-x-api-key", "no-bearer-scheme"],
)
def test_a_wrong_or_missing_placeholder_is_401_in_the_api_format_and_recorded(
    up: Upstream, gw: Gateway, headers: dict[str, str]
) -> None:
    mark = gw.settled()
    start = len(up.requests)
    client = gw.client()
    reply = client.post("/openai/chat/completions", json={"model": "m", "messages": USER}, headers=headers)
    assert reply.status_code == 401
    assert reply.json()["error"]["code"] == "bad_credentials"
    reply = client.post("/anthropic/v1/messages", json={"model": "m", "messages": USER}, headers=headers)
    assert reply.status_code == 401
    assert reply.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": reply.json()["error"]["message"]},
    }
    assert len(up.requests) == start
    for event in recorded_since(gw, mark, 2):
        assert (event["status"], event["decision"], event["reason"]) == (401, "denied", "bad_credentials")
        assert event["messages"] == []


def test_an_upstream_401_is_not_passed_on_and_no_key_appears(tmp_path: Path) -> None:
    """OpenAI's 401 quotes part of the key it refused: the agent gets the gateway's own 502."""
    script = [Turn(status=401, error=f"Incorrect API key provided: {KEY}")]
    with serve_upstream(script=script) as up, run_gateway(tmp_path, [openai_upstream(up, key=KEY)]) as gw:
        reply = gw.client().post("/openai/chat/completions", json={"model": "m", "messages": USER}, headers=OPENAI_AUTH)
        assert reply.status_code == 502
        assert reply.json()["error"]["code"] == "upstream_auth_failed"
        assert KEY not in reply.text
        (event,) = gw.wait_requests(1)
    assert (event["status"], event["decision"], event["reason"]) == (502, "allowed", "upstream_auth_failed")
    assert KEY not in gw.events_path.read_text() + gw.stdout + gw.stderr


def test_a_key_the_agent_sends_back_in_its_messages_is_redacted_from_the_events(tmp_path: Path) -> None:
    with serve_upstream() as up, run_gateway(tmp_path, [openai_upstream(up, key=KEY)]) as gw:
        messages = [{"role": "user", "content": f"my key is {KEY} and {KEY[:-1]}" + "x" * 70000 + KEY}]
        gw.client().post("/openai/chat/completions", json={"model": "m", "messages": messages}, headers=OPENAI_AUTH)
        gw.wait_requests(1)
    text = gw.events_path.read_text()
    assert KEY not in text
    assert "[redacted]" in text


# -- routing and the allow-list -----------------------------------------------------------------------


def test_an_unknown_upstream_is_404_and_recorded(gw: Gateway) -> None:
    mark = gw.settled()
    reply = gw.client().post("/mistral/v1/chat/completions", json={}, headers=OPENAI_AUTH)
    assert reply.status_code == 404
    assert reply.json()["error"]["code"] == "unknown_upstream"
    assert reply.headers["x-should-retry"] == "false"
    (event,) = recorded_since(gw, mark, 1)
    assert (event["upstream"], event["host"], event["path"]) == (None, None, "/mistral/v1/chat/completions")
    assert (event["status"], event["decision"], event["reason"]) == (404, "denied", "unknown_upstream")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/openai/files"),
        ("POST", "/openai/files"),
        ("POST", "/openai/batches"),
        ("GET", "/openai/chat/completions"),
        ("POST", "/openai/models"),
        ("POST", "/openai/../v1/files"),
        ("GET", "/openai/models/../files"),
        ("GET", "/openai/models/%2e%2e"),
        ("POST", "/openai/chat/completions/../../files"),
        ("POST", "/openai/chat/completions?x=<script>"),
        ("POST", "/anthropic/v1/complete"),
        ("POST", "/anthropic/chat/completions"),
        ("DELETE", "/anthropic/v1/models/x"),
        ("POST", "/anthropic/v1/messages/batches"),
    ],
)
def test_paths_outside_the_allow_list_are_403_in_the_api_format(
    up: Upstream, gw: Gateway, method: str, path: str
) -> None:
    mark = gw.settled()
    start = len(up.requests)
    headers = ANTHROPIC_AUTH if path.startswith("/anthropic") else OPENAI_AUTH
    body = json.dumps({"model": "m"}).encode()
    head = f"{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\nconnection: close\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    answer = _raw(gw, head.encode() + b"\r\n" + body)  # as sent: no client normalises the path
    assert answer.startswith(b"HTTP/1.1 403 "), answer[:100]
    body = json.loads(answer.partition(b"\r\n\r\n")[2])
    if path.startswith("/anthropic"):
        assert body["type"] == "error"
        assert body["error"]["type"] == "permission_error"
    else:
        assert body["error"]["code"] == "path_not_allowed"
    assert len(up.requests) == start
    (event,) = recorded_since(gw, mark, 1)
    assert (event["status"], event["decision"], event["reason"]) == (403, "denied", "path_not_allowed")


# -- what is recorded --------------------------------------------------------------------------------

SECRET_REASONING = "SECRET-REASONING-7d1e"


@pytest.mark.parametrize("stream", [False, True])
def test_hidden_reasoning_is_never_recorded(up: Upstream, gw: Gateway, port: int, stream: bool) -> None:
    mark = gw.settled()
    up.push(*(Turn(text="visible", reasoning=f"{SECRET_REASONING} response") for _ in range(3)))
    fresh = [{"role": "user", "content": f"a conversation of its own {uuid.uuid4().hex}"}]
    chat_history = [
        *fresh,
        {"role": "assistant", "content": "earlier", "reasoning_content": f"{SECRET_REASONING} echoed"},
        {"role": "user", "content": "go on"},
    ]
    responses_input = [
        *fresh,
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": f"{SECRET_REASONING} item"}]},
        {"role": "user", "content": "go on"},
    ]
    anthropic_history = [
        *fresh,
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": f"{SECRET_REASONING} block", "signature": "c2ln"},
            {"type": "redacted_thinking", "data": f"{SECRET_REASONING} redacted"},
            {"type": "text", "text": "earlier"},
        ]},
        {"role": "user", "content": "go on"},
    ]  # fmt: skip
    client = gw.client()
    for path, body, headers in (
        ("/openai/chat/completions", {"model": "m", "messages": chat_history}, OPENAI_AUTH),
        ("/openai/responses", {"model": "m", "input": responses_input}, OPENAI_AUTH),
        ("/anthropic/v1/messages", {"model": "m", "max_tokens": 99, "messages": anthropic_history}, ANTHROPIC_AUTH),
    ):
        reply = client.post(path, json={**body, "stream": stream}, headers=headers)
        assert SECRET_REASONING[:12] in reply.text  # the agent gets it (streams cut it in pieces)
    events = recorded_since(gw, mark, 3)
    assert "SECRET" not in json.dumps(events)
    assert "7d1e" not in json.dumps(events)
    for event in events:
        assert event["response"]["text"] == "visible"
    chat, responses, messages = events
    assert chat["messages"][1] == {"role": "assistant", "content": "earlier"}
    assert messages["messages"][-2]["content"] == [{"type": "text", "text": "earlier"}]
    assert all(item.get("type") != "reasoning" for item in responses["messages"])


def test_messages_are_recorded_once_per_conversation_not_quadratically(up: Upstream, gw: Gateway) -> None:
    mark = gw.settled()
    client = gw.client()
    history: list[dict[str, Any]] = [{"role": "system", "content": f"system prompt {uuid.uuid4().hex}"}]
    for turn in range(12):
        history.append({"role": "user", "content": f"question {turn}"})
        reply = client.post("/openai/chat/completions", json={"model": "m", "messages": history}, headers=OPENAI_AUTH)
        history.append(reply.json()["choices"][0]["message"])
    events = recorded_since(gw, mark, 12)
    recorded = [m for e in events for m in e["messages"]]
    assert len(recorded) == len(history) - 1  # each message once (the last answer has not been sent back yet)
    assert [m["content"] for m in recorded] == [m["content"] for m in history[:-1]]
    assert events[0]["continues"] is None
    assert events[0]["messages_from"] == 0
    for earlier, later in itertools.pairwise(events):
        assert later["continues"] == earlier["request_id"]
        assert later["messages_from"] == earlier["messages_from"] + len(earlier["messages"])


def test_a_rewritten_history_records_from_the_first_changed_message(gw: Gateway) -> None:
    mark = gw.settled()
    client = gw.client()
    base = [{"role": "system", "content": f"rewrite {uuid.uuid4().hex}"}, {"role": "user", "content": "a"}]
    longer = [*base, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    compacted = [base[0], {"role": "user", "content": "summary of a, b, c"}]
    for messages in (longer, compacted):
        client.post("/openai/chat/completions", json={"model": "m", "messages": messages}, headers=OPENAI_AUTH)
    first, second = recorded_since(gw, mark, 2)
    assert len(first["messages"]) == 4
    assert second["messages"] == [{"role": "user", "content": "summary of a, b, c"}]
    assert (second["messages_from"], second["continues"]) == (1, first["request_id"])


def test_a_huge_message_is_cut_and_the_line_stays_within_256_kib(gw: Gateway) -> None:
    mark = gw.settled()
    messages = [{"role": "user", "content": f"{i} " + "y" * 100_000} for i in range(30)]
    reply = gw.client().post("/openai/chat/completions", json={"model": "m", "messages": messages}, headers=OPENAI_AUTH)
    assert reply.status_code == 200
    (event,) = recorded_since(gw, mark, 1)
    lines = gw.events_path.read_bytes().splitlines()
    assert max(len(line) for line in lines) <= 256 * 1024
    assert event["messages"][0]["content"].endswith("bytes cut]")
    assert len(event["messages"]) + event.get("messages_cut", 0) == 30


# -- streaming is passed through as it arrives -----------------------------------------------------------


def test_stream_events_reach_the_agent_before_the_upstream_sends_the_next(up: Upstream, gw: Gateway) -> None:
    """Each delta carries the upstream's send time: the agent must hold the first before the last is sent."""
    up.push(Turn(stamp=5, chunk_delay=0.2))
    received: list[tuple[int, int]] = []
    body = {"model": "m", "messages": USER, "stream": True}
    with gw.client().stream("POST", "/openai/chat/completions", json=body, headers=OPENAI_AUTH) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                content = json.loads(line[6:])["choices"][0]["delta"].get("content", "") if line else ""
                if content.isdigit():
                    received.append((int(content), time.perf_counter_ns()))
    assert len(received) == 5
    sent_last = received[-1][0]
    assert received[0][1] < sent_last, "the first chunk was delivered only after the last one was sent"
    for sent, arrived in received:
        assert arrived >= sent


def test_a_huge_response_is_passed_through_whole(up: Upstream, gw: Gateway) -> None:
    mark = gw.settled()
    up.push(Turn(text="start", pad=6_000_000), Turn(text="start", pad=3_000_000, chunk_chars=65536))
    client = gw.client()
    plain = client.post("/openai/chat/completions", json={"model": "m", "messages": USER}, headers=OPENAI_AUTH)
    assert len(plain.json()["choices"][0]["message"]["content"]) == 6_000_005
    body = {"model": "m", "messages": USER, "stream": True}
    streamed = client.post("/openai/chat/completions", json=body, headers=OPENAI_AUTH)
    deltas = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert sum(len(d["choices"][0]["delta"].get("content") or "") for d in deltas if d["choices"]) == 3_000_005
    first, second = recorded_since(gw, mark, 2)
    assert first["usage"]["output_tokens"] == -(-6_000_005 // 4)
    assert second["usage"]["output_tokens"] == -(-3_000_005 // 4)
    assert first["bytes_out"] > 6_000_000


# -- budgets -------------------------------------------------------------------------------------------


def _budgets(**limits: int | None) -> dict[str, Any]:
    return {"budgets": {"requests": None, "input_tokens": None, "output_tokens": None, **limits}}


def test_the_requests_budget_gives_a_429_that_says_which_budget_and_is_recorded(tmp_path: Path) -> None:
    with serve_upstream() as up, run_gateway(tmp_path, [openai_upstream(up)], **_budgets(requests=2)) as gw:
        with gw.relay() as relay_port:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{relay_port}/openai", api_key=PLACEHOLDER)  # retries on
            for _ in range(2):
                client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
            with pytest.raises(openai.RateLimitError) as refused:
                client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
            assert "requests budget is exhausted (2 used of 2)" in str(refused.value)
            assert gw.client().get("/openai/models", headers=OPENAI_AUTH).status_code == 200  # listing is free
            summary = gw.control("GET", "/summary").json()
        assert len(up.requests) == 3
    events = gw.events()
    denied = [e for e in events if e["kind"] == "llm_request" and e["decision"] == "denied"]
    assert len(denied) == 1, "the SDK retried a 429 that says x-should-retry: false"
    assert (denied[0]["status"], denied[0]["reason"]) == (429, "budget_exhausted:requests")
    exhausted = [e for e in events if e["kind"] == "budget_exhausted"]
    assert [(e["budget"], e["used"], e["limit"]) for e in exhausted] == [("requests", 2, 2)]
    assert summary["requests"] == {"total": 4, "allowed": 3, "denied": 1}
    assert summary["budgets"]["requests"] == {"limit": 2, "used": 2}


def test_the_input_budget_refuses_the_request_after_the_one_that_crossed_it(tmp_path: Path) -> None:
    script = [Turn(text="a", usage=Usage(60, 1)), Turn(text="b", usage=Usage(60, 1))]
    with (
        serve_upstream(script=script) as up,
        run_gateway(tmp_path, [anthropic_upstream(up)], **_budgets(input_tokens=100)) as gw,
    ):
        client = gw.client()
        body = {"model": "m", "max_tokens": 10, "messages": USER}
        assert client.post("/anthropic/v1/messages", json=body, headers=ANTHROPIC_AUTH).status_code == 200
        assert client.post("/anthropic/v1/messages", json=body, headers=ANTHROPIC_AUTH).status_code == 200
        refused = client.post("/anthropic/v1/messages", json=body, headers=ANTHROPIC_AUTH)
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert "input_tokens budget is exhausted (120 used of 100)" in refused.json()["error"]["message"]
        gw.wait_requests(3)
    (exhausted,) = gw.events("budget_exhausted")
    assert (exhausted["budget"], exhausted["used"], exhausted["limit"]) == ("input_tokens", 120, 100)
    assert gw.requests()[-1]["reason"] == "budget_exhausted:input_tokens"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/openai/chat/completions", {"messages": USER, "max_tokens": 500}, "max_tokens"),
        ("/openai/chat/completions", {"messages": USER, "max_completion_tokens": 500}, "max_completion_tokens"),
        ("/openai/chat/completions", {"messages": USER}, "max_completion_tokens"),
        ("/openai/responses", {"input": "hi", "max_output_tokens": 500}, "max_output_tokens"),
        ("/openai/responses", {"input": "hi"}, "max_output_tokens"),
        ("/anthropic/v1/messages", {"messages": USER, "max_tokens": 500}, "max_tokens"),
    ],
)
def test_the_output_budget_clamps_the_output_limit_to_what_remains(
    tmp_path: Path, path: str, body: dict[str, Any], field: str
) -> None:
    script = [Turn(text="z" * 120), Turn(text="z" * 400)]  # 30 tokens, then 100 of which only 20 remain
    upstreams = lambda up: [openai_upstream(up), anthropic_upstream(up)]  # noqa: E731
    with serve_upstream(script=script) as up, run_gateway(tmp_path, upstreams(up), **_budgets(output_tokens=50)) as gw:
        headers = ANTHROPIC_AUTH if path.startswith("/anthropic") else OPENAI_AUTH
        client = gw.client()
        assert client.post(path, json={"model": "m", **body}, headers=headers).status_code == 200
        second = client.post(path, json={"model": "m", **body}, headers=headers)
        assert second.status_code == 200
        assert up.requests[1].json[field] == 20
        third = client.post(path, json={"model": "m", **body}, headers=headers)
        assert third.status_code == 429
        gw.wait_requests(3)
    assert gw.control_socket  # the summary is over: the events tell
    first, clamped, refused = gw.requests()
    assert (first["usage"]["output_tokens"], clamped["usage"]["output_tokens"]) == (30, 20)
    assert refused["reason"] == "budget_exhausted:output_tokens"
    assert [(e["budget"], e["used"]) for e in gw.events("budget_exhausted")] == [("output_tokens", 50)]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_an_output_budget_exhausted_mid_stream_cuts_the_stream_with_an_error_event(tmp_path: Path, api: str) -> None:
    """An upstream that ignores the clamped limit: the gateway cuts the stream when its live estimate passes."""
    turn = Turn(text="w" * 4000, chunk_chars=40, chunk_delay=0.002, ignore_max_tokens=True, usage=Usage(10, 1000))
    with (
        serve_upstream(script=[turn]) as up,
        run_gateway(tmp_path, [openai_upstream(up), anthropic_upstream(up)], **_budgets(output_tokens=100)) as gw,
    ):
        with gw.relay() as relay_port:
            if api == "openai":
                stream = oai(relay_port).chat.completions.create(model="m", messages=USER, stream=True)  # type: ignore[arg-type]
                with pytest.raises(openai.APIError) as cut:
                    "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            else:
                opened = ant(relay_port).messages.stream(model="m", max_tokens=4000, messages=USER)  # type: ignore[arg-type]
                with pytest.raises(anthropic.APIStatusError) as cut, opened as events:
                    "".join(events.text_stream)
        assert "output_tokens budget is exhausted" in str(cut.value)
        assert up.wait_outcome(0) == "client_gone", "the upstream request went on after the cut"
        (event,) = gw.wait_requests(1)
    assert (event["decision"], event["status"]) == ("allowed", 200)
    assert event["reason"] == "budget_exhausted:output_tokens"
    assert event["usage_source"] == "estimate"
    assert 100 < event["usage"]["output_tokens"] < 1000
    assert len(event["response"]["text"]) < 4000
    assert [e["budget"] for e in gw.events("budget_exhausted")] == ["output_tokens"]


# -- the policy ----------------------------------------------------------------------------------------


def test_a_closed_policy_denies_new_requests_with_403_closed_for_this_phase(tmp_path: Path) -> None:
    with serve_upstream() as up, run_gateway(tmp_path, [openai_upstream(up), anthropic_upstream(up)]) as gw:
        client = gw.client()
        assert (
            client.post(
                "/openai/chat/completions", json={"model": "m", "messages": USER}, headers=OPENAI_AUTH
            ).status_code
            == 200
        )
        changed = gw.control("POST", "/policy", {"policy": "closed", "phase": "official_evaluation"})
        assert changed.json() == {"policy": "closed", "phase": "official_evaluation"}
        refused = client.post("/openai/chat/completions", json={"model": "m", "messages": USER}, headers=OPENAI_AUTH)
        assert refused.status_code == 403
        assert refused.json()["error"]["message"] == "the network is closed for this phase"
        refused = client.post("/anthropic/v1/messages", json={"model": "m", "messages": USER}, headers=ANTHROPIC_AUTH)
        assert refused.json()["error"]["type"] == "permission_error"
        assert gw.control("POST", "/policy", {"policy": "open"}).json() == {"policy": "open", "phase": None}
        assert client.get("/openai/models", headers=OPENAI_AUTH).status_code == 200
        gw.wait_requests(4)
        assert len(up.requests) == 2
    assert [(e["policy"], e["phase"]) for e in gw.events("policy_changed")] == [
        ("closed", "official_evaluation"),
        ("open", None),
    ]
    denied = [e for e in gw.requests() if e["decision"] == "denied"]
    assert [(e["status"], e["reason"]) for e in denied] == [(403, "policy_closed")] * 2


def test_closing_the_policy_cuts_in_flight_streams(tmp_path: Path) -> None:
    turns = [Turn(text="s" * 2000, chunk_chars=10, chunk_delay=0.01) for _ in range(2)]
    with serve_upstream(script=turns) as up, run_gateway(tmp_path, [openai_upstream(up), anthropic_upstream(up)]) as gw:
        results: dict[str, str] = {}

        def consume(name: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> None:
            with gw.client().stream("POST", path, json=body, headers=headers) as reply:
                results[name] = "".join(reply.iter_text())

        chat = {"model": "m", "messages": USER, "stream": True}
        messages = {**chat, "max_tokens": 9999}
        threads = [
            threading.Thread(target=consume, args=("openai", "/openai/chat/completions", chat, OPENAI_AUTH)),
            threading.Thread(target=consume, args=("anthropic", "/anthropic/v1/messages", messages, ANTHROPIC_AUTH)),
        ]
        for thread in threads:
            thread.start()
        while len(up.requests) < 2:
            time.sleep(0.01)
        time.sleep(0.1)
        gw.control("POST", "/policy", {"policy": "closed"})
        for thread in threads:
            thread.join(10)
        assert up.wait_outcome(0) == up.wait_outcome(1) == "client_gone"
        gw.wait_requests(2)
    assert "closed for this phase" in results["openai"]
    assert 'event: error\ndata: {"type":"error","error":{"type":"permission_error"' in results["anthropic"]
    for event in gw.requests():
        assert (event["decision"], event["status"], event["reason"]) == ("allowed", 200, "policy_closed")
        assert 0 < len(event["response"]["text"]) < 2000


def _raw_request(gw: Gateway, path: str, body: bytes, length: int | None = None) -> socket.socket:
    """A request sent on a socket of its own (``length``: the content-length claimed), left unread."""
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(gw.agent_socket)
    head = (
        f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nauthorization: Bearer {PLACEHOLDER}\r\n"
        f"content-length: {len(body) if length is None else length}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def _unread(sock: socket.socket) -> int:
    """Bytes sent on ``sock`` that its peer has not read yet (SIOCOUTQ)."""
    return int(struct.unpack("i", fcntl.ioctl(sock, termios.TIOCOUTQ, b"\0" * 4))[0])


def test_a_request_cut_by_closing_the_policy_is_recorded_before_the_close_returns(tmp_path: Path) -> None:
    """The close answers once every exchange it cut is in the events file, whatever each was doing:
    a stream whose agent stopped reading (the gateway waits to send), a request waiting for the
    upstream's answer, a request whose body is still coming. The harness reads the file right after."""
    script = [Turn(text="a" * 4_000_000, chunk_chars=65536), Turn(text="late", delay=5)]
    with serve_upstream(script=script) as up, run_gateway(tmp_path, [openai_upstream(up)]) as gw:
        stream = json.dumps({"model": "m", "messages": USER, "stream": True}).encode()
        unread = _raw_request(gw, "/openai/chat/completions", stream)
        while len(up.requests) < 1:
            time.sleep(0.01)
        waiting = _raw_request(gw, "/openai/chat/completions", json.dumps({"model": "m", "messages": USER}).encode())
        while len(up.requests) < 2:
            time.sleep(0.01)
        trickling = _raw_request(gw, "/openai/chat/completions", b'{"model": "m", ', length=1000)
        deadline = time.monotonic() + 10
        while _unread(trickling) and time.monotonic() < deadline:  # until the gateway has read its head
            time.sleep(0.01)
        time.sleep(0.2)  # the unread stream fills the agent's socket
        assert gw.requests() == []
        assert gw.control("POST", "/policy", {"policy": "closed", "phase": "official"}).status_code == 200
        recorded = {e["request_id"]: e for e in gw.requests()}  # at once: no waiting for the log
        for sock in (unread, waiting, trickling):
            sock.close()
    assert {rid: (e["decision"], e["status"], e["reason"]) for rid, e in recorded.items()} == {
        "gw-1": ("allowed", 200, "policy_closed"),  # the stream, its agent not reading
        "gw-2": ("allowed", 403, "policy_closed"),  # waiting for the upstream's answer
        "gw-3": ("denied", 403, "policy_closed"),  # its body still coming
    }
    kinds = [e["kind"] for e in gw.events()]
    assert kinds.index("policy_changed") < kinds.index("llm_request")


def test_the_sockets_have_their_modes_and_the_control_socket_refuses_bad_requests(gw: Gateway) -> None:
    assert stat.S_IMODE(os.stat(gw.agent_socket).st_mode) == 0o666
    assert stat.S_IMODE(os.stat(gw.control_socket).st_mode) == 0o600
    assert gw.control("POST", "/policy", {"policy": "ajar"}).status_code == 400
    assert gw.control("POST", "/policy", {"policy": "open", "extra": 1}).status_code == 400
    assert gw.control("POST", "/policy", {"policy": "open", "phase": "Bad Phase!"}).status_code == 400
    assert gw.control("POST", "/policy", [1] * 3000).status_code == 413
    assert gw.control("GET", "/nothing").status_code == 404
    summary = gw.control("GET", "/summary").json()
    assert set(summary["requests"]) == {"total", "allowed", "denied"}
    assert set(summary["usage"]) == {"input_tokens", "output_tokens"}
    assert summary["policy"] == "open"


# -- hostile input --------------------------------------------------------------------------------------


def _raw(gw: Gateway, payload: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(gw.agent_socket)
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR) if not payload.endswith(b"\r\n\r\n") else None
        chunks = []
        while data := sock.recv(65536):
            chunks.append(data)
            if b"\r\n\r\n" in b"".join(chunks) and b'"}' in data:
                break
        return b"".join(chunks)


@pytest.mark.parametrize(
    ("payload", "status"),
    [
        (b"\x00\xff garbage\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400),
        (b"POST /openai/chat/completions HTTP/1.1\r\nhost: x\r\n" + b"x-long: " + b"a" * 70000 + b"\r\n\r\n", 431),
        (b"POST /openai/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 999999999999\r\n\r\n", 413),
        (b"POST /openai/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", 400),
    ],
    ids=["garbage", "bad-header", "huge-header", "huge-content-length", "bad-chunk"],
)
def test_malformed_http_gets_a_clear_error_and_is_recorded_never_a_crash(
    gw: Gateway, payload: bytes, status: int
) -> None:
    mark = gw.settled()
    answer = _raw(gw, payload)
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    assert b'"error"' in answer
    (event,) = recorded_since(gw, mark, 1)
    assert event["status"] == status
    assert event["decision"] == "denied"
    assert gw.client().get("/openai/models", headers=OPENAI_AUTH).status_code == 200  # still serving


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "bad_json"),
        (b"[1, 2]", "bad_json"),
        (b'{"model": "m", "model": "n"}', "bad_json"),
        (b"[" * 5000 + b"]" * 5000, "body_too_deep"),
        (b'{"a":' * 200 + b"1" + b"}" * 200, "body_too_deep"),
        (b'{"model": 5}', "bad_json"),
        (b'{"model": "m", "stream": "yes"}', "bad_json"),
        (b'{"model": "m", "max_tokens": -1}', "bad_json"),
        (b'{"model": "m", "max_tokens": 1e999}', "bad_json"),
        (b'{"model": "m", "messages": "\xff\xfe"}', "bad_json"),
    ],
    ids=["text", "array", "duplicate-key", "deep-array", "deep-object", "model-number", "stream-string",
         "negative-limit", "huge-number", "not-utf8"],
)  # fmt: skip
def test_hostile_json_bodies_get_400_in_the_api_format_and_are_recorded(
    up: Upstream, gw: Gateway, body: bytes, reason: str
) -> None:
    mark = gw.settled()
    start = len(up.requests)
    client = gw.client()
    for path, headers in (("/openai/chat/completions", OPENAI_AUTH), ("/anthropic/v1/messages", ANTHROPIC_AUTH)):
        reply = client.post(path, content=body, headers={**headers, "content-type": "application/json"})
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["type"] == "invalid_request_error"
    assert len(up.requests) == start
    for event in recorded_since(gw, mark, 2):
        assert (event["status"], event["decision"], event["reason"]) == (400, "denied", reason)


def test_an_oversized_body_gets_413_in_the_api_format(up: Upstream, gw: Gateway) -> None:
    mark = gw.settled()
    body = b'{"model": "m", "messages": "' + b"a" * (33 * 1024 * 1024) + b'"}'
    reply = gw.client().post("/anthropic/v1/messages", content=body, headers=ANTHROPIC_AUTH)
    assert reply.status_code == 413
    assert reply.json()["error"]["type"] == "request_too_large"
    (event,) = recorded_since(gw, mark, 1)
    assert (event["status"], event["reason"]) == (413, "body_too_large")


# -- the sockets ----------------------------------------------------------------------------------------


async def test_a_raw_stream_that_never_waits_still_lets_others_run_and_can_be_cancelled() -> None:
    """A reader whose socket always has data takes no scheduler pass per call, but every
    READY_RUN calls it takes one: another task runs, and a cancellation arrives before a byte is lost."""
    left, right = socket.socketpair()
    total = 150_000  # within the socket's buffer: all there at once
    right.sendall(b"x" * total)
    stream = RawStream(left)
    ticks, received = 0, 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        with trio.CancelScope() as scope:
            while received < total:
                received += len(await stream.receive_some(1000))
                if received == total // 2:
                    scope.cancel()
        nursery.cancel_scope.cancel()
    assert ticks >= total // 2000 // READY_RUN
    assert received < total  # cancelled half way ...
    rest = b""
    with contextlib.suppress(BlockingIOError):
        while data := left.recv(65536):
            rest += data
    assert len(rest) == total - received  # ... with no byte lost
    stream.close()
    right.close()


async def test_a_raw_stream_closed_under_a_waiting_reader_wakes_it() -> None:
    left, right = socket.socketpair()
    stream = RawStream(left)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:

            async def read() -> None:
                with pytest.raises(trio.ClosedResourceError):
                    await stream.receive_some()

            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            await stream.aclose()
    with pytest.raises(trio.ClosedResourceError):
        stream.send_nowait(b"x")
    right.close()


async def test_hangups_report_a_peer_that_closes_not_one_that_sends() -> None:
    hangups = Hangups()
    (quiet, quiet_peer), (talking, talking_peer), (closing, closing_peer) = (socket.socketpair() for _ in range(3))
    heard: list[str] = []
    first = trio.Event()

    def hear(name: str) -> None:
        heard.append(name)
        first.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hangups.run)
        for name, sock in (("quiet", quiet), ("talking", talking), ("closing", closing)):
            hangups.add(sock, lambda name=name: hear(name))
        talking_peer.sendall(b"the next request, pipelined")
        closing_peer.close()
        with trio.fail_after(5):
            await first.wait()
        await trio.sleep(0.1)
        assert heard == ["closing"]
        hangups.remove(quiet)
        quiet_peer.close()  # no longer watched
        await trio.sleep(0.1)
        assert heard == ["closing"]
        assert talking.recv(100) == b"the next request, pipelined"  # left unread for the next request
        nursery.cancel_scope.cancel()
    hangups.close()
    for sock in (quiet, talking, closing, talking_peer):
        sock.close()


# -- failures --------------------------------------------------------------------------------------------


def test_the_agent_dropping_mid_stream_cancels_the_upstream_request_and_is_recorded(up: Upstream, gw: Gateway) -> None:
    mark = gw.settled()
    up.push(Turn(text="d" * 5000, chunk_chars=10, chunk_delay=0.01, usage=Usage(10, 1250)))
    start = len(up.requests)
    body = {"model": "m", "messages": USER, "stream": True}
    with gw.client().stream("POST", "/openai/chat/completions", json=body, headers=OPENAI_AUTH) as reply:
        for index, _ in enumerate(reply.iter_raw()):
            if index == 3:
                break  # closes the connection
    assert up.wait_outcome(start) == "client_gone"
    (event,) = recorded_since(gw, mark, 1)
    assert (event["decision"], event["status"], event["reason"]) == ("allowed", 200, "client_disconnected")
    assert event["usage_source"] == "estimate"
    assert 0 < event["usage"]["output_tokens"] < 1250


def test_the_agent_dropping_while_the_upstream_thinks_cancels_the_upstream_request(up: Upstream, gw: Gateway) -> None:
    mark = gw.settled()
    up.push(Turn(text="late", delay=3))
    start = len(up.requests)
    with pytest.raises(httpx.ReadTimeout):
        gw.client().post(
            "/openai/chat/completions", json={"model": "m", "messages": USER}, headers=OPENAI_AUTH, timeout=0.5
        )
    (event,) = recorded_since(gw, mark, 1)
    assert event["reason"] == "client_disconnected"
    assert event["duration_ms"] < 2500, "the gateway waited for the upstream after the agent had gone"
    assert up.wait_outcome(start) == "client_gone"


def test_an_unreachable_upstream_is_502_and_recorded(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    dead = {
        "name": "local",
        "api": "openai",
        "base_url": f"http://127.0.0.1:{free}/v1",
        "api_key": None,
        "ca_file": None,
    }
    with run_gateway(tmp_path, [dead]) as gw:
        reply = gw.client().post("/local/chat/completions", json={"model": "m", "messages": USER}, headers=OPENAI_AUTH)
        assert reply.status_code == 502
        assert reply.json()["error"]["code"] == "upstream_failed"
        (event,) = gw.wait_requests(1)
    assert (event["decision"], event["status"], event["reason"]) == ("allowed", 502, "upstream_failed")
    assert event["usage"]["input_tokens"] == 0


def test_a_slow_upstream_is_504_and_a_stalled_stream_ends_with_an_error_event(tmp_path: Path) -> None:
    script = [Turn(text="never", delay=5), Turn(text="s" * 64, chunk_chars=8, chunk_delay=5)]
    with (
        serve_upstream(script=script) as up,
        run_gateway(tmp_path, [openai_upstream(up)], extra_args=("--upstream-timeout", "0.5")) as gw,
    ):
        client = gw.client()
        reply = client.post("/openai/chat/completions", json={"model": "m", "messages": USER}, headers=OPENAI_AUTH)
        assert reply.status_code == 504
        assert reply.json()["error"]["code"] == "upstream_timeout"
        body = {"model": "m", "messages": USER, "stream": True}
        stalled = client.post("/openai/chat/completions", json=body, headers=OPENAI_AUTH)
        assert stalled.status_code == 200
        assert '"code":"upstream_timeout"' in stalled.text
        timed_out, stalled_event = gw.wait_requests(2)
    assert (timed_out["status"], timed_out["reason"]) == (504, "upstream_timeout")
    assert (stalled_event["status"], stalled_event["reason"]) == (200, "upstream_timeout")


def test_an_upstream_dropping_mid_stream_ends_the_agent_stream_with_an_error_event(
    up: Upstream, gw: Gateway, port: int
) -> None:
    mark = gw.settled()
    up.push(Turn(text="broken " * 40, chunk_chars=8, disconnect_after=6))
    stream = oai(port).chat.completions.create(model="m", messages=USER, stream=True)  # type: ignore[arg-type]
    with pytest.raises(openai.APIError, match="the upstream broke the stream"):
        for _ in stream:
            pass
    (event,) = recorded_since(gw, mark, 1)
    assert (event["decision"], event["status"], event["reason"]) == ("allowed", 200, "upstream_failed")


@pytest.mark.parametrize("status", [400, 429, 500, 529])
def test_upstream_errors_are_passed_on_and_recorded(up: Upstream, gw: Gateway, status: int) -> None:
    mark = gw.settled()
    up.push(Turn(status=status, error=f"upstream says {status}"))
    reply = gw.client().post(
        "/anthropic/v1/messages", json={"model": "m", "max_tokens": 5, "messages": USER}, headers=ANTHROPIC_AUTH
    )
    assert reply.status_code == status
    assert reply.json()["error"]["message"] == f"upstream says {status}"
    (event,) = recorded_since(gw, mark, 1)
    assert (event["decision"], event["status"], event["reason"]) == ("allowed", status, None)
    assert event["response"] == {"error": f"upstream says {status}"}


def test_a_garbage_upstream_body_is_passed_on_and_recorded_without_usage(up: Upstream, gw: Gateway) -> None:
    mark = gw.settled()
    up.push(Turn(raw=b"{not json at all", content_type="application/json"))
    reply = gw.client().post("/openai/chat/completions", json={"model": "m", "messages": USER}, headers=OPENAI_AUTH)
    assert reply.content == b"{not json at all"
    (event,) = recorded_since(gw, mark, 1)
    assert event["usage_source"] == "none"
    assert event["response"] == {"error": "the response is not a JSON object"}


def test_an_https_upstream_is_verified_against_its_ca_file(tmp_path: Path) -> None:
    with serve_upstream(tls=True, api_key=KEY) as up:
        with run_gateway(tmp_path / "with-ca", [openai_upstream(up, key=KEY)]) as gw:
            reply = gw.client().post(
                "/openai/chat/completions", json={"model": "m", "messages": USER}, headers=OPENAI_AUTH
            )
            assert reply.status_code == 200
            assert reply.json()["choices"][0]["message"]["content"] == "echo: hello"
        without_ca = {**openai_upstream(up, key=KEY), "ca_file": None}
        with run_gateway(tmp_path / "system-cas", [without_ca]) as gw:
            reply = gw.client().post(
                "/openai/chat/completions", json={"model": "m", "messages": USER}, headers=OPENAI_AUTH
            )
            assert reply.status_code == 502
            assert "failed verification" in reply.json()["error"]["message"]
            (event,) = gw.wait_requests(1)
            assert event["reason"] == "upstream_failed"
    assert KEY not in gw.events_path.read_text() + gw.stderr


def test_sigterm_cuts_in_flight_streams_records_them_and_exits_0(tmp_path: Path) -> None:
    with serve_upstream(script=[Turn(text="t" * 1000, chunk_chars=5, chunk_delay=0.01)]) as up:
        with run_gateway(tmp_path, [openai_upstream(up)]) as gw:
            body = {"model": "m", "messages": USER, "stream": True}
            with gw.client().stream("POST", "/openai/chat/completions", json=body, headers=OPENAI_AUTH) as reply:
                chunks = reply.iter_raw()
                next(chunks)
                gw.proc.send_signal(signal.SIGTERM)
                with pytest.raises(httpx.RemoteProtocolError):
                    for _ in chunks:
                        pass
            assert gw.proc.wait(10) == 0
            gw.stop()
        assert up.wait_outcome(0) == "client_gone"
    kinds = [e["kind"] for e in gw.events()]
    assert kinds == ["gateway_started", "llm_request", "gateway_stopped"]
    request, stopped = gw.events()[1:]
    assert request["reason"] == "gateway_stopped"
    assert stopped["requests"] == {"total": 1, "allowed": 1, "denied": 0}
    assert gw.returncode == 0
    assert not os.path.exists(gw.agent_socket)


def test_a_refused_config_exits_2_naming_the_field_never_the_key(tmp_path: Path) -> None:
    bad = {"name": "openai", "api": "openai", "base_url": "http://api.openai.com/v1", "api_key": KEY, "ca_file": None}
    with pytest.raises(GatewayFailed) as failed, run_gateway(tmp_path, [bad]):
        pass
    assert failed.value.returncode == 2
    assert "plain http only to a loopback host" in failed.value.stderr
    assert KEY not in failed.value.stderr
    with pytest.raises(GatewayFailed) as failed, run_gateway(tmp_path, raw_config=b'{"run_id": "' + KEY.encode()):
        pass
    assert failed.value.returncode == 2
    assert KEY not in failed.value.stderr
