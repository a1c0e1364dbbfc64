"""Uploads checked on worker processes (ale_verify.workers, ale_verify.chain_workers): exactly the
verdicts of the server's own process, within bounds, and a dead worker costs only its upload."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import verifier_helpers as h
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_verifier_pipeline import CONTAINER_CASES, DOCUMENT_CASES
from trajectory_helpers import RunBuilder

from ale.core import bundle
from ale.core.trajectory import ChainError, link_chunks, verify_chain
from ale.core.verify import VerificationError
from ale_verify import db
from ale_verify._web import STATE_KEY
from ale_verify.app import close as close_app
from ale_verify.chain_workers import News, SharedChainJob, Span, check_span
from ale_verify.cli import build_parser
from ale_verify.config import Settings
from ale_verify.pipeline import LocalSite, Outcome, process_upload
from ale_verify.workers import Admission, Busy, UploadPool, WorkerLimits, _budget_cpu, _Job

RUNS = "runs"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, db_engine: h.Databases) -> h.World:
    return h.get_world(tmp_path_factory, request.config, db_engine)


# -- the chain shared among workers, without processes ---------------------------------------------


def _stream(n: int) -> bytes:
    """A whole run with ``n`` events in its agent phase, each with ``"i"``: its 0-based line."""
    run = RunBuilder(nonce="n").open_task()
    kinds = [("untrusted_agent", "note"), ("trusted_evaluator", "rpc"), ("trusted_harness", "rejected_agent_event")]
    for i in range(n):
        producer, kind = kinds[i % 3]
        run.add(producer, kind, {"i": len(run.lines), "text": "x" * (i % 300), "v": [0.25 * i, -i]})
    return run.close_task().finish().stream()


def _tamper(stream: bytes, line: int, old: bytes, new: bytes) -> bytes:
    lines = stream.split(b"\n")
    assert old in lines[line]
    lines[line] = lines[line].replace(old, new, 1)
    return b"\n".join(lines)


CHAIN_CASES = {
    "valid": lambda s: s,
    "edited-data": lambda s: _tamper(s, 40, b'"i":40', b'"i":41'),
    "broken-link": lambda s: _tamper(s, 60, b'"prev_hash":"', b'"prev_hash":"0'),
    "dropped-line": lambda s: b"\n".join(line for i, line in enumerate(s.split(b"\n")) if i != 33),
    "bad-seq": lambda s: _tamper(s, 70, b'"seq":70', b'"seq":71'),
    "not-canonical": lambda s: _tamper(s, 50, b'"i":50', b'"i":50.0'),
    "not-json": lambda s: _tamper(s, 45, b"{", b"["),
    "truncated": lambda s: s[:-1],
    "empty": lambda s: b"",
}


@attrs.define
class FakeHelpers:
    """Other workers, in this process: each offered chunk is left to its owner, or taken by
    "another worker" that checks it (read back through /proc/self/fd), or taken and then failed
    (back to the owner); the news arrive in order but in random batches, and a claim may come too
    late (the chunk was taken meanwhile: checked twice, one report kept). Offers may come from the
    decompression thread."""

    rng: random.Random
    offered: list[Span] = attrs.Factory(list)
    news_: list[News] = attrs.Factory(list)
    claimed: list[int] = attrs.Factory(list)
    dropped: bool = False
    lock: threading.Lock = attrs.Factory(threading.Lock)

    def offer(self, span: Span) -> None:
        with self.lock:
            self.offered.append(span)
            fate = self.rng.choice(["owner", "helped", "failed"])
            if fate == "helped":
                self.news_ += [("taken", span.index), ("report", (span.index, check_span(span)))]
            elif fate == "failed":
                self.news_ += [("taken", span.index), ("back", span.index)]

    def claim(self, index: int) -> None:
        self.claimed.append(index)

    def news(self, *, wait: bool, wake: int | None = None) -> list[News]:
        while True:
            with self.lock:
                if self.news_ or not wait:
                    cut = self.rng.randint(0, len(self.news_))
                    out, self.news_ = self.news_[:cut], self.news_[cut:]
                    if out or not wait:
                        return out
            if wake is not None and select.select([wake], [], [], 0.001)[0]:
                return []

    def drop(self) -> None:
        self.dropped = True


def _through(stream: bytes, seed: int, *, threaded: bool, alone: bool = False, **kwargs: Any) -> tuple[str, Any]:
    """The stream through a SharedChainJob: fed in blocks of random sizes, or decompressed by the
    job's own thread from a zstd frame (``alone``: checking chunks meanwhile); then the chunks'
    reports linked."""
    rng = random.Random(seed)
    helpers = FakeHelpers(rng)
    job = SharedChainJob(helpers, chunk_bytes=4096, alone=alone)
    try:
        if threaded:
            job.start(zstandard.ZstdCompressor(level=1, write_checksum=True).compress(stream))
            assert job.decompressed() == b""
        else:
            pos = 0
            while pos < len(stream):
                size = rng.randint(1, 3000)
                job.feed(stream[pos : pos + size])
                pos += size
        reports = job.reports()
        assert job.stream() == stream
        if isinstance(reports, bytes):
            assert reports == stream
            assert helpers.dropped
            return _verdict(lambda: verify_chain(reports, **kwargs))
        if not alone:  # alone, the owner offers only what it has not reached yet: none, on a slow machine
            assert len(helpers.offered) > 1
        return _verdict(lambda: link_chunks(reports, **kwargs))
    finally:
        job.cancel()


def _verdict(check: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return ("ok", check())
    except ChainError as exc:
        return ("error", (exc.reason, exc.line, str(exc)))


@pytest.mark.parametrize("case", sorted(CHAIN_CASES))
@pytest.mark.parametrize("nonce", [None, "n", "other"])
def test_shared_chunks_give_the_one_pass_verdict(case: str, nonce: str | None) -> None:
    stream = CHAIN_CASES[case](_stream(120))
    kwargs = {"expected_nonce": nonce, "check_nonce": nonce is not None}
    for seed in range(3):
        for threaded, alone in ((False, False), (True, False), (True, True)):
            assert _through(stream, seed, threaded=threaded, alone=alone, **kwargs) == _verdict(
                lambda: verify_chain(stream, **kwargs)
            )


def test_a_chunk_job_gives_the_decompression_error_when_asked_and_stops_when_cancelled() -> None:
    """The trajectory's zstd errors are raised by decompressed(), where the pipeline asks (after
    the documents); a job cancelled before that stops its decompression and frees everything."""
    job = SharedChainJob(FakeHelpers(random.Random(0)))
    job.start(b"not zstd at all")
    with pytest.raises(VerificationError) as caught:
        job.decompressed()
    assert caught.value.reason == "bad_zstd"
    job.cancel()
    big = zstandard.ZstdCompressor(level=1).compress(_stream(50) * 2000)  # ~60 MB decompressed
    job = SharedChainJob(FakeHelpers(random.Random(0)))
    job.start(big)
    job.cancel()  # at once: the thread stops at its next block
    assert job._thread is not None
    assert not job._thread.is_alive()
    assert _memfds(os.getpid()) == []


def test_a_chunk_job_without_room_for_its_mapping_decompresses_by_pwrite(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a tight address-space bound the memory file's mapping may fail (ENOMEM): the job then
    writes the decompressed blocks into the file instead, with the same reports."""
    from ale_verify import chain_workers

    def no_room(self: Any) -> Any:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    stream = _stream(120)
    expected = _through(stream, 0, threaded=True)
    monkeypatch.setattr(chain_workers._MemoryFile, "mapping", no_room)
    assert _through(stream, 0, threaded=True) == expected == _verdict(lambda: verify_chain(stream))


