"""A local LLM upstream for tests: the OpenAI and Anthropic wire formats over real HTTP(S) on 127.0.0.1.

Use from sync or async tests (the server runs in threads of its own)::

    with serve_upstream() as up:                          # echoes the last user message
        up.openai_base      # "http://127.0.0.1:PORT/v1"  (OpenAI SDK base_url)
        up.anthropic_base   # "http://127.0.0.1:PORT"     (Anthropic SDK base_url)
        up.requests         # [Request(method, path, headers, body, json, usage, outcome)], in arrival order

    with serve_upstream(script=[Turn(text="hi"), Turn(tool_calls=[ToolCall("ls", {"path": "."})])]) as up:
        ...                 # each API request gets the next scripted turn; past the end: 500 "script exhausted"
        up.push(Turn(...))  # more turns (without a script: served before falling back to the echo)

    with serve_upstream(tls=True, api_key="sk-real") as up:   # https with a throwaway CA (up.ca_file);
        ...                 # the key is required (Bearer or x-api-key), anything else gets 401

    with serve_upstream(by_model={"slow": Turn(chunk_delay=1, text="...")}) as up:
        ...                 # a request for model "slow" always gets that turn (before the script)

``python tests/llm_upstream.py --by-model JSON`` serves in a process of its own (a benchmark's
upstream), prints its URL on one line and runs until killed (``JSON``: model -> Turn fields).

Routes (real paths; the OpenAI base is ``/v1``, the Anthropic base the root): ``POST /v1/chat/completions``,
``POST /v1/responses``, ``POST /v1/messages``, ``POST /v1/messages/count_tokens``, ``GET /v1/models``,
``GET /v1/models/{id}`` (Anthropic's shape when the request has an ``anthropic-version`` header).
Every request, whatever its route, is appended to ``up.requests``.

A :class:`Turn` says what one response holds and how it is delivered: visible ``text``, ``tool_calls``,
hidden ``reasoning`` (Chat ``reasoning_content``, a Responses ``reasoning`` item, Anthropic ``thinking``
blocks: tests prove it is never recorded), ``usage`` (else derived: one token per 4 characters, see
:func:`tokens`), an error ``status``, ``raw`` bytes instead of JSON, a ``delay`` before the headers, a
``chunk_delay`` between stream events, ``disconnect_after`` N stream events (the connection is dropped
mid-stream), ``pad`` characters of filler text (huge bodies), ``stamp`` (each text delta is the upstream's
``time.perf_counter_ns()`` at sending, for latency benchmarks). Whether a response streams is the
request's own ``stream`` flag; streams carry usage as the real APIs do (Chat only with
``stream_options.include_usage``; Responses in ``response.completed``; Anthropic in ``message_start``
and ``message_delta``), cached tokens included. The request's output limit (``max_tokens``,
``max_completion_tokens``, ``max_output_tokens``) is honoured, the text cut to it and the finish reason
``length``/``max_tokens``, unless the turn says ``ignore_max_tokens``.

``Request.outcome`` is ``"complete"``, ``"client_gone"`` (the caller dropped the connection before the
response ended: how a test sees that a request was cancelled upstream) or ``"disconnected"`` (the turn
dropped it). :meth:`Upstream.wait_outcome` waits until a request has one.
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import itertools
import json
import math
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ale.core.parse import ParseError, parse_json

CHARS_PER_TOKEN = 4
MAX_REQUEST_BYTES = 256 << 20


def tokens(text: str) -> int:
    """The test upstream's tokenizer: one token per 4 characters, rounded up."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


