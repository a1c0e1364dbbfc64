"""HTTP/1.1 to the upstreams: h11 over Trio streams, TLS with verification, a keep-alive pool.

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
from typing import Any, Final

import h11
import trio

from ale.gateway.config import Upstream

MAX_IDLE: Final = 64
IDLE_SECONDS: Final = 30.0
CONNECT_SECONDS: Final = 30.0
READ_BYTES: Final = 65536
MAX_RESPONSE_HEADER_BYTES: Final = 256 * 1024


class UpstreamError(Exception):
    """The upstream could not be reached or broke the exchange (a short reason, never a key)."""


class Connection:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_RESPONSE_HEADER_BYTES)
        self.idle_since = time.monotonic()
        self.reused = False
        self.received = 0  # bytes of the current response so far

    async def next_event(self) -> Any:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            try:
                data = await self.stream.receive_some(READ_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError) as error:
                raise UpstreamError(f"the connection broke ({type(error).__name__})") from None
            self.received += len(data)
            self.h11.receive_data(bytes(data))

    async def send(self, data: bytes) -> None:
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError) as error:
            raise UpstreamError(f"the connection broke ({type(error).__name__})") from None

    def poll_chunk(self) -> bytes | None:
        """The body's next piece if h11 already holds it (None: the body's end), else :data:`WAIT`."""
        try:
            event = self.h11.next_event()
        except h11.RemoteProtocolError as error:
            raise UpstreamError(f"the upstream broke HTTP ({error})") from None
        if type(event) is h11.Data:
            return bytes(event.data)
        if type(event) is h11.EndOfMessage:
            return None
        if type(event) is h11.ConnectionClosed:
            raise UpstreamError("the upstream closed the connection mid-response")
        return WAIT

    def reusable(self) -> bool:
        return self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE

    async def aclose(self) -> None:
        with trio.move_on_after(1) as scope:
            scope.shield = True
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError):
                await self.stream.aclose()


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
                stream: trio.abc.Stream = await trio.open_tcp_stream(upstream.host, upstream.port)
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
            conn.h11.start_next_cycle()
            conn.idle_since, conn.reused, conn.received = time.monotonic(), False, 0
            self._idle.append(conn)
        else:
            await conn.aclose()

    async def close(self) -> None:
        while self._idle:
            await self._idle.pop().aclose()

    async def request(
        self, method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes
    ) -> tuple[Connection, h11.Response]:
        """Send a request and read the response's head; the caller reads the body with :func:`body`
        and gives the connection back with :meth:`release` (or closes it)."""
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
) -> h11.Response:
    try:
        head = conn.h11.send(h11.Request(method=method, target=target, headers=list(headers)))
        tail = conn.h11.send(h11.Data(data=body)) if body else b""
        end = conn.h11.send(h11.EndOfMessage())
    except h11.LocalProtocolError as error:
        raise UpstreamError(f"the request could not be sent ({error})") from None
    await conn.send(head + (tail or b"") + (end or b""))
    while True:
        try:
            event = await conn.next_event()
        except h11.RemoteProtocolError as error:
            raise UpstreamError(f"the upstream broke HTTP ({error})") from None
        if type(event) is h11.Response:
            return event
        if type(event) is h11.ConnectionClosed:
            raise UpstreamError("the upstream closed the connection before answering")
        # h11.InformationalResponse (100 Continue, ...): skipped


#: :meth:`Connection.poll_chunk`'s answer when nothing is buffered
WAIT: Final = b"<wait>"


async def next_chunk(conn: Connection) -> bytes | None:
    """The next piece of the response body as it arrives (None at its end; an :class:`UpstreamError`
    if it breaks)."""
    while True:
        try:
            event = await conn.next_event()
        except h11.RemoteProtocolError as error:
            raise UpstreamError(f"the upstream broke HTTP ({error})") from None
        if type(event) is h11.Data:
            return bytes(event.data)
        if type(event) is h11.EndOfMessage:
            return None
        if type(event) is h11.ConnectionClosed:
            raise UpstreamError("the upstream closed the connection mid-response")
