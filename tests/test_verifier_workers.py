"""Trajectory checking on worker processes (ale_verify.chain_workers): the same verdicts as one pass."""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import verifier_helpers as h
from test_verifier_pipeline import CONTAINER_CASES, DOCUMENT_CASES, _assert_rejected, _upload
from trajectory_helpers import RunBuilder

from ale.core.trajectory import ChainError, link_chunks, verify_chain
from ale_verify.chain_workers import ChainWorkers


@pytest.fixture(scope="module")
def workers() -> Iterator[ChainWorkers]:
    pool = ChainWorkers(2, chunk_bytes=4096)  # (the minimum) so that a small stream makes many chunks
    pool.warm()
    yield pool
    pool.close()


def _stream(n: int) -> bytes:
    """A whole run with ``n`` events in its agent phase, each with ``"i"``: its 0-based line."""
    run = RunBuilder(nonce="n").open_task()
    kinds = [("untrusted_agent", "note"), ("trusted_evaluator", "rpc"), ("trusted_harness", "rejected_agent_event")]
    for i in range(n):
        producer, kind = kinds[i % 3]
        run.add(producer, kind, {"i": len(run.lines), "text": "x" * (i % 300), "v": [0.25 * i, -i]})
    return run.close_task().finish().stream()


def _verdict(check: Any) -> tuple[str, Any]:
    try:
        return ("ok", check())
    except ChainError as exc:
        return ("error", (exc.reason, exc.line, str(exc)))


def _through(workers: ChainWorkers, stream: bytes, seed: int = 0, **kwargs: Any) -> Any:
    """Feed the stream in blocks of random sizes (as decompression does), then link the reports."""
    rng = random.Random(seed)
    job = workers.job()
    pos = 0
    while pos < len(stream):
        size = rng.randint(1, 3000)
        job.feed(stream[pos : pos + size])
        pos += size
    reports = job.reports()
    if isinstance(reports, bytes):
        assert reports == stream  # the one-pass fallback gets the whole stream back
        return None
    assert len(reports) > 1 or len(stream) < 8192
    return lambda: link_chunks(reports, **kwargs)


def _tamper(stream: bytes, line: int, old: bytes, new: bytes) -> bytes:
    lines = stream.split(b"\n")
    assert old in lines[line]
    lines[line] = lines[line].replace(old, new, 1)
    return b"\n".join(lines)


