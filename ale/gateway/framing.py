"""HTTP/1.1 to an upstream, as bytes (RFC 9112): the request head, the response head, the response
body decoded as its bytes arrive. Pure: no I/O.

:func:`request_head` writes the request head, :func:`parse_response_head` reads the response's (the
checks h11 makes), and :class:`BodyDecoder` the body:
chunked, a ``content-length``, or (without either) up to the connection's end. Each
:meth:`BodyDecoder.feed` gives back the body bytes the piece held and whether the piece was exactly
whole chunks (so a stream whose framing the agent gets unchanged can pass those bytes on as they came,
without re-framing). Anything that is not valid framing raises :class:`FramingError`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

import attrs

CHUNKED, LENGTH, CLOSE = "chunked", "length", "close"
#: a chunk-size line (with any extensions and trailing whitespace) is at most this long
MAX_LINE: Final = 1024
#: the trailer section after the last chunk is at most this long
MAX_TRAILERS: Final = 64 * 1024
_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})(;[^\r\n]*)?[ \t]*")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
# states of a chunked body
_SIZE_LINE, _DATA, _DATA_END, _TRAILERS, _DONE = range(5)


class FramingError(Exception):
    """The body's framing is broken (the message says how)."""


class BodyDecoder:
    """One response body's framing. ``done`` once the body is complete; ``extra`` holds any bytes
    that came after its end (a connection holding them is not reused)."""

    def __init__(self, framing: str, length: int = 0) -> None:
        self.framing = framing
        self.done = framing == LENGTH and length == 0
        self.extra = b""
        self._left = length  # LENGTH: bytes still to come; CHUNKED: bytes left of the current chunk
        self._state = _SIZE_LINE
        self._carry = b""  # CHUNKED: an unfinished line (a size line, a chunk's CRLF, the trailers)
        self._plain = False  # CHUNKED: the piece being fed is whole plain chunks so far

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """(the body bytes ``data`` held, whether ``data`` was exactly whole chunks, none the last)."""
        if self.done:
            self.extra += data
            return b"", False
        if self.framing == CLOSE:
            return data, False
        if self.framing == LENGTH:
            if len(data) < self._left:
                self._left -= len(data)
                return data, False
            body, self.extra, self._left, self.done = data[: self._left], data[self._left :], 0, True
            return body, False
        return self._chunked(data)

    def eof(self) -> None:
        """The connection ended: fine for a body framed by it, else :class:`FramingError`."""
        if self.framing == CLOSE:
            self.done = True
        elif not self.done:
            raise FramingError("the connection closed before the end of the body")

    def _chunked(self, data: bytes) -> tuple[bytes, bool]:
        self._plain = self._state == _SIZE_LINE and not self._carry
        if self._plain:  # the usual piece: one whole chunk, nothing else
            line_end = data.find(b"\r\n", 0, MAX_LINE)
            if line_end > 0 and _HEX.fullmatch(data, 0, line_end) and data.endswith(b"\r\n"):
                size = int(data[:line_end], 16)
                if size and line_end + size + 4 == len(data):
                    return data[line_end + 2 : -2], True
        if self._carry:
            data, self._carry = self._carry + data, b""
        out: list[bytes] = []
        pos = 0
        while 0 <= pos < len(data):
            pos = self._step(data, pos, out)
        aligned = self._plain and pos >= 0 and self._state == _SIZE_LINE and bool(out)
        return b"".join(out), aligned

    def _step(self, data: bytes, pos: int, out: list[bytes]) -> int:
        """Decode from ``pos`` in the current state; where the next step starts (-1: the rest is
        kept until more comes). ``_plain`` turns False at a chunk extension or the last chunk."""
        state = self._state
        if state == _DATA:
            take = min(self._left, len(data) - pos)
            out.append(data[pos : pos + take])
            self._left -= take
            if not self._left:
                self._state = _DATA_END
            return pos + take
        if state == _SIZE_LINE:
            return self._size_line(data, pos)
        if state == _DATA_END:
            if len(data) - pos < 2:
                self._keep(data[pos:], 2, "a chunk's end")
                return -1
            if data[pos : pos + 2] != b"\r\n":
                raise FramingError("a chunk is longer than its size says")
            self._state = _SIZE_LINE
            return pos + 2
        return self._trailers(data, pos)

    def _size_line(self, data: bytes, pos: int) -> int:
        line_end = data.find(b"\r\n", pos)
        if line_end < 0:
            self._keep(data[pos:], MAX_LINE, "a chunk size line")
            return -1
        match = _SIZE.fullmatch(data, pos, line_end)
        if match is None or line_end - pos > MAX_LINE:
            raise FramingError("a malformed chunk size line")
        self._left = int(match[1], 16)
        self._state = _DATA if self._left else _TRAILERS
        self._plain = self._plain and self._left > 0 and line_end - pos == len(match[1])
        return line_end + 2

    def _trailers(self, data: bytes, pos: int) -> int:
        if data.startswith(b"\r\n", pos):
            end = pos + 2
        else:
            found = data.find(b"\r\n\r\n", pos)
            if found < 0:
                self._keep(data[pos:], MAX_TRAILERS, "the trailers")
                return -1
            end = found + 4
        self._state, self.done, self.extra = _DONE, True, data[end:]
        return len(data)

    def _keep(self, rest: bytes, limit: int, what: str) -> None:
        if len(rest) > limit:
            raise FramingError(f"{what} is longer than {limit} bytes")
        self._carry = rest


