"""The judge's client: one Chat Completions request to any OpenAI-compatible endpoint.

``POST {base_url}/chat/completions`` over :mod:`http.client`, to an ``http(s)://`` base URL, or
over a Unix socket (the judge's gateway, whose route ``/judge`` stands for the real endpoint).
The answer's body is read up to :data:`ale.core.verdict.MAX_REPLY_BYTES` (a larger one is an
error, never read whole) and handed to the pure parsers of :mod:`ale.core.verdict`. One retry,
after :data:`RETRY_DELAY_S`, for what a retry can fix (a dropped connection, a timeout, 429 that is
not a budget, 5xx); every other failure is final. Blocking: the harness calls it from a worker thread.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable

import attrs

from ale.core.judge_input import JudgeInput
from ale.core.parse import ParseError, parse_json
from ale.core.rubric import Rubric
from ale.core.verdict import (
    MAX_REPLY_BYTES,
    JudgeResult,
    VerdictError,
    clip,
    failed,
    judged,
    parse_chat_reply,
    parse_verdict,
    request_body,
)

RETRY_DELAY_S = 2.0
ATTEMPTS = 2
DEFAULT_TIMEOUT_S = 300.0
TRANSPORT_ERRORS = (OSError, http.client.HTTPException, ssl.SSLError)


class EndpointError(ValueError):
    """A base URL the judge cannot use (the message says why; it never holds a key)."""


@attrs.frozen
class Endpoint:
    scheme: str
    host: str
    port: int
    path: str  # the base path without a trailing slash

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urllib.parse.urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EndpointError("the judge's base URL must be an http:// or https:// URL with a host")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise EndpointError("the judge's base URL may not hold credentials, a query or a fragment")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise EndpointError("the judge's base URL has an invalid port") from None
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def origin(self) -> str:
        """scheme://host[:port], as the manifest records it (no path, no credentials)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return f"{self.scheme}://{host}" + ("" if self.port == default else f":{self.port}")

    @property
    def base_url(self) -> str:
        return self.origin + self.path


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


@attrs.frozen
class HttpReply:
    status: int
    body: bytes
    request_id: str | None  # the gateway's x-ale-request-id


class Transport:
    """Where requests go: a base URL (``unix_socket``: over that socket, the URL's path kept)."""

    def __init__(
        self, base_url: str, api_key: str | None, *, unix_socket: str | None = None, timeout: float = DEFAULT_TIMEOUT_S
    ) -> None:
        self.endpoint = Endpoint.parse(base_url)
        self._key, self._socket, self._timeout = api_key, unix_socket, timeout

    def _connection(self) -> http.client.HTTPConnection:
        if self._socket is not None:
            return _UnixConnection(self._socket, self._timeout)
        e = self.endpoint
        if e.scheme == "https":
            context = ssl.create_default_context()
            return http.client.HTTPSConnection(e.host, e.port, timeout=self._timeout, context=context)
        return http.client.HTTPConnection(e.host, e.port, timeout=self._timeout)

    def post(self, route: str, payload: bytes) -> HttpReply:
        """POST ``payload`` (JSON) to ``{base path}/{route}``; the body read up to the cap plus one byte."""
        headers = {"content-type": "application/json", "accept": "application/json", "user-agent": "ale-judge/1"}
        if self._key:
            headers["authorization"] = f"Bearer {self._key}"
        conn = self._connection()
        try:
            conn.request("POST", f"{self.endpoint.path}/{route}", body=payload, headers=headers)
            response = conn.getresponse()
            body = response.read(MAX_REPLY_BYTES + 1)
            return HttpReply(response.status, body, response.getheader("x-ale-request-id"))
        finally:
            conn.close()


@attrs.frozen
class Exchange:
    """What asking the judge gave: its result, the requests made and their usage."""

    result: JudgeResult
    requests: int
    input_tokens: int
    output_tokens: int
    request_ids: tuple[str, ...]  # the gateway's ids of the requests (none without a gateway)


def _error_message(body: bytes) -> str:
    try:
        value = parse_json(body[:65536], what="an error body", max_depth=8)
    except ParseError:
        return clip(body[:300].decode("utf-8", "replace"), 300)
    error = value.get("error") if isinstance(value, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    code = error.get("code") if isinstance(error, dict) else None
    text = message if isinstance(message, str) else json.dumps(value)[:300]
    return clip(f"{text} ({code})" if isinstance(code, str) else text, 300)


def _retryable(reply: HttpReply) -> bool:
    if reply.status >= 500:
        return True
    return reply.status == 429 and b"budget" not in reply.body[:65536]


def _send(transport: Transport, payload: bytes, ids: list[str]) -> HttpReply | tuple[str, bool]:
    """One attempt: a 200 answer within the size cap, or (what went wrong, whether to retry)."""
    try:
        reply = transport.post("chat/completions", payload)
    except TRANSPORT_ERRORS as exc:
        return f"the judge's endpoint could not be reached: {type(exc).__name__}: {clip(str(exc), 200)}", True
    except ValueError:  # http.client refuses a header value (a key with a control character): no retry helps
        return "the judge's request could not be sent: its key is not a valid header value", False
    if reply.request_id:
        ids.append(reply.request_id)
    if len(reply.body) > MAX_REPLY_BYTES:
        return f"the judge's answer is over {MAX_REPLY_BYTES} bytes", False
    if reply.status != 200:
        return f"the judge's endpoint answered HTTP {reply.status}: {_error_message(reply.body)}", _retryable(reply)
    return reply


def _read(reply: HttpReply, model: str, judge_input: JudgeInput, rubric: Rubric) -> tuple[JudgeResult, int, int]:
    """The result an answer gives, and the tokens it reports."""
    digest = judge_input.sha256
    try:
        chat = parse_chat_reply(reply.body)
    except ParseError as exc:
        problem = f"the judge's answer is not a Chat Completions response: {clip(str(exc), 300)}"
        return failed("unparsable", problem, model=model, input_sha256=digest), 0, 0
    try:
        result = judged(parse_verdict(chat, rubric, digest), rubric, model)
    except VerdictError as exc:
        result = failed(exc.outcome, str(exc), model=model, input_sha256=digest)
    return result, chat.input_tokens, chat.output_tokens


def ask(
    transport: Transport,
    model: str,
    judge_input: JudgeInput,
    rubric: Rubric,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> Exchange:
    """Ask the judge about one input; every failure is an unfaithful result, never an exception."""
    payload = json.dumps(request_body(model, judge_input), ensure_ascii=False).encode("utf-8")
    ids: list[str] = []
    problem = ""
    for attempt in range(ATTEMPTS):
        if attempt:
            sleep(RETRY_DELAY_S)
        sent = _send(transport, payload, ids)
        if isinstance(sent, HttpReply):
            result, tokens_in, tokens_out = _read(sent, model, judge_input, rubric)
            return Exchange(result, attempt + 1, tokens_in, tokens_out, tuple(ids))
        problem, retry = sent
        if not retry:
            return Exchange(_error(problem, model, judge_input), attempt + 1, 0, 0, tuple(ids))
    return Exchange(_error(problem, model, judge_input), ATTEMPTS, 0, 0, tuple(ids))


def _error(problem: str, model: str, judge_input: JudgeInput) -> JudgeResult:
    return failed("error", problem, model=model, input_sha256=judge_input.sha256)
