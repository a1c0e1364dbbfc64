"""The trajectory's chain checked on every upload worker, while it is still decompressed.

Checking a trajectory is CPU-bound Python (parse, canonical form, SHA-256 of every line), and one
process uses one core. On an upload worker (:mod:`ale_verify.workers`), step 7 decompresses
``events.jsonl.zst`` into a :class:`SharedChainJob`: the stream goes into an anonymous in-memory
file (``memfd_create``: no path, never on disk, freed when closed) and is cut at newlines into
chunks of about ``chunk_bytes``. Each chunk (a :class:`Span`: where it lies in the memory file) is
offered to the pool at once: the server hands it to an idle worker, which reads it through
``/proc/<pid>/fd`` (:func:`check_span`, no copy through a pipe) and checks it with
:func:`ale.core.trajectory.check_chunk`. Step 9 checks itself every chunk no other worker took
(all of them when every worker is busy), waits for the others' reports and links them
(:func:`ale.core.trajectory.link_chunks`: the checks across chunk borders, then the grammar). The
verdict is exactly that of one pass over the whole stream (a property the core's tests check for
every way of cutting it); only the timing changes.

A stream that does not end in a newline is checked in one pass instead (so that its error names
the right line), over the stream read back from the memory file; so is a stream of one chunk,
which no other worker could help with. A chunk another worker failed to check (it died, or its
read failed) comes back to the owner, who checks it itself.
"""

from __future__ import annotations

import os
import secrets
import threading
from typing import Protocol

import attrs

from ale.core.trajectory import ChunkReport, check_chunk
from ale.core.verify import decompress_events

#: About this much of the stream (complete lines) makes a chunk: small enough that the last one
#: after decompression ends is quick, large enough that handing it over is cheap.
CHUNK_BYTES = 2 * 1024 * 1024
MIN_CHUNK_BYTES = 4096


@attrs.frozen
class Span:
    """A chunk of a job's trajectory: ``length`` bytes at ``offset`` of the memory file ``fd`` of
    process ``pid`` (named ``name``), whose first line is ``first_line`` (None: not yet known)."""

    index: int
    pid: int
    fd: int
    name: str
    offset: int
    length: int
    first_line: int | None


def check_span(span: Span) -> ChunkReport:
    """On a helping worker: read a span of another worker's memory file and check it."""
    path = f"/proc/{span.pid}/fd/{span.fd}"
    with open(path, "rb", buffering=0) as stream:
        # The descriptor number may have been reused if the job ended meanwhile: make sure it is
        # this job's file (the name is unique) before reading it.
        if os.readlink(path) not in (f"/memfd:{span.name} (deleted)", f"/memfd:{span.name}"):
            raise OSError("the trajectory's memory file is gone (the job ended)")
        chunk = os.pread(stream.fileno(), span.length, span.offset)
    if len(chunk) != span.length:
        raise OSError(f"read {len(chunk)} of {span.length} bytes of the trajectory")
    return check_chunk(chunk, span.first_line)


class Helpers(Protocol):
    """The owner's side of the pool (ale_verify.workers): offer chunks, get them back or their reports."""

    def offer(self, span: Span) -> None:
        """A chunk any idle worker may check (returns at once)."""

    def next(self, wake: int | None = None) -> Span | tuple[int, ChunkReport] | None:
        """A chunk of this job to check here (no other worker took it, or one failed to), or
        another worker's report (index, report); None as soon as ``wake`` (a descriptor) is readable."""

    def drop(self) -> None:
        """The chunks offered are not needed any more (the stream is checked in one pass)."""


class _Stopped(Exception):
    """The job was cancelled while its trajectory was being decompressed."""