def test_a_chunk_job_frees_its_memory_file() -> None:
    job = SharedChainJob(FakeHelpers(random.Random(0)), chunk_bytes=4096)
    job.feed(_stream(50))
    assert _memfds(os.getpid())
    job.cancel()
    job.cancel()  # idempotent
    assert _memfds(os.getpid()) == []
    with pytest.raises(RuntimeError, match="cancelled"):
        job.feed(b"{}\n")


def test_a_worker_reuses_one_memory_file_for_its_trajectories() -> None:
    """An upload worker's jobs write over one memory file (its pages cost nothing anew); a shorter
    trajectory after a longer one is checked, and read back, as its own bytes only."""
    long, short = _stream(400), _stream(30)
    job = SharedChainJob(FakeHelpers(random.Random(0)), chunk_bytes=4096, reuse=True)
    job.feed(long)
    first = _memfds(os.getpid())
    assert len(first) == 1
    assert job.stream() == long
    job.cancel()
    assert _memfds(os.getpid()) == first  # kept for the next job
    job = SharedChainJob(FakeHelpers(random.Random(0)), chunk_bytes=4096, reuse=True)
    assert _memfds(os.getpid()) == first  # the same file
    job.feed(short)
    assert job.stream() == short
    reports = job.reports()
    assert not isinstance(reports, bytes)
    assert link_chunks(reports) == verify_chain(short)
    assert sum(r.lines for r in reports) == short.count(b"\n")
    job.cancel()


