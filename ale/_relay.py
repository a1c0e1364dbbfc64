"""The sandbox's TCP relay to the gateway socket (docs/agent-contract.md, "The LLM gateway").

Agent SDKs and CLIs speak TCP (``OPENAI_BASE_URL=http://127.0.0.1:PORT/openai``); the sandbox's only
way out is a Unix socket (``/ale/gateway.sock``). A runtime starts the agent's command through this
module::

    python3 -I -m ale._relay PORT SOCKET -- COMMAND [ARG...]

It binds ``127.0.0.1:PORT`` in the sandbox's own network namespace, forks the relay (twice, so that
it is no child of the command) and then *execs* the command in its own process: the command keeps
the pid, the signals and the exit status it would have had without the relay. The relay accepts
connections on the port and splices each, byte for byte, to a new connection to SOCKET; it reads
nothing of what passes, so it can reach that socket and nothing else. It ignores SIGTERM, SIGINT and
SIGHUP (a runtime stopping the sandbox signals every process in it; the agent's grace period keeps
its LLM), and ends with the sandbox (its PID namespace), or within a second of the command's end
where there is none. One thread, one ``epoll``; every chunk is passed on as it arrives (no Nagle).

Standard library only: this module is part of the agent's environment (``ale.runner.agent_env``).
"""

from __future__ import annotations

import errno
import os
import selectors
import signal
import socket
import sys
import traceback
from collections.abc import Sequence

CHUNK = 256 * 1024  # most bytes read at once from one side
BACKLOG = 512
USAGE = "usage: python3 -m ale._relay PORT SOCKET -- COMMAND [ARG...]"
_GONE = (errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN, errno.ETIMEDOUT, errno.ECONNABORTED, errno.EHOSTUNREACH)


class _Side:
    """One socket of a spliced pair: what is still to be written to it, and whether its reading is over."""

    __slots__ = ("eof", "pending", "registered", "shut", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = b""  # read from the peer, not yet written here
        self.eof = False  # this side sent EOF (nothing more to read from it)
        self.shut = False  # the peer's EOF was passed on to this side (shutdown for writing)
        self.registered = 0  # the selector events it is registered for


class _Pair:
    __slots__ = ("a", "b")

    def __init__(self, a: _Side, b: _Side) -> None:
        self.a, self.b = a, b

    def peer(self, side: _Side) -> _Side:
        return self.b if side is self.a else self.a


class Relay:
    """Accepts on ``listener``, splices each connection to a new one to the Unix socket ``target``."""

    def __init__(self, listener: socket.socket, target: str) -> None:
        self.listener = listener
        self.target = target
        self.selector = selectors.DefaultSelector()
        listener.setblocking(False)
        self.selector.register(listener, selectors.EVENT_READ, None)

    def serve(self, alive: Sequence[int] = ()) -> None:
        """Relay until every pid in ``alive`` is gone (checked once a second), or forever."""
        while True:
            events = self.selector.select(timeout=1.0 if alive else None)
            for key, mask in events:
                if key.data is None:
                    self._accept()
                else:
                    self._ready(key.data, key.fileobj, mask)  # type: ignore[arg-type]
            if alive and not events and not any(_exists(pid) for pid in alive):
                return

    def _accept(self) -> None:
        for _ in range(64):  # a burst of connections without starving the open ones
            try:
                conn, _addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, say: the client sees its connection refused
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return
                raise
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(self.target)
            except OSError as exc:
                print(f"ale relay: cannot reach the gateway at {self.target}: {exc.strerror}", file=sys.stderr)
                upstream.close()
                conn.close()
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.setblocking(False)
            upstream.setblocking(False)
            pair = _Pair(_Side(conn), _Side(upstream))
            self._update(pair, pair.a)
            self._update(pair, pair.b)

    def _ready(self, pair: _Pair, sock: socket.socket, mask: int) -> None:
        side = pair.a if sock is pair.a.sock else pair.b
        try:
            if mask & selectors.EVENT_WRITE:
                self._flush(pair, side)
            if mask & selectors.EVENT_READ:
                self._read(pair, side)
        except OSError as exc:
            if exc.errno not in _GONE:
                print(f"ale relay: {exc}", file=sys.stderr)
            self._close(pair)
            return
        if pair.a.eof and pair.b.eof and not pair.a.pending and not pair.b.pending:
            self._close(pair)
            return
        self._update(pair, pair.a)
        self._update(pair, pair.b)

    def _read(self, pair: _Pair, side: _Side) -> None:
        peer = pair.peer(side)
        try:
            data = side.sock.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            side.eof = True
            self._pass_eof(peer)
            return
        try:
            sent = peer.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        if sent < len(data):
            peer.pending = data[sent:]  # read no more from this side until it is written

    def _flush(self, pair: _Pair, side: _Side) -> None:
        try:
            sent = side.sock.send(side.pending)
        except (BlockingIOError, InterruptedError):
            return
        side.pending = side.pending[sent:]
        if not side.pending and pair.peer(side).eof:
            self._pass_eof(side)

    @staticmethod
    def _pass_eof(side: _Side) -> None:
        if side.pending or side.shut:
            return
        side.shut = True
        try:
            side.sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            if exc.errno not in _GONE:
                raise

    def _update(self, pair: _Pair, side: _Side) -> None:
        """Register ``side`` for what it waits for: reading (its peer has room), writing (it has data)."""
        peer = pair.peer(side)
        wanted = (0 if side.eof or peer.pending else selectors.EVENT_READ) | (
            selectors.EVENT_WRITE if side.pending else 0
        )
        if wanted == side.registered:
            return
        if not side.registered:
            self.selector.register(side.sock, wanted, pair)
        elif not wanted:
            self.selector.unregister(side.sock)
        else:
            self.selector.modify(side.sock, wanted, pair)
        side.registered = wanted

    def _close(self, pair: _Pair) -> None:
        for side in (pair.a, pair.b):
            if side.registered:
                self.selector.unregister(side.sock)
                side.registered = 0
            side.sock.close()


def _exists(pid: int) -> bool:
    """Whether ``pid`` still runs: a zombie (ended, not yet waited for) does not."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rpartition(b")")[2].split()[:1] not in ([b"Z"], [b"X"], [])
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")  # no such process, unless there is no /proc at all
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def listen(port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(BACKLOG)
    return listener


def _daemon(listener: socket.socket, target: str, command_pid: int) -> None:
    """The relay's own process (the grandchild): quiet, signal-proof, holding nothing of the command's."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    keep = listener.fileno()
    os.closerange(3, keep)  # the event channel and anything else inherited: the command's, not ours
    os.closerange(keep + 1, 1 << 16)
    Relay(listener, target).serve(alive=(command_pid,))


def main(argv: Sequence[str]) -> int:
    if len(argv) < 4 or argv[2] != "--" or not argv[0].isdigit():
        print(USAGE, file=sys.stderr)
        return 2
    port, target, command = int(argv[0]), argv[1], list(argv[3:])
    try:
        listener = listen(port)
    except OSError as exc:
        print(f"ale relay: cannot listen on 127.0.0.1:{port}: {exc.strerror}", file=sys.stderr)
        return 125
    command_pid = os.getpid()
    child = os.fork()
    if child == 0:  # the relay's processes (tested through the sandbox)
        try:
            if os.fork() == 0:
                _daemon(listener, target, command_pid)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    listener.close()  # the relay has its own copy; the command gets none
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # ignored by Python at start-up: the command's default
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"ale relay: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
