"""What the gateway records: the messages new since an earlier request, and lines within the caps.

Agents send a conversation's whole history with every request, so recording each request's
messages would grow the log quadratically. :class:`Conversations` remembers, per (upstream,
endpoint), the message digests of the last :data:`MAX_CONVERSATIONS` distinct conversations; a
request that continues one of them (its messages start with that conversation's, up to some
point) records only the messages past the longest such common prefix, with ``messages_from`` (the
index of its first recorded message) and ``continues`` (the request_id of the request it
continues). Each message of a conversation is thus recorded once; a conversation that rewrites its
history (a compaction, an edit) records its messages from the first one that changed.

:func:`fit_line` makes one JSON line within :data:`LINE_BYTES`: strings cut (with
:func:`ale.runner.recorder.clip_text`) to :data:`STRING_BYTES`, then tighter caps, then as many
messages as fit, with ``messages_cut`` saying how many were left out. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from ale.gateway.wire import MAX_BODY_DEPTH
from ale.runner.recorder import clip_text

KIB = 1024
STRING_BYTES: Final = 64 * KIB
LINE_BYTES: Final = 256 * KIB
#: the tighter string caps tried, in order, when a line is still too long
_TIGHTER: Final = (16 * KIB, 4 * KIB, 1 * KIB, 256)
#: containers nested deeper than this in an event's data are replaced by a note: a safety net, since
#: the messages a record holds come from bodies parsed with at most MAX_BODY_DEPTH levels, which
#: leaves room for the record's own (so a short line needs no walk at all)
MAX_DATA_DEPTH: Final = 56
assert MAX_BODY_DEPTH + 4 <= MAX_DATA_DEPTH
MAX_CONVERSATIONS: Final = 64


def digest(message: Any) -> bytes:
    return hashlib.blake2b(orjson.dumps(message), digest_size=16).digest()


def _common(old: Sequence[bytes], new: Sequence[bytes]) -> int:
    """The length of the longest common prefix (list slices compare in C: O(n log n) at worst)."""
    if new[: len(old)] == old:
        return len(old)
    low, high = 0, min(len(old), len(new))
    while low < high:
        middle = (low + high + 1) // 2
        if old[:middle] == new[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


class Conversations:
    """The recent conversations of each (upstream, endpoint), by their messages' digests."""

    def __init__(self, limit: int = MAX_CONVERSATIONS) -> None:
        self._limit = limit
        self._seen: dict[tuple[str, str], OrderedDict[str, list[bytes]]] = {}

    def new_messages(self, where: tuple[str, str], request_id: str, messages: Sequence[Any]) -> tuple[int, str | None]:
        """(index of the first message to record, request_id of the request this one continues)."""
        digests = [digest(m) for m in messages]
        recent = self._seen.setdefault(where, OrderedDict())
        best, parent = 0, None
        for earlier, seen in recent.items():
            common = _common(seen, digests)
            if common > best:
                best, parent = common, earlier
        if parent is not None and best == len(recent[parent]):
            del recent[parent]  # continued as it was: this request stands for it from now on
        recent[request_id] = digests
        while len(recent) > self._limit:
            recent.popitem(last=False)
        return best, parent


def _redacted(text: str, redact: Sequence[str]) -> str:
    for secret in redact:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


REDACTED: Final = "[redacted]"


def clip(value: Any, limit: int, redact: Sequence[str] = (), depth: int = 1) -> Any:
    """``value`` with every ``redact`` string replaced by ``[redacted]``, then every string cut
    to ``limit`` UTF-8 bytes, and containers nested past :data:`MAX_DATA_DEPTH` replaced by a note."""
    kind = type(value)
    if kind is str:
        return clip_text(_redacted(value, redact) if redact else value, limit)
    if kind is not dict and kind is not list:
        return value
    if depth > MAX_DATA_DEPTH:
        return f"... [nested deeper than {MAX_DATA_DEPTH} levels: cut]"
    if kind is list:
        return [clip(item, limit, redact, depth + 1) for item in value]
    return {clip(str(key), 256, redact): clip(item, limit, redact, depth + 1) for key, item in value.items()}


def fit_line(record: Mapping[str, Any], redact: Sequence[str] = ()) -> bytes:
    """One JSON line (with its newline) for ``record``, within :data:`LINE_BYTES`; every
    occurrence of a ``redact`` string replaced by ``[redacted]`` (before any string is cut, so no
    part of one is left either)."""
    escaped = [orjson.dumps(s)[1:-1] for s in redact]
    line = orjson.dumps(record)
    if len(line) <= STRING_BYTES:  # no string in it can be over the cap, nor nest too deep (see above)
        return _redact_line(line, escaped) + b"\n"
    for limit in (STRING_BYTES, *_TIGHTER):
        line = _line(clip(record, limit, redact), escaped)
        if len(line) <= LINE_BYTES:
            return line
    smallest = clip(record, _TIGHTER[-1], redact)
    messages = smallest.get("messages")
    if type(messages) is list:
        low, high = 0, len(messages)
        while low < high:  # the most messages that fit
            middle = (low + high + 1) // 2
            if len(_line({**smallest, "messages": messages[:middle], "messages_cut": 0}, escaped)) <= LINE_BYTES:
                low = middle
            else:
                high = middle - 1
        smallest = {**smallest, "messages": messages[:low], "messages_cut": len(messages) - low}
        line = _line(smallest, escaped)
        if len(line) <= LINE_BYTES:
            return line
    note = {"truncated": True, "original_bytes": len(line)}
    kept = {k: v for k, v in smallest.items() if k not in ("messages", "response")}
    return _line({**kept, "messages": [], "response": note}, escaped)


def _redact_line(line: bytes, redact: Sequence[bytes]) -> bytes:
    for secret in redact:
        if secret in line:
            line = line.replace(secret, b"[redacted]")
    return line


def _line(record: Mapping[str, Any], redact: Sequence[bytes]) -> bytes:
    return _redact_line(orjson.dumps(record), redact) + b"\n"