class SharedChainJob:
    """One trajectory: :meth:`start` its decompression (or :meth:`feed` it the decompressed blocks
    in order), then ask for :meth:`reports`.

    :meth:`start` decompresses on a thread of its own (zstd releases the GIL), so that this
    worker checks chunks (:meth:`decompressed`) while the rest of its trajectory is decompressed.
    """

    def __init__(self, helpers: Helpers, chunk_bytes: int = CHUNK_BYTES) -> None:
        self._helpers = helpers
        self._chunk_bytes = max(MIN_CHUNK_BYTES, chunk_bytes)
        self._name = f"ale-trajectory-{secrets.token_hex(8)}"
        self._fd: int | None = os.memfd_create(self._name, os.MFD_CLOEXEC)
        self._size = 0  # bytes written
        self._cut = 0  # where the next chunk starts
        self._last_newline = -1  # offset of the last newline written
        self._spans: list[Span] = []  # (written by whoever feeds: the decompression thread)
        self._done: dict[int, ChunkReport] = {}
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None  # a pipe the decompression thread writes to when it ends
        self._error: BaseException | None = None
        self._stop = False

    def _span(self, end: int) -> Span:
        assert self._fd is not None
        first_line = 1 if not self._spans else None  # later chunks learn their place when linked
        span = Span(len(self._spans), os.getpid(), self._fd, self._name, self._cut, end - self._cut, first_line)
        self._spans.append(span)
        self._cut = end
        return span

    def start(self, compressed: bytes) -> None:
        """Decompress ``events.jsonl.zst`` (:func:`ale.core.verify.decompress_events`) into this
        job on a thread; :meth:`decompressed` waits for it."""
        self._wake = os.pipe()
        self._thread = threading.Thread(target=self._decompress, args=(compressed,), name="ale-events", daemon=True)
        self._thread.start()

    def _decompress(self, compressed: bytes) -> None:
        assert self._wake is not None
        try:
            decompress_events(compressed, self.feed)
        except BaseException as exc:  # raised again by decompressed(), in the pipeline's order
            self._error = exc
        finally:
            os.write(self._wake[1], b".")

    def decompressed(self) -> bytes:
        """Wait for :meth:`start`'s decompression, checking this job's chunks meanwhile; then what
        :func:`~ale.core.verify.decompress_events` gives when it feeds (empty), or its error."""
        if self._thread is None or self._wake is None:
            raise RuntimeError("the job's decompression was not started")
        while self._thread.is_alive():
            got = self._helpers.next(self._wake[0])
            if got is None:
                break
            self._take(got)
        self._thread.join()
        if self._error is not None:
            raise self._error
        return b""

    def _take(self, got: Span | tuple[int, ChunkReport]) -> None:
        if isinstance(got, Span):
            if got.index not in self._done:
                self._done[got.index] = self._check_here(got)
        else:
            self._done.setdefault(*got)

    def feed(self, block: bytes) -> None:
        """The next decompressed block; complete lines are offered once a chunk is full."""
        if self._fd is None:
            raise RuntimeError("the job was cancelled")
        if self._stop:
            raise _Stopped("the job is being cancelled")
        view = memoryview(block)
        while view:
            view = view[os.write(self._fd, view) :]
        base = self._size
        newline = block.rfind(b"\n")
        if newline >= 0:
            self._last_newline = base + newline
        self._size += len(block)
        while self._last_newline + 1 - self._cut >= self._chunk_bytes:
            # the chunk ends at the first newline that makes it chunk_bytes long: in this block,
            # since the blocks before had none past the last cut's reach
            end = base + block.find(b"\n", max(0, self._cut + self._chunk_bytes - 1 - base)) + 1
            self._helpers.offer(self._span(end))

    def reports(self) -> list[ChunkReport] | bytes:
        """The chunks' reports in stream order, or the whole stream: check it in one pass instead."""
        if self._fd is None:
            raise RuntimeError("the job was cancelled")
        if self._thread is not None:
            self._thread.join()
        if self._size != self._last_newline + 1 or not self._spans:  # truncated, or one chunk
            self._helpers.drop()
            return self.stream()
        if self._size > self._cut:
            self._helpers.offer(self._span(self._size))
        while len(self._done) < len(self._spans):
            got = self._helpers.next()
            assert got is not None
            self._take(got)
        return [self._done[i] for i in range(len(self._spans))]

    def _check_here(self, span: Span) -> ChunkReport:
        assert self._fd is not None
        return check_chunk(self._read(span.offset, span.length), span.first_line)

    def _read(self, offset: int, length: int) -> bytes:
        assert self._fd is not None
        data = os.pread(self._fd, length, offset) if length else b""
        if len(data) != length:
            raise OSError(f"read {len(data)} of {length} bytes back from the trajectory's memory file")
        return data

    def stream(self) -> bytes:
        """The whole trajectory as fed (for the one pass, and the judge inputs of step 12)."""
        if self._fd is None:
            raise RuntimeError("the job was cancelled")
        return self._read(0, self._size)

    def cancel(self) -> None:
        """End the job: its decompression stopped, the in-memory file freed (idempotent)."""
        self._stop = True
        if self._thread is not None:
            self._thread.join()
        if self._wake is not None:
            for fd in self._wake:
                os.close(fd)
            self._wake = None
        if self._fd is not None:
            # A worker still reading holds its own descriptor; the memory goes with the last one.
            os.close(self._fd)
            self._fd = None
