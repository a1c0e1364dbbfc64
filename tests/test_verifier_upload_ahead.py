"""Uploads sent ahead (ale_verify.workers): a worker that checks an upload is sent the next one, and
starts it the moment it ends its own; until then the upload still waits (it may be cancelled, taken
back for a worker that is idle, refused when the server stops), and a worker that dies before it
started it costs it nothing: another worker checks it."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import verifier_helpers as h
from test_verifier_workers import _challenged, _pool, _submit, _wait

from ale_verify import db, tokens
from ale_verify.config import Settings
from ale_verify.pipeline import LocalSite
from ale_verify.workers import Busy, UploadPool, _Link


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, db_engine: h.Databases) -> h.World:
    return h.get_world(tmp_path_factory, request.config, db_engine)


class _Gates:
    """The site's answers, each challenge held at step 8 until the test opens its gate."""

    def __init__(self, settings: Settings) -> None:
        self._site = LocalSite(settings)
        self._lock = threading.Lock()
        self.gates: dict[str, threading.Event] = {}
        self.entered: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._site, name)

    def challenge(self, challenge_id: str) -> Any:
        with self._lock:
            gate = self.gates.setdefault(challenge_id, threading.Event())
            self.entered.append(challenge_id)
        assert gate.wait(120)
        return self._site.challenge(challenge_id)

    def open(self, challenge_id: str) -> None:
        with self._lock:
            self.gates.setdefault(challenge_id, threading.Event()).set()

    def open_all(self) -> None:
        with self._lock:
            for gate in self.gates.values():
                gate.set()


def _plain(world: h.World) -> bytes:
    return h.encrypt_files(h.seal(world.files("plain")), world.keys.recipient)


def _challenged_as(world: h.World, settings: Settings) -> tuple[bytes, str]:
    """A bundle bound to a new challenge, and the challenge's id."""
    row = db.create_challenge(settings.database, h.PARTICIPANT, 3600)
    token = tokens.issue(
        world.keys.signing_key, challenge_id=row["id"], nonce=row["nonce"], user_id=h.PARTICIPANT,
        expires_at=row["expires_at"],
    )  # fmt: skip
    return h.encrypt_files(h.rebind(world.files("site"), row["nonce"], token), world.keys.recipient), row["id"]


def _both_held(world: h.World, pool: UploadPool, settings: Settings) -> tuple[_Gates, list[tuple[Any, str]]]:
    """Two workers, each held at step 8 of a challenged upload: (future, challenge id) of each."""
    _wait(lambda: len(pool.pids()) == 2, "the workers")
    gates = _Gates(settings)
    pool._site = gates  # type: ignore[assignment]
    held = []
    for i in range(2):
        data, challenge_id = _challenged_as(world, settings)
        held.append((_submit(pool, settings, data, f"held-{i}.ale"), challenge_id))
    _wait(lambda: len(gates.entered) == 2 and all(w.asking for w in pool._workers), "both workers at step 8")
    return gates, held


def _ahead(pool: UploadPool) -> list[Any]:
    with pool._lock:
        return [w for w in pool._workers if w.ahead is not None]


@attrs.frozen
class _SentAhead:
    pool: UploadPool
    settings: Settings
    gates: _Gates
    held: list[tuple[Any, str]]
    later: Any  # the upload's future
    holder: Any  # the worker it was sent ahead to


@contextlib.contextmanager
def _sent_ahead(world: h.World, tmp_path: Path) -> Iterator[_SentAhead]:
    """Two workers held at step 8, and a third upload sent ahead to one of them; the pool closed after."""
    pool, settings = _pool(world, tmp_path, processes=2)
    try:
        gates, held = _both_held(world, pool, settings)
        later = _submit(pool, settings, _plain(world), "later.ale")
        _wait(lambda: len(_ahead(pool)) == 1, "the upload sent ahead")
        (holder,) = _ahead(pool)
        yield _SentAhead(pool, settings, gates, held, later, holder)
    finally:
        pool.close()


def test_a_worker_gives_back_an_upload_recalled_before_it_started_it() -> None:
    """The worker's side: uploads sent while it checks one are held in order; a recall takes back
    one not started (``recalled``), and one already started is not given back."""
    server, worker = multiprocessing.Pipe(duplex=True)
    link = _Link(worker)
    server.send(("upload", 1, "a"))
    server.send(("upload", 2, "b"))
    server.send(("upload", 3, "c"))
    server.send(("recall", 2))
    assert link.task() == ("upload", 1, "a")
    assert server.poll(5)
    assert server.recv() == ("recalled", 2)
    server.send(("recall", 1))  # started: it runs to its verdict
    assert link.task() == ("upload", 3, "c")
    assert not server.poll(0.2)
    server.send(("stop",))
    assert link.task() == ("stop",)


