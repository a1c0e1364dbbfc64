"""The gateway's pure parts: its configuration, the wire formats, recording and budgets, and fuzz
targets for every parser of what the agent or an upstream sends (``pytest -m fuzz``)."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h11
import orjson
import pytest
from fuzzing import fuzz_settings, hostile_json, json_values
from gateway_process import OPENAI_AUTH_HEADER, PLACEHOLDER, Gateway, openai_upstream, run_gateway
from hypothesis import assume, given
from hypothesis import strategies as st
from llm_upstream import serve_upstream

from ale.core.parse import ParseError, parse_json
from ale.gateway import wire
from ale.gateway.budget import Ledger
from ale.gateway.config import Budgets, ConfigError, parse_config
from ale.gateway.framing import (
    CHUNKED,
    CLOSE,
    LENGTH,
    BodyDecoder,
    FramingError,
    ResponseHead,
    head_end,
    parse_response_head,
    request_head,
)
from ale.gateway.recording import LINE_BYTES, Conversations, fit_line
from ale.gateway.upstream import body_framing

UPSTREAM = {
    "name": "openai",
    "api": "openai",
    "base_url": "https://api.openai.com/v1",
    "api_key": "sk-x",
    "ca_file": None,
}
BASE = {
    "run_id": "r", "placeholder_key": "ph", "upstreams": [UPSTREAM], "policy": "open",
    "budgets": {"requests": None, "input_tokens": None, "output_tokens": None},
}  # fmt: skip


def _config(**changes: Any) -> bytes:
    upstream = {**UPSTREAM, **changes.pop("upstream", {})}
    return json.dumps({**BASE, "upstreams": [upstream], **changes}).encode()


# -- configuration ---------------------------------------------------------------------------------------


def test_a_valid_config_is_taken_apart() -> None:
    config = parse_config(
        _config(upstreams=[UPSTREAM, {**UPSTREAM, "name": "local", "base_url": "http://127.0.0.1:8080"}])
    )
    openai, local = config.upstreams
    assert (openai.scheme, openai.host, openai.port, openai.base_path) == ("https", "api.openai.com", 443, "/v1")
    assert (local.scheme, local.host_header, local.base_path) == ("http", "127.0.0.1:8080", "")
    assert "sk-x" not in repr(config)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"upstream": {"base_url": "http://api.openai.com/v1"}}, "plain http only to a loopback host"),
        ({"upstream": {"base_url": "http://10.0.0.1/v1"}}, "plain http only to a loopback host"),
        ({"upstream": {"base_url": "https://user:pw@api.openai.com"}}, "no credentials"),
        ({"upstream": {"base_url": "https://api.openai.com/v1?x=1"}}, "no credentials, query or fragment"),
        ({"upstream": {"base_url": "https://api.openai.com/v1/../x"}}, "escaped or relative path"),
        ({"upstream": {"base_url": "https://api.openai.com/%2e%2e"}}, "escaped or relative path"),
        ({"upstream": {"base_url": "ftp://api.openai.com"}}, "http(s) URL"),
        ({"upstream": {"base_url": "https://"}}, "http(s) URL"),
        ({"upstream": {"name": "Open AI"}}, "[a-z0-9-]"),
        ({"upstream": {"api": "gemini"}}, "api"),
        ({"upstream": {"extra": 1}}, "extra"),
        ({"upstream": {"api_key": "has space"}}, "printable"),
        ({"upstream": {"ca_file": "/x.pem", "base_url": "http://127.0.0.1"}}, "ca_file is for an https"),
        ({"upstream": {"api_key": "ph"}}, "equals the placeholder"),
        ({"upstreams": []}, "upstreams is empty"),
        ({"upstreams": [UPSTREAM, UPSTREAM]}, "the same name"),
        ({"policy": "ajar"}, "policy"),
        ({"budgets": {"requests": -1, "input_tokens": None, "output_tokens": None}}, "negative"),
        ({"budgets": {"requests": 1.5, "input_tokens": None, "output_tokens": None}}, "requests"),
        ({"run_id": ""}, "run_id"),
        ({"surprise": True}, "surprise"),
    ],
)
def test_a_config_outside_the_contract_is_refused_naming_what_is_wrong(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(_config(**changes))
    assert words in str(refused.value)
    assert "sk-x" not in str(refused.value)


@pytest.mark.fuzz
@fuzz_settings
@given(st.one_of(hostile_json, json_values.map(lambda v: json.dumps(v).encode()), st.binary(max_size=300)))
def test_fuzz_config_parser_raises_only_config_error(raw: bytes) -> None:
    with contextlib.suppress(ConfigError):
        parse_config(raw)


# -- routes ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("api", "method", "rest", "query", "expected"),
    [
        ("openai", "POST", "chat/completions", "", (wire.CHAT, None)),
        ("openai", "POST", "responses", "", (wire.RESPONSES, None)),
        ("openai", "GET", "models", "", (wire.MODELS, None)),
        ("openai", "GET", "models/meta-llama/Llama-3-8B", "", (wire.MODELS, "meta-llama/Llama-3-8B")),
        ("openai", "GET", "models/ft:gpt-4o:org:x", "", (wire.MODELS, "ft:gpt-4o:org:x")),
        ("anthropic", "POST", "v1/messages", "beta=true", (wire.MESSAGES, None)),
        ("anthropic", "POST", "v1/messages/count_tokens", "", (wire.COUNT_TOKENS, None)),
        ("anthropic", "GET", "v1/models", "limit=20&after_id=claude-x", (wire.MODELS, None)),
        ("openai", "GET", "models/../files", "", None),
        ("openai", "GET", "models/", "", None),
        ("openai", "GET", "models/a//b", "", None),
        ("openai", "GET", "models/" + "a" * 257, "", None),
        ("openai", "POST", "v1/messages", "", None),
        ("anthropic", "POST", "chat/completions", "", None),
        ("openai", "POST", "chat/completions", "a=<b>", None),
        ("openai", "POST", "chat/completions/", "", None),
    ],
)
def test_the_allow_list(api: str, method: str, rest: str, query: str, expected: Any) -> None:
    assert wire.route(api, method, rest, query) == expected


# -- request bodies ---------------------------------------------------------------------------------------


def test_the_output_clamp_and_the_usage_request() -> None:
    info = wire.inspect_request(wire.CHAT, {"model": "m", "stream": True, "max_tokens": 500})
    assert wire.output_clamp(wire.CHAT, info, 20) == 20
    assert wire.output_clamp(wire.CHAT, info, 800) is None
    unset = wire.inspect_request(wire.CHAT, {"model": "m"})
    assert wire.output_clamp(wire.CHAT, unset, 16383) == 16383
    assert wire.output_clamp(wire.CHAT, unset, 16384) is None
    body = {"model": "m", "stream": True, "max_tokens": 500, "stream_options": {"x": 1}}
    changed = orjson.loads(wire.prepare_body(wire.CHAT, body, info, 20) or b"")
    assert changed == {
        "model": "m",
        "stream": True,
        "max_tokens": 20,
        "stream_options": {"x": 1, "include_usage": True},
    }
    asked = wire.inspect_request(wire.CHAT, {"stream": True, "stream_options": {"include_usage": True}})
    assert wire.prepare_body(wire.CHAT, {"stream": True}, asked, None) is None


def test_visible_messages_drop_hidden_reasoning_but_not_tool_inputs() -> None:
    body = {
        "system": [{"type": "text", "text": "sys"}],
        "messages": [
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hidden"}, {"type": "redacted_thinking", "data": "x"},
                {"type": "tool_use", "id": "t", "name": "n", "input": {"reasoning": "the tool's own argument"}},
            ]},
        ],
    }  # fmt: skip
    assert wire.visible_messages(wire.MESSAGES, body) == [
        {"role": "system", "content": [{"type": "text", "text": "sys"}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t", "name": "n", "input": {"reasoning": "the tool's own argument"}},
        ]},
    ]  # fmt: skip
    chat = {"messages": [{"role": "assistant", "content": "a", "reasoning_content": "h", "reasoning": {"x": 1}}]}
    assert wire.visible_messages(wire.CHAT, chat) == [{"role": "assistant", "content": "a"}]
    responses = {
        "instructions": "be brief",
        "input": [{"type": "reasoning", "summary": []}, {"role": "user", "content": "q"}],
    }
    assert wire.visible_messages(wire.RESPONSES, responses) == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "q"},
    ]  # fmt: skip


@pytest.mark.fuzz
@fuzz_settings
@given(
    st.one_of(hostile_json, json_values.map(lambda v: json.dumps(v).encode())), st.sampled_from(sorted(wire.GENERATION))
)
def test_fuzz_request_body_parser_raises_only_parse_error(raw: bytes, endpoint: str) -> None:
    try:
        body = wire.parse_body(raw, 1 << 20)
        info = wire.inspect_request(endpoint, body)
    except ParseError:
        return
    messages = wire.visible_messages(endpoint, body)
    assert isinstance(messages, list)
    wire.prepare_body(endpoint, body, info, wire.output_clamp(endpoint, info, 10))


# -- responses and streams ----------------------------------------------------------------------------------


def test_usage_is_normalised_for_every_api() -> None:
    chat = {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 4}}
    assert wire.usage_of("openai", chat) == wire.Usage(10, 2, 4)
    responses = {"input_tokens": 7, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 1}}
    assert wire.usage_of("openai", responses) == wire.Usage(7, 3, 1)
    messages = {
        "input_tokens": 5,
        "cache_read_input_tokens": 100,
        "cache_creation_input_tokens": 20,
        "output_tokens": 9,
    }
    assert wire.usage_of("anthropic", messages) == wire.Usage(125, 9, 100)
    assert wire.usage_of("openai", {"prompt_tokens": -5, "completion_tokens": True}) == wire.Usage(0, 0, 0)
    assert wire.usage_of("openai", "nonsense") is None


def test_anthropic_stream_usage_takes_message_delta_over_message_start() -> None:
    reader = wire.StreamReader("anthropic", wire.MESSAGES)
    start = {
        "type": "message_start",
        "message": {"usage": {"input_tokens": 3, "cache_read_input_tokens": 7, "output_tokens": 1}},
    }
    reader.event("message_start", json.dumps(start).encode())
    reader.event(
        "message_delta",
        json.dumps(
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 42}}
        ).encode(),
    )
    assert reader.usage == wire.Usage(10, 42, 7)
    assert reader.seen.stop == "end_turn"


STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"content":"he"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"secret"}}]}\r\n\r\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"llo"},"finish_reason":"stop"}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.fuzz
@fuzz_settings
@given(st.lists(st.integers(0, len(STREAM)), max_size=20))
def test_fuzz_sse_splitter_any_chunking_gives_the_same_events_and_loses_no_byte(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    pieces = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    events = list(wire.events_of(wire.SseSplitter(), iter(pieces)))
    assert b"".join(raw for raw, _, _ in events) == STREAM
    reader = wire.StreamReader("openai", wire.CHAT, drop_usage_chunk=True)
    forwarded = [raw for raw, name, data in events if reader.event(name, data)]
    assert len(forwarded) == 4  # the usage chunk the agent did not ask for is dropped
    assert reader.seen.as_dict() == {"text": "hello", "tool_calls": [], "stop": "stop"}
    assert reader.usage == wire.Usage(3, 2, 0)
    assert reader.estimated_output == 3  # "he" + "secret" + "llo": 11 characters


def test_a_reader_takes_whole_events_and_gives_back_the_ones_to_forward() -> None:
    events = wire.SseSplitter().feed(STREAM)
    reader = wire.StreamReader("openai", wire.CHAT)
    assert reader.take(events) is events  # nothing dropped: the same list, so its bytes can go as they came
    dropping = wire.StreamReader("openai", wire.CHAT, drop_usage_chunk=True)
    assert dropping.take(events) == [events[0], events[1], events[2], events[4]]
    assert wire.event_fields(events[0]) == (None, b'{"choices":[{"index":0,"delta":{"content":"he"}}]}')
    assert wire.event_fields(b"event: ping\r\ndata: a\r\ndata:b\r\n: note\r\n\r\n") == ("ping", b"a\nb")
    assert wire.event_fields(b": only a comment\n\n") == (None, None)


def test_an_event_over_the_pending_limit_is_passed_on_unread() -> None:
    splitter = wire.SseSplitter(max_pending=64)
    big = b'data: {"choices":[{"delta":{"content":"' + b"x" * 100
    first = splitter.feed(b"data: [DONE]\n\n" + big)
    assert [type(raw) for raw in first] == [bytes, wire.Unread]
    second = splitter.feed(b'"}}]}\n\ndata: {}\n\n')
    assert [type(raw) for raw in second] == [wire.Unread, bytes]
    assert b"".join(first + second) == b"data: [DONE]\n\n" + big + b'"}}]}\n\ndata: {}\n\n'
    reader = wire.StreamReader("openai", wire.CHAT)
    assert reader.take(first + second) == first + second
    assert reader.seen.as_dict()["text"] == ""  # the unread event's text is not read from its pieces


def _as_event(value: Any) -> bytes:
    return b"data: " + json.dumps(value).encode() + b"\n\n"


@pytest.mark.fuzz
@fuzz_settings
@given(
    st.lists(st.one_of(st.binary(max_size=200), hostile_json, json_values.map(_as_event)), max_size=8),
    st.sampled_from([("openai", wire.CHAT), ("openai", wire.RESPONSES), ("anthropic", wire.MESSAGES)]),
)  # fmt: skip
def test_fuzz_stream_reader_reads_any_upstream_bytes_without_raising(chunks: list[bytes], api: tuple[str, str]) -> None:
    splitter = wire.SseSplitter(max_pending=4096)
    reader = wire.StreamReader(*api)
    out = b""
    for raw, name, data in wire.events_of(splitter, iter(chunks)):
        if reader.event(name, data):
            out += raw
        else:
            assert data is not None
    assert len(out) <= sum(map(len, chunks))
    json.dumps(reader.seen.as_dict())


@pytest.mark.fuzz
@fuzz_settings
@given(
    st.one_of(hostile_json, json_values.map(lambda v: json.dumps(v).encode())), st.sampled_from(sorted(wire.GENERATION))
)
def test_fuzz_whole_response_reader_never_raises(raw: bytes, endpoint: str) -> None:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = None
    for status in (200, 500):
        _, seen = wire.read_response("anthropic" if endpoint == wire.MESSAGES else "openai", endpoint, status, value)
        assert seen is not None
        json.dumps(seen.as_dict())


# -- response framing ----------------------------------------------------------------------------------------


def _chunked(payloads: list[bytes], trailers: bytes = b"") -> tuple[bytes, set[int]]:
    """A chunked body and the offsets where a chunk's frame starts (a piece may be passed on as it
    came only when it starts and ends at one of those, none the last chunk)."""
    out, starts = b"", set()
    for payload in payloads:
        starts.add(len(out))
        out += b"%x\r\n%s\r\n" % (len(payload), payload)
    return out + b"0\r\n" + trailers + b"\r\n", starts | {len(out)}


@pytest.mark.fuzz
@fuzz_settings
@given(
    st.lists(st.binary(min_size=1, max_size=40), max_size=8),
    st.sampled_from([b"", b"x-trailer: 1\r\n"]),
    st.lists(st.integers(0, 600), max_size=12),
)
def test_fuzz_a_chunked_body_decodes_the_same_under_any_split_and_whole_chunks_are_flagged(
    payloads: list[bytes], trailers: bytes, cuts: list[int]
) -> None:
    body, starts = _chunked(payloads, trailers)
    points = sorted({c for c in cuts if c < len(body)})
    decoder, got = BodyDecoder(CHUNKED), b""
    for a, b in zip([0, *points], [*points, len(body)], strict=True):
        data, aligned = decoder.feed(body[a:b])
        got += data
        if aligned:
            assert a in starts, (a, b)
            assert b in starts, (a, b)
            assert b < len(body) - len(trailers) - 3, (a, b)  # not the last chunk
            assert data
            assert body[a:b].startswith(b"%x\r\n" % len(payloads[sorted(starts).index(a)]))
    assert got == b"".join(payloads)
    assert decoder.done
    assert decoder.extra == b""
    decoder.eof()


def test_whole_chunks_received_at_once_are_flagged_and_anything_else_is_not() -> None:
    decoder = BodyDecoder(CHUNKED)
    assert decoder.feed(b"5\r\nhello\r\n") == (b"hello", True)
    assert decoder.feed(b"1\r\na\r\n2\r\nbc\r\n") == (b"abc", True)
    assert decoder.feed(b"3;ext=1\r\nabc\r\n") == (b"abc", False)  # an extension: framed anew
    assert decoder.feed(b"3\r\nab") == (b"ab", False)
    assert decoder.feed(b"c\r\n") == (b"c", False)
    assert decoder.feed(b"0\r\n\r\nHTTP/1.1 200 OK") == (b"", False)
    assert decoder.done
    assert decoder.extra == b"HTTP/1.1 200 OK"


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"zz\r\n", "malformed chunk size"),
        (b"0x5\r\nhello\r\n", "malformed chunk size"),
        (b"+5\r\nhello\r\n", "malformed chunk size"),
        (b"5\r\nhello!!\r\n", "longer than its size"),
        (b"1" * 2000, "chunk size line is longer"),
        (b"0\r\n" + b"x: y\r\n" * 20000, "trailers is longer"),
    ],
)
def test_broken_chunked_framing_is_a_framing_error(data: bytes, words: str) -> None:
    with pytest.raises(FramingError, match=words):
        BodyDecoder(CHUNKED).feed(data)


def test_a_body_cut_short_is_a_framing_error_unless_the_connection_frames_it() -> None:
    decoder = BodyDecoder(CHUNKED)
    decoder.feed(b"5\r\nhel")
    with pytest.raises(FramingError, match="closed before the end"):
        decoder.eof()
    length = BodyDecoder(LENGTH, 5)
    assert length.feed(b"hel") == (b"hel", False)
    with pytest.raises(FramingError):
        length.eof()
    assert length.feed(b"lo, extra") == (b"lo", False)
    assert length.done
    assert length.extra == b", extra"
    assert BodyDecoder(LENGTH, 0).done
    close = BodyDecoder(CLOSE)
    assert close.feed(b"anything") == (b"anything", False)
    close.eof()
    assert close.done


@pytest.mark.fuzz
@fuzz_settings
@given(st.lists(st.binary(max_size=80), max_size=8))
def test_fuzz_the_body_decoder_raises_only_framing_error(pieces: list[bytes]) -> None:
    decoder = BodyDecoder(CHUNKED)
    with contextlib.suppress(FramingError):
        for piece in pieces:
            data, _ = decoder.feed(piece)
            assert len(data) <= len(piece) + 2048
        decoder.eof()


def test_a_response_head_is_read_as_h11_reads_it() -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Empty:\r\nx-b:  a  b \r\n\r\nbody"
    end = head_end(raw)
    assert raw[end:] == b"body"
    head = parse_response_head(raw[:end])
    assert head == ResponseHead(
        200, b"OK", ((b"content-type", b"text/event-stream"), (b"x-empty", b""), (b"x-b", b"a  b")), b"1.1"
    )
    ours = h11.Connection(h11.CLIENT)
    ours.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    ours.receive_data(raw)
    theirs = ours.next_event()
    assert (theirs.status_code, theirs.reason, list(theirs.headers)) == (
        head.status_code,
        head.reason,
        list(head.headers),
    )
    assert head_end(b"HTTP/1.1 204 No Content\n\n") == 25  # a bare LF, as h11 takes it
    assert head_end(b"HTTP/1.1 200 OK\r\nA: b\r\n") == -1
    assert parse_response_head(b"HTTP/1.0 200\r\n\r\n").reason == b""


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"HTTP/2 200 OK\r\n\r\n", "status line"),
        (b"HTTP/1.1 20 OK\r\n\r\n", "status line"),
        (b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n", "header line"),
        (b"HTTP/1.1 200 OK\r\nA: b\r\n  folded\r\n\r\n", "header line"),
        (b"HTTP/1.1 200 OK\r\nA: b\x00c\r\n\r\n", "header line"),
        (b"HTTP/1.1 200 OK\r\nA: b\rc\r\n\r\n", "header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", "conflicting"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", "malformed content-length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "transfer-coding"),
        (b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "transfer-coding"),
    ],
)
def test_a_broken_response_head_is_a_framing_error(raw: bytes, words: str) -> None:
    with pytest.raises(FramingError, match=words):
        parse_response_head(raw)


@pytest.mark.fuzz
@fuzz_settings
@given(
    st.one_of(
        st.binary(max_size=300),
        st.text(alphabet="ab-:; \t\r\n\x00,7chunkedCONTENT-LENGTHtransfer-encoding", max_size=120).map(str.encode),
    )
)
def test_fuzz_the_response_head_parser_raises_only_framing_error_and_refuses_what_h11_refuses(raw: bytes) -> None:
    head = b"HTTP/1.1 200 OK\r\n" + raw + b"\r\n\r\n"
    head = head[: head_end(head)] if head_end(head) > 0 else head
    try:
        ours: ResponseHead | None = parse_response_head(head)
    except FramingError:
        ours = None
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    conn.receive_data(head)
    try:
        theirs = conn.next_event()
    except h11.RemoteProtocolError:
        theirs = None
    if ours is not None:  # what we take, h11 takes the same way (we may refuse more: folded lines)
        assert theirs is not None
        assert (theirs.status_code, list(theirs.headers)) == (ours.status_code, list(ours.headers))


def test_a_request_head_cannot_be_split_by_what_it_carries() -> None:
    assert (
        request_head("POST", "/v1/x", [("host", "h"), ("a", "b")]) == b"POST /v1/x HTTP/1.1\r\nhost: h\r\na: b\r\n\r\n"
    )
    for headers in ([("a", "b\r\nx-injected: 1")], [("a\n", "b")], [("a", "b\x00")]):
        with pytest.raises(FramingError, match="line break or a NUL"):
            request_head("POST", "/", headers)
    with pytest.raises(FramingError):
        request_head("POST", "/ HTTP/1.1\r\nx: y", [])


def test_the_response_framing_follows_rfc_9112() -> None:
    def response(status: int, *headers: tuple[bytes, bytes]) -> ResponseHead:
        return ResponseHead(status, b"", tuple(headers), b"1.1")

    assert body_framing("GET", response(200, (b"transfer-encoding", b"chunked"))) == (CHUNKED, 0)
    assert body_framing("GET", response(200, (b"content-length", b"12"))) == (LENGTH, 12)
    assert body_framing("GET", response(200)) == (CLOSE, 0)
    assert body_framing("HEAD", response(200, (b"content-length", b"12"))) == (LENGTH, 0)
    assert body_framing("POST", response(204)) == (LENGTH, 0)
    assert body_framing("POST", response(304)) == (LENGTH, 0)


# -- recording -----------------------------------------------------------------------------------------------


def test_conversations_record_each_message_once_and_branches_beside() -> None:
    conversations = Conversations(limit=3)
    where = ("openai", wire.CHAT)
    assert conversations.new_messages(where, "r1", ["s", "a"]) == (0, None)
    assert conversations.new_messages(where, "r2", ["s", "a", "b", "c"]) == (2, "r1")
    assert conversations.new_messages(where, "r3", ["s", "x"]) == (1, "r2")  # a branch
    assert conversations.new_messages(where, "r4", ["s", "a", "b", "c", "d"]) == (4, "r2")
    assert conversations.new_messages(("anthropic", wire.MESSAGES), "r5", ["s"]) == (0, None)


@pytest.mark.fuzz
@fuzz_settings
@given(json_values, st.integers(0, 3))
def test_fuzz_every_line_fits_its_cap_and_holds_no_secret(value: Any, repeat: int) -> None:
    try:  # a record holds what parse_json gave (no integer past 2**53)
        value = parse_json(json.dumps(value), what="value")
    except ParseError:
        assume(False)
    secret = "sk-secret-0123456789"
    record = {"kind": "llm_request", "messages": [value, secret * repeat, "y" * (200_000 * repeat)] * (repeat + 1),
              "response": {"text": "z" * (70_000 * repeat) + secret}}  # fmt: skip
    line = fit_line(record, [secret])
    assert len(line) <= LINE_BYTES
    assert line.endswith(b"\n")
    assert secret.encode() not in line
    orjson.loads(line)


def test_the_ledger_refuses_in_order_and_counts_live_streams() -> None:
    ledger = Ledger(Budgets(requests=3, input_tokens=None, output_tokens=100))
    assert ledger.admit("a") == 100
    assert not ledger.estimate("a", 60)
    assert ledger.admit("b") == 40  # a's live estimate is reserved
    assert ledger.estimate("b", 50)  # 60 + 50 > 100: cut
    ledger.settle("a", wire.Usage(10, 55, 0))
    ledger.settle("b", None, 0)
    assert ledger.refusal() is None
    assert ledger.admit("c") == 45
    assert ledger.refusal() == "requests"
    assert ledger.newly_exhausted() == [("requests", 3, 3)]
    assert ledger.newly_exhausted() == []


# -- the live parser --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with serve_upstream() as up, run_gateway(tmp_path_factory.mktemp("fuzz"), [openai_upstream(up)]) as gw:
        yield gw
    assert gw.returncode == 0
    assert gw.stderr == "", gw.stderr


_HEADS = st.sampled_from([
    b"POST /openai/chat/completions HTTP/1.1\r\nhost: x\r\n" + OPENAI_AUTH_HEADER + b"content-length: %d\r\n\r\n",
    b"POST /openai/responses HTTP/1.1\r\nhost: x\r\n" + OPENAI_AUTH_HEADER + b"transfer-encoding: chunked\r\n\r\n",
    b"GET /openai/models/%s HTTP/1.1\r\nhost: x\r\n\r\n",
    b"%s\r\n\r\n",
])  # fmt: skip


def _send(gw: Gateway, payload: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(gw.agent_socket)
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the gateway may refuse and close before it has read everything
        answer = b""
        try:
            while data := sock.recv(65536):
                answer += data
        except OSError:
            pass
        return answer


@pytest.mark.fuzz
@fuzz_settings
@given(_HEADS, st.one_of(hostile_json, json_values.map(lambda v: json.dumps(v).encode()), st.binary(max_size=300)))
def test_fuzz_the_gateway_answers_any_request_with_http_or_closes_never_crashes(
    live: Gateway, head: bytes, body: bytes
) -> None:
    if b"content-length: %d" in head:
        payload = head % len(body) + body
    elif b"chunked" in head:
        payload = head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    else:
        payload = head % body[:200]
    answer = _send(live, payload)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 "), answer[:100]
    assert live.proc.poll() is None


def test_after_the_fuzzing_the_gateway_still_serves(live: Gateway) -> None:
    assert live.client().get("/openai/models", headers={"authorization": f"Bearer {PLACEHOLDER}"}).status_code == 200
    assert Path(live.events_path).exists()