def test_a_second_job_while_the_arena_is_held_gets_a_memory_file_of_its_own_and_frees_it() -> None:
    held = SharedChainJob(FakeHelpers(random.Random(0)), chunk_bytes=4096, reuse=True)
    arena = _memfds(os.getpid())
    other = SharedChainJob(FakeHelpers(random.Random(0)), chunk_bytes=4096, reuse=True)
    other.feed(_stream(20))
    assert len(_memfds(os.getpid())) == len(arena) + 1
    other.cancel()
    assert _memfds(os.getpid()) == arena
    held.cancel()
    assert _memfds(os.getpid()) == arena  # the arena stays, for the next job


def test_a_helper_reads_only_its_own_jobs_memory_file(tmp_path: Path) -> None:
    """A descriptor number reused after a job ended must not be read as that job's trajectory."""
    other = tmp_path / "not-a-trajectory"
    other.write_bytes(_stream(3))
    fd = os.open(other, os.O_RDONLY)
    try:
        with pytest.raises(OSError, match="gone"):
            check_span(Span(0, os.getpid(), fd, "ale-trajectory-0000", 0, 10, 1))
    finally:
        os.close(fd)


def _memfds(pid: int) -> list[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if "ale-trajectory" in target:
            out.append(target)
    return out


# -- the same verdict in the server's process and on the workers -----------------------------------


@attrs.define
class Sides:
    """The in-process pipeline on one database, a pool of two workers on another, each database
    holding the same users, runner key and challenges."""

    world: h.World
    inproc: Settings
    served: Settings
    pool: UploadPool
    tmp: Path
    n: int = 0

    def both(self, ciphertext: bytes, user: str = h.PARTICIPANT) -> tuple[Outcome, Outcome]:
        """The same ciphertext through both; each verdict after its storage."""
        a, b = self._file(ciphertext), self._file(ciphertext)
        mine = process_upload(a, self.inproc, self.world.keys.signing_key, user_id=user)
        theirs = self.pool.submit(b, user_id=user, now=time.time()).result(timeout=300)
        assert not a.exists()
        assert not b.exists()
        return mine, theirs

    def _file(self, data: bytes) -> Path:
        self.n += 1
        path = self.tmp / f"upload-{self.n}.ale"
        path.write_bytes(data)
        return path

    def challenge(self) -> dict[str, Any]:
        """One challenge, the same row in both databases."""
        row = db.create_challenge(self.inproc.database, h.PARTICIPANT, 3600)
        with db.connect(self.served.database) as s:
            s.execute(
                f"INSERT INTO challenges ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values())
            )
        from ale_verify import tokens

        token = tokens.issue(
            self.world.keys.signing_key,
            challenge_id=row["id"],
            nonce=row["nonce"],
            user_id=h.PARTICIPANT,
            expires_at=row["expires_at"],
        )
        return {"nonce": row["nonce"], "token": token}


def _database(world: h.World, tmp: Path, name: str) -> Settings:
    settings = world.settings(tmp / name)
    settings.tmp_dir.mkdir(parents=True, exist_ok=True)
    db.migrate(settings.database)
    for user in (h.PARTICIPANT, "someone-else"):
        db.upsert_user(settings.database, user, user, "local")
    db.register_runner_key(
        settings.database,
        key_id=world.runner_key_id,
        public_key=world.runner_public,
        kind="benchmark_team",
        label="the test runner",
        actor=h.OPERATOR,
    )
    return settings


@pytest.fixture(scope="module")
def sides(world: h.World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sides]:
    tmp = tmp_path_factory.mktemp("sides")
    inproc, served = _database(world, tmp, "inproc"), _database(world, tmp, "served")
    pool = UploadPool(served, world.keys.signing_key, 2, chunk_bytes=4096)  # many chunks: the helpers work
    (tmp / "uploads").mkdir()
    try:
        yield Sides(world, inproc, served, pool, tmp / "uploads")
    finally:
        pool.close()


def _same(mine: Outcome, theirs: Outcome, sides: Sides) -> None:
    """The verdict and what was stored of it are equal, but for the submission's id and time."""
    assert attrs.evolve(theirs, submission_id=mine.submission_id) == mine
    rows = [db.get_submission(s.database, o.submission_id) for s, o in ((sides.inproc, mine), (sides.served, theirs))]
    for row in rows:
        assert row is not None
        for key in ("id", "received_at"):
            row.pop(key)
        for entry in row["history"]:
            for key in ("at", "seq", "submission_id"):
                entry.pop(key, None)
    assert rows[0] == rows[1]


@pytest.mark.parametrize("case", sorted(CONTAINER_CASES))
def test_workers_give_the_in_process_verdict_on_broken_containers(sides: Sides, case: str) -> None:
    build, reason = CONTAINER_CASES[case]
    mine, theirs = sides.both(build(sides.world, dict(sides.world.files("plain"))))
    assert mine.reason == reason
    _same(mine, theirs, sides)


@pytest.mark.parametrize("case", sorted(DOCUMENT_CASES))
def test_workers_give_the_in_process_verdict_on_hostile_documents(sides: Sides, case: str) -> None:
    """Every hostile document and trajectory of the pipeline tests, both ways."""
    build, reason = DOCUMENT_CASES[case]
    mine, theirs = sides.both(h.encrypt_files(build(dict(sides.world.files("plain"))), sides.world.keys.recipient))
    assert mine.reason == reason
    _same(mine, theirs, sides)


def test_workers_give_the_in_process_verdict_on_valid_bundles(sides: Sides) -> None:
    """Self-reported, validated (a challenge), officially verified (and signed): both ways. The
    trajectories here are cut into several chunks, which the pool's idle worker helps check."""
    world = sides.world
    plain = h.encrypt_files(h.seal(world.files("plain")), world.keys.recipient)
    c = sides.challenge()
    validated = h.encrypt_files(h.rebind(world.files("site"), c["nonce"], c["token"]), world.keys.recipient)
    c = sides.challenge()
    signed = h.rebind(world.files("signed"), c["nonce"], c["token"], runner_key=world.runner_key())
    signed_bytes = h.encrypt_files(signed, world.keys.recipient)
    assert len(h.read_events(world.files("site"))) > 20  # several 4 KiB chunks
    for data, level in ((plain, "self_reported"), (validated, "validated"), (signed_bytes, "officially_verified")):
        mine, theirs = sides.both(data)
        assert (mine.status, mine.level) == ("accepted", level), mine.reasons
        _same(mine, theirs, sides)
        again = sides.both(data)  # the challenge is used now: replayed, both ways
        assert again[0].reason == ("token_replayed" if level != "self_reported" else None)
        _same(*again, sides)


def test_workers_give_the_in_process_verdict_on_challenge_faults(sides: Sides) -> None:
    world = sides.world
    c = sides.challenge()
    official = world.files("site")
    other_user = h.encrypt_files(h.rebind(official, c["nonce"], c["token"]), world.keys.recipient)
    mine, theirs = sides.both(other_user, user="someone-else")
    assert mine.reason == "token_invalid"
    _same(mine, theirs, sides)
    wrong_nonce = h.rebind(official, "ab" * 32, c["token"])
    mine, theirs = sides.both(h.encrypt_files(wrong_nonce, world.keys.recipient))
    assert mine.reason == "nonce_mismatch"
    _same(mine, theirs, sides)


GARBAGE = {
    "random-bytes": lambda w, rng: rng.randbytes(5000),
    "age-of-random": lambda w, rng: h.encrypt(rng.randbytes(30_000), w.keys.recipient),
    "age-of-zstd-of-random": lambda w, rng: h.encrypt(bundle.compress(rng.randbytes(30_000)), w.keys.recipient),
    "age-of-zeros": lambda w, rng: h.encrypt(bytes(1 << 20), w.keys.recipient),
    "age-header-only": lambda w, rng: h.encrypt(b"", w.keys.recipient)[:200],
    "nul-bytes": lambda w, rng: bytes(4096),
}


@pytest.mark.parametrize("case", sorted(GARBAGE))
def test_garbage_through_the_workers_is_rejected_as_in_process(sides: Sides, case: str) -> None:
    mine, theirs = sides.both(GARBAGE[case](sides.world, random.Random(case)))
    assert mine.status == "rejected"
    assert mine.reason in h.REJECTION_REASONS
    _same(mine, theirs, sides)


@pytest.mark.fuzz
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_flipped_bytes_through_the_workers(sides: Sides, data: st.DataObject) -> None:
    """A byte of one of the files flipped anywhere (before sealing, so that the integrity root
    holds and a later check must find it; integrity.json after), and maybe one of the ciphertext."""
    world = sides.world
    files = dict(world.files("plain"))
    name = data.draw(st.sampled_from(sorted(files)))
    raw = bytearray(files[name])
    raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    sealed = {**h.seal(files), name: bytes(raw)} if name == "integrity.json" else h.seal({**files, name: bytes(raw)})
    ciphertext = bytearray(h.encrypt_files(sealed, world.keys.recipient))
    if data.draw(st.booleans()):
        ciphertext[data.draw(st.integers(0, 1 << 20)) % len(ciphertext)] ^= 0x40  # (age's length varies)
    mine, theirs = sides.both(bytes(ciphertext))
    _same(mine, theirs, sides)


# -- bounds, deaths and leaks -------------------------------------------------------------------


def _held(settings: Settings, fail: BaseException | None = None) -> Any:
    """The site's answers (pipeline.LocalSite), held at the challenge (step 8) until the test
    sets ``release``; then the challenge's answer, or ``fail`` raised."""
    site = LocalSite(settings)
    entered, release = threading.Event(), threading.Event()

    class Held:
        def __getattr__(self, name: str) -> Any:
            return getattr(site, name)

        def challenge(self, challenge_id: str) -> Any:
            entered.set()
            assert release.wait(120)
            if fail is not None:
                raise fail
            return site.challenge(challenge_id)

    held = Held()
    held.entered, held.release = entered, release  # type: ignore[attr-defined]
    return held


def _pool(world: h.World, tmp: Path, processes: int = 1, **overrides: Any) -> tuple[UploadPool, Settings]:
    settings = attrs.evolve(_database(world, tmp, "db"), **overrides)
    return UploadPool(settings, world.keys.signing_key, processes), settings


def _challenged(world: h.World, settings: Settings) -> bytes:
    row = db.create_challenge(settings.database, h.PARTICIPANT, 3600)
    from ale_verify import tokens

    token = tokens.issue(
        world.keys.signing_key, challenge_id=row["id"], nonce=row["nonce"], user_id=h.PARTICIPANT,
        expires_at=row["expires_at"],
    )  # fmt: skip
    return h.encrypt_files(h.rebind(world.files("site"), row["nonce"], token), world.keys.recipient)


def _submit(pool: UploadPool, settings: Settings, data: bytes, name: str) -> Any:
    path = settings.tmp_dir / name
    path.write_bytes(data)
    return pool.submit(path, user_id=h.PARTICIPANT, now=time.time())


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _stored(settings: Settings, outcome: Outcome) -> dict[str, Any]:
    row = db.get_submission(settings.database, outcome.submission_id)
    assert row is not None
    return row


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV, signal.SIGXCPU])
def test_a_worker_killed_mid_upload_fails_that_upload_and_the_pool_recovers(
    world: h.World, tmp_path: Path, sig: signal.Signals
) -> None:
    pool, settings = _pool(world, tmp_path, processes=1)
    try:
        held = _held(settings)
        pool._site = held
        killed = _submit(pool, settings, _challenged(world, settings), "a.ale")
        assert held.entered.wait(120)  # the worker waits for the server's answer at step 8
        (victim,) = pool.pids()
        os.kill(victim, sig)
        outcome = killed.result(timeout=60)
        assert (outcome.status, outcome.reason) == ("rejected", "worker_failed")
        message = outcome.reasons[0]["message"]
        expected = {signal.SIGKILL: "killed by SIGKILL", signal.SIGSEGV: "killed by SIGSEGV"}
        assert expected.get(sig, "CPU time bound") in message, message
        assert _stored(settings, outcome)["reason"] == "worker_failed"
        assert len(_stored(settings, outcome)["summary"]["ciphertext_sha256"]) == 64
        held.release.set()
        _wait(lambda: pool.pids() not in ([], [victim]), "a new worker")
        after = _submit(pool, settings, h.encrypt_files(h.seal(world.files("plain")), world.keys.recipient), "b.ale")
        assert after.result(timeout=120).status == "accepted"
        assert list(settings.tmp_dir.iterdir()) == []
    finally:
        pool.close()
    assert all(not _alive(pid) for pid in pool.pids())


