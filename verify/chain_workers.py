"""Trajectory checking on worker processes, overlapped with decompression.

Checking a trajectory is CPU-bound Python (parse, canonical form, SHA-256 of every line), and one
process can only use one core. While step 7 decompresses ``events.jsonl.zst``, a :class:`ChainJob`
cuts the stream at newlines into chunks of about ``chunk_bytes`` and hands each to a process pool
(:func:`ale.core.trajectory.check_chunk`, which also lists each chunk's grammar tokens); step 9
waits for the reports and links them (:func:`ale.core.trajectory.link_chunks`: the checks across
chunk borders, then the grammar replayed over the tokens in order). The verdict is exactly that of
one pass over the whole stream (a property the core's tests check for every way of cutting it,
against a plain reference verifier); only the timing changes.

Anything unusual takes the one-pass path instead, over the stream read back from the job's memory
file: a stream that does not end in a newline (so its error names the right line), a broken pool,
a worker that raised. The pool is started once, with ``forkserver`` (never ``fork``: the server
has threads), and restarted if a worker dies. Every stream, small ones too, goes to the workers,
which keeps the server's own process free for requests.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import secrets
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from ale.core.trajectory import ChunkReport, check_chunk

log = logging.getLogger(__name__)

#: About this much of the stream (complete lines) makes a chunk: small enough that the last one
#: after decompression ends is quick, large enough that handing it over is cheap.
CHUNK_BYTES = 2 * 1024 * 1024

#: Workers run this much nicer than the server: its own process feeds them (decompression is the
#: critical path of an upload, and it answers the API), they take whatever CPU is left.
WORKER_NICENESS = 10


def _start_worker() -> None:
    os.nice(WORKER_NICENESS)


def _warm() -> int:
    return os.getpid()


class ChainWorkers:
    """A pool of processes that check trajectory chunks. Thread-safe; one per server."""

    def __init__(self, processes: int | None = None, *, chunk_bytes: int = CHUNK_BYTES) -> None:
        if processes is not None and processes < 1:
            raise ValueError("processes must be at least 1")
        self.processes = processes or max(1, len(os.sched_getaffinity(0)))
        self.chunk_bytes = max(4096, chunk_bytes)
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._closed = False

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._closed:
                raise RuntimeError("the chain workers are closed")
            if self._pool is None:
                context = multiprocessing.get_context("forkserver")
                context.set_forkserver_preload(["ale.core.trajectory"])
                self._pool = ProcessPoolExecutor(self.processes, mp_context=context, initializer=_start_worker)
            return self._pool

    def _broken(self, pool: ProcessPoolExecutor) -> None:
        """A worker died: the pool is unusable (its pending futures all fail); the next job gets a new one."""
        with self._lock:
            if self._pool is pool:
                self._pool = None
        pool.shutdown(wait=False)

    def warm(self) -> None:
        """Start every worker now, so the first upload does not pay for it."""
        pool = self._executor()
        for future in [pool.submit(_warm) for _ in range(self.processes)]:
            future.result()

    def job(self) -> ChainJob:
        return ChainJob(self)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _check_span(pid: int, fd: int, name: str, offset: int, length: int, first_line: int | None) -> ChunkReport:
    """In a worker: read a span of the job's in-memory file and check it."""
    path = f"/proc/{pid}/fd/{fd}"
    with open(path, "rb", buffering=0) as stream:
        # The descriptor number may have been reused if the job ended meanwhile: make sure it is
        # this job's file (the name is unique) before reading it.
        if os.readlink(path) not in (f"/memfd:{name} (deleted)", f"/memfd:{name}"):
            raise OSError("the trajectory's memory file is gone (the job ended)")
        chunk = os.pread(stream.fileno(), length, offset)
    if len(chunk) != length:
        raise OSError(f"read {len(chunk)} of {length} bytes of the trajectory")
    return check_chunk(chunk, first_line)


class ChainJob:
    """One trajectory: :meth:`feed` it the decompressed blocks in order, then ask for :meth:`reports`.

    The stream goes into an anonymous in-memory file (``memfd_create``: no path, never on disk,
    freed when closed) and each worker reads its span through ``/proc/<pid>/fd``, so a chunk is
    copied once instead of being pickled through a pipe.
    """

    def __init__(self, workers: ChainWorkers) -> None:
        self._workers = workers
        self._name = f"ale-trajectory-{secrets.token_hex(8)}"
        self._fd: int | None = os.memfd_create(self._name, os.MFD_CLOEXEC)
        self._size = 0  # bytes written
        self._cut = 0  # where the next chunk starts
        self._last_newline = -1  # offset of the last newline written
        self._futures: list[Future[ChunkReport]] = []
        self._pool: ProcessPoolExecutor | None = None
        self._failed = False

    def _submit(self, end: int) -> None:
        if self._failed or self._fd is None:
            return
        try:
            if self._pool is None:
                self._pool = self._workers._executor()
            first_line = 1 if not self._futures else None  # later chunks learn their place when linked
            args = (os.getpid(), self._fd, self._name, self._cut, end - self._cut, first_line)
            self._futures.append(self._pool.submit(_check_span, *args))
            self._cut = end
        except BrokenProcessPool as exc:
            self._give_up(f"cannot submit to the chain workers: {exc}", broken=True)
        except RuntimeError as exc:  # closed, or shutting down
            self._give_up(f"cannot submit to the chain workers: {exc}")

    def _give_up(self, why: str, *, broken: bool = False) -> None:
        log.warning("trajectory check falls back to one pass in-process: %s", why)
        self._failed = True
        for future in self._futures:
            future.cancel()
        if broken and self._pool is not None:
            self._workers._broken(self._pool)

    def feed(self, block: bytes) -> None:
        """The next decompressed block; complete lines go to the workers once a chunk is full."""
        if self._fd is None:
            raise RuntimeError("the job was cancelled")
        view = memoryview(block)
        while view:
            view = view[os.write(self._fd, view) :]
        newline = block.rfind(b"\n")
        if newline >= 0:
            self._last_newline = self._size + newline
        self._size += len(block)
        if not self._failed and self._last_newline + 1 - self._cut >= self._workers.chunk_bytes:
            self._submit(self._last_newline + 1)

    def reports(self) -> list[ChunkReport] | bytes:
        """The chunks' reports in stream order, or the whole stream: check it in one pass instead."""
        try:
            if self._fd is None:
                raise RuntimeError("the job was cancelled")
            if not self._failed and self._size == self._last_newline + 1:  # else truncated: one pass
                if self._size > self._cut:
                    self._submit(self._size)
                try:
                    if not self._failed:
                        return [future.result() for future in self._futures]
                except BrokenProcessPool as exc:
                    self._give_up(f"a worker died: {exc}", broken=True)
                except Exception as exc:  # a worker's bug must not become the uploader's verdict
                    log.exception("a chain worker failed")
                    self._give_up(f"a worker raised {type(exc).__name__}")
            return self._whole()
        finally:
            self.cancel()

    def _whole(self) -> bytes:
        assert self._fd is not None
        data = os.pread(self._fd, self._size, 0) if self._size else b""
        if len(data) != self._size:
            raise OSError(f"read {len(data)} of {self._size} bytes back from the trajectory's memory file")
        return data

    def cancel(self) -> None:
        """End the job: queued chunks are not checked, the in-memory file is freed (idempotent)."""
        for future in self._futures:
            future.cancel()
        if self._fd is not None:
            # A worker still reading holds its own descriptor; the memory goes with the last one.
            os.close(self._fd)
            self._fd = None