def test_a_worker_killed_holding_a_running_and_an_upload_sent_ahead_fails_only_the_running_one(
    world: h.World,
    tmp_path: Path,
) -> None:
    """Both workers busy; the next upload is sent ahead to one; that one is killed: its running
    upload is rejected as worker_failed, the one sent ahead is checked by another worker (the new
    one, while the other is still held) and accepted."""
    with _sent_ahead(world, tmp_path) as s:
        victim = s.holder.pid
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        accepted = s.later.result(timeout=120)  # the other worker is still held at step 8
        assert accepted.status == "accepted", accepted.reasons
        killed = [f for f, _ in s.held if f.done()]
        assert len(killed) == 1
        outcome = killed[0].result()
        assert (outcome.status, outcome.reason) == ("rejected", "worker_failed")
        s.gates.open_all()
        statuses = sorted(f.result(timeout=120).status for f, _ in s.held)
        assert statuses == ["accepted", "rejected"]
        stored = {row["id"]: row["status"] for row in db.all_submissions(s.settings.database)}
        assert stored[accepted.submission_id] == "accepted"
        assert stored[outcome.submission_id] == "rejected"
        assert victim not in s.pool.pids()
        _wait(lambda: not list(s.settings.tmp_dir.iterdir()), "every upload's file to go")


def test_an_upload_sent_ahead_to_a_busy_worker_goes_to_a_worker_that_becomes_idle(
    world: h.World,
    tmp_path: Path,
) -> None:
    """Both workers busy; the next upload is sent ahead to one; the other ends its upload: the
    holder (still at step 8) gives the upload back and the idle worker checks it."""
    with _sent_ahead(world, tmp_path) as s:
        (other,) = (w for w in s.pool._workers if w is not s.holder)
        assert s.holder.job is not None
        assert other.job is not None
        holders = s.holder.job.future
        s.gates.open(next(challenge_id for f, challenge_id in s.held if f is other.job.future))
        assert s.later.result(timeout=120).status == "accepted"
        assert not holders.done()  # still held at step 8: the upload did not wait for it
        s.gates.open_all()
        assert [f.result(timeout=120).status for f, _ in s.held] == ["accepted", "accepted"]


def test_an_upload_sent_ahead_and_cancelled_is_given_back_and_dropped(
    world: h.World,
    tmp_path: Path,
) -> None:
    pool, settings = _pool(world, tmp_path, processes=1)
    try:
        _wait(lambda: len(pool.pids()) == 1, "the worker")
        gates = _Gates(settings)
        pool._site = gates  # type: ignore[assignment]
        first = _submit(pool, settings, _challenged(world, settings), "a.ale")
        _wait(lambda: len(gates.entered) == 1, "the worker at step 8")
        waiting = _submit(pool, settings, b"never checked", "b.ale")
        _wait(lambda: len(_ahead(pool)) == 1, "the upload sent ahead")
        assert waiting.cancel()
        _wait(lambda: not (settings.tmp_dir / "b.ale").exists(), "the cancelled upload's file to go")
        assert not _ahead(pool)
        gates.open_all()
        assert first.result(timeout=120).status == "accepted"
        assert len(db.all_submissions(settings.database)) == 1
    finally:
        pool.close()


def test_closing_refuses_an_upload_sent_ahead_and_not_started(
    world: h.World,
    tmp_path: Path,
) -> None:
    pool, settings = _pool(world, tmp_path, processes=1)
    _wait(lambda: len(pool.pids()) == 1, "the worker")
    gates = _Gates(settings)
    pool._site = gates  # type: ignore[assignment]
    first = _submit(pool, settings, _challenged(world, settings), "a.ale")
    _wait(lambda: len(gates.entered) == 1, "the worker at step 8")
    ahead = _submit(pool, settings, _plain(world), "b.ale")
    _wait(lambda: len(_ahead(pool)) == 1, "the upload sent ahead")
    closer = threading.Thread(target=pool.close)
    closer.start()
    with pytest.raises(Busy, match="shutting down"):
        ahead.result(timeout=60)
    gates.open_all()
    assert first.result(timeout=120).status == "accepted"
    closer.join(60)
    assert not closer.is_alive()
    assert list(settings.tmp_dir.iterdir()) == []
    assert len(db.all_submissions(settings.database)) == 1