def test_a_worker_that_dies_after_its_challenge_was_claimed_leaves_the_challenge_unused_for_a_retry(
    world: h.World, tmp_path: Path
) -> None:
    """The worker is killed after the server answered that its challenge is unused (step 8): the
    upload is stored as worker_failed without using the challenge (its use is stored with the
    verdict, in one transaction), so the same bundle, uploaded again, is accepted."""
    pool, settings = _pool(world, tmp_path, processes=1)
    try:
        site = LocalSite(settings)
        entered, release = threading.Event(), threading.Event()

        class HeldAfterConsume:
            def __getattr__(self, name: str) -> Any:
                return getattr(site, name)

            def consume(self, challenge_id: str, submission_id: str) -> bool:
                claimed = site.consume(challenge_id, submission_id)
                entered.set()
                assert release.wait(120)
                return claimed

        pool._site = HeldAfterConsume()  # type: ignore[assignment]
        data = _challenged(world, settings)
        killed = _submit(pool, settings, data, "a.ale")
        assert entered.wait(120)  # the challenge is claimed; the worker waits for the answer
        (victim,) = pool.pids()
        os.kill(victim, signal.SIGKILL)
        outcome = killed.result(timeout=60)
        assert (outcome.status, outcome.reason) == ("rejected", "worker_failed")
        release.set()
        (row,) = db.all_submissions(settings.database)
        assert row["reason"] == "worker_failed"
        challenge = _only_challenge(settings.database)
        assert (challenge["used_at"], challenge["used_by_submission"]) == (None, None)
        pool._site = site
        _wait(lambda: pool.pids() not in ([], [victim]), "a new worker")
        again = _submit(pool, settings, data, "b.ale").result(timeout=120)
        assert (again.status, again.level) == ("accepted", "validated"), again.reasons
        assert _only_challenge(settings.database)["used_by_submission"] == again.submission_id
    finally:
        pool.close()


