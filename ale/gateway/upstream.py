"""HTTP/1.1 to the upstreams: heads written and read, the body decoded as it arrives, by
:mod:`ale.gateway.framing`, over :class:`~ale.gateway.transport.RawStream` sockets; TLS with
verification, a keep-alive pool.

One :class:`Pool` per upstream keeps idle connections (at most :data:`MAX_IDLE`, each for at most
:data:`IDLE_SECONDS`). https connections verify the certificate chain against the system's CAs
(or the upstream's ``ca_file`` only) and the host name; plain http is only ever configured for a
loopback host (``ale.gateway.config``). A request on a reused connection that fails before any
byte of the response arrived (the server closed an idle connection) is sent once more on a new one.
"""

from __future__ import annotations

import contextlib
import ssl
import time
from collections.abc import Sequence
from typing import Final

import trio

from ale.gateway.config import Upstream
from ale.gateway.framing import (
    CHUNKED,
    CLOSE,
    LENGTH,
    MAX_HEAD,
    BodyDecoder,
    FramingError,
    ResponseHead,
    head_end,
    parse_response_head,
    request_head,
)
from ale.gateway.transport import READ_BYTES, open_tcp

MAX_IDLE: Final = 256
IDLE_SECONDS: Final = 30.0
CONNECT_SECONDS: Final = 30.0


class UpstreamError(Exception):
    """The upstream could not be reached or broke the exchange (a short reason, never a key)."""


class Connection:
    """One connection to an upstream: HTTP/1.1 as :mod:`ale.gateway.framing` writes and reads it,
    the body read piece by piece as it arrives."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.idle_since = time.monotonic()
        self.reused = False
        self.received = 0  # bytes of the current response so far
        self.body: BodyDecoder | None = None
        self._buffered = b""  # body bytes that came with the head
        self._keep_alive = False

    async def response_head(self, method: str) -> ResponseHead:
        """The response's head (informational 1xx ones skipped); the body is read after it."""
        buffer = b""
        while True:
            end = head_end(buffer)
            while end < 0:
                if len(buffer) > MAX_HEAD:
                    raise UpstreamError(f"the upstream's response head is over {MAX_HEAD} bytes")
                data = await self._receive()
                if not data:
                    raise UpstreamError("the upstream closed the connection before answering")
                self.received += len(data)
                start, buffer = max(0, len(buffer) - 2), buffer + data
                end = head_end(buffer, start)
            try:
                head = parse_response_head(buffer[:end])
            except FramingError as error:
                raise UpstreamError(f"the upstream broke HTTP ({error})") from None
            buffer = buffer[end:]
            if not 100 <= head.status_code < 200:
                self.start_body(method, head, buffer)
                return head
            if head.status_code == 101:
                raise UpstreamError("the upstream broke HTTP (it switched protocols)")

    async def _receive(self) -> bytes:
        try:
            data = await self.stream.receive_some(READ_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError) as error:
            raise UpstreamError(f"the connection broke ({type(error).__name__})") from None
        return data if type(data) is bytes else bytes(data)

    async def send(self, data: bytes) -> None:
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError) as error:
            raise UpstreamError(f"the connection broke ({type(error).__name__})") from None

    def start_body(self, method: str, response: ResponseHead, buffered: bytes) -> None:
        """Read the body of ``response`` (to a ``method`` request) from here on with its framing
        (``buffered``: what came after the head)."""
        framing, length = body_framing(method, response)
        self.body = BodyDecoder(framing, length)
        self._buffered = buffered
        connection = b",".join(v for k, v in response.headers if k == b"connection").lower()
        self._keep_alive = framing != CLOSE and response.http_version == b"1.1" and b"close" not in connection

    @property
    def ready(self) -> bool:
        """Whether :meth:`piece` has its answer without waiting (bytes that came with the head, or the end)."""
        return bool(self._buffered) or (self.body is not None and self.body.done)

    async def piece(self) -> tuple[bytes, bytes | None] | None:
        """The body's next piece as it arrives: (its bytes, the bytes as received when they were
        exactly whole chunks, else None); None at the body's end; UpstreamError if it breaks."""
        body = self.body
        assert body is not None, "start_body first"
        while not body.done:
            if self._buffered:
                data, self._buffered = self._buffered, b""
            else:
                data = await self._receive()
                if not data:
                    try:
                        body.eof()
                    except FramingError:
                        raise UpstreamError("the upstream closed the connection mid-response") from None
                    return None
            self.received += len(data)
            try:
                payload, aligned = body.feed(data)
            except FramingError as error:
                raise UpstreamError(f"the upstream broke HTTP ({error})") from None
            if payload:
                return payload, data if aligned else None
        return None

    def reusable(self) -> bool:
        body = self.body
        return body is not None and body.done and not body.extra and not self._buffered and self._keep_alive

    def reset(self) -> None:
        """Ready for the next request (after a body read to its end on a reusable connection)."""
        self.body, self._keep_alive = None, False
        self.idle_since, self.reused, self.received = time.monotonic(), False, 0

    async def aclose(self) -> None:
        with trio.move_on_after(1) as scope:
            scope.shield = True
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
                await self.stream.aclose()


