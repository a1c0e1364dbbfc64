"""Request bodies: read with a size cap, parsed by the project's one JSON parser, typed at once.

Each JSON body the API accepts is a frozen attrs class below. :func:`json_body` reads at most
:data:`MAX_JSON_BODY` bytes (413 past it, before reading when ``Content-Length`` says so), takes
``application/json`` only (415 for any other declared media type), parses with
:func:`ale.core.parse.parse_json` (depth at most :data:`MAX_JSON_DEPTH`; UTF-8, unique keys, safe
integers), refuses fields the class does not have (``self_elevation`` for level claims,
``unknown_field`` otherwise) and structures the object with the strict converter; every other
fault is a 400 ``bad_request`` that names it. Nothing a client sends reaches a view untyped.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
from quart import request

from ale.core.parse import JsonLimitError, ParseError, parse_json, structure
from ale_verify import db
from ale_verify._web import ApiError, refuse_fields

if TYPE_CHECKING:
    from attrs import AttrsInstance

T = TypeVar("T", bound="AttrsInstance")

#: Every valid body fits, even with each character of its strings written as a ``\\u`` escape.
MAX_JSON_BODY = 128 * 1024
#: The bodies are flat objects (depth 1); deeper nesting is refused before it is parsed.
MAX_JSON_DEPTH = 8
#: The longest text field (a reason, a label).
MAX_TEXT = 2000
JSON_MEDIA_TYPE = "application/json"
#: An upload's body is written to its file in pieces of about this much (what the server holds of it).
SPOOL_BLOCK = 1024 * 1024


def _text(_instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    if not value.strip() or len(value) > MAX_TEXT:
        raise ValueError(f"{attribute.name} must be a non-empty string (at most {MAX_TEXT} characters)")
    if "\x00" in value:  # no engine's text holds it the same way (PostgreSQL refuses it): ale_verify.db
        raise ValueError(f"{attribute.name} must not contain a NUL character")


def _kind(_instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    if value not in db.RUNNER_KINDS:
        raise ValueError(f"{attribute.name} is one of {', '.join(db.RUNNER_KINDS)}")


def _ed25519_public(_instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):  # not base64, or not ASCII at all
        raw = b""
    if len(raw) != 32:
        raise ValueError(f"{attribute.name} is a base64 raw Ed25519 public key (32 bytes)")


@attrs.frozen
class NoBody:
    """``POST /api/v1/challenges``: an empty body or ``{}``; the request carries nothing."""


@attrs.frozen
class LevelChange:
    """``POST .../audit`` and ``.../revoke``: why the operator changes the level."""

    reason: str = attrs.field(validator=_text)


@attrs.frozen
class RunnerKey:
    """``POST /api/v1/operator/runner-keys``: a trusted runner's public key."""

    public_key: str = attrs.field(validator=[_text, _ed25519_public])
    kind: str = attrs.field(validator=_kind)
    label: str = attrs.field(validator=_text)

    @property
    def raw(self) -> bytes:
        return base64.b64decode(self.public_key, validate=True)


@attrs.frozen
class JudgeKeyBody:
    """``POST /api/v1/operator/judge-keys``: a judging party's public key (its signed verdicts are credited)."""

    public_key: str = attrs.field(validator=[_text, _ed25519_public])
    label: str = attrs.field(validator=_text)

    @property
    def raw(self) -> bytes:
        return base64.b64decode(self.public_key, validate=True)


@attrs.frozen
class Revocation:
    """``POST /api/v1/operator/judge-keys/{key_id}/revoke``: why the operator revokes the key."""

    reason: str = attrs.field(validator=_text)


def check_media_type(*accepted: str) -> None:
    """415 unless the declared ``Content-Type`` is one of ``accepted`` (none declared is taken as
    the endpoint's own type; a ``charset`` parameter, if any, must be UTF-8)."""
    if not request.headers.get("Content-Type"):
        return
    charset = request.mimetype_params.get("charset", "utf-8").lower()
    if request.mimetype not in accepted or charset not in ("utf-8", "utf8"):
        raise ApiError(415, "unsupported_media_type", f"send the body as {' or '.join(accepted)} (UTF-8)")


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "too_large", f"the body limit of this endpoint is {limit} bytes")