CASES = {
    "valid": lambda s: s,
    "edited-data": lambda s: _tamper(s, 40, b'"i":40', b'"i":41'),
    "broken-link": lambda s: _tamper(s, 60, b'"prev_hash":"', b'"prev_hash":"0'),
    "dropped-line": lambda s: b"\n".join(line for i, line in enumerate(s.split(b"\n")) if i != 33),
    "bad-seq": lambda s: _tamper(s, 70, b'"seq":70', b'"seq":71'),
    "not-canonical": lambda s: _tamper(s, 50, b'"i":50', b'"i":50.0'),
    "not-json": lambda s: _tamper(s, 45, b"{", b"["),
    "empty": lambda s: b"",
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("nonce", [None, "n", "other"])
def test_workers_give_the_one_pass_verdict(workers: ChainWorkers, case: str, nonce: str | None) -> None:
    stream = CASES[case](_stream(120))
    kwargs = {"expected_nonce": nonce, "check_nonce": nonce is not None}
    linked = _through(workers, stream, seed=len(case), **kwargs)
    assert linked is not None
    assert _verdict(linked) == _verdict(lambda: verify_chain(stream, **kwargs))


def test_a_truncated_stream_goes_to_the_one_pass(workers: ChainWorkers) -> None:
    stream = _stream(30)[:-1]
    assert _through(workers, stream) is None  # the caller runs verify_chain, which names the line
    with pytest.raises(ChainError, match="truncated"):
        verify_chain(stream)


def _memfds() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "ale-trajectory" in target:
            out.append(target)
    return out


def test_jobs_free_their_memory_file(workers: ChainWorkers) -> None:
    stream = _stream(50)
    job = workers.job()
    job.feed(stream)
    assert _memfds()
    job.cancel()
    job.cancel()  # idempotent
    assert _memfds() == []
    with pytest.raises(RuntimeError, match="cancelled"):
        job.feed(stream)
    assert _through(workers, stream) is not None
    assert _memfds() == []


def test_a_dead_worker_means_one_pass_then_a_fresh_pool() -> None:
    pool = ChainWorkers(2, chunk_bytes=4096)
    try:
        pool.warm()
        stream = _stream(200)
        job = pool.job()
        for pid in list(pool._pool._processes):  # type: ignore[union-attr]
            os.kill(pid, signal.SIGKILL)
        job.feed(stream)
        assert job.reports() == stream
        linked = _through(pool, stream)  # a new pool serves the next job
        assert linked is not None
        assert linked().head == verify_chain(stream).head
    finally:
        pool.close()
    late = pool.job()  # after close: the job says "check in one pass" instead of failing the upload
    late.feed(_stream(100))
    assert late.reports() == _stream(100)


def test_processes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ChainWorkers(0)


# -- the served pipeline with workers ---------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, db_engine: h.Databases) -> h.World:
    return h.get_world(tmp_path_factory, request.config, db_engine)


def test_served_pipeline_with_workers_accepts_a_real_bundle(world: h.World, tmp_path: Path) -> None:
    data = h.encrypt_files(h.seal(world.files("plain")), world.keys.recipient)
    reply, _ = _upload(world, tmp_path, data, check_processes=2)
    assert reply.status == 201, reply.body
    assert reply.json["status"] == "accepted"
    assert _memfds() == []


@pytest.mark.parametrize("case", sorted(DOCUMENT_CASES))
def test_served_pipeline_with_workers_refuses_what_one_pass_refuses(world: h.World, tmp_path: Path, case: str) -> None:
    """Every hostile document and trajectory of the pipeline tests, through the worker path."""
    build, reason = DOCUMENT_CASES[case]
    data = h.encrypt_files(build(dict(world.files("plain"))), world.keys.recipient)
    reply, _ = _upload(world, tmp_path, data, check_processes=2)
    _assert_rejected(reply, reason)
    assert _memfds() == []


def test_a_worker_reads_only_its_own_jobs_memory_file(tmp_path: Path) -> None:
    """A descriptor number reused after a job ended must not be read as that job's trajectory."""
    from ale_verify.chain_workers import _check_span

    other = tmp_path / "not-a-trajectory"
    other.write_bytes(_stream(3))
    fd = os.open(other, os.O_RDONLY)
    try:
        with pytest.raises(OSError, match="gone"):
            _check_span(os.getpid(), fd, "ale-trajectory-0000", 0, 10, 1)
    finally:
        os.close(fd)
    stream = _stream(5)
    name = "ale-trajectory-test"
    fd = os.memfd_create(name)
    try:
        os.write(fd, stream)
        assert _check_span(os.getpid(), fd, name, 0, len(stream), 1).lines == stream.count(b"\n")
    finally:
        os.close(fd)


def test_a_worker_that_raises_means_one_pass_and_the_pool_stays(workers: ChainWorkers) -> None:
    """A task that raises (a bug, or a memory file gone) is not a broken pool: other jobs go on."""
    stream = _stream(200)
    job = workers.job()
    job._name = "ale-trajectory-not-this-one"  # the workers will refuse to read the file
    job.feed(stream)
    pool = workers._pool
    assert job.reports() == stream
    assert workers._pool is pool  # not torn down
    assert _through(workers, stream) is not None


@pytest.mark.parametrize("case", sorted(CONTAINER_CASES))
def test_served_pipeline_with_workers_refuses_broken_containers(world: h.World, tmp_path: Path, case: str) -> None:
    """Failures before the trajectory is read: the job is dropped, its memory file freed."""
    build, reason = CONTAINER_CASES[case]
    reply, _ = _upload(world, tmp_path, build(world, dict(world.files("plain"))), check_processes=2)
    _assert_rejected(reply, reason)
    assert _memfds() == []
