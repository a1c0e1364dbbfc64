"""Shared machinery for the verifier's tests (a plain module, imported by tests/test_verifier_*.py).

* :func:`get_world` builds, once per session, the site's keys (``ale-verify keygen``), a live
  ``ale-verify serve`` on a free 127.0.0.1 port, a registered runner key (``ale runner-key`` and the
  operator API), and real bundles made by ``ale run``: one without a site (``--episodes 2``), one
  bound to a challenge of the live site (``--site``), one also signed (``--runner-key``).
* The bundle editors (:func:`edit`, :func:`rebind`, :func:`seal`, :func:`encrypt_files`) re-pack a
  real bundle's files after a change, recomputing what a forger would recompute (event hashes,
  per-file SHA-256, the Merkle root, the signature) so that exactly one check is left to fail.
* :class:`Verifier` wraps an in-process app (``create_app``) and Quart's test client, checks every
  response for the site's secrets, and knows whether the service is still healthy and clean.
* Each world makes its databases with one engine (``get_world(..., db_engine)``, conftest.py's
  ``db_engine``: SQLite or PostgreSQL); :func:`raw_connect`, :func:`dump` and :func:`count` read
  either engine's database with its own driver, past the verifier's code.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import hashlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs
import httpx
import pyrage
import zstandard
from pg_cluster import Databases

from ale.core import bundle
from ale.core.canonical import canonical_json
from ale.core.merkle import files_root
from ale.core.reasons import Use, reasons_for
from ale.core.signing import load_private_key, sign_root
from ale.core.trajectory import event_hash
from ale_verify import db, tokens
from ale_verify.app import create_app
from ale_verify.config import Settings

T = TypeVar("T")

RUNNER_CLI = (sys.executable, "-m", "ale.runner.cli")
VERIFY_CLI = (sys.executable, "-m", "ale_verify.cli")
TASK = "cartpole-balance"
OPERATOR = "operator:alice"
PARTICIPANT = "participant"

#: Every reason the pipeline may give for a rejected upload (the one enum's rejection codes).
REJECTION_REASONS = frozenset(r.value for r in reasons_for(Use.REJECTION))


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run an asyncio coroutine from a sync test (pytest-trio owns ``async def`` tests)."""
    return asyncio.run(coro)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ALE_", "GITHUB_", "KEEP_SUBMISSION")) and k != "DATABASE_URL"
    }
    env.update(extra)
    return env


# -- the site's keys and secrets ------------------------------------------------------------------


@attrs.frozen
class SiteKeys:
    data_dir: Path
    key_file: Path
    signing_key_file: Path
    identity: str  # AGE-SECRET-KEY-1...
    recipient: str  # age1...
    signing_key: bytes

    def secret_forms(self) -> list[bytes]:
        """Every spelling of a site secret that must never appear in a response or a log: the age
        identity as written and its raw X25519 scalar, the signing key; raw, hex and base64."""
        forms = [self.identity.encode(), self.identity.lower().encode(), b"AGE-SECRET-KEY"]
        for raw in (self.signing_key, bech32_payload(self.identity)):
            forms += [
                raw,
                raw.hex().encode(),
                raw.hex().upper().encode(),
                base64.b64encode(raw).rstrip(b"="),
                base64.urlsafe_b64encode(raw).rstrip(b"="),
            ]
        return forms


_BECH32 = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"


def bech32_payload(text: str) -> bytes:
    """The bytes a bech32 string (``age1...``, ``AGE-SECRET-KEY-1...``) encodes (checksum not verified)."""
    data = text.lower().rsplit("1", 1)[1][:-6]
    acc = bits = 0
    out = bytearray()
    for char in data:
        acc = (acc << 5) | _BECH32.index(char)
        bits += 5
        if bits >= 8:
            bits -= 8
            out.append((acc >> bits) & 0xFF)
    return bytes(out)


