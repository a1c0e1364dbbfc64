"""The LLM agent's client for an OpenAI-compatible Chat Completions endpoint (standard library only).

``POST {base_url}/chat/completions`` with tools, over one kept-alive :mod:`http.client`
connection. Transient failures (429 that is not a budget, 5xx, a dropped connection, a timeout, a
200 whose body cannot be read) are retried with exponential backoff and jitter (``Retry-After``
honoured, capped; ``x-should-retry: true`` forces a retry and ``false`` stops one of a 4xx), within a
number of attempts and the caller's deadline. What retrying cannot
fix raises at once: :class:`BudgetExhausted` (the gateway's budget 429, or an upstream's
``insufficient_quota``), :class:`ContextOverflow` (a 400 saying the prompt is too long) and
:class:`UpstreamFailed` (any other refusal, or retries used up). Every response body is untrusted
JSON, read with a size cap and parsed with :func:`ale.core.parse.parse_json`.
"""

from __future__ import annotations

import http.client
import json
import random
import re
import ssl
import time
import urllib.parse
from collections.abc import Callable, Sequence
from email.utils import parsedate_to_datetime
from typing import Any

import attrs

from ale.core.parse import ParseError, parse_json

MAX_RESPONSE_BYTES = 32 * 1024 * 1024
MAX_ERROR_CHARS = 500  # of an upstream's error message, in logs and exceptions
RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 520, 522, 524, 529})
#: Words in a 429's error type, code or message that mean no retry can succeed: the gateway's
#: budget refusal (docs/gateway.md) and OpenAI's exhausted quota.
BUDGET_MARKERS = ("budget", "insufficient_quota", "quota exceeded", "exceeded your current quota")
_CONTEXT_MARKERS = re.compile(
    r"context[_ ]length|context window|maximum context|too many tokens|prompt is too long|"
    r"reduce the length|exceeds the context|input is too long|tokens? limit",
    re.IGNORECASE,
)
TRANSPORT_ERRORS = (OSError, http.client.HTTPException, ssl.SSLError)


class UpstreamError(RuntimeError):
    """The endpoint did not give a usable completion; ``status`` is the HTTP status (0: none)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class BudgetExhausted(UpstreamError):
    """The gateway (or the provider) refuses further requests for budget or quota: stop cleanly."""


class ContextOverflow(UpstreamError):
    """The request's messages do not fit the model's context window."""


class UpstreamFailed(UpstreamError):
    """A refusal no retry can fix, or the retries ran out."""


class _Retry(Exception):
    """One failed attempt worth repeating, after at least ``delay`` seconds (None: the backoff)."""

    def __init__(self, reason: str, delay: float | None = None, status: int = 0) -> None:
        super().__init__(reason)
        self.reason, self.delay, self.status = reason, delay, status


@attrs.frozen
class Endpoint:
    """Where the Chat Completions route is: scheme, host, port and the base path."""

    scheme: str
    host: str
    port: int
    path: str  # the base path without a trailing slash, e.g. "/openai" or "/v1"

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urllib.parse.urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the base URL {url!r} is not an http:// or https:// URL with a host")
        if parts.query or parts.fragment:
            raise ValueError(f"the base URL {url!r} has a query or fragment")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ValueError(f"the base URL {url!r} has an invalid port") from None
        return cls(scheme=parts.scheme, host=parts.hostname, port=port, path=parts.path.rstrip("/"))

    def url(self, route: str) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}/{route}"


@attrs.frozen
class ToolCall:
    id: str
    name: str
    arguments: str  # the raw JSON text the model wrote (parsed by the tool layer)


@attrs.frozen
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0


@attrs.frozen
class Completion:
    """The first choice of a completion: visible text, tool calls, why it stopped, usage."""

    content: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str
    usage: Usage
    model: str

    def message(self) -> dict[str, Any]:
        """The assistant message to send back in the conversation (never any reasoning text)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content or (None if self.tool_calls else "")}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return message


def clip(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... [{len(text) - limit} more characters]"


def _error_text(body: bytes) -> tuple[str, str]:
    """(message, type-and-code words) of an error body in OpenAI's format, or its raw text."""
    try:
        data = parse_json(body, what="the error body", max_bytes=1 << 20)
    except ParseError:
        return clip(body.decode("utf-8", "replace").strip()), ""
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, str):
        return clip(error), ""
    if not isinstance(error, dict):
        return clip(body.decode("utf-8", "replace").strip()), ""
    words = " ".join(str(error.get(k) or "") for k in ("type", "code"))
    return clip(str(error.get("message") or "")), words


