"""Sockets for the gateway's hot path: a Trio stream that waits only when the kernel says it must.

:class:`RawStream` is a :class:`trio.abc.HalfCloseableStream` over a non-blocking stdlib socket:
``receive_some`` and ``send_all`` call ``recv`` and ``send`` directly and only park the task
(:func:`trio.lowlevel.wait_readable` / :func:`~trio.lowlevel.wait_writable`) when the socket would
block. Trio's own ``SocketStream`` passes through the scheduler once per operation even when it
need not wait (a checkpoint after every successful call, under two context managers); at thousands
of stream chunks a second that round trip was a large part of the gateway's cost. Fairness is kept
by a checkpoint before an operation that follows :data:`READY_RUN` in a row that did not wait, so a
busy connection cannot starve the others and a cancellation still arrives (before any byte moves).
After a ``recv`` that drained the socket (fewer bytes than asked for), the next one waits for
readability first instead of trying a ``recv`` that would fail with EAGAIN.

:func:`serve_raw` accepts on a listening socket and hands each connection to a handler as a
:class:`RawStream`. :func:`open_tcp` connects (Trio's happy eyeballs) and takes the socket over.
:class:`Hangups` tells when peers hang up, for every socket at once with one task (a task per
request to watch its agent's socket cost as much as the rest of the request's handling).
"""

from __future__ import annotations

import contextlib
import errno
import select
import socket
from collections.abc import Awaitable, Callable
from typing import Final

import trio
import trio.lowlevel

READ_BYTES: Final = 65536
#: operations in a row that found the socket ready before a checkpoint is taken anyway
READY_RUN: Final = 16
#: accept() errors that mean "out of resources for now": wait and retry (as trio.serve_listeners does)
_ACCEPT_RETRY: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
ACCEPT_RETRY_SECONDS: Final = 0.1


class RawStream(trio.abc.HalfCloseableStream):
    """A connected socket as a Trio stream, without a scheduler round trip per call."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.socket = sock
        self._closed = False
        self._drained = False  # the last recv emptied the socket: wait before the next
        self._ready = 0  # operations in a row that did not wait

    async def _turn(self) -> None:
        """At the start of an operation: after :data:`READY_RUN` in a row that did not wait, a
        checkpoint (the others run, a cancellation arrives) before any byte moves."""
        if self._ready >= READY_RUN:
            self._ready = 0
            await trio.lowlevel.checkpoint()

    def _broken(self, error: OSError) -> trio.BrokenResourceError | trio.ClosedResourceError:
        if self._closed:
            return trio.ClosedResourceError("the stream is closed")
        return trio.BrokenResourceError(f"the connection broke ({error.strerror or type(error).__name__})")

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        size = max_bytes or READ_BYTES
        sock = self.socket
        if self._drained:
            await self._wait_readable()
        else:
            await self._turn()
        while True:
            try:
                data = sock.recv(size)
                break
            except BlockingIOError:
                await self._wait_readable()
            except OSError as error:
                raise self._broken(error) from None
        self._drained = len(data) < size
        self._ready += 1
        return data

    async def _wait_readable(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        self._ready = 0
        await trio.lowlevel.wait_readable(self.socket)

    def send_nowait(self, data: bytes | bytearray | memoryview) -> memoryview | None:
        """Send what the socket takes now; what is left (None: everything went)."""
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        try:
            sent = self.socket.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as error:
            raise self._broken(error) from None
        return None if sent == len(data) else memoryview(data)[sent:]

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            await trio.lowlevel.checkpoint()
            return
        await self._turn()
        rest = self.send_nowait(data)
        self._ready += 1
        if rest is not None:
            await self.send_rest(rest)

    async def send_rest(self, rest: memoryview) -> None:
        """Send ``rest`` (what :meth:`send_nowait` left), waiting for the socket as it must."""
        self._ready = 0
        while rest:
            await trio.lowlevel.wait_writable(self.socket)
            left = self.send_nowait(rest)
            if left is None:
                return
            rest = left

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.wait_writable(self.socket)

    async def send_eof(self) -> None:
        try:
            self.socket.shutdown(socket.SHUT_WR)
        except OSError as error:
            raise self._broken(error) from None
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            trio.lowlevel.notify_closing(self.socket)
            self.socket.close()


async def open_tcp(host: str, port: int) -> RawStream:
    """A TCP connection (Trio's ``open_tcp_stream``: happy eyeballs, TCP_NODELAY) as a RawStream."""
    stream = await trio.open_tcp_stream(host, port)
    try:
        fd = stream.socket.detach()
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return RawStream(socket.socket(fileno=fd))


async def serve_raw(
    listener: socket.socket, handler: Callable[[RawStream], Awaitable[None]], nursery: trio.Nursery
) -> None:
    """Accept connections on ``listener`` for ever, each handled by ``handler`` in ``nursery``."""
    listener.setblocking(False)
    while True:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            await trio.lowlevel.wait_readable(listener)
            continue
        except OSError as error:
            if error.errno not in _ACCEPT_RETRY:
                raise
            await trio.sleep(ACCEPT_RETRY_SECONDS)
            continue
        nursery.start_soon(handler, RawStream(conn))


class Hangups:
    """One task that learns when the peer of any registered socket hangs up (closes its side, or
    the connection breaks: ``EPOLLRDHUP``, ``EPOLLHUP``, ``EPOLLERR``), for all of them at once: an
    epoll set of its own, waited on through Trio. What the peer sends meanwhile stays unread in the
    socket. Each registration is reported once, then forgotten."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._callbacks: dict[int, Callable[[], object]] = {}

    def add(self, sock: socket.socket, callback: Callable[[], object]) -> None:
        fd = sock.fileno()
        self._epoll.register(fd, select.EPOLLRDHUP)
        self._callbacks[fd] = callback

    def remove(self, sock: socket.socket) -> None:
        fd = sock.fileno()
        if self._callbacks.pop(fd, None) is not None:
            with contextlib.suppress(OSError):
                self._epoll.unregister(fd)

    async def run(self) -> None:
        while True:
            await trio.lowlevel.wait_readable(self._epoll.fileno())
            for fd, _events in self._epoll.poll(0):
                callback = self._callbacks.pop(fd, None)
                with contextlib.suppress(OSError):
                    self._epoll.unregister(fd)
                if callback is not None:
                    callback()

    def close(self) -> None:
        self._epoll.close()