def _only_challenge(database: Any) -> dict[str, Any]:
    with db.connect(database) as s:
        (row,) = s.rows("SELECT * FROM challenges")
    return row


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/status").read_text().find("State:\tZ") < 0


def test_a_worker_past_its_memory_bound_fails_that_upload_and_the_pool_recovers(world: h.World, tmp_path: Path) -> None:
    """The bound is the worker's address space (RLIMIT_AS): here shrunk on the running worker to
    what it uses plus 8 MiB, then sent a 16 MB upload to read."""
    pool, settings = _pool(world, tmp_path, processes=1)
    try:
        _wait(lambda: len(pool.pids()) == 1, "the worker")
        (pid,) = pool.pids()
        status = Path(f"/proc/{pid}/status").read_text()
        used = int(status.split("VmSize:")[1].split()[0]) * 1024
        import resource

        resource.prlimit(pid, resource.RLIMIT_AS, (used + 8 * 1024 * 1024, resource.RLIM_INFINITY))
        outcome = _submit(pool, settings, os.urandom(16 * 1024 * 1024), "big.ale").result(timeout=60)
        assert (outcome.status, outcome.reason) == ("rejected", "worker_failed")
        assert "memory bound" in outcome.reasons[0]["message"]
        _wait(lambda: pool.pids() not in ([], [pid]), "a new worker")
        after = _submit(pool, settings, h.encrypt_files(h.seal(world.files("plain")), world.keys.recipient), "b.ale")
        assert after.result(timeout=120).status == "accepted"
    finally:
        pool.close()


