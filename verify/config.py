"""Configuration from the environment (``ale-verify serve`` reads nothing else)."""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path

import attrs

from ale_verify import db


def _bool(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def _int(env: dict[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def _non_negative(value: int, name: str) -> int:
    if value < 0:
        raise ValueError(f"{name} must be 0 or more, got {value}")
    return value


def _at_least(value: int, low: int, name: str) -> int:
    if value < low:
        raise ValueError(f"{name} must be {low} or more, got {value}")
    return value


def _seconds(env: dict[str, str], name: str, default: float, *, low: float) -> float:
    """A number of seconds, from ``low`` to a day (finite)."""
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not low <= value <= 86400:  # NaN fails this too
        raise ValueError(f"{name} must be from {low:g} to 86400 seconds, got {raw!r}")
    return value


def _positive(value: int, name: str) -> int:
    if value < 1:
        raise ValueError(f"{name} must be 1 or more, got {value}")
    return value


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity mask, which a container's cpuset sets)."""
    return max(1, len(os.sched_getaffinity(0)))


def _workers(env: dict[str, str]) -> int:
    """``ALE_VERIFY_WORKERS``, else its older name ``ALE_VERIFY_CHECK_PROCESSES``, else the usable
    cores; both set is a mistake, said at once."""
    if "ALE_VERIFY_WORKERS" in env and "ALE_VERIFY_CHECK_PROCESSES" in env:
        raise ValueError("set ALE_VERIFY_WORKERS or its older name ALE_VERIFY_CHECK_PROCESSES, not both")
    name = "ALE_VERIFY_CHECK_PROCESSES" if "ALE_VERIFY_CHECK_PROCESSES" in env else "ALE_VERIFY_WORKERS"
    return _non_negative(_int(env, name, usable_cores()), name)


def _database(env: dict[str, str], data: Path) -> db.Location:
    """``DATABASE_URL`` (SQLite or PostgreSQL), else ``ALE_VERIFY_DATABASE`` (a SQLite file), else
    ``$ALE_VERIFY_DATA/verifier.sqlite3``; both set is a mistake, said at once."""
    url, path = env.get("DATABASE_URL"), env.get("ALE_VERIFY_DATABASE")
    if url is not None and path is not None:
        raise ValueError("set DATABASE_URL or ALE_VERIFY_DATABASE, not both")
    if url is not None:
        return db.location(url.strip())
    return db.location(Path(path)) if path is not None else db.default_location(data)


def _judge_keys(text: str) -> tuple[tuple[str, str], ...]:
    """``LABEL=BASE64,...``: registered judge keys (a key without ``LABEL=`` is labelled by its start)."""
    keys = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        label, key = item.split("=", 1) if "=" in item.rstrip("=") else ("", item)
        key = key.strip()
        try:
            raw = base64.b64decode(key, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) != 32:
            raise ValueError(f"ALE_VERIFY_JUDGE_KEYS: {key[:60]!r} is not base64 of a 32-byte Ed25519 public key")
        keys.append((label.strip() or key[:12], key))
    return tuple(keys)


@attrs.frozen(repr=False)
class Settings:
    #: a SQLite file (a Path is one) or a PostgreSQL database: ale_verify.db.location
    database: db.Location = attrs.field(converter=db.location)
    key_file: Path  # the site's age identity (private)
    signing_key_file: Path  # HMAC key for challenge tokens and sessions (private)
    tmp_dir: Path
    keep_bundles: bool = False
    bundle_dir: Path | None = None
    #: the images' provenance statements the operator registered (ale-verify register-provenance),
    #: one a digest; None: none is registered (docs/verifier.md, "Image provenance")
    provenance_dir: Path | None = None
    max_upload_bytes: int = 20 * 1024 * 1024
    max_decompressed_bytes: int = 64 * 1024 * 1024
    max_files: int = 16
    max_file_bytes: int = 48 * 1024 * 1024
    max_stanzas: int = 8
    #: upload worker processes (ale_verify.workers; 0: every check in the server's own process)
    workers: int = 0
    #: uploads the server holds at once (being received, waiting for a worker, being checked)
    max_pending_uploads: int = 64
    #: a worker's address space (bytes; 0: unbounded) and each of its tasks' CPU time (seconds; 0: unbounded)
    worker_memory_bytes: int = 2 * 1024 * 1024 * 1024
    worker_cpu_s: int = 120
    challenge_ttl_s: int = 7 * 24 * 3600
    challenges_per_hour: int = 60
    uploads_per_hour: int = 30
    operators: frozenset[str] = frozenset()
    github_client_id: str = ""
    github_client_secret: str = ""
    github_authorize_url: str = "https://github.com/login/oauth/authorize"
    github_token_url: str = "https://github.com/login/oauth/access_token"
    github_user_url: str = "https://api.github.com/user"
    public_url: str = "http://127.0.0.1:8000"
    #: the operator's faithfulness judge (docs/verifier.md, "Faithfulness"): re-judge every upload's
    #: reproduction tasks whose verdict no registered judge key signed; off when judge_model is empty
    judge_model: str = ""
    judge_base_url: str = "https://api.openai.com/v1"
    judge_api_key_file: Path | None = None  # a file holding the judge endpoint's key (private)
    judge_timeout_s: float = 300.0
    #: registered judge keys: (label, base64 of the raw Ed25519 public key); their signed verdicts are credited
    judge_keys: tuple[tuple[str, str], ...] = ()
    #: the judge jobs (verify/judge_worker.py): attempts in all, the first retry's delay (doubling),
    #: a claim's lease (renewed while the judge is asked) and how often an idle worker looks for jobs
    judge_attempts: int = 5
    judge_retry_s: float = 60.0
    judge_lease_s: float = 60.0
    judge_poll_s: float = 5.0

    def __repr__(self) -> str:  # never print secrets, even by accident
        return f"Settings(database={self.database}, key_file=<path>, keep_bundles={self.keep_bundles})"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        data = Path(env.get("ALE_VERIFY_DATA", "verifier-data"))
        g = env.get

        def n(name: str, default: int) -> int:
            return _int(env, name, default)

        return cls(
            database=_database(env, data),
            key_file=Path(g("ALE_VERIFY_KEY_FILE", str(data / "site-identity.txt"))),
            signing_key_file=Path(g("ALE_VERIFY_SIGNING_KEY_FILE", str(data / "signing-key.bin"))),
            tmp_dir=Path(g("ALE_VERIFY_TMP", str(data / "tmp"))),
            keep_bundles=_bool(g("KEEP_SUBMISSION_BUNDLES"), False),
            bundle_dir=Path(g("ALE_VERIFY_BUNDLE_DIR", str(data / "bundles"))),
            provenance_dir=Path(g("ALE_VERIFY_PROVENANCE_DIR", str(data / "provenance"))),
            max_upload_bytes=n("ALE_VERIFY_MAX_UPLOAD_BYTES", 20 * 1024 * 1024),
            max_decompressed_bytes=n("ALE_VERIFY_MAX_DECOMPRESSED_BYTES", 64 * 1024 * 1024),
            max_files=n("ALE_VERIFY_MAX_FILES", 16),
            max_file_bytes=n("ALE_VERIFY_MAX_FILE_BYTES", 48 * 1024 * 1024),
            max_stanzas=n("ALE_VERIFY_MAX_STANZAS", 8),
            workers=_workers(env),
            max_pending_uploads=_positive(n("ALE_VERIFY_MAX_PENDING_UPLOADS", 64), "ALE_VERIFY_MAX_PENDING_UPLOADS"),
            worker_memory_bytes=_non_negative(
                n("ALE_VERIFY_WORKER_MEMORY_BYTES", 2 * 1024 * 1024 * 1024), "ALE_VERIFY_WORKER_MEMORY_BYTES"
            ),
            worker_cpu_s=_non_negative(n("ALE_VERIFY_WORKER_CPU_S", 120), "ALE_VERIFY_WORKER_CPU_S"),
            challenge_ttl_s=n("ALE_VERIFY_CHALLENGE_TTL_S", 7 * 24 * 3600),
            challenges_per_hour=n("ALE_VERIFY_CHALLENGES_PER_HOUR", 60),
            uploads_per_hour=n("ALE_VERIFY_UPLOADS_PER_HOUR", 30),
            operators=frozenset(o.strip() for o in g("ALE_VERIFY_OPERATORS", "").split(",") if o.strip()),
            github_client_id=g("GITHUB_CLIENT_ID", ""),
            github_client_secret=g("GITHUB_CLIENT_SECRET", ""),
            github_authorize_url=g("GITHUB_AUTHORIZE_URL", "https://github.com/login/oauth/authorize"),
            github_token_url=g("GITHUB_TOKEN_URL", "https://github.com/login/oauth/access_token"),
            github_user_url=g("GITHUB_USER_URL", "https://api.github.com/user"),
            public_url=g("ALE_VERIFY_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/"),
            judge_model=g("ALE_VERIFY_JUDGE_MODEL", "").strip(),
            judge_base_url=g("ALE_VERIFY_JUDGE_BASE_URL", "https://api.openai.com/v1").strip(),
            judge_api_key_file=Path(key_file) if (key_file := g("ALE_VERIFY_JUDGE_API_KEY_FILE")) else None,
            judge_timeout_s=float(n("ALE_VERIFY_JUDGE_TIMEOUT_S", 300)),
            judge_keys=_judge_keys(g("ALE_VERIFY_JUDGE_KEYS", "")),
            judge_attempts=_at_least(n("ALE_VERIFY_JUDGE_ATTEMPTS", 5), 1, "ALE_VERIFY_JUDGE_ATTEMPTS"),
            judge_retry_s=_seconds(env, "ALE_VERIFY_JUDGE_RETRY_S", 60.0, low=0.0),
            judge_lease_s=_seconds(env, "ALE_VERIFY_JUDGE_LEASE_S", 60.0, low=1.0),
            judge_poll_s=_seconds(env, "ALE_VERIFY_JUDGE_POLL_S", 5.0, low=0.05),
        )
