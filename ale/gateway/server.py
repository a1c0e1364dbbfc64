"""The gateway's two servers: the agent's HTTP/1.1 socket and the harness's control socket (Trio + h11).

One task per agent connection reads requests with a bounded h11 parser (:data:`MAX_HEADER_BYTES` of
head, :data:`MAX_BODY_BYTES` of body, stalls bounded by :data:`READ_SECONDS`) and handles each in
turn (:meth:`Gateway.handle`): route and allow-list, placeholder, policy, body, budgets, then the
exchange with the upstream, during which the agent's connection is watched (one task for all of
them, :class:`~ale.gateway.transport.Hangups`) so that a client that goes away cancels the upstream
request at once. Responses are passed on as they arrive: a stream event by event (each upstream
read's complete events in one write), any other body chunk by chunk. Every request ends in
exactly one ``llm_request`` event (:meth:`Gateway.finish`), whatever happened, cancellation by
SIGTERM included; closing the policy (:meth:`Gateway.set_policy`) returns once every exchange it
cut has ended so.
"""

from __future__ import annotations

import contextlib
import hmac
import itertools
import math
import time
from collections.abc import Sequence
from typing import Any, Final

import attrs
import h11
import orjson
import trio

from ale.core.parse import JsonLimitError, ParseError, parse_json
from ale.gateway import wire
from ale.gateway.budget import Ledger
from ale.gateway.config import Config, Upstream
from ale.gateway.events import EventLog
from ale.gateway.framing import ResponseHead
from ale.gateway.recording import Conversations
from ale.gateway.transport import Hangups, RawStream
from ale.gateway.upstream import Connection, Pool, UpstreamError

MAX_HEADER_BYTES: Final = 64 * 1024
MAX_BODY_BYTES: Final = 32 * 1024 * 1024
#: a non-stream response body is kept (to read its usage) up to this size; past it, passed on unread
MAX_PARSED_RESPONSE: Final = 16 * 1024 * 1024
MAX_CONNECTIONS: Final = 1024
KEEPALIVE_SECONDS: Final = 300.0
READ_SECONDS: Final = 60.0
WRITE_SECONDS: Final = 300.0
UPSTREAM_SECONDS: Final = 600.0
#: how long the answer to an exchange the gateway cuts (an error event, a 403) may wait for the agent
CUT_WRITE_SECONDS: Final = 1.0
#: a silent upstream's body read ends between ``--upstream-timeout`` and this much of it (the
#: deadline is moved on only when less than the timeout is left, not at every piece)
STALL_SLACK: Final = 1.1
#: request headers passed on to the upstream (and any ``x-stainless-*``); everything else is dropped
FORWARDED_HEADERS: Final = frozenset(
    {"content-type", "accept", "user-agent", "anthropic-version", "anthropic-beta", "openai-beta", "idempotency-key"}
)
#: response headers never passed on to the agent
DROPPED_RESPONSE_HEADERS: Final = frozenset(
    {
        b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"set-cookie",
        b"proxy-authenticate", b"proxy-connection", b"te", b"trailer", b"upgrade", b"alt-svc",
        b"strict-transport-security", b"www-authenticate",
    }
)  # fmt: skip
_AGENT_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
_SSE = b"text/event-stream"


class AgentGone(Exception):
    """The agent's connection closed or broke."""


@attrs.define
class Exchange:
    """One request, as it will be recorded."""

    request_id: str
    method: str
    path: str
    started: float
    upstream: Upstream | None = None
    api: str = "openai"  # the error format
    endpoint: str | None = None
    model: str | None = None
    stream: bool = False
    status: int = 0
    decision: str = "denied"
    reason: str | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    ttfb: float | None = None
    body: dict[str, Any] | None = None
    request_bytes: int = 0
    usage: wire.Usage | None = None
    usage_source: str = "none"
    response: dict[str, Any] | None = None
    metered: bool = False
    cut: str | None = None  # why the gateway ends it early: "policy_closed", "budget_exhausted:NAME"
    read_scope: trio.CancelScope | None = None  # what a cut cancels: a wait for the agent's body or the upstream
    agent: Agent | None = None
    estimate: int = 0
    complete: bool = False  # the whole response reached the agent
    ended: trio.Event = attrs.Factory(trio.Event)  # set once it is recorded