def keygen(data_dir: Path) -> SiteKeys:
    """``ale-verify keygen``: the public key is printed, the two private files are 0600."""
    proc = subprocess.run(
        [*VERIFY_CLI, "keygen"],
        env=_env(ALE_VERIFY_DATA=str(data_dir)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    recipient = proc.stdout.strip()
    key_file, signing_key_file = data_dir / "site-identity.txt", data_dir / "signing-key.bin"
    identity = next(line for line in key_file.read_text().splitlines() if line.startswith("AGE-SECRET-KEY-1"))
    assert str(pyrage.x25519.Identity.from_str(identity).to_public()) == recipient
    assert "AGE-SECRET-KEY" not in proc.stdout + proc.stderr
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert signing_key_file.stat().st_mode & 0o777 == 0o600
    return SiteKeys(data_dir, key_file, signing_key_file, identity, recipient, signing_key_file.read_bytes())


def find_secret(keys: SiteKeys, blob: bytes | str) -> bytes | None:
    data = blob.encode("utf-8", "surrogateescape") if isinstance(blob, str) else bytes(blob)
    for form in keys.secret_forms():
        if form in data:
            return form
    if b"AGE-SECRET-KEY" in data.upper():
        return b"AGE-SECRET-KEY"
    return None


def assert_no_secret(keys: SiteKeys, blob: bytes | str, where: str = "") -> None:
    found = find_secret(keys, blob)
    assert found is None, f"a site secret ({found[:12]!r}...) appears in {where or 'the output'}"


# -- the live server ------------------------------------------------------------------------------


@attrs.define
class LiveServer:
    """``ale-verify serve`` (hypercorn) in a subprocess on 127.0.0.1."""

    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    settings: Settings

    def token(self, user: str) -> str:
        db.upsert_user(self.settings.database, user, user, "local")
        return db.create_api_token(self.settings.database, user, "test")

    def healthy(self) -> bool:
        try:
            reply = httpx.get(f"{self.url}/healthz", timeout=10)
        except httpx.HTTPError:
            return False
        return reply.status_code == 200 and reply.json().get("status") == "ok"

    def log(self) -> bytes:
        return self.log_path.read_bytes()

    def wait_healthy(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"the live server did not start:\n{self.log_path.read_text(errors='replace')}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_live_server(
    keys: SiteKeys, root: Path, *, operators: str = OPERATOR, name: str = "live", wait: bool = True, **env_extra: str
) -> LiveServer:
    """``ale-verify serve`` on a free port (``env_extra``: more environment, e.g. ``DATABASE_URL``);
    with ``wait``, once it answers /healthz (else :meth:`LiveServer.wait_healthy`)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = _env(
        ALE_VERIFY_DATA=str(keys.data_dir),
        ALE_VERIFY_TMP=str(root / f"{name}-tmp"),
        ALE_VERIFY_OPERATORS=operators,
        ALE_VERIFY_PUBLIC_URL=url,
        **env_extra,
    )
    settings = Settings.from_env(env)
    log_path = root / f"{name}-server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*VERIFY_CLI, "serve", "--bind", f"127.0.0.1:{port}", "--access-log"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = LiveServer(url, proc, log_path, settings)
    if wait:
        server.wait_healthy()
    return server


# -- the session's world --------------------------------------------------------------------------


@attrs.define
class World:
    root: Path
    keys: SiteKeys
    live: LiveServer
    runner_pem: Path
    runner_public: str
    runner_key_id: str
    databases: Databases = attrs.field(factory=lambda: Databases("sqlite"))
    _cache: dict[str, Any] = attrs.Factory(dict)  # shared by the worlds of each engine (attrs.evolve)
    _logs: dict[str, str] = attrs.Factory(dict)

    def settings(self, tmp: Path, **overrides: Any) -> Settings:
        """Settings for an in-process app with the site's keys and its own, new database."""
        base: dict[str, Any] = {
            "database": self.databases.new(tmp),
            "key_file": self.keys.key_file,
            "signing_key_file": self.keys.signing_key_file,
            "tmp_dir": tmp / "upload-tmp",
            "bundle_dir": tmp / "bundles",
            "operators": frozenset({OPERATOR}),
        }
        base.update(overrides)
        return Settings(**base)

    @property
    def bundles(self) -> dict[str, bytes]:
        """Ciphertexts of the real runs: plain (no site, --episodes 2), site (challenge), signed."""
        if "bundles" not in self._cache:
            self._cache["bundles"] = self._make_bundles()
        made: dict[str, bytes] = self._cache["bundles"]
        return made

    def files(self, name: str) -> dict[str, bytes]:
        return bundle.unpack(self.bundles[name], self.keys.identity)

    def runner_key(self) -> Any:
        return load_private_key(self.runner_pem.read_bytes())

    def _make_bundles(self) -> dict[str, bytes]:
        token = self.live.token(PARTICIPANT)
        common = ["run", TASK, "--plain", "--agent-time", "30"]
        site = ["--site", self.live.url, "--token", token]
        variants = {
            "plain": ["--episodes", "2", "--recipient", self.keys.recipient],
            "site": site,
            "signed": [*site, "--runner-key", str(self.runner_pem)],
        }
        procs = {}
        for name, extra in variants.items():
            out = self.root / "runs" / name
            log = (self.root / f"run-{name}.log").open("wb")
            procs[name] = (
                subprocess.Popen(
                    [*RUNNER_CLI, *common, "--out", str(out), *extra],
                    cwd=self.root,
                    env=_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=log,
                ),
                log,
            )
        made = {}
        try:
            for name, (proc, log) in procs.items():
                stdout, _ = proc.communicate(timeout=300)
                log.close()
                self._logs[name] = (self.root / f"run-{name}.log").read_text(errors="replace")
                assert proc.returncode == 0, self._logs[name]
                path = Path(stdout.decode().strip().splitlines()[-1])
                made[name] = (path if path.is_absolute() else self.root / path).read_bytes()
        finally:
            for proc, log in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                log.close()
        return made


_WORLD: World | None = None


def get_world(tmp_path_factory: Any, config: Any, databases: Databases | None = None) -> World:
    """The session's world, built once however many test modules ask for it; with ``databases``
    (conftest.py's ``db_engine``), the same world making its databases with that engine."""
    global _WORLD
    if _WORLD is None:
        _WORLD = _make_world(tmp_path_factory, config)
    return _WORLD if databases is None else attrs.evolve(_WORLD, databases=databases)


def _make_world(tmp_path_factory: Any, config: Any) -> World:
    root = Path(tmp_path_factory.mktemp("verifier-world"))
    keys = keygen(root / "site")
    live = start_live_server(keys, root)
    config.add_cleanup(live.stop)
    operator_token = live.token(OPERATOR)
    runner_pem = root / "runner.pem"
    proc = subprocess.run(
        [*RUNNER_CLI, "runner-key", str(runner_pem)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines())
    public, key_id = lines["public key (register it on the site)"], lines["key id"]
    reply = httpx.post(
        f"{live.url}/api/v1/operator/runner-keys",
        json={"public_key": public, "kind": "benchmark_team", "label": "the test runner"},
        headers={"Authorization": f"Bearer {operator_token}"},
        timeout=30,
    )
    assert reply.status_code == 201, reply.text
    assert reply.json() == {"key_id": key_id}
    return World(root, keys, live, runner_pem, public, key_id)


# -- either engine's database, past the verifier's code ------------------------------------------


@contextlib.contextmanager
def raw_connect(database: Any) -> Iterator[Any]:
    """The engine's own driver (sqlite3 or psycopg), autocommit, on a verifier's database."""
    where = db.location(database)
    if isinstance(where, db.SqliteUrl):
        conn = sqlite3.connect(where.path, isolation_level=None)
        try:
            yield conn
        finally:
            conn.close()
        return
    import psycopg

    with psycopg.connect(where.url, autocommit=True) as pg:
        yield pg


#: What the drivers raise when the database refuses a statement (a trigger, a constraint).
def driver_errors() -> tuple[type[BaseException], ...]:
    try:
        import psycopg
    except ImportError:
        return (sqlite3.DatabaseError,)
    return (sqlite3.DatabaseError, psycopg.Error)


def tables(database: Any) -> list[str]:
    with raw_connect(database) as conn:
        if isinstance(db.location(database), db.SqliteUrl):
            query = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        else:
            query = "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        return sorted(row[0] for row in conn.execute(query).fetchall())


def dump(database: Any) -> str:
    """Every row of every table, as text (to search for what must not be stored)."""
    lines = []
    with raw_connect(database) as conn:
        for table in tables(database):
            lines += [f"{table}: {row!r}" for row in conn.execute(f"SELECT * FROM {table}").fetchall()]
    return "\n".join(lines)


def count(database: Any, table: str) -> int:
    with raw_connect(database) as conn:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


# -- editing a bundle's files ---------------------------------------------------------------------


def jbytes(document: Any) -> bytes:
    """A bundle JSON file: canonical JSON plus a newline."""
    return canonical_json(document) + b"\n"


def jdoc(files: Mapping[str, bytes], name: str) -> dict[str, Any]:
    return json.loads(files[name])


def read_events(files: Mapping[str, bytes]) -> list[dict[str, Any]]:
    raw = bundle.decompress(files["events.jsonl.zst"], bundle.Limits(max_decompressed=64 << 20))
    return [json.loads(line) for line in raw.splitlines()]


def events_bytes(events: Iterable[Mapping[str, Any]]) -> bytes:
    return b"".join(canonical_json(dict(e)) + b"\n" for e in events)


def rehash(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Recompute every prev_hash and hash in order (a forger's chain)."""
    out, head = [], "0" * 64
    for e in events:
        e = {k: v for k, v in e.items() if k != "hash"}
        e["prev_hash"] = head
        e["hash"] = head = event_hash(e)
        out.append(e)
    return out


def with_events(files: Mapping[str, bytes], events: list[dict[str, Any]], *, summary: bool = True) -> dict[str, bytes]:
    """Replace the trajectory (and, with ``summary``, the manifest's trajectory summary)."""
    new = dict(files)
    new["events.jsonl.zst"] = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(events_bytes(events))
    if summary:
        manifest = jdoc(new, "manifest.json")
        manifest["trajectory"]["events"] = len(events)
        manifest["trajectory"]["chain_head"] = events[-1]["hash"]
        new["manifest.json"] = jbytes(manifest)
    return new


def seal(files: Mapping[str, bytes], *, runner_key: Any = None, keep_signature: bool = False) -> dict[str, bytes]:
    """Recompute integrity.json: per-file SHA-256, the Merkle root, the chain head, the signature."""
    new = dict(files)
    integrity = jdoc(new, "integrity.json")
    digests = {n: hashlib.sha256(d).hexdigest() for n, d in new.items() if n != "integrity.json"}
    root = files_root(digests)
    integrity["files"] = digests
    integrity["merkle_root"] = root
    with contextlib.suppress(zstandard.ZstdError, ValueError, IndexError, KeyError):  # no trajectory: keep the head
        integrity["chain_head"] = read_events(new)[-1]["hash"]
    if runner_key is not None:
        integrity["signature"] = sign_root(runner_key, root)
    elif not keep_signature:
        integrity["signature"] = None
    new["integrity.json"] = jbytes(integrity)
    return new


def edit(
    files: Mapping[str, bytes],
    name: str,
    change: Callable[[Any], Any],
    *,
    runner_key: Any = None,
    reseal: bool = True,
) -> dict[str, bytes]:
    """Change one JSON document (``change`` edits it in place or returns a new one) and reseal."""
    document = jdoc(files, name)
    result = change(document)
    new = dict(files)
    new[name] = jbytes(document if result is None else result)
    return seal(new, runner_key=runner_key) if reseal else new


def rebind(files: Mapping[str, bytes], nonce: str, token: str, *, runner_key: Any = None) -> dict[str, bytes]:
    """Bind a real run's files to another challenge, as the harness would have: the nonce in the
    first event (the chain re-hashed), the manifest's challenge, integrity and signature."""
    events = read_events(files)
    events[0] = copy.deepcopy(events[0])
    events[0]["data"]["nonce"] = nonce
    new = with_events(files, rehash(events))
    manifest = jdoc(new, "manifest.json")
    manifest["challenge"] = {"nonce": nonce, "token": token}
    new["manifest.json"] = jbytes(manifest)
    return seal(new, runner_key=runner_key)


def unbind(files: Mapping[str, bytes], *, runner_key: Any = None) -> dict[str, bytes]:
    """The same run without a challenge (nonce null in the first event)."""
    events = read_events(files)
    events[0]["data"]["nonce"] = None
    new = with_events(files, rehash(events))
    manifest = jdoc(new, "manifest.json")
    manifest["challenge"] = None
    new["manifest.json"] = jbytes(manifest)
    return seal(new, runner_key=runner_key)


def encrypt(plain: bytes, *recipients: str) -> bytes:
    return bytes(pyrage.encrypt(plain, [pyrage.x25519.Recipient.from_str(r) for r in recipients]))


def encrypt_files(files: Mapping[str, bytes], recipient: str) -> bytes:
    """age(zstd(tar)) of any set of flat files (extra or missing ones included)."""
    return encrypt(bundle.compress(bundle.build_tar(files)), recipient)


def member(
    name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", *, link: str = ""
) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o644
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        return info, data
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    return info, None


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def tar_header(name: bytes, size: int, /, **fields: bytes) -> bytes:
    """A ustar header written from POSIX's table (an implementation independent of
    ale.core.bundle): the documented canonical layout unless ``fields`` override a field's bytes
    (``mode=b"0004755\\0"``, ``magic=b"ustar "``, ...); the checksum is computed last unless given."""
    layout = [
        ("name", 100, name), ("mode", 8, b"0000644\0"), ("uid", 8, b"0000000\0"), ("gid", 8, b"0000000\0"),
        ("size", 12, _octal(size, 12)), ("mtime", 12, b"00000000000\0"), ("chksum", 8, b" " * 8),
        ("typeflag", 1, b"0"), ("linkname", 100, b""), ("magic", 6, b"ustar\0"), ("version", 2, b"00"),
        ("uname", 32, b""), ("gname", 32, b""), ("devmajor", 8, b"0000000\0"), ("devminor", 8, b"0000000\0"),
        ("prefix", 155, b""), ("pad", 12, b""),
    ]  # fmt: skip
    assert set(fields) <= {f for f, _, _ in layout}, fields
    header = b"".join(fields.get(f, default).ljust(width, b"\0")[:width] for f, width, default in layout)
    assert len(header) == 512
    if "chksum" not in fields:
        header = header[:148] + b"%06o\0 " % sum(header) + header[156:]
    return header


def tar_entry(name: str, data: bytes = b"", /, **fields: bytes) -> bytes:
    """One member: its header and its data padded with zeros to 512 bytes."""
    return tar_header(name.encode(), len(data), **fields) + data + bytes(-len(data) % 512)


def tar_end(body: bytes) -> bytes:
    """Two zero blocks, and zeros up to the next multiple of 10240 bytes."""
    body += bytes(1024)
    return body + bytes(-len(body) % 10240)


_TYPEFLAGS = {tarfile.REGTYPE: b"0", tarfile.LNKTYPE: b"1", tarfile.SYMTYPE: b"2", tarfile.CHRTYPE: b"3",
              tarfile.BLKTYPE: b"4", tarfile.DIRTYPE: b"5", tarfile.FIFOTYPE: b"6"}  # fmt: skip


def raw_tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    """A tar of these members in the given order, each header canonical but for what the member
    is (its name, type, link target, device numbers): one defect at a time."""
    body = b""
    for info, data in members:
        fields = {"typeflag": _TYPEFLAGS[info.type], "linkname": info.linkname.encode()}
        if info.type in (tarfile.CHRTYPE, tarfile.BLKTYPE):
            fields |= {"devmajor": _octal(info.devmajor, 8), "devminor": _octal(info.devminor, 8)}
        body += tar_entry(info.name, data or b"", **fields)
    return tar_end(body)


def regular_members(files: Mapping[str, bytes]) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    return [member(n, data=d) for n, d in sorted(files.items())]


# -- the in-process app ---------------------------------------------------------------------------


@attrs.define
class Reply:
    status: int
    body: bytes
    headers: Any

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def reason(self) -> str | None:
        data = self.json
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            return data["error"].get("reason")
        return data.get("reason") if isinstance(data, dict) else None


class Verifier:
    """An in-process verifier app and a test client; every response is checked for secrets."""

    def __init__(self, world: World, tmp: Path, **overrides: Any) -> None:
        self.world = world
        self.settings = world.settings(tmp, **overrides)
        self.app = create_app(self.settings)
        self.client = self.app.test_client()
        self.replies: list[Reply] = []
        self._tokens: dict[str, str] = {}

    # users and tokens
    def token(self, user: str = PARTICIPANT) -> str:
        if user not in self._tokens:
            db.upsert_user(self.settings.database, user, user, "local")
            self._tokens[user] = db.create_api_token(self.settings.database, user, "test")
        return self._tokens[user]

    def auth(self, user: str | None) -> dict[str, str]:
        return {} if user is None else {"Authorization": f"Bearer {self.token(user)}"}

    def direct_challenge(self, user: str = PARTICIPANT, *, ttl_s: int = 3600) -> dict[str, Any]:
        """A challenge made as the endpoint makes one, straight in the database."""
        db.upsert_user(self.settings.database, user, user, "local")
        row = db.create_challenge(self.settings.database, user, ttl_s)
        token = tokens.issue(
            self.world.keys.signing_key,
            challenge_id=row["id"],
            nonce=row["nonce"],
            user_id=user,
            expires_at=row["expires_at"],
        )
        return {"challenge_id": row["id"], "nonce": row["nonce"], "token": token, "expires_at": row["expires_at"]}

    # HTTP
    def _record(self, status: int, body: bytes, headers: Any, what: str) -> Reply:
        reply = Reply(status, body, headers)
        assert_no_secret(self.world.keys, body, f"the body of {what}")
        assert_no_secret(self.world.keys, "\n".join(f"{k}: {v}" for k, v in headers.items()), f"headers of {what}")
        if headers.get("Content-Type", "").startswith("application/json"):
            json.loads(body)  # well-formed, always
        self.replies.append(reply)
        return reply

    async def call(self, method: str, path: str, *, user: str | None = None, **kw: Any) -> Reply:
        headers = {**self.auth(user), **kw.pop("headers", {})}
        response = await self.client.open(path, method=method, headers=headers, **kw)
        return self._record(response.status_code, await response.get_data(), response.headers, f"{method} {path}")

    async def get(self, path: str, **kw: Any) -> Reply:
        return await self.call("GET", path, **kw)

    async def post(self, path: str, **kw: Any) -> Reply:
        return await self.call("POST", path, **kw)

    async def upload(self, data: bytes, *, user: str = PARTICIPANT, query: str = "", **kw: Any) -> Reply:
        headers = {"Content-Type": "application/octet-stream", **kw.pop("headers", {})}
        path = "/api/v1/submissions" + (f"?{query}" if query else "")
        return await self.post(path, user=user, data=data, headers=headers, **kw)

    async def stream_upload(
        self,
        chunks: Iterable[bytes],
        *,
        user: str = PARTICIPANT,
        headers: Mapping[str, str] | None = None,
        complete: bool = True,
        answer_within: float = 30.0,
        pace: float = 0.0,
    ) -> Reply:
        """A body sent chunk by chunk with no Content-Length (unless ``headers`` declare one).

        Sending stops as soon as the app answers (``pace`` seconds between chunks); with
        ``complete=False`` the body is never finished, so only an app that answers without
        reading all of it can answer at all."""
        all_headers = {"Content-Type": "application/octet-stream", **self.auth(user), **(headers or {})}
        conn = self.client.request("/api/v1/submissions", method="POST", headers=all_headers)
        async with conn:
            for chunk in chunks:
                if conn.status_code is not None:
                    break
                await conn.send(chunk)
                await asyncio.sleep(pace)
            else:
                if complete:
                    await conn.send_complete()
            deadline = time.monotonic() + answer_within
            while conn.status_code is None and time.monotonic() < deadline:  # noqa: ASYNC110 - polling the test connection
                await asyncio.sleep(0.01)
            if conn.status_code is None:
                await conn.disconnect()
                raise AssertionError(f"the app did not answer within {answer_within} s")
        response = await conn.as_response()
        return self._record(response.status_code, await response.get_data(), response.headers, "a streamed upload")

    async def challenge(self, user: str = PARTICIPANT) -> dict[str, Any]:
        reply = await self.post("/api/v1/challenges", user=user)
        assert reply.status == 201, reply.body
        return reply.json

    async def submission(self, submission_id: str) -> dict[str, Any]:
        reply = await self.get(f"/api/v1/submissions/{submission_id}")
        assert reply.status == 200, reply.body
        return reply.json

    def leftovers(self) -> list[Path]:
        """Temp files left behind, and kept bundles when keeping is off."""
        left = list(self.settings.tmp_dir.iterdir()) if self.settings.tmp_dir.exists() else []
        bdir = self.settings.bundle_dir
        if not self.settings.keep_bundles and bdir is not None and bdir.exists():
            left += list(bdir.iterdir())
        return left

    async def assert_healthy(self) -> None:
        reply = await self.get("/healthz")
        assert reply.status == 200
        assert reply.json["status"] == "ok"
        assert self.leftovers() == []