@dataclass(frozen=True)
class Usage:
    """Token counts; ``input_tokens`` counts every prompt token, the cached ones included."""

    input_tokens: int
    output_tokens: int
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] | str  # a str is sent as it is (possibly not JSON)
    id: str | None = None

    def arguments_text(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass(frozen=True)
class Turn:
    text: str = ""
    tool_calls: Sequence[ToolCall] = ()
    reasoning: str | None = None
    usage: Usage | None = None
    status: int = 200
    error: str | None = None  # the error message (status >= 400); default: "upstream error N"
    raw: bytes | None = None  # the body as it is (with ``content_type``), no JSON made
    content_type: str = "application/json"
    delay: float = 0.0
    chunk_delay: float = 0.0
    chunk_chars: int = 16
    disconnect_after: int | None = None
    pad: int = 0
    stamp: int = 0  # stream this many stamped text deltas (``chunk_delay`` apart) instead of ``text``
    ignore_max_tokens: bool = False


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased; a repeated header's values joined with ", "
    body: bytes
    json: Any = None
    usage: Usage | None = None  # what the response reported (None: no usage in it)
    outcome: str | None = None
    done: threading.Event = field(default_factory=threading.Event, repr=False)


class _Gone(Exception):
    """The caller dropped the connection."""


@dataclass
class Upstream:
    url: str
    ca_file: str | None
    requests: list[Request]
    script: list[Turn]
    default: Turn | None
    scripted: bool
    by_model: dict[str, Turn]
    api_key: str | None
    _stop: threading.Event
    _lock: threading.Lock

    @property
    def openai_base(self) -> str:
        return f"{self.url}/v1"

    @property
    def anthropic_base(self) -> str:
        return self.url

    def push(self, *turns: Turn) -> None:
        """Append turns to the script."""
        with self._lock:
            self.script.extend(turns)

    def wait_outcome(self, index: int = -1, timeout: float = 10.0) -> str | None:
        """The outcome of ``requests[index]`` once it has one (None after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                request = self.requests[index] if -len(self.requests) <= index < len(self.requests) else None
            if request is not None and request.done.wait(max(0.0, deadline - time.monotonic())):
                return request.outcome
            time.sleep(0.01)
        return None

    def _next_turn(self) -> Turn | None:
        with self._lock:
            if self.script:
                return self.script.pop(0)
        return self.default

    def _record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)


@contextmanager
def serve_upstream(
    script: Sequence[Turn] | None = None,
    *,
    default: Turn | None = None,
    tls: bool = False,
    api_key: str | None = None,
    by_model: dict[str, Turn] | None = None,
) -> Iterator[Upstream]:
    """Serve the test upstream on 127.0.0.1 (a free port) until the block ends.

    ``script``: the turns API requests get, in order (past its end: a 500 "script exhausted"). Without
    a script every request gets ``default``, or an echo of its last user message.
    """
    stop, lock = threading.Event(), threading.Lock()
    up = Upstream(
        "", None, [], list(script or ()), default, script is not None, dict(by_model or {}), api_key, stop, lock
    )
    server = _Server(("127.0.0.1", 0), _Handler)
    server.upstream = up
    with tempfile.TemporaryDirectory(prefix="ale-upstream-") as folder:
        scheme = "http"
        if tls:
            scheme = "https"
            up.ca_file, context = _tls_context(Path(folder))
            server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        up.url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            yield up
        finally:
            stop.set()
            server.shutdown()
            server.server_close()
            thread.join(5)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    upstream: Upstream

    def handle_error(self, request: Any, client_address: Any) -> None:  # a dropped TLS handshake, ...
        pass


# -- request handling ------------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(10)
            self.request.do_handshake()
            self.request.settimeout(None)
        super().setup()
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(min(length, MAX_REQUEST_BYTES)) if length else b""
        headers: dict[str, str] = {}
        for name, value in self.headers.items():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        request = Request(self.command, self.path, headers, body)
        up = self.server.upstream
        up._record(request)
        try:
            self._answer(request)
            request.outcome = request.outcome or "complete"
        except (_Gone, OSError):
            request.outcome = request.outcome or "client_gone"
            self.close_connection = True
        finally:
            request.done.set()

    def _answer(self, request: Request) -> None:
        api = "anthropic" if "anthropic-version" in request.headers else "openai"
        path = request.path.split("?", 1)[0]
        if path in ("/v1/messages", "/v1/messages/count_tokens"):
            api = "anthropic"
        up = self.server.upstream
        if up.api_key is not None and not _authorised(request.headers, up.api_key):
            return self._error(api, 401, "invalid api key", "authentication_error")
        if request.method == "GET" and (path == "/v1/models" or path.startswith("/v1/models/")):
            return self._json(200, _models(api, path.removeprefix("/v1/models").strip("/") or None))
        route = {
            ("POST", "/v1/chat/completions"): "chat",
            ("POST", "/v1/responses"): "responses",
            ("POST", "/v1/messages"): "messages",
            ("POST", "/v1/messages/count_tokens"): "count_tokens",
        }.get((request.method, path))
        if route is None:
            return self._error(api, 404, f"no route {request.method} {path}", "not_found_error")
        try:
            request.json = parse_json(request.body, what="request body", max_bytes=MAX_REQUEST_BYTES)
        except ParseError as error:
            return self._error(api, 400, f"bad JSON: {error}", "invalid_request_error")
        if not isinstance(request.json, dict):
            return self._error(api, 400, "the body is not an object", "invalid_request_error")
        if route == "count_tokens":
            return self._json(200, {"input_tokens": _input_tokens(request.json)})
        turn = self._turn(request.json)
        if turn is None:
            return self._error(api, 500, "script exhausted", "api_error")
        self._respond(route, request, turn)

    def _turn(self, body: dict[str, Any]) -> Turn | None:
        up = self.server.upstream
        model = body.get("model")
        if isinstance(model, str) and model in up.by_model:
            return up.by_model[model]
        turn = up._next_turn()
        if turn is None and not up.scripted:
            return Turn(text=f"echo: {_last_user_text(body)}"[:400])
        return turn

    def _respond(self, route: str, request: Request, turn: Turn) -> None:
        if turn.delay and self.server.upstream._stop.wait(turn.delay):
            return
        api = "anthropic" if route == "messages" else "openai"
        if turn.raw is not None:
            return self._send(turn.status, turn.raw, turn.content_type)
        if turn.status >= 400:
            return self._error(api, turn.status, turn.error or f"upstream error {turn.status}", "api_error")
        body = request.json
        reply = _Reply.of(turn, body, route)
        request.usage = reply.usage if route != "chat" or not body.get("stream") or reply.stream_usage else None
        if body.get("stream") is True:
            self._stream(request, turn, _EVENTS[route](reply, body))
        else:
            self._json(200, _BODIES[route](reply, body))

    # -- writing -------------------------------------------------------------------------------------

    def _send(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(payload)))
        self.send_header("x-request-id", f"req_{next(_IDS)}")
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()

    def _json(self, status: int, value: Any) -> None:
        self._send(status, json.dumps(value).encode(), "application/json")

    def _error(self, api: str, status: int, message: str, kind: str) -> None:
        if api == "anthropic":
            self._json(status, {"type": "error", "error": {"type": kind, "message": message}})
        else:
            self._json(status, {"error": {"message": message, "type": kind, "param": None, "code": None}})

    def _stream(self, request: Request, turn: Turn, events: Iterator[tuple[str | None, Any]]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        stop = self.server.upstream._stop
        for count, (name, data) in enumerate(events):
            if turn.disconnect_after is not None and count >= turn.disconnect_after:
                request.outcome = "disconnected"
                self.close_connection = True
                self.request.shutdown(socket.SHUT_RDWR)
                return
            if count and turn.chunk_delay and stop.wait(turn.chunk_delay):
                raise _Gone
            if isinstance(data, dict) and data.pop("_stamp", False):
                text = json.dumps(data).replace('"_STAMP_"', json.dumps(str(time.perf_counter_ns())))
            else:
                text = data if isinstance(data, str) else json.dumps(data)
            event = (f"event: {name}\n" if name else "") + f"data: {text}\n\n"
            self._chunk(event.encode())
        self._chunk(b"")

    def _chunk(self, payload: bytes) -> None:
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            self.wfile.flush()
        except OSError as error:
            raise _Gone from error


def _authorised(headers: dict[str, str], key: str) -> bool:
    return headers.get("authorization") == f"Bearer {key}" or headers.get("x-api-key") == key


# -- the content of one response -----------------------------------------------------------------

_IDS = itertools.count(1)


def _last_user_text(body: dict[str, Any]) -> str:
    items = body.get("messages") or body.get("input") or []
    if isinstance(items, str):
        return items
    for item in reversed(items if isinstance(items, list) else []):
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _input_tokens(body: dict[str, Any]) -> int:
    parts = [body.get("messages"), body.get("input"), body.get("system"), body.get("instructions")]
    return tokens(json.dumps([p for p in parts if p is not None]))


def _output_limit(body: dict[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


@dataclass
class _Reply:
    """One response's content, cut to the request's output limit."""

    id: str
    model: str
    text: str
    pieces: list[str]  # the text as streamed
    reasoning: str | None
    tool_calls: list[ToolCall]
    usage: Usage
    truncated: bool
    stamp: int
    stream_usage: bool

    @classmethod
    def of(cls, turn: Turn, body: dict[str, Any], route: str) -> _Reply:
        text = turn.text + "x" * turn.pad
        limit = None if turn.ignore_max_tokens else _output_limit(body)
        reasoning_tokens = tokens(turn.reasoning or "")
        calls = list(turn.tool_calls)
        truncated = False
        if limit is not None and reasoning_tokens + tokens(text) + _call_tokens(calls) > limit:
            truncated, calls = True, []
            text = text[: max(0, limit - reasoning_tokens) * CHARS_PER_TOKEN]
        step = max(1, turn.chunk_chars)
        pieces = [text[i : i + step] for i in range(0, len(text), step)]
        output = reasoning_tokens + tokens(text) + _call_tokens(calls) + turn.stamp * 5
        usage = turn.usage or Usage(_input_tokens(body), output, 0, reasoning_tokens)
        options = body.get("stream_options")
        stream_usage = isinstance(options, dict) and options.get("include_usage") is True
        model = body.get("model") if isinstance(body.get("model"), str) else "test-model"
        prefix = {"chat": "chatcmpl", "responses": "resp", "messages": "msg"}[route]
        return cls(f"{prefix}_{next(_IDS)}", model, text, pieces, turn.reasoning, calls, usage, truncated,
                   turn.stamp, stream_usage)  # fmt: skip

    def call_id(self, index: int, prefix: str) -> str:
        return self.tool_calls[index].id or f"{prefix}_{self.id}_{index}"


def _call_tokens(calls: Sequence[ToolCall]) -> int:
    return sum(tokens(call.name + call.arguments_text()) for call in calls)


def _stamps(reply: _Reply) -> Iterator[str]:
    return iter(["_STAMP_"] * reply.stamp)


# -- OpenAI Chat Completions ----------------------------------------------------------------------


def _chat_usage(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def _chat_finish(reply: _Reply) -> str:
    return "length" if reply.truncated else "tool_calls" if reply.tool_calls else "stop"


def _chat_body(reply: _Reply, body: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None, "refusal": None}
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": reply.call_id(i, "call"), "type": "function",
             "function": {"name": call.name, "arguments": call.arguments_text()}}
            for i, call in enumerate(reply.tool_calls)
        ]  # fmt: skip
    return {
        "id": reply.id, "object": "chat.completion", "created": int(time.time()), "model": reply.model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": _chat_finish(reply)}],
        "usage": _chat_usage(reply.usage), "system_fingerprint": "fp_test",
    }  # fmt: skip


def _chat_events(reply: _Reply, body: dict[str, Any]) -> Iterator[tuple[str | None, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> tuple[None, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return None, {"id": reply.id, "object": "chat.completion.chunk", "created": int(time.time()),
                      "model": reply.model, "choices": [choice], **extra}  # fmt: skip

    yield chunk({"role": "assistant", "content": ""})
    if reply.reasoning:
        for i in range(0, len(reply.reasoning), 16):
            yield chunk({"reasoning_content": reply.reasoning[i : i + 16]})
    for _ in _stamps(reply):
        yield chunk({"content": "_STAMP_"}, _stamp=True)
    for piece in reply.pieces:
        yield chunk({"content": piece})
    for i, call in enumerate(reply.tool_calls):
        head = {"index": i, "id": reply.call_id(i, "call"), "type": "function",
                "function": {"name": call.name, "arguments": ""}}  # fmt: skip
        yield chunk({"tool_calls": [head]})
        arguments = call.arguments_text()
        for j in range(0, len(arguments), 16):
            yield chunk({"tool_calls": [{"index": i, "function": {"arguments": arguments[j : j + 16]}}]})
    yield chunk({}, _chat_finish(reply))
    if reply.stream_usage:
        yield None, {"id": reply.id, "object": "chat.completion.chunk", "created": int(time.time()),
                     "model": reply.model, "choices": [], "usage": _chat_usage(reply.usage)}  # fmt: skip
    yield None, "[DONE]"


# -- OpenAI Responses -----------------------------------------------------------------------------


def _responses_usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_input_tokens},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def _responses_items(reply: _Reply) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.reasoning is not None:
        items.append({"type": "reasoning", "id": f"rs_{reply.id}",
                      "summary": [{"type": "summary_text", "text": reply.reasoning}],
                      "encrypted_content": "ZW5jcnlwdGVkIHJlYXNvbmluZw=="})  # fmt: skip
    if reply.text or not reply.tool_calls:
        items.append(_message_item(reply, reply.text))
    items.extend(
        {"type": "function_call", "id": f"fc_{reply.id}_{i}", "call_id": reply.call_id(i, "call"),
         "name": call.name, "arguments": call.arguments_text(), "status": "completed"}
        for i, call in enumerate(reply.tool_calls)
    )  # fmt: skip
    return items


def _message_item(reply: _Reply, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
    return {"type": "message", "id": f"msg_{reply.id}", "status": status, "role": "assistant", "content": content}


def _responses_body(reply: _Reply, body: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    done = status == "completed"
    return {
        "id": reply.id, "object": "response", "created_at": int(time.time()), "status": status,
        "model": reply.model, "output": _responses_items(reply) if done else [], "parallel_tool_calls": True,
        "tool_choice": "auto", "tools": [], "error": None, "incomplete_details":
        ({"reason": "max_output_tokens"} if reply.truncated and done else None),
        "usage": _responses_usage(reply.usage) if done else None,
    }  # fmt: skip


def _responses_events(reply: _Reply, body: dict[str, Any]) -> Iterator[tuple[str | None, Any]]:
    sequence = itertools.count()

    def event(kind: str, **data: Any) -> tuple[str, Any]:
        return kind, {"type": kind, "sequence_number": next(sequence), **data}

    yield event("response.created", response=_responses_body(reply, body, "in_progress"))
    index = 0
    if reply.reasoning is not None:
        item = _responses_items(reply)[0]
        yield event("response.output_item.added", output_index=0, item={**item, "summary": []})
        for i in range(0, len(reply.reasoning), 16):
            yield event("response.reasoning_summary_text.delta", item_id=item["id"], output_index=0,
                        summary_index=0, delta=reply.reasoning[i : i + 16])  # fmt: skip
        yield event("response.output_item.done", output_index=0, item=item)
        index = 1
    if reply.text or not reply.tool_calls or reply.stamp:
        item_id = f"msg_{reply.id}"
        yield event("response.output_item.added", output_index=index, item=_message_item(reply, "", "in_progress"))
        part = {"type": "output_text", "text": "", "annotations": []}
        yield event("response.content_part.added", item_id=item_id, output_index=index, content_index=0, part=part)
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        for _ in _stamps(reply):
            kind, data = event("response.output_text.delta", **where, delta="_STAMP_")
            yield kind, {**data, "_stamp": True}
        for piece in reply.pieces:
            yield event("response.output_text.delta", **where, delta=piece)
        yield event("response.output_text.done", **where, text=reply.text)
        yield event("response.content_part.done", **where, part={**part, "text": reply.text})
        yield event("response.output_item.done", output_index=index, item=_message_item(reply, reply.text))
        index += 1
    for i, call in enumerate(reply.tool_calls):
        item = {"type": "function_call", "id": f"fc_{reply.id}_{i}", "call_id": reply.call_id(i, "call"),
                "name": call.name, "arguments": "", "status": "in_progress"}  # fmt: skip
        yield event("response.output_item.added", output_index=index, item=item)
        arguments = call.arguments_text()
        for j in range(0, len(arguments), 16):
            yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                        delta=arguments[j : j + 16])  # fmt: skip
        yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                    arguments=arguments)  # fmt: skip
        yield event("response.output_item.done", output_index=index,
                    item={**item, "arguments": arguments, "status": "completed"})  # fmt: skip
        index += 1
    final = "incomplete" if reply.truncated else "completed"
    completed = {**_responses_body(reply, body), "status": final}
    yield event(f"response.{final}", response=completed)


# -- Anthropic Messages --------------------------------------------------------------------------


def _messages_usage(usage: Usage) -> dict[str, Any]:
    """Anthropic's ``input_tokens`` leaves out the tokens read from the cache (``Usage.input_tokens``
    counts every prompt token, as OpenAI's do)."""
    return {
        "input_tokens": usage.input_tokens - usage.cached_input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_input_tokens,
        "output_tokens": usage.output_tokens,
    }


def _messages_stop(reply: _Reply) -> str:
    return "max_tokens" if reply.truncated else "tool_use" if reply.tool_calls else "end_turn"


def _messages_content(reply: _Reply) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = []
    if reply.reasoning is not None:
        content.append({"type": "thinking", "thinking": reply.reasoning, "signature": "c2lnbmF0dXJl"})
    if reply.text or not reply.tool_calls:
        content.append({"type": "text", "text": reply.text})
    for i, call in enumerate(reply.tool_calls):
        arguments = call.arguments if isinstance(call.arguments, dict) else {"raw": call.arguments}
        content.append({"type": "tool_use", "id": reply.call_id(i, "toolu"), "name": call.name, "input": arguments})
    return content


def _messages_body(reply: _Reply, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": reply.id, "type": "message", "role": "assistant", "model": reply.model,
        "content": _messages_content(reply), "stop_reason": _messages_stop(reply), "stop_sequence": None,
        "usage": _messages_usage(reply.usage),
    }  # fmt: skip


def _messages_events(reply: _Reply, body: dict[str, Any]) -> Iterator[tuple[str | None, Any]]:
    def event(kind: str, **data: Any) -> tuple[str, Any]:
        return kind, {"type": kind, **data}

    start_usage = {**_messages_usage(reply.usage), "output_tokens": 1}
    message = {**_messages_body(reply, body), "content": [], "stop_reason": None, "usage": start_usage}
    yield event("message_start", message=message)
    yield event("ping")
    index = 0
    if reply.reasoning is not None:
        yield event("content_block_start", index=0, content_block={"type": "thinking", "thinking": ""})
        for i in range(0, len(reply.reasoning), 16):
            delta = {"type": "thinking_delta", "thinking": reply.reasoning[i : i + 16]}
            yield event("content_block_delta", index=0, delta=delta)
        yield event("content_block_delta", index=0, delta={"type": "signature_delta", "signature": "c2lnbmF0dXJl"})
        yield event("content_block_stop", index=0)
        index = 1
    if reply.text or not reply.tool_calls or reply.stamp:
        yield event("content_block_start", index=index, content_block={"type": "text", "text": ""})
        for _ in _stamps(reply):
            kind, data = event("content_block_delta", index=index, delta={"type": "text_delta", "text": "_STAMP_"})
            yield kind, {**data, "_stamp": True}
        for piece in reply.pieces:
            yield event("content_block_delta", index=index, delta={"type": "text_delta", "text": piece})
        yield event("content_block_stop", index=index)
        index += 1
    for i, call in enumerate(reply.tool_calls):
        block = {"type": "tool_use", "id": reply.call_id(i, "toolu"), "name": call.name, "input": {}}
        yield event("content_block_start", index=index, content_block=block)
        arguments = call.arguments_text()
        for j in range(0, len(arguments), 16):
            delta = {"type": "input_json_delta", "partial_json": arguments[j : j + 16]}
            yield event("content_block_delta", index=index, delta=delta)
        yield event("content_block_stop", index=index)
        index += 1
    delta = {"stop_reason": _messages_stop(reply), "stop_sequence": None}
    yield event("message_delta", delta=delta, usage={"output_tokens": reply.usage.output_tokens})
    yield event("message_stop")


_BODIES = {"chat": _chat_body, "responses": _responses_body, "messages": _messages_body}
_EVENTS = {"chat": _chat_events, "responses": _responses_events, "messages": _messages_events}


def _models(api: str, model: str | None) -> dict[str, Any]:
    names = [model] if model else ["test-model", "test-model-mini"]
    if api == "anthropic":
        data = [{"type": "model", "id": n, "display_name": n, "created_at": "2025-01-01T00:00:00Z"} for n in names]
        return data[0] if model else {"data": data, "has_more": False, "first_id": names[0], "last_id": names[-1]}
    entries = [{"id": n, "object": "model", "created": 1735689600, "owned_by": "ale-tests"} for n in names]
    return entries[0] if model else {"object": "list", "data": entries}


# -- TLS: a throwaway CA and a certificate for 127.0.0.1 and localhost ------------------------------


def _tls_context(folder: Path) -> tuple[str, ssl.SSLContext]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ALE test upstream CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    leaf = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    ca_file, cert_file, key_file = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    ca_file.write_bytes(ca.public_bytes(pem))
    cert_file.write_bytes(leaf.public_bytes(pem) + ca.public_bytes(pem))
    no_encryption = serialization.NoEncryption()
    key_file.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, no_encryption))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return str(ca_file), context


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="serve the test upstream until killed")
    parser.add_argument("--by-model", default="{}", help="JSON: model name -> Turn fields")
    args = parser.parse_args()
    turns = {name: Turn(**fields) for name, fields in json.loads(args.by_model).items()}
    with serve_upstream(by_model=turns) as served:
        print(served.url, flush=True)
        threading.Event().wait()