# -- the response head -----------------------------------------------------------------------------------

#: the response head is at most this long (status line and header lines)
MAX_HEAD: Final = 256 * 1024
# as h11 reads them (RFC 9110/9112): a status line, header lines, a blank line (CRLF or a bare LF)
_STATUS_LINE = re.compile(rb"HTTP/([0-9]\.[0-9]) ([0-9]{3})(?: ((?:[ \t]|[^\x00\s])*))?")
_FIELD = re.compile(rb"([-!#$%&'*+.^_`|~0-9a-zA-Z]+):[ \t]*((?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?)[ \t]*")
_HEAD_END = re.compile(rb"\n\r?\n")
_UNSAFE = re.compile(r"[\r\n\x00]")


@attrs.frozen
class ResponseHead:
    """A response's status line and headers (names lower-cased, in order)."""

    status_code: int
    reason: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    http_version: bytes


def head_end(buffer: bytes, start: int = 0) -> int:
    """Where the head in ``buffer`` ends (after its blank line), searching from ``start``; -1: not yet."""
    match = _HEAD_END.search(buffer, start)
    return -1 if match is None else match.end()


def parse_response_head(head: bytes) -> ResponseHead:
    """A response head (up to and with its blank line), strictly: FramingError for anything else
    (a folded header line, a transfer-coding other than chunked, conflicting lengths, ...)."""
    lines = [line[:-1] if line.endswith(b"\r") else line for line in head.split(b"\n")]
    while lines and not lines[-1]:
        lines.pop()
    status = _STATUS_LINE.fullmatch(lines[0]) if lines else None
    if status is None:
        raise FramingError("a malformed status line")
    headers = []
    for line in lines[1:]:
        field = _FIELD.fullmatch(line)
        if field is None:
            raise FramingError("a malformed header line")
        headers.append((field[1].lower(), field[2]))
    version, code = status[1], int(status[2])
    _check_framing(version, headers)
    return ResponseHead(code, status[3] or b"", tuple(headers), version)


def _check_framing(version: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    lengths = {v.strip() for name, value in headers if name == b"content-length" for v in value.split(b",")}
    if len(lengths) > 1:
        raise FramingError("conflicting content-length headers")
    if lengths and not next(iter(lengths)).isdigit():
        raise FramingError("a malformed content-length")
    codings = [value for name, value in headers if name == b"transfer-encoding"]
    if codings and (len(codings) > 1 or codings[0].lower() != b"chunked" or version == b"1.0"):
        raise FramingError("a transfer-coding other than chunked")


def request_head(method: str, target: str, headers: Sequence[tuple[str, str]]) -> bytes:
    """An HTTP/1.1 request head; FramingError if any part of it would break the framing."""
    parts = [f"{method} {target} HTTP/1.1\r\n", *(f"{name}: {value}\r\n" for name, value in headers), "\r\n"]
    if _UNSAFE.search(method + target + "".join(name + value for name, value in headers)):
        raise FramingError("a request line or header holds a line break or a NUL")
    return "".join(parts).encode("latin-1")