def refuse_declared_over(limit: int) -> None:
    """413 at once when ``Content-Length`` declares more than ``limit`` bytes (nothing is read)."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise _too_large(limit)


async def read_capped(limit: int) -> bytes:
    """The whole body, or 413 as soon as it is known to exceed ``limit`` bytes (the declared
    ``Content-Length`` first, then while reading, so no more than ``limit`` bytes are ever held)."""
    refuse_declared_over(limit)
    received = bytearray()
    async for chunk in request.body:
        received += chunk
        if len(received) > limit:
            raise _too_large(limit)
    return bytes(received)


def new_spool(directory: Path) -> tuple[int, str]:
    """A new private file in ``directory`` for a body (blocking: its descriptor and name)."""
    return tempfile.mkstemp(prefix="upload-", suffix=".ale", dir=directory)


async def spool_in_thread(make: Callable[[], tuple[int, str] | None]) -> tuple[int, str] | None:
    """``make()`` in a thread (blocking: a :func:`new_spool`, after whatever comes first, or None).
    If the request is cancelled meanwhile (its client went away), the file made all the same is
    closed and removed."""
    task = asyncio.ensure_future(asyncio.to_thread(make))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_drop_spool)
        raise


def _drop_spool(task: asyncio.Future[tuple[int, str] | None]) -> None:
    if task.cancelled() or task.exception() is not None or (spool := task.result()) is None:
        return
    os.close(spool[0])
    _remove(spool[1])


async def spool_capped(limit: int, directory: Path, spool: tuple[int, str] | None = None) -> Path | None:
    """The whole body written to a new private file in ``directory`` (or ``spool``, one
    :func:`new_spool` made: its path; None for an empty body), or 413 as soon as it is known to
    exceed ``limit`` bytes. At most about :data:`SPOOL_BLOCK` bytes of it are held in memory; the
    file is deleted if anything fails."""
    if spool is None:
        refuse_declared_over(limit)
        spool = await spool_in_thread(functools.partial(new_spool, directory))
        assert spool is not None
    fd, name = spool
    path, size, pending = Path(name), 0, bytearray()
    try:
        refuse_declared_over(limit)
        async for chunk in request.body:
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            pending += chunk
            if len(pending) >= SPOOL_BLOCK:
                await asyncio.to_thread(_write_all, fd, bytes(pending))
                pending.clear()
        if pending:
            await asyncio.to_thread(_write_all, fd, bytes(pending))
    except BaseException:
        os.close(fd)
        _remove(name)
        raise
    os.close(fd)
    if size == 0:
        _remove(name)
        return None
    return path


def _remove(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def decode_body(raw: bytes, cls: type[T], *, empty_ok: bool = False) -> T:
    """``raw`` (already within the size cap) as a ``cls``, or the ApiError that says what is wrong."""
    if empty_ok and not raw.strip():
        raw = b"{}"
    try:
        data = parse_json(raw, what="the body", max_bytes=MAX_JSON_BODY, max_depth=MAX_JSON_DEPTH)
    except JsonLimitError as exc:
        raise (_too_large(MAX_JSON_BODY) if exc.limit == "size" else ApiError(400, "bad_request", str(exc))) from None
    except ParseError as exc:
        raise ApiError(400, "bad_request", f"{exc} (the body must be one JSON object)") from None
    if not isinstance(data, dict):
        raise ApiError(400, "bad_request", f"the body must be a JSON object, not {_json_type(data)}")
    refuse_fields(data, allowed=(a.name for a in attrs.fields(cls)), what="fields")
    try:
        return structure(data, cls, what="the body")
    except ParseError as exc:
        raise ApiError(400, "bad_request", str(exc)) from None


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return names.get(type(value), "null")


async def json_body(cls: type[T], *, empty_ok: bool = False) -> T:
    """The request's JSON body as a ``cls`` (see the module's docstring for every refusal)."""
    check_media_type(JSON_MEDIA_TYPE)
    return decode_body(await read_capped(MAX_JSON_BODY), cls, empty_ok=empty_ok)
