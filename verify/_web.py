"""What every route module shares: the app's state, the API's errors, authentication.

The state lives on the app (``app.extensions``), not in closures, so each blueprint is a plain
module: :func:`state` gives the running app's :class:`AppState`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterable
from functools import wraps
from typing import Any, TypeVar

import attrs
from quart import Response, current_app, jsonify, request, session

from ale_verify import db
from ale_verify.config import Settings
from ale_verify.judge_worker import JudgeWorker
from ale_verify.pipeline import ELEVATION_FIELDS
from ale_verify.workers import Admission, UploadPool

T = TypeVar("T")
View = Callable[..., Awaitable[Any]]

STATE_KEY = "ale_verify"
#: An identifier in a path (a submission id, a runner key id): anything else names nothing.
PATH_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: The longest ``Authorization`` header read as a bearer token; a longer one is no token.
MAX_AUTHORIZATION = 512


@attrs.frozen(repr=False)
class AppState:
    """What the routes need: the settings, the site's keys, the uploads' admission and workers."""

    settings: Settings
    signing_key: bytes
    recipient: str  # the site's age public key
    admission: Admission
    pool: UploadPool | None  # None: uploads are checked in the server's own process
    judge_worker: JudgeWorker | None = None  # with a judge configured (ale_verify.judge_worker)

    def __repr__(self) -> str:  # never print the signing key, even by accident
        return f"AppState({self.settings!r}, recipient={self.recipient})"


def state() -> AppState:
    """The running app's state (inside a request or a serving hook)."""
    found: AppState = current_app.extensions[STATE_KEY]
    return found


class ApiError(Exception):
    """An answer with a status and a stable reason code; the app turns it into the JSON error."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def error_response(status: int, reason: str, message: str) -> Response:
    response = jsonify({"error": {"reason": reason, "message": message}})
    response.status_code = status
    return response


async def run_db(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Blocking work (the database, decryption, checks) in a thread, off the event loop."""
    return await asyncio.to_thread(fn, *args, **kwargs)


def refuse_fields(names: Iterable[str], *, allowed: Iterable[str] = (), what: str = "fields") -> None:
    """400 for a field the request may not carry: ``self_elevation`` for a level claim (levels are
    the verifier's), ``unknown_field`` for anything else not in ``allowed``."""
    unknown = set(names) - set(allowed)
    if unknown & ELEVATION_FIELDS:
        raise ApiError(400, "self_elevation", "levels are assigned by the verifier, not by requests")
    if unknown:
        shown = ", ".join(sorted(name[:64] for name in unknown)[:10])
        raise ApiError(400, "unknown_field", f"unknown {what}: {shown}")


def check_path_ids(_endpoint: str | None, values: dict[str, Any] | None) -> None:
    """Every path parameter is an identifier (:data:`PATH_ID`); any other value names nothing, so
    404 before any lookup, whatever its length or characters (``../``, NUL, unicode)."""
    for value in (values or {}).values():
        if not isinstance(value, str) or PATH_ID.fullmatch(value) is None:
            raise ApiError(404, "not_found", "no such resource")


async def _current_user() -> str | None:
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer ") and len(header) < MAX_AUTHORIZATION:
        user: str | None = await run_db(db.user_for_token, state().settings.database, header[7:].strip())
        return user
    return session.get("user") or None


def authenticated(fn: View) -> View:
    """The view gets the user (an API token or the login session) first; 401 without one."""

    @wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        user = await _current_user()
        if user is None:
            raise ApiError(401, "unauthenticated", "log in (GitHub) or send an API token: Authorization: Bearer ...")
        return await fn(user, *args, **kwargs)

    return wrapper


def operator(fn: View) -> View:
    """:func:`authenticated`, and the user is one of the site's operators (403 otherwise)."""

    @authenticated
    @wraps(fn)
    async def wrapper(user: str, *args: Any, **kwargs: Any) -> Any:
        if user not in state().settings.operators:
            raise ApiError(403, "forbidden", "this operation is for the site's operators")
        return await fn(user, *args, **kwargs)

    return wrapper