def body_framing(method: str, response: ResponseHead) -> tuple[str, int]:
    """How a response's body is framed (RFC 9112 section 6.3; :func:`parse_response_head` has
    refused a transfer-coding other than chunked and a malformed or conflicting content-length)."""
    status = response.status_code
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return LENGTH, 0
    length: int | None = None
    for name, value in response.headers:
        if name == b"transfer-encoding":
            return CHUNKED, 0
        if name == b"content-length":
            length = int(value.split(b",")[0])
    return (CLOSE, 0) if length is None else (LENGTH, length)


class Pool:
    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self._idle: list[Connection] = []
        self._tls: ssl.SSLContext | None = None
        if upstream.tls:
            self._tls = ssl.create_default_context(cafile=upstream.ca_file)
            self._tls.set_alpn_protocols(["http/1.1"])

    async def _connect(self) -> Connection:
        upstream = self.upstream
        try:
            with trio.fail_after(CONNECT_SECONDS):
                stream: trio.abc.Stream = await open_tcp(upstream.host, upstream.port)
                if self._tls is not None:
                    tls = trio.SSLStream(stream, self._tls, server_hostname=upstream.host, https_compatible=True)
                    await tls.do_handshake()
                    stream = tls
        except trio.TooSlowError:
            raise UpstreamError(f"connecting to {upstream.host_header} timed out") from None
        except (OSError, ssl.SSLError, trio.BrokenResourceError) as error:
            cause = error.__cause__ if isinstance(error, trio.BrokenResourceError) else error
            if isinstance(cause, ssl.SSLCertVerificationError):
                reason = cause.verify_message or cause.reason or "unverified"
                raise UpstreamError(
                    f"the certificate of {upstream.host_header} failed verification: {reason}"
                ) from None
            raise UpstreamError(f"cannot connect to {upstream.host_header} ({type(cause).__name__})") from None
        return Connection(stream)

    async def acquire(self) -> Connection:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since < IDLE_SECONDS:
                conn.reused = True
                return conn
            await conn.aclose()
        return await self._connect()

    async def release(self, conn: Connection) -> None:
        """Keep ``conn`` for the next request if its exchange ended cleanly, else close it."""
        if conn.reusable() and len(self._idle) < MAX_IDLE:
            conn.reset()
            self._idle.append(conn)
        else:
            await conn.aclose()

    async def close(self) -> None:
        while self._idle:
            await self._idle.pop().aclose()

    async def request(
        self, method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes
    ) -> tuple[Connection, ResponseHead]:
        """Send a request and read the response's head; the caller reads the body with
        :meth:`Connection.piece` and gives the connection back with :meth:`release` (or closes it)."""
        for attempt in (0, 1):
            conn = await self.acquire()
            try:
                return conn, await _exchange(conn, method, target, headers, body)
            except UpstreamError:
                await conn.aclose()
                if not (conn.reused and attempt == 0 and conn.received == 0):
                    raise
            except BaseException:
                await conn.aclose()
                raise
        raise AssertionError("unreachable")


async def _exchange(
    conn: Connection, method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes
) -> ResponseHead:
    try:
        head = request_head(method, target, headers)
    except FramingError as error:
        raise UpstreamError(f"the request could not be sent ({error})") from None
    await conn.send(head + body)
    return await conn.response_head(method)