class Agent:
    """One agent connection: its stream and its h11 state. Sends go straight to the socket; only one
    that must wait for the agent to read gets a deadline (:data:`WRITE_SECONDS`, shortened for the
    answer to a cut)."""

    def __init__(self, stream: RawStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        self.gone = False
        self.chunked = False  # the response being sent is chunked
        self.write_limit = math.inf  # no send waits past this (trio time)
        self.write_scope: trio.CancelScope | None = None
        self.sending = False  # a send is waiting for the agent (interrupted: the connection is unusable)

    async def next_event(self, seconds: float, ex: Exchange | None = None) -> Any:
        """The next h11 event; trio.TooSlowError if the peer sends nothing for ``seconds``, _Cut
        if the gateway cuts ``ex`` meanwhile (only a wait has a scope for a cut to cancel)."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            with trio.CancelScope(deadline=trio.current_time() + seconds) as scope:
                if ex is not None:
                    ex.read_scope = scope
                try:
                    data = await self.stream.receive_some(65536)
                except _AGENT_ERRORS:
                    raise AgentGone from None
                finally:
                    if ex is not None:
                        ex.read_scope = None
            if scope.cancelled_caught:
                raise _Cut if ex is not None and ex.cut is not None else trio.TooSlowError
            self.h11.receive_data(data)

    def frame(self, event: Any) -> bytes:
        """An event's bytes: a chunked body's Data framed here (what h11 would write, without its
        bookkeeping: a chunked body has no length to track), the rest by h11."""
        if self.chunked and type(event) is h11.Data:
            return self.frame_data(event.data)
        data = self.h11.send(event) or b""
        if type(event) is h11.Response:
            self.chunked = b"\r\ntransfer-encoding: chunked\r\n" in data.lower()
        return data

    def frame_data(self, data: bytes) -> bytes:
        """Body bytes as they go on the wire."""
        if not self.chunked:
            return self.h11.send(h11.Data(data=data)) or b""
        return b"%x\r\n%s\r\n" % (len(data), data) if data else b""

    async def send(self, *events: Any) -> int:
        """Send h11 events; the body bytes sent."""
        await self.write(b"".join(self.frame(event) for event in events))
        return sum(len(e.data) for e in events if type(e) is h11.Data)

    async def write(self, data: bytes | bytearray, pause: trio.CancelScope | None = None) -> bool:
        """Send bytes; whether the send had to wait for the agent (``pause``: a scope whose deadline
        does not run meanwhile, the caller's wait for its upstream). AgentGone if it broke, or
        stopped reading for :data:`WRITE_SECONDS` (or past :attr:`write_limit`)."""
        if not data:
            return False
        try:
            rest = self.stream.send_nowait(data)
        except _AGENT_ERRORS:
            self.gone = True
            raise AgentGone from None
        if rest is None:
            return False
        if pause is not None:
            pause.deadline = math.inf
        with trio.CancelScope(deadline=min(trio.current_time() + WRITE_SECONDS, self.write_limit)) as scope:
            self.write_scope, self.sending = scope, True
            try:
                await self.stream.send_rest(rest)
            except _AGENT_ERRORS:
                scope.cancel()
            finally:
                self.write_scope = None
            self.sending = False
        if scope.cancel_called:
            self.gone = True
            raise AgentGone
        return True

    def hurry(self, seconds: float) -> None:
        """From now on no send waits more than ``seconds`` (the one waiting now included)."""
        self.write_limit = min(self.write_limit, trio.current_time() + seconds)
        if self.write_scope is not None:
            self.write_scope.deadline = min(self.write_scope.deadline, self.write_limit)


class Gateway:
    def __init__(self, config: Config, log: EventLog, *, upstream_seconds: float = UPSTREAM_SECONDS) -> None:
        self.config = config
        self.log = log
        self.policy = config.policy
        self.phase: str | None = None
        self.pools = {u.name: Pool(u) for u in config.upstreams}
        self.ledger = Ledger(config.budgets)
        self.conversations = Conversations()
        self.counts = {"total": 0, "allowed": 0, "denied": 0}
        self.in_flight: dict[str, Exchange] = {}
        self.hangups = Hangups()
        self.upstream_seconds = upstream_seconds
        self._stall = upstream_seconds * STALL_SLACK
        self.connections = 0
        self.stopping = False
        self._ids = itertools.count(1)
        self._placeholder = config.placeholder_key.encode()

    # -- the agent socket ---------------------------------------------------------------------------

    async def serve_connection(self, stream: RawStream) -> None:
        self.connections += 1
        agent = Agent(stream)
        try:
            if self.connections <= MAX_CONNECTIONS:
                await self._requests(agent)
        except Exception as error:  # a defect: its request is recorded (handle), the gateway goes on
            self.log.defect(error)
        finally:
            self.connections -= 1
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await _close(stream)

    async def _requests(self, agent: Agent) -> None:
        while True:
            try:
                event = await agent.next_event(KEEPALIVE_SECONDS)
            except (AgentGone, trio.TooSlowError):
                return
            except h11.RemoteProtocolError as error:
                return await self._bad_http(agent, error)
            if type(event) is not h11.Request:
                return  # ConnectionClosed, or PAUSED after a response that must close
            await self.handle(agent, event)
            if agent.gone or agent.h11.our_state is not h11.DONE or agent.h11.their_state is not h11.DONE:
                return
            agent.h11.start_next_cycle()

    async def _bad_http(self, agent: Agent, error: h11.RemoteProtocolError) -> None:
        ex = Exchange(self._next_id(), "", "", time.monotonic())
        status = error.error_status_hint if error.error_status_hint in (400, 413, 414, 431) else 400
        try:
            reason = "headers_too_large" if status == 431 else "bad_http"
            await self._deny(agent, ex, status, reason, f"malformed HTTP request: {error}", close=True)
        except AgentGone:
            pass
        finally:
            self.finish(ex)

    def _next_id(self) -> str:
        return f"gw-{next(self._ids)}"

    async def handle(self, agent: Agent, request: h11.Request) -> None:
        target = request.target.decode("ascii", "replace")
        ex = Exchange(self._next_id(), request.method.decode("ascii", "replace"), target, time.monotonic())
        ex.agent, agent.write_limit = agent, math.inf
        self.in_flight[ex.request_id] = ex
        ended = False
        try:
            await self._handle(agent, request, ex)
            ended = True
        except AgentGone:
            ex.reason, ended = ex.reason or "client_disconnected", True
        finally:
            del self.in_flight[ex.request_id]
            if not ended:  # cancelled (SIGTERM), or a defect
                ex.reason = ex.reason or ("gateway_stopped" if self.stopping else "internal_error")
                agent.gone = True
            try:
                self.finish(ex)
            finally:
                ex.ended.set()

    async def _handle(self, agent: Agent, request: h11.Request, ex: Exchange) -> None:
        headers = dict(request.headers)  # h11 lower-cases the names
        name, rest, query = self._target(ex)
        refusal = _head_refusal(request, headers)
        if refusal is not None:
            return await self._deny(agent, ex, *refusal, close=True)
        raw = await self._read_body(agent, ex)
        if raw is None:
            return
        refusal = self._refusal(ex, name, rest, query, headers)
        if refusal is not None:
            return await self._deny(agent, ex, *refusal)
        forward: bytes | None = raw
        if ex.method == "POST":
            forward = await self._prepare(agent, ex, raw)
        if forward is not None:
            await self._forward(agent, ex, headers, forward)

    def _target(self, ex: Exchange) -> tuple[str, str, str]:
        """(upstream name, path below it, query) of the request target; the upstream noted on ``ex``."""
        path, _, query = ex.path.partition("?")
        name, _, rest = path.removeprefix("/").partition("/")
        upstream = self.config.upstream(name) if path.startswith("/") else None
        if upstream is not None:
            ex.upstream, ex.api = upstream, upstream.api
            ex.path = upstream.base_path + "/" + rest + (f"?{query}" if query else "")
        return name, rest, query

    def _refusal(
        self, ex: Exchange, name: str, rest: str, query: str, headers: dict[bytes, bytes]
    ) -> tuple[int, str, str] | None:
        """Why the request is refused before its body is read, in this order: no such upstream, a
        path off the allow-list, a wrong placeholder, a closed policy (None: none of these)."""
        if ex.upstream is None:
            return 404, "unknown_upstream", _unknown(name, self.config)
        found = wire.route(ex.upstream.api, ex.method, rest, query)
        if found is None:
            allowed = wire.allowed_paths(ex.api)
            return (
                403,
                "path_not_allowed",
                f"{ex.method} /{name}/{rest} is not an allowed API path (allowed: {allowed})",
            )
        ex.endpoint, ex.model = found
        if not self._authorised(headers):
            return 401, "bad_credentials", _BAD_CREDENTIALS
        if self.policy == "closed":
            return 403, "policy_closed", _CLOSED
        return None

    async def _read_body(self, agent: Agent, ex: Exchange) -> bytes | None:
        """The request body, or None once the request is denied (a cut while it comes: 403)."""
        parts: list[bytes] = []
        while True:
            try:
                event = await agent.next_event(READ_SECONDS, ex)
            except _Cut:
                status, code, message, param = self._cut_error(ex.cut or "")
                await self._deny(agent, ex, status, code, message, close=True, param=param)
                return None
            except trio.TooSlowError:
                await self._deny(agent, ex, 408, "read_timeout", "the request body stalled", close=True)
                return None
            except h11.RemoteProtocolError as error:
                await self._deny(agent, ex, 400, "bad_http", f"malformed HTTP request body: {error}", close=True)
                return None
            if type(event) is h11.Data:
                ex.bytes_in += len(event.data)
                if ex.bytes_in > MAX_BODY_BYTES:
                    await self._deny(agent, ex, 413, "body_too_large", _too_large(ex.bytes_in), close=True)
                    return None
                parts.append(bytes(event.data))
            elif type(event) is h11.EndOfMessage:
                return b"".join(parts)
            else:
                raise AgentGone

    def _authorised(self, headers: dict[bytes, bytes]) -> bool:
        given = headers.get(b"x-api-key")
        bearer = headers.get(b"authorization", b"")
        if bearer[:7].lower() == b"bearer ":
            ok = hmac.compare_digest(bearer[7:].strip(), self._placeholder)
            return ok or (given is not None and hmac.compare_digest(given.strip(), self._placeholder))
        return given is not None and hmac.compare_digest(given.strip(), self._placeholder)

    async def _prepare(self, agent: Agent, ex: Exchange, raw: bytes) -> bytes | None:
        """The body to forward, or None once the request is denied (bad JSON, budgets)."""
        try:
            body = wire.parse_body(raw, MAX_BODY_BYTES)
            info = wire.inspect_request(ex.endpoint or "", body)
        except JsonLimitError as error:
            code = "body_too_deep" if error.limit == "depth" else "body_too_large"
            await self._deny(agent, ex, 400, code, str(error))
            return None
        except ParseError as error:
            await self._deny(agent, ex, 400, "bad_json", str(error))
            return None
        ex.model, ex.stream = info.model, info.stream
        if ex.endpoint not in wire.GENERATION:
            return raw
        refusal = self.ledger.refusal()
        if refusal is not None:
            report = self.ledger.report(refusal)
            if report is not None:
                self._exhausted(*report)
            message = self._budget_message(refusal)
            await self._deny(agent, ex, 429, f"budget_exhausted:{refusal}", message, param=refusal)
            return None
        ex.body, ex.request_bytes, ex.metered = body, len(raw), True
        remaining = self.ledger.admit(ex.request_id)
        clamp = wire.output_clamp(ex.endpoint, info, remaining)
        changed = wire.prepare_body(ex.endpoint, body, info, clamp)
        if ex.endpoint == wire.CHAT and info.stream and not info.stream_usage:
            ex.usage_source = "injected"  # marker: drop the usage chunk the agent did not ask for
        return raw if changed is None else changed

    def _budget_message(self, name: str) -> str:
        used, limit = self.ledger.used(name), self.ledger.limit(name)
        return f"the run's {name} budget is exhausted ({used} used of {limit}): no more LLM requests in this run"

    def _upstream_headers(self, upstream: Upstream, headers: dict[bytes, bytes], size: int) -> list[tuple[str, str]]:
        out = [("host", upstream.host_header)]
        for key, value in headers.items():
            name = key.decode("latin-1")
            if name in FORWARDED_HEADERS or name.startswith("x-stainless-"):
                out.append((name, value.decode("latin-1")))
        out += [("accept-encoding", "identity"), ("content-length", str(size))]
        if upstream.api_key is not None:
            if upstream.api == "anthropic":
                out.append(("x-api-key", upstream.api_key))
            else:
                out.append(("authorization", f"Bearer {upstream.api_key}"))
        return out

    async def _forward(self, agent: Agent, ex: Exchange, headers: dict[bytes, bytes], body: bytes) -> None:
        assert ex.upstream is not None
        ex.decision = "allowed"
        pool = self.pools[ex.upstream.name]
        out = self._upstream_headers(ex.upstream, headers, len(body))
        sock = agent.stream.socket
        with trio.CancelScope() as scope:
            self.hangups.add(sock, lambda: _hung_up(agent, ex, scope))
            try:
                await self._exchange(agent, ex, pool, out, body)
            except AgentGone:
                agent.gone = True
            finally:
                self.hangups.remove(sock)
        if agent.gone and ex.reason is None and not ex.complete:
            ex.reason = "client_disconnected"

    async def _exchange(
        self, agent: Agent, ex: Exchange, pool: Pool, headers: Sequence[tuple[str, str]], body: bytes
    ) -> None:
        opened: tuple[Connection, ResponseHead] | None = None
        failure: str | None = None
        with trio.CancelScope(deadline=trio.current_time() + self.upstream_seconds) as scope:
            ex.read_scope = scope
            if ex.cut is None:
                try:
                    opened = await pool.request(ex.method, ex.path, headers, body)
                except UpstreamError as error:
                    failure = str(error)
        ex.read_scope = None
        if failure is not None:
            return await self._deny(agent, ex, 502, "upstream_failed", failure, recorded="allowed")
        if opened is None and ex.cut is None:  # the deadline, not a cut
            message = f"{pool.upstream.host_header} did not answer in time"
            return await self._deny(agent, ex, 504, "upstream_timeout", message, recorded="allowed")
        if opened is None:
            return await self._cut_before_head(agent, ex)
        conn, response = opened
        try:
            await self._respond(agent, ex, conn, response)
        finally:
            if conn.reusable():
                await pool.release(conn)
            else:
                await conn.aclose()

    async def _cut_before_head(self, agent: Agent, ex: Exchange) -> None:
        status, code, message, param = self._cut_error(ex.cut or "")
        await self._deny(agent, ex, status, code, message, param=param, recorded="allowed")

    def _cut_error(self, cut: str) -> tuple[int, str, str, str | None]:
        if cut.startswith("budget_exhausted:"):
            name = cut.partition(":")[2]
            return 429, cut, self._budget_message(name), name
        return 403, "policy_closed", _CLOSED, None

    async def _respond(self, agent: Agent, ex: Exchange, conn: Connection, response: ResponseHead) -> None:
        ex.ttfb = time.monotonic() - ex.started
        ex.status = response.status_code
        if response.status_code == 401:  # never pass on what an upstream says of the gateway's key
            with trio.CancelScope() as ex.read_scope:
                await _drain(conn)
            ex.read_scope = None
            message = f"the upstream {ex.upstream.name if ex.upstream else ''} refused the gateway's credentials"
            return await self._deny(agent, ex, 502, "upstream_auth_failed", message, recorded="allowed")
        content_type = next((v for k, v in response.headers if k == b"content-type"), b"")
        streaming = content_type.startswith(_SSE)
        # a stream is re-framed (events may be dropped or added); any other body keeps its length
        passed = [
            (k, v)
            for k, v in response.headers
            if k not in DROPPED_RESPONSE_HEADERS or (k == b"content-length" and not streaming)
        ]
        passed.append((b"x-ale-request-id", ex.request_id.encode()))
        head = h11.Response(status_code=response.status_code, headers=passed, reason=response.reason)
        if streaming:
            await self._stream(agent, ex, conn, head)
        else:
            await self._body(agent, ex, conn, head)

    async def _piece(
        self, agent: Agent, ex: Exchange, conn: Connection, out: _Out, scope: trio.CancelScope
    ) -> tuple[bytes, bytes | None] | None:
        """The next piece of the upstream's body (None: its end), read within ``scope`` (the
        exchange's wait for its upstream: cancelled by a cut, its deadline moved on as pieces come).
        What is pending goes to the agent before waiting for more (a piece already received goes out
        with it: one send carries a head and the body that came with it). _Cut once the gateway
        ends the exchange."""
        if ex.cut is not None:
            raise _Cut
        if out.parts and not conn.ready and await agent.write(out.take(ex), scope):
            scope.deadline = trio.current_time() + self._stall  # the agent was slow, not the upstream
        piece = await conn.piece()
        now = trio.current_time()
        if scope.deadline - now < self.upstream_seconds:
            scope.deadline = now + self._stall
        return piece

    def _wait_scope(self, ex: Exchange) -> trio.CancelScope:
        ex.read_scope = trio.CancelScope(deadline=trio.current_time() + self._stall)
        return ex.read_scope

    async def _body(self, agent: Agent, ex: Exchange, conn: Connection, head: h11.Response) -> None:
        kept: list[bytes] | None = [] if ex.metered or ex.status >= 400 else None
        size = 0
        out = _Out(agent.frame(head))
        try:
            with self._wait_scope(ex) as scope:
                while (piece := await self._piece(agent, ex, conn, out, scope)) is not None:
                    chunk, raw = piece
                    if kept is not None:
                        size += len(chunk)
                        kept = kept if size <= MAX_PARSED_RESPONSE else None
                        if kept is not None:
                            kept.append(chunk)
                    out.add(raw if raw is not None and agent.chunked else agent.frame_data(chunk), len(chunk))
            _raise_if_cancelled(ex, scope)
        except (_Cut, UpstreamError, trio.TooSlowError) as error:
            ex.reason = ex.cut or _failure(error)
            agent.gone = True  # a body cut short: only closing the connection says so
            return
        finally:
            ex.read_scope = None
        out.add(agent.frame(h11.EndOfMessage()), 0)
        await agent.write(out.take(ex))
        ex.complete = True
        if kept is not None:
            self._read_whole(ex, b"".join(kept))

    def _read_whole(self, ex: Exchange, raw: bytes) -> None:
        try:
            value = parse_json(
                raw, what="response", max_bytes=MAX_PARSED_RESPONSE, max_depth=wire.MAX_BODY_DEPTH, unique_keys=False
            )
        except ParseError:
            value = None
        usage, seen = wire.read_response(ex.api, ex.endpoint or "", ex.status, value)
        if usage is not None:
            ex.usage, ex.usage_source = usage, "upstream"
        ex.response = seen.as_dict() if seen is not None else None

    async def _stream(self, agent: Agent, ex: Exchange, conn: Connection, head: h11.Response) -> None:
        """Pass a stream on event by event: each piece's whole events in one write, as the upstream
        framed them when its piece was exactly those events in whole chunks, else framed here."""
        splitter = wire.SseSplitter()
        reader = wire.StreamReader(ex.api, ex.endpoint or "", drop_usage_chunk=ex.usage_source == "injected")
        ex.usage_source = "none"
        metered = ex.metered and self.ledger.limits.output_tokens is not None  # only then can it go over
        out = _Out(agent.frame(head))
        try:
            with self._wait_scope(ex) as scope:
                while (piece := await self._piece(agent, ex, conn, out, scope)) is not None:
                    chunk, raw = piece
                    held = splitter.pending
                    events = splitter.feed(chunk)
                    kept = reader.take(events)
                    if raw is not None and kept is events and not held and not splitter.pending and agent.chunked:
                        out.add(raw, len(chunk))
                    elif kept:
                        data = b"".join(kept)
                        out.add(agent.frame_data(data), len(data))
                    if metered and self.ledger.estimate(ex.request_id, reader.estimated_output):
                        ex.cut = ex.cut or "budget_exhausted:output_tokens"
            _raise_if_cancelled(ex, scope)
            rest = splitter.flush()
            if rest:
                out.add(agent.frame_data(rest), len(rest))
        except (_Cut, UpstreamError, trio.TooSlowError) as error:
            ex.reason = ex.cut or _failure(error)
            await self._end_stream(agent, ex, out)
            return
        finally:
            ex.read_scope = None
            self._read_stream(ex, reader)
        out.add(agent.frame(h11.EndOfMessage()), 0)
        await agent.write(out.take(ex))
        ex.complete = True

    async def _end_stream(self, agent: Agent, ex: Exchange, out: _Out) -> None:
        """End a stream the gateway cut, or whose upstream failed, with an error event (unless a
        send to the agent was interrupted half way: then only closing the connection can end it)."""
        if agent.sending:
            agent.gone = True
            return
        if ex.cut is not None:
            status, code, message, param = self._cut_error(ex.cut)
        elif ex.reason == "upstream_timeout":
            status, code, message, param = 504, "upstream_timeout", "the upstream stream stalled", None
        else:
            status, code, message, param = 502, "upstream_failed", "the upstream broke the stream", None
        event = wire.stream_error(ex.api, status, message, code, param)
        out.add(agent.frame_data(event), len(event))
        out.add(agent.frame(h11.EndOfMessage()), 0)
        await agent.write(out.take(ex))

    def _read_stream(self, ex: Exchange, reader: wire.StreamReader) -> None:
        ex.estimate = reader.estimated_output
        ex.response = reader.seen.as_dict() if ex.endpoint in wire.GENERATION else None
        if reader.usage is not None:
            ex.usage, ex.usage_source = reader.usage, "upstream"

    async def _deny(
        self,
        agent: Agent,
        ex: Exchange,
        status: int,
        code: str,
        message: str,
        *,
        close: bool = False,
        param: str | None = None,
        recorded: str = "denied",
    ) -> None:
        """Answer with the gateway's own error in the API's format (``recorded``: the decision
        recorded, "allowed" for an exchange the upstream had a part in)."""
        ex.status, ex.decision, ex.reason = status, recorded, ex.reason or code
        if recorded == "denied":
            ex.response = None
        elif ex.endpoint in wire.GENERATION:
            ex.response = {"error": message}
        body = wire.error_body(ex.api, status, message, code, param)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-should-retry", b"false"),
            (b"x-ale-request-id", ex.request_id.encode()),
        ]
        if close:
            headers.append((b"connection", b"close"))
            agent.gone = True
        if agent.h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            agent.gone = True
            return
        ex.bytes_out += await agent.send(h11.Response(status_code=status, headers=headers), h11.Data(data=body))
        await agent.send(h11.EndOfMessage())

    # -- recording -------------------------------------------------------------------------------------

    def finish(self, ex: Exchange) -> None:
        """Record the request (and settle its budgets): exactly once per request."""
        self.counts["total"] += 1
        self.counts["allowed" if ex.decision == "allowed" else "denied"] += 1
        usage = ex.usage
        if ex.metered:
            if ex.ttfb is not None and not ex.complete and (ex.cut is not None or ex.reason in _CUT_SHORT):
                usage = self._estimated(ex)
            self.ledger.settle(ex.request_id, usage)
        messages, start, parent = self._messages(ex)
        self.log.write(
            "llm_request",
            request_id=ex.request_id,
            method=ex.method,
            upstream=ex.upstream.name if ex.upstream else None,
            host=ex.upstream.host_header if ex.upstream else None,
            path=ex.path,
            status=ex.status,
            decision=ex.decision,
            reason=ex.reason,
            model=ex.model,
            stream=ex.stream,
            bytes_in=ex.bytes_in,
            bytes_out=ex.bytes_out,
            duration_ms=round((time.monotonic() - ex.started) * 1000, 3),
            ttfb_ms=None if ex.ttfb is None else round(ex.ttfb * 1000, 3),
            usage=(usage or wire.Usage()).as_dict(),
            usage_source=ex.usage_source,
            messages=messages,
            messages_from=start,
            continues=parent,
            response=ex.response,
        )
        for name, used, limit in self.ledger.newly_exhausted():
            self._exhausted(name, used, limit)

    def _estimated(self, ex: Exchange) -> wire.Usage:
        """The usage of an exchange cut short: what the upstream said, with the output at least the
        live estimate and the input at least the body's size / 4 when the upstream said nothing."""
        reported = ex.usage or wire.Usage()
        ex.usage_source = "estimate"
        ex.usage = wire.Usage(
            reported.input_tokens or -(-ex.request_bytes // wire.CHARS_PER_TOKEN),
            max(reported.output_tokens, ex.estimate),
            reported.cached_input_tokens,
        )
        return ex.usage

    def _messages(self, ex: Exchange) -> tuple[list[Any], int, str | None]:
        if ex.body is None or ex.upstream is None or ex.endpoint not in wire.GENERATION:
            return [], 0, None
        messages = wire.visible_messages(ex.endpoint, ex.body)
        start, parent = self.conversations.new_messages((ex.upstream.name, ex.endpoint), ex.request_id, messages)
        return messages[start:], start, parent

    def _exhausted(self, name: str, used: int, limit: int) -> None:
        self.log.write("budget_exhausted", budget=name, used=used, limit=limit)

    # -- control ------------------------------------------------------------------------------------

    async def set_policy(self, policy: str, phase: str | None) -> None:
        """Open or close; closing cuts every exchange in flight and returns once each is recorded."""
        self.policy, self.phase = policy, phase
        self.log.write("policy_changed", policy=policy, phase=phase)
        if policy == "closed":
            for ex in self.cut_all("policy_closed"):
                await ex.ended.wait()

    def cut_all(self, reason: str) -> list[Exchange]:
        """Cut every exchange in flight (one whose response is complete only ends); the exchanges, to
        wait for. Each ends at once: a wait for its body or its upstream is cancelled, and its answer
        (the 403, the error event) waits at most :data:`CUT_WRITE_SECONDS` for the agent."""
        exchanges = list(self.in_flight.values())
        for ex in exchanges:
            if ex.cut is None and not ex.complete:
                ex.cut = reason
                if ex.read_scope is not None:
                    ex.read_scope.cancel()
            if ex.agent is not None:
                ex.agent.hurry(CUT_WRITE_SECONDS)
        return exchanges

    def summary(self) -> dict[str, Any]:
        return {
            "requests": dict(self.counts),
            "usage": {"input_tokens": self.ledger.input_tokens, "output_tokens": self.ledger.output_tokens},
            "cached_input_tokens": self.ledger.cached_input_tokens,
            "policy": self.policy,
            "phase": self.phase,
            "budgets": self.ledger.summary(),
        }

    def started(self) -> None:
        self.log.write(
            "gateway_started",
            upstreams=[u.describe() for u in self.config.upstreams],
            policy=self.policy,
            budgets=self.config.budgets.as_dict(),
        )

    def stopped(self) -> None:
        usage = {
            "input_tokens": self.ledger.input_tokens,
            "output_tokens": self.ledger.output_tokens,
            "cached_input_tokens": self.ledger.cached_input_tokens,
        }
        self.log.write("gateway_stopped", requests=dict(self.counts), usage=usage)

    async def close(self) -> None:
        for pool in self.pools.values():
            await pool.close()
        self.hangups.close()

    # -- the control socket -------------------------------------------------------------------------

    async def serve_control(self, stream: RawStream) -> None:
        agent = Agent(stream)
        try:
            with trio.move_on_after(READ_SECONDS):
                event = await agent.next_event(READ_SECONDS)
                if type(event) is h11.Request:
                    status, value = await self._control(agent, event)
                    body = orjson.dumps(value)
                    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                    await agent.send(h11.Response(status_code=status, headers=headers), h11.Data(data=body))
                    await agent.send(h11.EndOfMessage())
        except (AgentGone, h11.RemoteProtocolError, trio.TooSlowError):
            pass
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await _close(stream)

    async def _control(self, agent: Agent, request: h11.Request) -> tuple[int, dict[str, Any]]:
        parts: list[bytes] = []
        size = 0
        while type(event := await agent.next_event(READ_SECONDS)) is h11.Data:
            size += len(event.data)
            if size > 4096:
                return 413, {"error": "the body is larger than 4096 bytes"}
            parts.append(bytes(event.data))
        target = request.target.decode("ascii", "replace")
        if request.method == b"GET" and target == "/summary":
            return 200, self.summary()
        if request.method != b"POST" or target != "/policy":
            return 404, {"error": "the control socket answers POST /policy and GET /summary"}
        try:
            value = parse_json(b"".join(parts), what="policy request", max_bytes=4096)
        except ParseError as error:
            return 400, {"error": str(error)}
        policy, phase = (value.get("policy"), value.get("phase")) if type(value) is dict else (None, None)
        extra = set(value) - {"policy", "phase"} if type(value) is dict else set()
        if policy not in ("open", "closed") or extra or not (phase is None or _is_phase(phase)):
            return 400, {"error": 'expected {"policy": "open" | "closed", "phase": [a-z_]{1,32} (optional)}'}
        await self.set_policy(policy, phase)
        return 200, {"policy": self.policy, "phase": self.phase}


class _Cut(Exception):
    """The gateway ends the exchange (``Exchange.cut`` says why)."""


#: why an exchange whose response had begun ended early (its usage is then at least an estimate)
_CUT_SHORT: Final = frozenset({"client_disconnected", "upstream_failed", "upstream_timeout", "gateway_stopped"})
_CLOSED: Final = "the network is closed for this phase"
_BAD_CREDENTIALS: Final = "missing or wrong API key: use the placeholder key this sandbox was given"


def _is_phase(value: Any) -> bool:
    return type(value) is str and 1 <= len(value) <= 32 and all(c.islower() or c == "_" for c in value)


def _head_refusal(request: h11.Request, headers: dict[bytes, bytes]) -> tuple[int, str, str] | None:
    if len(request.target) + sum(len(k) + len(v) + 4 for k, v in request.headers) > MAX_HEADER_BYTES:
        return 431, "headers_too_large", f"the request head exceeds the gateway's limit of {MAX_HEADER_BYTES} bytes"
    length = headers.get(b"content-length")
    if length is not None and int(length) > MAX_BODY_BYTES:
        return 413, "body_too_large", _too_large(int(length))
    return None


def _too_large(size: int) -> str:
    return f"the request body ({size} bytes or more) exceeds the gateway's limit of {MAX_BODY_BYTES} bytes"


def _unknown(name: str, config: Config) -> str:
    names = ", ".join(f"/{u.name}/" for u in config.upstreams)
    shown = name if len(name) <= 64 else name[:64] + "..."
    return f"no upstream named {shown!r}: this gateway serves {names}"


def _failure(error: BaseException) -> str:
    return "upstream_timeout" if isinstance(error, trio.TooSlowError) else "upstream_failed"


async def _drain(conn: Connection) -> None:
    with trio.move_on_after(10):
        try:
            size = 0
            while (piece := await conn.piece()) is not None and size < MAX_PARSED_RESPONSE:
                size += len(piece[0])
        except UpstreamError:
            pass


def _hung_up(agent: Agent, ex: Exchange, scope: trio.CancelScope) -> None:
    """The agent's connection closed (or broke): the exchange is cancelled at once unless its
    response is already complete (data the agent sent meanwhile stays for its next request)."""
    agent.gone = True
    if not ex.complete:
        scope.cancel()


def _raise_if_cancelled(ex: Exchange, scope: trio.CancelScope) -> None:
    """After an exchange's wait for its upstream: _Cut if the gateway cut it, TooSlowError if the
    upstream went silent for its timeout."""
    if scope.cancelled_caught:
        raise _Cut if ex.cut is not None else trio.TooSlowError


class _Out:
    """Bytes waiting to go to the agent, and how many of them are body bytes."""

    __slots__ = ("body", "parts")

    def __init__(self, first: bytes) -> None:
        self.parts = [first] if first else []
        self.body = 0

    def add(self, data: bytes, body: int) -> None:
        if data:
            self.parts.append(data)
        self.body += body

    def take(self, ex: Exchange) -> bytes:
        """All of it, counted as sent on ``ex``."""
        data = b"".join(self.parts)
        ex.bytes_out += self.body
        self.parts, self.body = [], 0
        return data


async def _close(stream: RawStream) -> None:
    with contextlib.suppress(*_AGENT_ERRORS):
        await stream.aclose()
