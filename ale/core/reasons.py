"""The verifier's vocabulary: every reason code and every verification level, once.

:class:`Reason` is what a refused upload, a note on an accepted one, or a refused request says
(stored in the database, returned by the API, printed by ``ale inspect``); :class:`Level` is what
the backend assigns. The pipeline, the database (``verify/db.py`` loads both into tables that
its triggers check every row against), the OpenAPI document and ``docs/verifier.md`` all take
them from here; :data:`REASONS` and :data:`LEVELS` say what each one means, and
:func:`reasons_table` / :func:`levels_table` are the tables the docs hold.

:class:`VerificationError` is the one failure of a bundle check: anything else a check raises is
the verifier's bug, never the uploader's.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs


class Reason(enum.StrEnum):
    """A stable reason code (the value is what is stored and returned)."""

    # receiving
    TOO_LARGE = "too_large"
    EMPTY_UPLOAD = "empty_upload"
    # age
    NOT_AGE = "not_age"
    BAD_AGE_HEADER = "bad_age_header"
    TOO_MANY_STANZAS = "too_many_stanzas"
    DECRYPT_FAILED = "decrypt_failed"
    # zstd
    BAD_ZSTD = "bad_zstd"
    TRUNCATED_ZSTD = "truncated_zstd"
    ZSTD_TRAILING_DATA = "zstd_trailing_data"
    DECOMPRESSED_TOO_LARGE = "decompressed_too_large"
    # tar
    BAD_TAR = "bad_tar"
    TOO_MANY_FILES = "too_many_files"
    ABSOLUTE_PATH = "absolute_path"
    PATH_TRAVERSAL = "path_traversal"
    SYMLINK = "symlink"
    HARDLINK = "hardlink"
    DEVICE = "device"
    DIRECTORY = "directory"
    BAD_MEMBER = "bad_member"
    UNSAFE_MODE = "unsafe_mode"
    FILE_TOO_LARGE = "file_too_large"
    DUPLICATE_MEMBER = "duplicate_member"
    TAR_NOT_CANONICAL = "tar_not_canonical"
    TAR_TRAILING_DATA = "tar_trailing_data"
    # allow-list
    UNEXPECTED_FILE = "unexpected_file"
    MISSING_FILE = "missing_file"
    # documents
    SCHEMA_INVALID = "schema_invalid"
    SELF_ELEVATION = "self_elevation"
    INCONSISTENT_RESULTS = "inconsistent_results"
    # challenge
    TOKEN_INVALID = "token_invalid"
    TOKEN_EXPIRED = "token_expired"
    TOKEN_REPLAYED = "token_replayed"
    NONCE_MISMATCH = "nonce_mismatch"
    # chain, integrity, versions, scores
    CHAIN_INVALID = "chain_invalid"
    NETWORK_MISMATCH = "network_mismatch"
    INTEGRITY_MISMATCH = "integrity_mismatch"
    BAD_SIGNATURE = "bad_signature"
    UNREGISTERED_RUNNER = "unregistered_runner"
    UNKNOWN_RELEASE = "unknown_release"
    UNKNOWN_TASK_VERSION = "unknown_task_version"
    TASK_MISMATCH = "task_mismatch"
    IMAGE_MISMATCH = "image_mismatch"
    SCORE_MISMATCH = "score_mismatch"
    # the upload's worker
    WORKER_FAILED = "worker_failed"
    # notes on an accepted upload (why its level is not higher)
    NO_CHALLENGE = "no_challenge"
    UNOFFICIAL_EPISODES = "unofficial_episodes"
    UNJUDGED = "unjudged"
    JUDGING_PENDING = "judging_pending"
    PROVENANCE_MISSING = "provenance_missing"
    PROVENANCE_INVALID = "provenance_invalid"
    # refused requests (the API's error bodies)
    BAD_REQUEST = "bad_request"
    UNKNOWN_FIELD = "unknown_field"
    UNAUTHENTICATED = "unauthenticated"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    CONFLICT = "conflict"
    RATE_LIMITED = "rate_limited"
    NOT_CONFIGURED = "not_configured"
    BAD_STATE = "bad_state"
    OAUTH_FAILED = "oauth_failed"
    DATABASE_UNAVAILABLE = "database_unavailable"
    VERIFIER_BUSY = "verifier_busy"
    INTERNAL_ERROR = "internal_error"


class Use(enum.StrEnum):
    """Where a reason code appears."""

    REJECTION = "rejection"  # a refused upload's reason (stored; a 422 verdict)
    NOTE = "note"  # a note on an accepted upload, in its reasons list
    REQUEST = "request"  # an API error body (never stored)


@attrs.frozen
class ReasonInfo:
    step: str  # the pipeline step (docs/verifier.md) or the API's part
    uses: frozenset[Use]
    description: str


_R, _N, _Q = frozenset({Use.REJECTION}), frozenset({Use.NOTE}), frozenset({Use.REQUEST})
_RQ = _R | _Q


def _info(step: str, uses: frozenset[Use], description: str) -> ReasonInfo:
    return ReasonInfo(step, uses, description)


R = Reason
REASONS: Mapping[Reason, ReasonInfo] = {
    R.TOO_LARGE: _info(
        "1 receive",
        _RQ,
        "the upload (or the `.ale` file checked offline) is over the size cap, default 20 MiB "
        "(HTTP 413 while it is read)",
    ),
    R.EMPTY_UPLOAD: _info("1 receive", _Q, "the upload has no bytes (HTTP 400)"),
    R.NOT_AGE: _info("3 decrypt", _R, "not an age file: no `age-encryption.org/v1` line first"),
    R.BAD_AGE_HEADER: _info(
        "3 decrypt", _R, "the age header breaks the age v1 grammar, is over 64 KiB, or has no X25519 stanza"
    ),
    R.TOO_MANY_STANZAS: _info(
        "3 decrypt", _R, "more X25519 recipient stanzas than the limit (default 8; other stanza types are not counted)"
    ),
    R.DECRYPT_FAILED: _info(
        "3 decrypt", _R, "the site's key does not open it, or the payload is cut, altered or followed by more bytes"
    ),
    R.BAD_ZSTD: _info(
        "4 decompress", _R, "not one valid zstd frame (bad magic, reserved bits, dictionary, corrupt data)"
    ),
    R.TRUNCATED_ZSTD: _info("4 decompress", _R, "the zstd frame ends before its last block or its checksum"),
    R.ZSTD_TRAILING_DATA: _info("4 decompress", _R, "bytes after the zstd frame (a second frame or anything else)"),
    R.DECOMPRESSED_TOO_LARGE: _info(
        "4 decompress", _R, "it decompresses beyond its limit (the tar: default 64 MiB; events.jsonl.zst: 256 MiB)"
    ),
    R.BAD_TAR: _info("5 tar", _R, "not a tar archive: bad header checksum or size field, cut short, or empty"),
    R.TOO_MANY_FILES: _info("5 tar", _R, "more members than the limit (default 16)"),
    R.ABSOLUTE_PATH: _info("5 tar", _R, "a member name is an absolute path"),
    R.PATH_TRAVERSAL: _info("5 tar", _R, "a member name has a `..` component or a backslash"),
    R.SYMLINK: _info("5 tar", _R, "a member is a symbolic link"),
    R.HARDLINK: _info("5 tar", _R, "a member is a hard link"),
    R.DEVICE: _info("5 tar", _R, "a member is a character or block device or a FIFO"),
    R.DIRECTORY: _info("5 tar", _R, "a member is a directory"),
    R.BAD_MEMBER: _info("5 tar", _R, "a member is not a regular file with a flat UTF-8 name"),
    R.UNSAFE_MODE: _info("5 tar", _R, "a member's mode has the setuid, setgid or sticky bit"),
    R.FILE_TOO_LARGE: _info("5 tar", _R, "a member is larger than the limit (default 48 MiB)"),
    R.DUPLICATE_MEMBER: _info("5 tar", _R, "two members have the same name"),
    R.TAR_NOT_CANONICAL: _info(
        "5 tar", _R, "the archive is not in the documented layout (header fields, order, extended headers, padding)"
    ),
    R.TAR_TRAILING_DATA: _info("5 tar", _R, "bytes other than zeros after the end-of-archive blocks"),
    R.UNEXPECTED_FILE: _info("6 allow-list", _R, "a member outside the eight allow-listed files"),
    R.MISSING_FILE: _info("6 allow-list", _R, "one of the eight allow-listed files is missing"),
    R.SCHEMA_INVALID: _info(
        "7 documents", _R, "a document does not parse, is not canonical, or is not valid against its schema"
    ),
    R.SELF_ELEVATION: _info(
        "7 documents",
        _RQ,
        "a document, query parameter or body field claims a level (`level`, `verified`, ...): levels are the "
        "verifier's",
    ),
    R.INCONSISTENT_RESULTS: _info(
        "7 documents",
        _R,
        "the documents contradict themselves or each other (results, faithfulness verdicts, runs, task lists; "
        "a verdict for another judge input than the bundle gives: step 12)",
    ),
    R.TOKEN_INVALID: _info(
        "8 challenge", _R, "the challenge token is not the site's, names no challenge, or is not this user's"
    ),
    R.TOKEN_EXPIRED: _info("8 challenge", _R, "the challenge token has expired"),
    R.TOKEN_REPLAYED: _info("8 challenge", _R, "the challenge was already used by another upload"),
    R.NONCE_MISMATCH: _info("8 challenge", _R, "the nonce in the manifest or the trajectory is not the challenge's"),
    R.CHAIN_INVALID: _info("9 chain", _R, "the trajectory's hash chain or event grammar is broken"),
    R.NETWORK_MISMATCH: _info(
        "9 chain",
        _R,
        "network_summary.json differs from the totals recomputed from the trajectory's network events "
        "(requests, tokens, the gateway and its upstreams, the phases' policies)",
    ),
    R.INTEGRITY_MISMATCH: _info(
        "10 integrity", _R, "a file digest, the Merkle root or the chain head differs from integrity.json"
    ),
    R.BAD_SIGNATURE: _info(
        "10 integrity",
        _R,
        "the runner signature, or a judge's signature on a verdict (step 12), is malformed or does not verify",
    ),
    R.UNREGISTERED_RUNNER: _info("10 integrity", _R, "the signing key is not a registered, active runner key"),
    R.UNKNOWN_RELEASE: _info(
        "11 versions", _R, "the release manifest or its required task set is not one this site knows"
    ),
    R.UNKNOWN_TASK_VERSION: _info("11 versions", _R, "a task (with its digest) is not known, or not in the release"),
    R.TASK_MISMATCH: _info(
        "11 versions", _R, "the bundle misstates a task's genre, mode, metric, safety metrics or episode count"
    ),
    R.IMAGE_MISMATCH: _info(
        "11 versions",
        _R,
        "an OCI runtime ran images other than the ones the release names (by manifest digest), or the "
        "manifest's image digests contradict each other",
    ),
    R.SCORE_MISMATCH: _info(
        "12 scores",
        _R,
        "the claimed scores, or their 95% intervals (docs/intervals.md), differ from the recomputed ones",
    ),
    R.WORKER_FAILED: _info(
        "1-13 worker",
        _R,
        "the worker process checking the upload died before it gave a verdict: it ran past its memory or CPU "
        "time bound (`ALE_VERIFY_WORKER_MEMORY_BYTES`, `ALE_VERIFY_WORKER_CPU_S`) or was killed; the message says "
        "which",
    ),
    R.NO_CHALLENGE: _info("level", _N, "the run had no challenge: freshness cannot be proven (`self_reported`)"),
    R.UNOFFICIAL_EPISODES: _info("level", _N, "the run overrode the official episode counts (`self_reported`)"),
    R.UNJUDGED: _info(
        "12 faithfulness",
        _N,
        "a completed reproduction task has no verdict the verifier credits (no trusted judge key signed one, and "
        "the verifier has no judge or its judge gave no verdict; or the signing key was revoked since): shown "
        "unjudged, final 0",
    ),
    R.JUDGING_PENDING: _info(
        "12 faithfulness",
        _N,
        "a completed reproduction task waits for the verifier's own judge, asked after the upload: shown judging "
        "pending, final 0 until it answers (then judged, or unjudged with the reason)",
    ),
    R.PROVENANCE_MISSING: _info(
        "level",
        _N,
        "an image the run ran (OCI runtimes) has no provenance statement registered on the site, or the "
        "release names no images lock: an official run is then `validated`, not `officially_verified`",
    ),
    R.PROVENANCE_INVALID: _info(
        "level",
        _N,
        "the provenance statement registered for an image the run ran does not hold against the release's "
        "lock (signer no longer registered, bad signature, another digest, definition or layers, malformed): "
        "an official run is then `validated`",
    ),
    R.BAD_REQUEST: _info("API", _Q, "a malformed request: body, parameter or value (HTTP 400)"),
    R.UNKNOWN_FIELD: _info("API", _Q, "a parameter or body field the endpoint does not take (HTTP 400)"),
    R.UNAUTHENTICATED: _info("API", _Q, "no valid API token or login session (HTTP 401)"),
    R.FORBIDDEN: _info("API", _Q, "the operation is for the site's operators (HTTP 403)"),
    R.NOT_FOUND: _info("API", _Q, "no such submission, key or route (HTTP 404)"),
    R.METHOD_NOT_ALLOWED: _info("API", _Q, "the route does not take this method (HTTP 405)"),
    R.UNSUPPORTED_MEDIA_TYPE: _info(
        "API", _Q, "a body declared as another media type than the endpoint reads (HTTP 415)"
    ),
    R.CONFLICT: _info("API", _Q, "the state change is not allowed from the current state (HTTP 409)"),
    R.RATE_LIMITED: _info("API", _Q, "over the per-user hourly limit (HTTP 429)"),
    R.NOT_CONFIGURED: _info("API", _Q, "GitHub login is not configured on this site (HTTP 404)"),
    R.BAD_STATE: _info("API", _Q, "the OAuth state does not match this browser's login (HTTP 400)"),
    R.OAUTH_FAILED: _info("API", _Q, "the OAuth provider refused or answered nonsense (HTTP 502)"),
    R.DATABASE_UNAVAILABLE: _info(
        "API", _Q, "the verifier's database cannot be reached or used now; try again later (HTTP 503)"
    ),
    R.VERIFIER_BUSY: _info(
        "API",
        _Q,
        "the verifier holds as many uploads as it takes at once (`ALE_VERIFY_MAX_PENDING_UPLOADS`) or is "
        "shutting down; send it again after `Retry-After` seconds (HTTP 503)",
    ),
    R.INTERNAL_ERROR: _info("API", _Q, "the verifier's own bug; the operator has the details in the log (HTTP 500)"),
}
del R

if set(REASONS) != set(Reason):  # pragma: no cover - a new member without its description
    raise RuntimeError(f"reasons without a description: {sorted(set(Reason) - set(REASONS))}")


def reasons_for(use: Use) -> tuple[Reason, ...]:
    """The codes that may appear in ``use``, in declaration order."""
    return tuple(r for r in Reason if use in REASONS[r].uses)


class Level(enum.StrEnum):
    """A verification level, assigned by the backend only."""

    SELF_REPORTED = "self_reported"
    VALIDATED = "validated"
    AUDITED = "audited"
    OFFICIALLY_VERIFIED = "officially_verified"
    REVOKED = "revoked"


LEVELS: Mapping[Level, str] = {
    Level.SELF_REPORTED: "every check passed, but something could not be proven: the run had no challenge "
    "(freshness), or it overrode the official episode counts",
    Level.VALIDATED: "every check passed, with a valid one-time challenge, and the recomputed scores equal the "
    "claimed ones",
    Level.AUDITED: "an operator reviewed it (`.../audit` with a reason), from `self_reported` or `validated`",
    Level.OFFICIALLY_VERIFIED: "validated, and the integrity root is signed by a registered, active runner key "
    "(benchmark team, approved third party, hardware-attested, official rerun): `ale run --runner-key KEY.pem`; "
    "for a run on an OCI runtime, each image that ran also has a registered provenance statement that holds "
    "against the release's lock",
    Level.REVOKED: "an operator revoked it (`.../revoke` with a reason); kept and shown, never ranked",
}

if set(LEVELS) != set(Level):  # pragma: no cover
    raise RuntimeError("levels without a description")


class VerificationError(ValueError):
    """A bundle that fails a check; ``reason`` is stable (stored and returned by the verifier)."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = Reason(reason)


def reasons_table() -> str:
    """The reason codes as the Markdown table docs/verifier.md holds (a test compares them)."""
    rows = ["| code | where | meaning |", "|---|---|---|"]
    for reason in Reason:
        info = REASONS[reason]
        uses = ", ".join(u.value for u in Use if u in info.uses)
        rows.append(f"| `{reason.value}` | {info.step} ({uses}) | {info.description} |")
    return "\n".join(rows)


def levels_table() -> str:
    """The levels as the Markdown table docs/verifier.md holds."""
    rows = ["| level | when |", "|---|---|"]
    rows += [f"| `{level.value}` | {LEVELS[level]} |" for level in Level]
    return "\n".join(rows)
