"""The trajectory's chain checked on every upload worker, while it is still decompressed.

Checking a trajectory is CPU-bound Python (parse, canonical form, SHA-256 of every line), and one
process uses one core. On an upload worker (:mod:`ale_verify.workers`), step 7 starts the
decompression of ``events.jsonl.zst`` on a thread of a :class:`SharedChainJob` while it checks
the JSON documents (zstd's streaming decoder holds the GIL for each block it decodes, so Python
work in the same process slows it down: see below). The stream is decompressed straight into an
anonymous in-memory file's mapping (``memfd_create``: no path, never on disk; an upload worker
reuses one for every upload, see :class:`_Arena`) and is cut at newlines into chunks of
about ``chunk_bytes`` (a :class:`Span`: where it lies in the memory file). The upload's own worker
checks its chunks in order; whatever it cannot reach now (every chunk but the one it checks) it
offers to the pool: the server hands an offered chunk to an idle worker, newest first, which reads
it through ``/proc/<pid>/fd`` (:func:`check_span`, no copy through a pipe), checks it with
:func:`ale.core.trajectory.check_chunk`, and the server tells the owner it took it. An offered
chunk no one took yet the owner claims back when it gets to it (all of them when every worker is
busy). It never waits for a permission, only, at the end, for the other workers' reports. In a pool
of more than one worker, the owner offers every chunk cut while the trajectory is still being
decompressed and leaves the decompression thread the GIL, checking only afterwards; alone, it
checks chunks meanwhile. Step 9 links the reports (:func:`ale.core.trajectory.link_chunks`: the
checks across chunk borders, then the grammar). The verdict is exactly that of one pass over the
whole stream (a property the core's tests check for every way of cutting it); only the timing
changes.

A stream that does not end in a newline is checked in one pass instead (so that its error names
the right line), over the stream read back from the memory file; so is a stream of one chunk,
which no other worker could help with. A chunk another worker failed to check (it died, or its
read failed) comes back to the owner, who checks it itself.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import threading
from collections.abc import Callable
from typing import Protocol

import attrs

from ale.core.trajectory import ChunkReport, check_chunk
from ale.core.verify import MAX_EVENTS_BYTES, decompress_events, decompress_events_into


@attrs.define
class _MemoryFile:
    """An anonymous memory file (``memfd_create``: no path) of MAX_EVENTS_BYTES (sparse: a page
    costs memory only once written) and, once asked for, its mapping into this process, which the
    decompression writes into directly (no block allocated, none copied by ``pwrite``)."""

    fd: int
    name: str
    _mapping: mmap.mmap | None = None

    @classmethod
    def new(cls) -> _MemoryFile:
        name = f"ale-trajectory-{secrets.token_hex(8)}"
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, MAX_EVENTS_BYTES)
        except OSError:
            os.close(fd)
            raise
        return cls(fd, name)

    def mapping(self) -> mmap.mmap:
        if self._mapping is None:
            self._mapping = mmap.mmap(self.fd, MAX_EVENTS_BYTES)
        return self._mapping

    def close(self) -> None:
        """Unmap and close (a worker still reading holds its own descriptor; the memory goes with the last one)."""
        if self._mapping is not None:
            self._mapping.close()
            self._mapping = None
        os.close(self.fd)


class _Arena:
    """The memory file a process reuses for one trajectory after another, and its mapping.

    A fresh memory file costs its pages anew for every upload: 46 MB written into a new one take
    ~22 ms of the decompression thread (the kernel allocates and clears each page), against ~4 ms
    into pages it already holds, and closing it frees them again (~6 ms). So each worker keeps one
    file, holding as many pages as its largest trajectory so far needed (its size is the
    trajectory's limit, MAX_EVENTS_BYTES, but a page costs only once written), mapped once into
    the process, and a job decompresses over it from the start. Bytes past a job's own size are
    an earlier upload's and are never read (every span and :meth:`SharedChainJob.stream` lie
    within the job's size); a chunk of an ended job that a helper reads after the next job began
    writing gets checked, but its report names the ended job, and the server and the owner drop
    it (their job ids differ).
    One job at a time holds it; a second job in the same process meanwhile gets a file of its own.
    Only jobs made with ``reuse`` (an upload worker's) use it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._file: _MemoryFile | None = None
        self._held = False

    def take(self) -> _MemoryFile | None:
        """The arena if no job holds it, else None."""
        with self._lock:
            if self._held:
                return None
            if self._file is None:
                self._file = _MemoryFile.new()
            self._held = True
            return self._file

    def give_back(self) -> None:
        with self._lock:
            self._held = False


_ARENA = _Arena()

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


#: What the owner hears about its chunks: ("taken", index) another worker checks it;
#: ("report", (index, report)) its report; ("back", index) it failed to: check it here.
News = tuple[str, object]


class Helpers(Protocol):
    """The owner's side of the pool (ale_verify.workers)."""

    def offer(self, span: Span) -> None:
        """A chunk any idle worker may check (returns at once)."""

    def claim(self, index: int) -> None:
        """This worker checks that chunk: it is handed to no other (returns at once)."""

    def news(self, *, wait: bool, wake: int | None = None) -> list[News]:
        """What came about this job's chunks; with ``wait``, block until something does or
        ``wake`` (a descriptor) is readable."""

    def drop(self) -> None:
        """The chunks offered are not needed any more (the stream is checked in one pass)."""


class _Stopped(Exception):
    """The job was cancelled while its trajectory was being decompressed."""


class SharedChainJob:
    """One trajectory: :meth:`start` its decompression (or :meth:`feed` it the decompressed blocks
    in order), then ask for :meth:`reports`."""

    def __init__(
        self, helpers: Helpers, chunk_bytes: int = CHUNK_BYTES, *, alone: bool = False, reuse: bool = False
    ) -> None:
        self._helpers = helpers
        #: no other worker can take a chunk: check them while the rest is decompressed (else this
        #: worker leaves the decompression the GIL and offers every chunk, checking only later)
        self._alone = alone
        self._chunk_bytes = max(MIN_CHUNK_BYTES, chunk_bytes)
        #: with ``reuse``, the process's arena (an upload worker's) if no other job holds it
        arena = _ARENA.take() if reuse else None
        self._arena = arena is not None  # (else a file of its own, freed when the job ends)
        #: the trajectory's memory file (None once the job is cancelled)
        self._file: _MemoryFile | None = arena if arena is not None else _MemoryFile.new()
        self._size = 0  # bytes written
        self._cut = 0  # where the next chunk starts
        self._last_newline = -1  # offset of the last newline written
        self._spans: list[Span] = []  # appended by whoever feeds (the decompression thread)
        self._done: dict[int, ChunkReport] = {}
        self._taken: set[int] = set()  # chunks another worker checks
        self._offered: set[int] = set()  # chunks the pool may hand to another worker
        self._offering = threading.Lock()  # (the decompression thread offers too)
        self._busy = False  # this worker is checking a chunk
        self._next = 0  # the first chunk this worker may not have looked at yet
        self._signal = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # a new chunk, or the decompression's end
        self._thread: threading.Thread | None = None
        self._ended = False
        self._error: BaseException | None = None
        self._stop = False

    # -- the stream

    def start(self, compressed: bytes) -> None:
        """Decompress ``events.jsonl.zst`` (:func:`ale.core.verify.decompress_events`) into this
        job on a thread; :meth:`decompressed` waits for it."""
        self._thread = threading.Thread(target=self._decompress, args=(compressed,), name="ale-events", daemon=True)
        self._thread.start()

    def _decompress(self, compressed: bytes) -> None:
        try:
            assert self._file is not None
            try:
                mapping = self._file.mapping()
            except OSError:  # no room for the mapping (a tight ALE_VERIFY_WORKER_MEMORY_BYTES): the blocks by pwrite
                decompress_events(compressed, self.feed)
                return
            with memoryview(mapping) as into:
                decompress_events_into(compressed, into, lambda offset, length: self._took(mapping, offset, length))
        except BaseException as exc:  # raised again by decompressed(), in the pipeline's order
            self._error = exc
        finally:
            self._ended = True
            self._poke()

    def _poke(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._signal[1], b".")

    def feed(self, block: bytes) -> None:
        """The next decompressed block; complete lines are offered once a chunk is full."""
        if self._file is None:
            raise RuntimeError("the job was cancelled")
        if self._stop:
            raise _Stopped("the job is being cancelled")
        view, at = memoryview(block), self._size
        while view:
            written = os.pwrite(self._file.fd, view, at)
            view, at = view[written:], at + written
        self._took(block, 0, len(block))

    def _took(self, data: bytes | mmap.mmap, start: int, length: int) -> None:
        """The stream grew by ``data[start:start + length]``, already in the memory file at the
        stream's end (the block fed, or the file's own mapping); complete lines are offered once
        a chunk is full."""
        if self._stop:
            raise _Stopped("the job is being cancelled")
        end, base = start + length, self._size - start  # (the stream's offset of data[0])
        newline = data.rfind(b"\n", start, end)
        if newline >= 0:
            self._last_newline = base + newline
        self._size += length
        while self._last_newline + 1 - self._cut >= self._chunk_bytes:
            # the chunk ends at the first newline that makes it chunk_bytes long: in this block,
            # since the blocks before had none past the last cut's reach
            end_of_chunk = data.find(b"\n", max(start, self._cut + self._chunk_bytes - 1 - base), end) + 1
            self._add(base + end_of_chunk)

    def _add(self, end: int) -> None:
        assert self._file is not None
        first_line = 1 if not self._spans else None  # later chunks learn their place when linked
        file = self._file
        span = Span(len(self._spans), os.getpid(), file.fd, file.name, self._cut, end - self._cut, first_line)
        self._cut = end
        self._spans.append(span)
        if self._busy or not (self._alone or self._ended):  # this worker will not get to it soon: anyone may
            self._offer(span.index)
        self._poke()

    def _offer(self, index: int) -> None:
        with self._offering:
            if index not in self._offered:
                self._offered.add(index)
                self._helpers.offer(self._spans[index])

    def stream(self) -> bytes:
        """The whole trajectory as fed (for the one pass, and the judge inputs of step 12)."""
        if self._file is None:
            raise RuntimeError("the job was cancelled")
        return self._read(0, self._size)

    def _read(self, offset: int, length: int) -> bytes:
        assert self._file is not None
        data = os.pread(self._file.fd, length, offset) if length else b""
        if len(data) != length:
            raise OSError(f"read {len(data)} of {length} bytes back from the trajectory's memory file")
        return data

    # -- the chunks

    def decompressed(self) -> bytes:
        """Wait for :meth:`start`'s decompression, checking chunks meanwhile; then what
        :func:`~ale.core.verify.decompress_events` gives when it feeds (empty), or its error."""
        if self._thread is None:
            raise RuntimeError("the job's decompression was not started")
        if self._alone:
            self._work(until=lambda: self._ended)
        self._thread.join()
        if self._error is not None:
            raise self._error
        return b""

    def reports(self) -> list[ChunkReport] | bytes:
        """The chunks' reports in stream order, or the whole stream: check it in one pass instead."""
        if self._file is None:
            raise RuntimeError("the job was cancelled")
        if self._thread is not None:
            self._thread.join()
        if self._size != self._last_newline + 1 or not self._spans:  # truncated, or one chunk
            self._helpers.drop()
            return self.stream()
        if self._size > self._cut:
            self._add(self._size)
        self._work(until=lambda: len(self._done) == len(self._spans))
        return [self._done[i] for i in range(len(self._spans))]

    def _work(self, until: Callable[[], bool]) -> None:
        """Check every chunk no other worker took, in order; take in the news; until ``until()``."""
        while not until():
            self._hear(self._helpers.news(wait=False))
            index = self._free()
            if index is not None:
                self._check_here(index)
                continue
            if until():
                return
            self._hear(self._helpers.news(wait=True, wake=self._signal[0]))
            with contextlib.suppress(BlockingIOError):
                os.read(self._signal[0], 4096)

    def _check_here(self, index: int) -> None:
        """Check a chunk here, claimed back if it was offered; meanwhile the pool may take the others."""
        with self._offering:
            if index in self._offered:
                self._helpers.claim(index)
        self._busy = True
        try:
            for other in range(index + 1, len(self._spans)):
                if other not in self._done and other not in self._taken:
                    self._offer(other)
            span = self._spans[index]
            self._done.setdefault(index, check_chunk(self._read(span.offset, span.length), span.first_line))
        finally:
            self._busy = False

    def _free(self) -> int | None:
        """The first chunk neither checked here nor taken by another worker."""
        count = len(self._spans)
        while self._next < count and self._next in self._done:
            self._next += 1
        for index in range(self._next, count):
            if index not in self._done and index not in self._taken:
                return index
        return None

    def _hear(self, news: list[News]) -> None:
        for kind, what in news:
            if kind == "taken":
                assert isinstance(what, int)
                self._taken.add(what)
            elif kind == "back":
                assert isinstance(what, int)
                self._taken.discard(what)
            else:
                assert isinstance(what, tuple)
                done: tuple[int, ChunkReport] = what
                self._done.setdefault(*done)

    def cancel(self) -> None:
        """End the job: its decompression stopped, and its memory file given back to the arena or
        closed (idempotent)."""
        self._stop = True
        if self._thread is not None:
            self._thread.join()
        if self._signal[0] >= 0:
            for fd in self._signal:
                os.close(fd)
            self._signal = (-1, -1)
        if self._file is not None:
            if self._arena:  # kept for the next job
                _ARENA.give_back()
            else:
                self._file.close()
            self._file = None