def _retry_after(headers: http.client.HTTPMessage, cap: float) -> float | None:
    raw = (headers.get("retry-after-ms") or "").strip()
    if raw:
        try:
            return min(max(float(raw) / 1000, 0.0), cap)
        except ValueError:
            pass
    raw = (headers.get("retry-after") or "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(raw).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return min(max(seconds, 0.0), cap) if seconds == seconds else None


def _text(content: Any) -> str:
    """A message's visible text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _tool_calls(raw: Any) -> tuple[ToolCall, ...]:
    calls = []
    for i, entry in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(entry, dict):
            continue
        function = entry.get("function")
        function = function if isinstance(function, dict) else {}
        name = function.get("name")
        arguments = function.get("arguments")
        if not isinstance(arguments, str):  # some servers send the object itself
            arguments = "{}" if arguments is None else json.dumps(arguments)
        call_id = entry.get("id")
        calls.append(
            ToolCall(
                id=call_id if isinstance(call_id, str) and call_id else f"call_{i}_{random.getrandbits(32):08x}",
                name=name if isinstance(name, str) else "",
                arguments=arguments,
            )
        )
    return tuple(calls)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    details = raw.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    return Usage(_count(raw.get("prompt_tokens")), _count(raw.get("completion_tokens")), _count(cached))


def parse_completion(body: bytes) -> Completion:
    """A 200's body as a :class:`Completion`; raises :class:`ParseError` when it is not one."""
    data = parse_json(body, what="the completion", max_bytes=MAX_RESPONSE_BYTES)
    if not isinstance(data, dict):
        raise ParseError("the completion is not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ParseError("the completion has no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise ParseError("the completion's first choice has no message")
    finish = choices[0].get("finish_reason")
    model = data.get("model")
    return Completion(
        content=_text(message.get("content")),
        tool_calls=_tool_calls(message.get("tool_calls")),
        finish_reason=finish if isinstance(finish, str) else "",
        usage=_usage(data.get("usage")),
        model=model if isinstance(model, str) else "",
    )


@attrs.define
class ChatClient:
    """Chat Completions with tools against ``base_url``, retried as the module says."""

    base_url: str
    api_key: str
    model: str
    timeout: float = 600.0  # seconds to wait for one response
    max_attempts: int = 8
    backoff: float = 1.0  # the first retry's delay; doubles up to max_backoff
    max_backoff: float = 60.0
    extra: dict[str, Any] = attrs.Factory(dict)  # more request fields (max_tokens, temperature)
    log: Callable[[str], None] = print
    sleep: Callable[[float], None] = time.sleep
    endpoint: Endpoint = attrs.field(init=False)
    _conn: http.client.HTTPConnection | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self.endpoint = Endpoint.parse(self.base_url)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._conn is None:
            e = self.endpoint
            if e.scheme == "https":
                self._conn = http.client.HTTPSConnection(
                    e.host, e.port, timeout=timeout, context=ssl.create_default_context()
                )
            else:
                self._conn = http.client.HTTPConnection(e.host, e.port, timeout=timeout)
        self._conn.timeout = timeout
        if self._conn.sock is not None:
            self._conn.sock.settimeout(timeout)
        return self._conn

    def complete(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], *, deadline: float | None = None
    ) -> Completion:
        """One completion; ``deadline`` (a ``time.monotonic()`` value) bounds waiting and retrying."""
        body = json.dumps(
            {"model": self.model, "messages": list(messages), "tools": list(tools), **self.extra},
            ensure_ascii=False,
        ).encode("utf-8")
        delay = self.backoff
        for attempt in range(1, self.max_attempts + 1):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 1.0:
                raise UpstreamFailed("no time left to wait for the model")
            try:
                return self._attempt(body, self.timeout if left is None else min(self.timeout, left))
            except _Retry as retry:
                self.close()
                if attempt == self.max_attempts:
                    raise UpstreamFailed(
                        f"gave up after {attempt} attempts: {retry.reason}", status=retry.status
                    ) from None
                wait = retry.delay if retry.delay is not None else delay * (0.5 + random.random())
                if deadline is not None and time.monotonic() + wait > deadline - 1.0:
                    raise UpstreamFailed(f"{retry.reason}; no time left to retry", status=retry.status) from None
                self.log(f"attempt {attempt} failed ({retry.reason}); retrying in {wait:.1f} s")
                self.sleep(wait)
                delay = min(delay * 2, self.max_backoff)
        raise AssertionError("unreachable")

    def _attempt(self, body: bytes, timeout: float) -> Completion:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            conn = self._connection(timeout)
            conn.request("POST", f"{self.endpoint.path}/chat/completions", body=body, headers=headers)
            response = conn.getresponse()
            data = response.read(MAX_RESPONSE_BYTES + 1)
        except TimeoutError:
            raise _Retry(f"no response within {timeout:.3g} s") from None
        except TRANSPORT_ERRORS as exc:
            raise _Retry(f"connection failed: {type(exc).__name__}: {clip(str(exc), 200)}") from None
        if len(data) > MAX_RESPONSE_BYTES:
            raise _Retry(f"the response is larger than {MAX_RESPONSE_BYTES} bytes")
        if response.length:  # a short read: the connection closed before the declared length
            raise _Retry(f"connection failed: the response ended {response.length} bytes early")
        if response.will_close:
            self.close()
        if response.status == 200:
            try:
                return parse_completion(data)
            except ParseError as exc:
                raise _Retry(f"unreadable completion: {exc}", status=200) from None
        self._refusal(response.status, response.headers, data)
        raise AssertionError("unreachable")

    def _refusal(self, status: int, headers: http.client.HTTPMessage, data: bytes) -> None:
        message, words = _error_text(data)
        said = f"HTTP {status}: {message}" if message else f"HTTP {status}"
        if status == 429 and any(m in f"{words} {message}".lower() for m in BUDGET_MARKERS):
            raise BudgetExhausted(said, status)
        if status in (400, 413, 422) and _CONTEXT_MARKERS.search(message):
            raise ContextOverflow(said, status)
        # x-should-retry, as OpenAI's SDKs read it, except that "false" does not stop retries of a
        # 5xx: the gateway sends it with its 502/504 too, where the upstream may answer next time.
        advice = (headers.get("x-should-retry") or "").strip().lower()
        if advice == "true" or (status in RETRY_STATUSES and (advice != "false" or status >= 500)):
            raise _Retry(said, _retry_after(headers, self.max_backoff), status)
        raise UpstreamFailed(said, status)