def test_the_cpu_budget_ends_a_task_that_runs_past_it() -> None:
    """_budget_cpu's RLIMIT_CPU: a loop that runs past its one second is ended by SIGXCPU."""
    code = (
        "from ale_verify.workers import WorkerLimits, _budget_cpu\n_budget_cpu(WorkerLimits(0, 1))\nwhile True: pass\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], timeout=60, check=False)
    assert proc.returncode == -signal.SIGXCPU
    _budget_cpu(WorkerLimits(0, 0))  # 0: no budget, nothing set


def test_a_worker_that_gives_no_sign_of_life_is_killed_and_its_upload_fails(world: h.World, tmp_path: Path) -> None:
    """A worker stopped (SIGSTOP) as it is handed an upload: the watchdog kills it after
    ``stall_s`` of silence, the upload is rejected as worker_failed, a new worker takes its place."""
    settings = _database(world, tmp_path, "db")
    pool = UploadPool(settings, world.keys.signing_key, 1, stall_s=2)
    try:
        _wait(lambda: len(pool.pids()) == 1, "the worker")
        (pid,) = pool.pids()
        os.kill(pid, signal.SIGSTOP)
        data = h.encrypt_files(h.seal(world.files("plain")), world.keys.recipient)
        outcome = _submit(pool, settings, data, "a.ale").result(timeout=120)
        assert (outcome.status, outcome.reason) == ("rejected", "worker_failed")
        assert "no sign of life for 2 s" in outcome.reasons[0]["message"]
        _wait(lambda: pool.pids() not in ([], [pid]), "a new worker")
        assert _submit(pool, settings, data, "b.ale").result(timeout=120).status == "accepted"
    finally:
        pool.close()


def test_a_helper_that_dies_on_a_chunk_gives_it_back_to_its_owner(world: h.World, tmp_path: Path) -> None:
    """Two workers: the idle one is frozen (SIGSTOP) before the upload, so it is handed a chunk it
    never checks; killed, its chunk goes back to the upload's own worker, and the verdict stands."""
    settings = _database(world, tmp_path, "db")
    pool = UploadPool(settings, world.keys.signing_key, 2, chunk_bytes=4096)
    try:
        _wait(lambda: len(pool.pids()) == 2, "the workers")
        data = h.encrypt_files(h.seal(world.files("plain")), world.keys.recipient)
        reference = process_upload(_file(tmp_path, data), _database(world, tmp_path, "ref"), world.keys.signing_key,
                                   user_id=h.PARTICIPANT)  # fmt: skip
        first = pool.pids()[1]
        os.kill(first, signal.SIGSTOP)
        try:
            future = _submit(pool, settings, data, "a.ale")
            _wait(lambda: any(w.state == "check" and w.pid == first for w in pool._workers), "a chunk for it")
        finally:
            os.kill(first, signal.SIGKILL)
        outcome = future.result(timeout=120)
        assert attrs.evolve(outcome, submission_id="x") == attrs.evolve(reference, submission_id="x")
    finally:
        pool.close()


def _file(tmp: Path, data: bytes) -> Path:
    path = tmp / f"f-{time.monotonic_ns()}.ale"
    path.write_bytes(data)
    return path


def test_the_database_failing_during_an_upload_on_a_worker_is_503_and_nothing_is_stored(
    world: h.World, tmp_path: Path
) -> None:
    async def go() -> None:
        v = h.Verifier(world, tmp_path, workers=1)
        state = v.app.extensions[STATE_KEY]
        try:
            held = _held(v.settings, fail=db.Unavailable("the database went away"))
            held.release.set()
            state.pool._site = held
            v.token()
            reply = await v.upload(_challenged(world, v.settings))
            assert (reply.status, reply.reason) == (503, "database_unavailable")
            assert reply.headers["Retry-After"] == "5"
            assert db.all_submissions(v.settings.database) == []
            await v.assert_healthy()
        finally:
            await close_app(state)

    h.run(go())


def test_a_pool_at_capacity_answers_503_with_retry_after(world: h.World, tmp_path: Path) -> None:
    """One upload at a time (ALE_VERIFY_MAX_PENDING_UPLOADS=1): a second one is refused before its
    body is read, and counted in no rate limit; once the first is done, uploads are taken again."""

    async def go() -> None:
        v = h.Verifier(world, tmp_path, workers=1, max_pending_uploads=1, uploads_per_hour=3)
        state = v.app.extensions[STATE_KEY]
        try:
            v.token()
            held = _held(v.settings)
            state.pool._site = held
            first = asyncio.ensure_future(v.upload(_challenged(world, v.settings)))
            await asyncio.to_thread(held.entered.wait, 120)
            plain = h.encrypt_files(h.seal(world.files("plain")), world.keys.recipient)
            for _ in range(5):
                busy = await v.upload(plain)
                assert (busy.status, busy.reason) == (503, "verifier_busy")
                assert busy.headers["Retry-After"] == "5"
            held.release.set()
            assert (await first).json["level"] == "validated"
            again = await v.upload(plain)  # 2 of 3 an hour: the refused ones took none
            assert again.status == 201, again.body
            assert state.admission.held == 0
            await v.assert_healthy()
        finally:
            await close_app(state)

    h.run(go())


def test_an_upload_cancelled_while_it_waits_is_dropped(world: h.World, tmp_path: Path) -> None:
    pool, settings = _pool(world, tmp_path, processes=1)
    admission = Admission(4)
    try:
        held = _held(settings)
        pool._site = held
        first = _submit(pool, settings, _challenged(world, settings), "a.ale")
        assert held.entered.wait(120)
        ticket = admission.admit()
        path = settings.tmp_dir / "b.ale"
        path.write_bytes(b"never checked")
        waiting = pool.submit(path, user_id=h.PARTICIPANT, now=time.time(), ticket=ticket)
        assert waiting.cancel()
        held.release.set()
        assert first.result(timeout=120).level == "validated"
        _wait(lambda: not path.exists(), "the cancelled upload's file to go")
        assert admission.held == 0
        assert len(db.all_submissions(settings.database)) == 1
    finally:
        pool.close()


def test_closing_refuses_the_queued_uploads_and_stops_every_worker(world: h.World, tmp_path: Path) -> None:
    pool, settings = _pool(world, tmp_path, processes=1)
    held = _held(settings)
    pool._site = held
    first = _submit(pool, settings, _challenged(world, settings), "a.ale")
    assert held.entered.wait(120)
    queued = _submit(pool, settings, b"queued", "b.ale")
    pids = pool.pids()
    closer = threading.Thread(target=pool.close)
    closer.start()
    with pytest.raises(Busy, match="shutting down"):
        queued.result(timeout=60)
    held.release.set()  # the upload being checked finishes before the workers stop
    assert first.result(timeout=120).level == "validated"
    closer.join(60)
    assert not closer.is_alive()
    assert not any(_alive(pid) for pid in pids)
    assert list(settings.tmp_dir.iterdir()) == []
    with pytest.raises(Busy):
        pool.submit(settings.tmp_dir / "c.ale", user_id=h.PARTICIPANT, now=time.time()).result(timeout=10)


def test_served_with_workers_end_to_end_and_nothing_leaks(world: h.World, tmp_path: Path) -> None:
    """Through the API on two workers: accepted and rejected uploads, then no temp file, no memory
    file in any worker but its one arena, the same workers (none died), and after closing no worker left."""

    async def go() -> None:
        v = h.Verifier(world, tmp_path, workers=2)
        state = v.app.extensions[STATE_KEY]
        try:
            await asyncio.to_thread(_wait, lambda: len(state.pool.pids()) == 2, "the workers")
            ready = state.pool.pids()
            plain = h.encrypt_files(h.seal(world.files("plain")), world.keys.recipient)
            replies = await asyncio.gather(*(v.upload(plain) for _ in range(6)), v.upload(b"garbage"))
            assert [r.status for r in replies] == [201] * 6 + [422]
            assert replies[-1].json["reason"] == "not_age"
            pids = state.pool.pids()
            assert pids == ready  # none died
            for pid in pids:
                # at most the worker's arena (chain_workers._Arena): one file, open twice once mapped
                # (Python's mmap keeps a descriptor of its own)
                assert len(set(_memfds(pid))) <= 1
            await v.assert_healthy()
        finally:
            await close_app(state)
        assert not any(_alive(pid) for pid in pids)

    h.run(go())


# -- configuration ---------------------------------------------------------------------------------


def test_workers_setting_and_option() -> None:
    base = {"ALE_VERIFY_DATA": "/nonexistent"}
    assert Settings.from_env(base).workers == len(os.sched_getaffinity(0))
    assert Settings.from_env({**base, "ALE_VERIFY_WORKERS": "3"}).workers == 3
    assert Settings.from_env({**base, "ALE_VERIFY_CHECK_PROCESSES": "0"}).workers == 0  # its older name
    with pytest.raises(ValueError, match="not both"):
        Settings.from_env({**base, "ALE_VERIFY_WORKERS": "1", "ALE_VERIFY_CHECK_PROCESSES": "1"})
    for bad in ("-1", "two"):
        with pytest.raises(ValueError, match="ALE_VERIFY_WORKERS"):
            Settings.from_env({**base, "ALE_VERIFY_WORKERS": bad})
    with pytest.raises(ValueError, match="ALE_VERIFY_MAX_PENDING_UPLOADS"):
        Settings.from_env({**base, "ALE_VERIFY_MAX_PENDING_UPLOADS": "0"})
    assert build_parser().parse_args(["serve", "--workers", "2"]).workers == 2
    assert build_parser().parse_args(["serve"]).workers is None
    for bad in ("-1", "x", "99999"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--workers", bad])
    with pytest.raises(ValueError, match="at least 1"):
        Admission(0)


_FAULTS_SCRIPT = """
import resource, sys
from ale_verify import workers
kept = workers._keep_heap() if sys.argv[1] == "keep" else None
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def upload():
    block = bytes(20 * 1024 * 1024)  # (cleared: every page touched)
    copy = bytearray(block)  # a second block while the first is held
    del block, copy
upload()  # the first: its pages are new either way
before = faults()
for _ in range(5):
    upload()
print(kept, faults() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_an_upload_worker_reuses_its_freed_memory_instead_of_new_pages() -> None:
    """Without it, each 20 MB buffer of an upload comes back as ~5,000 new pages to fault in."""
    out = {}
    for mode in ("keep", "default"):
        proc = subprocess.run([sys.executable, "-c", _FAULTS_SCRIPT, mode], capture_output=True, text=True, check=True)
        kept, faults = proc.stdout.split()
        out[mode] = (kept, int(faults))
    assert out["keep"][0] == "True"
    pages = 5 * 2 * 20 * 1024 * 1024 // 4096  # 5 rounds of two 20 MB blocks
    assert out["default"][1] > pages // 2  # (the default maps and unmaps each block anew)
    assert out["keep"][1] < out["default"][1] // 5


def test_a_chunk_reported_after_the_stop_was_sent_does_not_make_the_workers_exit_a_death(
    world: h.World, tmp_path: Path
) -> None:
    """Closing, a worker may still check a chunk its owner checked too; its report must not make
    it "idle" again, or its exit on the stop is logged as a death."""
    pool, _ = _pool(world, tmp_path, processes=1)
    try:
        _wait(lambda: len(pool.pids()) == 1, "the worker")
        w = pool._workers[0]
        job = _Job(7, tmp_path / "x.ale", h.PARTICIPANT, "sub-x", time.time(), None)
        span = Span(3, os.getpid(), 0, "ale-trajectory-x", 0, 10, None)
        with pool._lock:
            w.state, w.task = "leaving", (job, span)
            pool._checked(w, job.id, span.index, None, None)
            assert w.state == "leaving"
            w.state, w.task = "check", (job, span)
            pool._checked(w, job.id, span.index, None, None)
            assert w.state == "idle"
    finally:
        pool.close()
