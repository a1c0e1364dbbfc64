"""Upload workers: every upload's checks on a bounded pool of processes, so uploads use every core.

The server process receives uploads, talks to the database and answers; steps 1 to 13 of each
upload (:func:`ale_verify.pipeline.verify_upload`: decryption, decompression, the tar, the
documents, the chain, the integrity root, the re-scoring) run on one of ``processes`` worker
processes (docs/verifier.md, "Upload workers"). A worker asks the server for what needs the
site's own records (:class:`ale_verify.pipeline.Site`: a challenge, a runner key), and offers its
trajectory's chunks to the workers that are idle
(:mod:`ale_verify.chain_workers`). The server stores the verdict (step 14) and deletes the upload's
file (step 15).

Bounds: :class:`Admission` refuses an upload (:class:`Busy`, HTTP 503 with ``Retry-After``) when
``ALE_VERIFY_MAX_PENDING_UPLOADS`` uploads are already in the server (being received, waiting for a
worker, or being checked); a worker's address space is capped (``RLIMIT_AS``) and each task it runs gets a
CPU time budget (``RLIMIT_CPU``). A worker that dies (killed, past a bound) fails only the upload
it was checking, which is stored as rejected with ``worker_failed`` and why; a chunk it was
checking for another upload goes back to that upload's worker; a new worker takes its place.

The pool is thread-based (a reader and a writer thread per worker, a small thread pool for the
site's answers and the verdicts' storage), so it serves any event loop: callers wait on the
:class:`concurrent.futures.Future` that :meth:`UploadPool.submit` returns. Workers are started
with ``forkserver`` (never ``fork``: the server has threads).
"""

from __future__ import annotations

import collections
import ctypes
import hashlib
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import resource
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import attrs

from ale.core.reasons import Reason
from ale.core.trajectory import ChunkReport
from ale.core.verify import RunnerKey
from ale_verify import pipeline
from ale_verify.chain_workers import CHUNK_BYTES, News, SharedChainJob, Span, check_span
from ale_verify.config import Settings

log = logging.getLogger(__name__)

#: What the server tells an upload's worker about its chunks (chain_workers.News).
CHAIN_NEWS = ("taken", "report", "back")
#: The tasks the server sends a worker (an upload may come while it checks another: it is held).
TASKS = ("upload", "check", "stop")
#: What a worker says about the upload it checks (the job's id second).
JOB_MESSAGES = frozenset({"ask", "done", "bug", "aborted", "memory", "chunk", "mine", "drop"})
#: What a worker may ask of the server (pipeline.Site's methods).
SITE_METHODS = frozenset({"challenge", "consume", "runner_key"})
#: Seconds a refused client is told to wait (Retry-After).
RETRY_AFTER_S = 5
#: A worker that ran out of its memory bound exits with this status after saying so.
EXIT_MEMORY = 3
#: How long close() waits for the uploads being checked, then for each worker to exit.
CLOSE_TIMEOUT_S = 30.0
#: A worker's GIL switch interval (Python's default is 5 ms).
SWITCH_INTERVAL_S = 0.001
#: How often the watchdog looks for a worker that gives no sign of life.
WATCH_EVERY_S = 1.0


class Busy(Exception):
    """The pool takes no more uploads now (every slot is taken, or it is shutting down)."""


class WorkerBug(Exception):
    """The pipeline raised something other than a verdict on a worker: the verifier's bug."""


@attrs.frozen
class WorkerLimits:
    """What bounds a worker: its address space (bytes, 0: none), each task's CPU time (seconds,
    0: none), and the size of the trajectory's chunks it shares."""

    memory_bytes: int
    cpu_s: int
    chunk_bytes: int = CHUNK_BYTES
    processes: int = 1  # the pool's workers


# -- the worker process ---------------------------------------------------------------------------


class _Aborted(BaseException):
    """The server could not answer the worker (the database is unavailable, ...): the upload stops.
    A BaseException, so that no ``except Exception`` of the pipeline takes it for a verdict."""


class _Link:
    """The worker's end of its pipe: tasks, the answers to its questions, its chunks' news."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._sending = threading.Lock()  # the pipeline's thread and the trajectory's decompression send
        self.job: int | None = None  # the upload being checked here
        self.chain: collections.deque[tuple[Any, ...]] = collections.deque()  # its chunks' messages
        self.dropped = False
        self.held: collections.deque[tuple[Any, ...]] = collections.deque()  # tasks sent ahead, in order

    def send(self, message: tuple[Any, ...]) -> None:
        with self._sending:
            self.conn.send(message)

    def _keep(self, message: tuple[Any, ...]) -> None:
        """A message about the current upload's chunks (another one's are stale: dropped)."""
        if self.hold(message):
            return
        if message[0] in CHAIN_NEWS and message[1] == self.job and not self.dropped:
            self.chain.append(message)

    def hold(self, message: tuple[Any, ...]) -> bool:
        """A task (the next upload, sent while this one is checked) is held until this one ends; a
        ``recall`` takes back a held upload (another worker is idle, its client went away, the server
        stops): ``recalled`` tells the server it was not started. False: not about the tasks."""
        if message[0] in TASKS:
            self.held.append(message)
            return True
        if message[0] != "recall":
            return False
        taken = next((m for m in self.held if m[0] == "upload" and m[1] == message[1]), None)
        if taken is not None:  # (else it was started, or never came: the server learns it from its messages)
            self.held.remove(taken)
            self.send(("recalled", message[1]))
        return True

    def task(self) -> tuple[Any, ...]:
        """The next task: ``upload``, ``check`` or ``stop`` (a recall that came first is honoured)."""
        while self.conn.poll(0):
            self.hold(self.conn.recv())  # anything else is about an upload that has ended here: dropped
        while not self.held:
            self.hold(self.conn.recv())
        return self.held.popleft()

    def ask(self, method: str, *args: Any) -> Any:
        """The server's answer to a question of the pipeline (pipeline.Site)."""
        self.send(("ask", self.job, method, args))
        while True:
            message: tuple[Any, ...] = self.conn.recv()
            if message[0] == "answer" and message[1] == self.job:
                return message[2]
            if message[0] == "abort" and message[1] == self.job:
                raise _Aborted
            self._keep(message)

    def chain_news(self, *, wait: bool, wake: int | None = None) -> list[tuple[Any, ...]]:
        """The messages about this upload's chunks that came; with ``wait``, at least one unless
        ``wake`` is readable first."""
        while True:
            while self.conn.poll(0):
                self._keep(self.conn.recv())
            if self.chain or not wait:
                news = list(self.chain)
                self.chain.clear()
                return news
            ready = multiprocessing.connection.wait([self.conn] if wake is None else [self.conn, wake])
            if self.conn not in ready:
                return []


@attrs.define
class _RemoteSite:
    """pipeline.Site on a worker: every question goes to the server, which answers with its LocalSite."""

    link: _Link

    def challenge(self, challenge_id: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self.link.ask("challenge", challenge_id)
        return found

    def consume(self, challenge_id: str, submission_id: str) -> bool:
        return bool(self.link.ask("consume", challenge_id, submission_id))

    def runner_key(self, key_id: str) -> RunnerKey | None:
        found: RunnerKey | None = self.link.ask("runner_key", key_id)
        return found


@attrs.define
class _PoolHelpers:
    """chain_workers.Helpers on a worker: the idle workers, through the server."""

    link: _Link

    def offer(self, span: Span) -> None:
        self.link.send(("chunk", self.link.job, span))

    def claim(self, index: int) -> None:
        self.link.send(("mine", self.link.job, index))

    def drop(self) -> None:
        self.link.dropped = True
        self.link.chain.clear()
        self.link.send(("drop", self.link.job))

    def news(self, *, wait: bool, wake: int | None = None) -> list[News]:
        out: list[News] = []
        for message in self.link.chain_news(wait=wait, wake=wake):
            if message[0] == "report":
                report: ChunkReport = pickle.loads(message[3])  # our own worker's pickle
                out.append(("report", (message[2], report)))
            else:
                out.append((message[0], message[2]))
        return out


def _bound_memory(limits: WorkerLimits) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a worker killed by a bound leaves no core file
    if limits.memory_bytes > 0:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        soft = limits.memory_bytes if hard == resource.RLIM_INFINITY else min(hard, limits.memory_bytes)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: blocks up to this size come from the heap (glibc's largest mmap threshold on 64-bit systems)
HEAP_BLOCK_BYTES = 32 * 1024 * 1024
#: the heap is given back to the kernel only past this much free memory at its top
HEAP_TRIM_BYTES = 512 * 1024 * 1024


def _keep_heap() -> bool:
    """Keep the memory of one upload for the next (glibc only; True if set).

    By default glibc maps each block of 128 KiB or more on its own and unmaps it when freed, so
    every upload's buffers of tens of MB (the file, the payload, the tar, its members) come back
    as fresh pages, each faulted in and cleared by the kernel again: about 25 ms of a 20 MB
    upload's critical path. Blocks up to 32 MiB come from the heap instead, and the heap keeps its
    free memory: a worker stays at its largest upload's size, within its RLIMIT_AS."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc: the allocator's own defaults
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, HEAP_BLOCK_BYTES) and mallopt(_M_TRIM_THRESHOLD, HEAP_TRIM_BYTES))


def _budget_cpu(limits: WorkerLimits) -> None:
    """The next task may use ``cpu_s`` more seconds of CPU; past them the kernel sends SIGXCPU,
    whose default action ends the process (the server then says why)."""
    if limits.cpu_s <= 0:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = int(usage.ru_utime + usage.ru_stime) + limits.cpu_s + 1
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def worker_main(conn: Connection, settings: Settings, signing_key: bytes, limits: WorkerLimits) -> None:
    """A worker process: upload and chunk tasks from the server, until it says stop or goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C at the server's terminal: the server stops us
    # The trajectory's decompression thread takes the GIL back after every block while this one
    # checks chunks: at Python's default 5 ms a turn it would wait more than it decompresses.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    _bound_memory(limits)
    _keep_heap()
    pipeline.warm()
    link = _Link(conn)
    link.send(("ready", os.getpid()))
    while True:
        try:
            message = link.task()
        except (EOFError, OSError):  # the server is gone
            return
        if message[0] == "stop":
            return
        _budget_cpu(limits)
        try:
            if message[0] == "check":
                _check(link, message[1], message[2])
            else:
                _upload(link, settings, signing_key, limits, message)
        except MemoryError:
            raise SystemExit(EXIT_MEMORY) from None


def _check(link: _Link, job: int, span: Span) -> None:
    try:
        blob, error = pickle.dumps(check_span(span), protocol=pickle.HIGHEST_PROTOCOL), None
    except MemoryError:
        link.send(("checked", job, span.index, None, "MemoryError"))
        raise
    except Exception as exc:  # its owner checks it again itself; whatever this was, it is logged
        blob, error = None, f"{type(exc).__name__}: {exc}"
    link.send(("checked", job, span.index, blob, error))


def _upload(
    link: _Link, settings: Settings, signing_key: bytes, limits: WorkerLimits, message: tuple[Any, ...]
) -> None:
    _, job, path, user_id, submission_id, now = message
    link.job, link.dropped = job, False
    link.chain.clear()
    chain: SharedChainJob | None = None
    try:
        chain = SharedChainJob(_PoolHelpers(link), limits.chunk_bytes, alone=limits.processes == 1, reuse=True)
        outcome = pipeline.verify_upload(
            Path(path),
            settings,
            signing_key,
            user_id=user_id,
            submission_id=submission_id,
            now=now,
            site=_RemoteSite(link),
            chain=chain,
        )
    except _Aborted:
        link.send(("aborted", job))
    except MemoryError:
        link.send(("memory", job))
        raise
    except Exception:  # the verifier's bug, never the uploader's: the server answers 500 and logs it
        link.send(("bug", job, traceback.format_exc(limit=20)))
    else:
        link.send(("done", job, outcome))
    finally:
        link.job = None
        link.chain.clear()
        if chain is not None:
            chain.cancel()  # (verify_upload did, unless it was not reached)


# -- the server's side ----------------------------------------------------------------------------


class Admission:
    """At most ``limit`` uploads in the server at once, from before their body is read until their
    verdict is stored (with or without workers). Thread-safe."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the server takes at least 1 upload at a time")
        self.limit = limit
        self._lock = threading.Lock()
        self._held = 0

    def admit(self) -> Ticket:
        """A place for one more upload, or :class:`Busy`."""
        with self._lock:
            if self._held >= self.limit:
                raise Busy(f"the verifier holds {self.limit} uploads already (ALE_VERIFY_MAX_PENDING_UPLOADS)")
            self._held += 1
        return Ticket(self)

    @property
    def held(self) -> int:
        with self._lock:
            return self._held

    def _release(self) -> None:
        with self._lock:
            self._held -= 1


class Ticket:
    """One upload's place among the admitted ones."""

    def __init__(self, admission: Admission) -> None:
        self._admission: Admission | None = admission

    def release(self) -> None:
        """Give the place back (idempotent)."""
        admission, self._admission = self._admission, None
        if admission is not None:
            admission._release()


@attrs.define(eq=False)
class _Job:
    id: int
    path: Path
    user_id: str
    submission_id: str
    now: float
    ticket: Ticket | None
    future: Future[pipeline.Outcome] = attrs.field(factory=Future)
    owner: _Worker | None = None
    pending: collections.deque[Span] = attrs.field(factory=collections.deque)  # offered, not yet taken
    helping: dict[int, _Worker] = attrs.Factory(dict)  # chunks other workers check, by index
    dropped: bool = False  # its owner checks the stream in one pass: chunks not needed
    error: BaseException | None = None  # what the site's answer raised
    challenge: str | None = None  # the challenge it claimed at step 8: its use is stored with the verdict
    recalling: bool = False  # sent ahead to a worker, asked back (recall) before it started


@attrs.define(eq=False)
class _Worker:
    slot: int
    process: Any  # multiprocessing.Process (forkserver)
    conn: Connection
    outbox: queue.SimpleQueue[tuple[Any, ...] | None] = attrs.field(factory=queue.SimpleQueue)
    state: str = "starting"  # starting | idle | upload | check | leaving | dead
    pid: int | None = None
    job: _Job | None = None  # the upload it checks
    ahead: _Job | None = None  # the upload sent ahead, which it starts when ``job`` ends (not started yet)
    task: tuple[_Job, Span] | None = None  # the chunk it checks for another upload
    heard: float = 0.0  # (monotonic) its last message, or the last one it was sent
    asking: bool = False  # it waits for the server's answer
    stalled: str | None = None  # why the watchdog killed it


def _describe_exit(code: int | None, limits: WorkerLimits, stalled: str | None = None) -> str:
    if stalled is not None:
        return stalled
    if code == -signal.SIGXCPU:
        return f"it used more than its CPU time bound ({limits.cpu_s} s of CPU)"
    if code == EXIT_MEMORY:
        return f"it ran out of its memory bound ({limits.memory_bytes} bytes of address space)"
    if code is None:
        return "it stopped answering"
    if code < 0:
        name = signal.Signals(-code).name
        hint = " (by the kernel's out-of-memory killer, or an operator)" if code == -signal.SIGKILL else ""
        return f"it was killed by {name}{hint}"
    return f"it exited with status {code}"


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
    except OSError:
        return ""
    return digest.hexdigest()


class UploadPool:
    """``processes`` upload workers and the queue in front of them. Thread-safe; one per server."""

    def __init__(
        self,
        settings: Settings,
        signing_key: bytes,
        processes: int,
        *,
        chunk_bytes: int = CHUNK_BYTES,
        stall_s: float | None = None,
    ) -> None:
        if processes < 1:
            raise ValueError("an upload pool has at least 1 worker")
        self.settings, self.processes = settings, processes
        #: a worker checking something that sends nothing for this long (and waits for no answer
        #: and no chunk) is stopped or stuck: killed. Default: twice its CPU budget and 30 s.
        self.stall_s = stall_s if stall_s is not None else 2 * (settings.worker_cpu_s or 300) + 30
        self.limits = WorkerLimits(settings.worker_memory_bytes, settings.worker_cpu_s, chunk_bytes, processes)
        self._signing_key = signing_key
        self._site = pipeline.LocalSite(settings)
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)  # notified whenever an upload ends
        self._queue: collections.deque[_Job] = collections.deque()
        self._jobs: dict[int, _Job] = {}  # the uploads being checked, in the order they started
        self._closed = False
        self._ids = itertools.count(1)
        self._failures = [0] * processes  # workers of each slot that died before they were ready
        self._executor = ThreadPoolExecutor(2 * processes + 2, thread_name_prefix="ale-verify-site")
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(["ale_verify.workers"])
        self._workers: list[_Worker] = []
        for slot in range(processes):
            self._spawn(slot)
        threading.Thread(target=self._watch, name="ale-verify-watchdog", daemon=True).start()

    # -- what callers use

    def submit(self, path: Path, *, user_id: str, now: float, ticket: Ticket | None = None) -> Future[pipeline.Outcome]:
        """Check the uploaded file on a worker, store the verdict, delete the file (always) and
        release ``ticket``.

        The future is cancellable while the upload waits for a worker (nothing was done: the
        file is deleted, nothing stored); once a worker has it, the upload runs to its stored
        verdict whatever the caller does."""
        job = _Job(next(self._ids), path, user_id, pipeline.new_submission_id(), now, ticket)
        job.future.add_done_callback(lambda future: self._cancelled(job) if future.cancelled() else None)
        with self._lock:
            closed = self._closed
            if not closed:
                self._queue.append(job)
                self._dispatch()
        if closed:
            job.future.set_running_or_notify_cancel()
            self._settle(job, Busy("the verifier is shutting down"))
        return job.future

    def pids(self) -> list[int]:
        """The workers' process ids (the ready ones)."""
        with self._lock:
            return [w.pid for w in self._workers if w.pid is not None and w.state != "dead"]

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Refuse new uploads, fail the queued ones (Busy), let the ones being checked finish
        (up to ``timeout``), then stop every worker."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            queued = list(self._queue)
            self._queue.clear()
            for w in self._workers:  # the uploads sent ahead and not started wait no more: refused
                self._recall(w)
        for job in queued:
            self._refuse(job)
        deadline = time.monotonic() + timeout
        with self._lock:
            while (self._jobs or any(w.ahead for w in self._workers)) and (left := deadline - time.monotonic()) > 0:
                self._settled.wait(left)
            workers = list(self._workers)
            for w in workers:
                w.state = "leaving" if w.state != "dead" else w.state
                w.outbox.put(("stop",))
                w.outbox.put(None)
        for w in workers:
            w.process.join(max(0.1, deadline - time.monotonic()))
            if w.process.is_alive():
                w.process.kill()
                w.process.join(5)
        self._executor.shutdown(wait=True)

    # -- workers

    def _spawn(self, slot: int) -> None:
        """Start the worker of ``slot`` (a new one in a dead one's place) and its two threads."""
        parent, child = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=worker_main,
            args=(child, self.settings, self._signing_key, self.limits),
            name=f"ale-verify-worker-{slot}",
            daemon=True,
        )
        process.start()
        child.close()
        worker = _Worker(slot, process, parent)
        with self._lock:
            if slot < len(self._workers):
                self._workers[slot] = worker
            else:
                self._workers.append(worker)
            if self._closed:
                worker.state = "leaving"
                worker.outbox.put(("stop",))
                worker.outbox.put(None)
        threading.Thread(target=self._write, args=(worker,), name=f"ale-verify-w{slot}-out", daemon=True).start()
        threading.Thread(target=self._read, args=(worker,), name=f"ale-verify-w{slot}-in", daemon=True).start()

    def _later(self, fn: Any, *args: Any) -> None:
        """Run ``fn`` in the site's thread pool (on a thread of its own once that is shut down)."""
        try:
            self._executor.submit(fn, *args)
        except RuntimeError:
            threading.Thread(target=fn, args=args, name="ale-verify-late", daemon=True).start()

    def _write(self, w: _Worker) -> None:
        while (message := w.outbox.get()) is not None:
            try:
                w.conn.send(message)
            except (OSError, ValueError):  # it died: the reader says so
                return

    def _read(self, w: _Worker) -> None:
        while True:
            try:
                message = w.conn.recv()
            except (EOFError, OSError):
                break
            except Exception:  # a message that does not unpickle: this worker is not to be trusted
                log.exception("an upload worker sent garbage; replacing it")
                w.process.kill()
                break
            try:
                self._handle(w, message)
            except Exception:  # our bug: logged, the worker replaced, its upload failed
                log.exception("handling a message from an upload worker failed")
                w.process.kill()
                break
        self._gone(w)

    def _gone(self, w: _Worker) -> None:
        """The worker's pipe closed: it exited or died. Its upload fails, its chunk goes back."""
        w.process.join(10)
        if w.process.is_alive():  # it closed its pipe but lives on: not ours to trust any more
            w.process.kill()
            w.process.join(10)
        code = w.process.exitcode
        w.conn.close()
        with self._lock:
            state, job, task, stalled, ahead = w.state, w.job, w.task, w.stalled, w.ahead
            w.state, w.job, w.task, w.ahead = "dead", None, None, None
            w.outbox.put(None)
            if job is not None:
                self._jobs.pop(job.id, None)
            if task is not None and task[0].id in self._jobs:
                self._give_back(task[0], task[1])
            if ahead is not None:  # never started there: another worker checks it
                self._requeue(ahead)
                self._dispatch()
            replace = not self._closed
            if state == "starting":
                self._failures[w.slot] += 1
            failures = self._failures[w.slot]
        why = _describe_exit(code, self.limits, stalled)
        if state != "leaving":
            log.error("upload worker %s (pid %s) died: %s", w.slot, w.pid, why)
        if job is not None:
            self._later(self._fail, job, why)
        if replace:
            if state == "starting":  # it died before it was ready: do not spin
                time.sleep(min(30.0, 0.25 * 2**failures))
            self._spawn(w.slot)

    def _watch(self) -> None:
        """Kill a worker that checks something and gives no sign of life for ``stall_s``: stopped
        (SIGSTOP) or stuck outside its CPU budget. Its upload fails, or its chunk goes back."""
        while True:
            time.sleep(WATCH_EVERY_S)
            now = time.monotonic()
            with self._lock:
                if self._closed:
                    return
                stuck = [
                    w
                    for w in self._workers
                    if w.state in ("upload", "check")
                    and not w.asking
                    and not (w.job is not None and w.job.helping)  # it may wait for their reports
                    and now - w.heard > self.stall_s
                    and w.stalled is None
                ]
                for w in stuck:
                    w.stalled = f"it gave no sign of life for {self.stall_s:.0f} s (stopped or stuck)"
            for w in stuck:
                log.error("upload worker %s (pid %s) %s: killing it", w.slot, w.pid, w.stalled)
                w.process.kill()

    def _handle(self, w: _Worker, message: tuple[Any, ...]) -> None:
        kind = message[0]
        with self._lock:
            w.heard = time.monotonic()
            if kind in JOB_MESSAGES and w.job is None and w.ahead is not None and message[1] == w.ahead.id:
                self._start_ahead(w)  # it started the upload sent ahead before the recall reached it
            if kind == "ready":
                w.pid, w.state = message[1], "idle" if w.state == "starting" else w.state
                self._failures[w.slot] = 0
            elif kind == "ask":
                self._ask(w, message[1], message[2], message[3])
            elif kind in ("done", "bug", "aborted", "memory"):
                self._ended(w, kind, message)
            elif kind in ("chunk", "mine", "drop"):
                self._chunks(w, kind, message[1], message[2] if len(message) > 2 else None)
            elif kind == "checked":
                self._checked(w, *message[1:])
            elif kind == "recalled":
                self._recalled(w, message[1])
            else:
                raise ValueError(f"an upload worker sent an unknown message {kind!r}")
            self._dispatch()

    def _chunks(self, w: _Worker, kind: str, job_id: int, what: Any) -> None:
        """An upload's worker offers a chunk, claims one it checks itself, or drops them all."""
        job = self._jobs.get(job_id)
        if job is None or w.job is not job:
            return
        if kind == "chunk" and not job.dropped:
            job.pending.append(what)
        elif kind == "mine":
            job.pending = collections.deque(span for span in job.pending if span.index != what)
        elif kind == "drop":
            job.dropped = True
            job.pending.clear()

    def _dispatch(self) -> None:
        """Give every idle worker a chunk of an upload being checked, or else the next upload; then
        (no worker idle) send every worker that checks an upload the next one ahead, or (workers
        idle, none waiting) take back the uploads sent ahead for them."""
        self._hand_out()
        idle = sum(w.state == "idle" for w in self._workers)
        if idle:
            for w in self._workers:
                if idle and self._recall(w):
                    idle -= 1
        elif not any(job.pending for job in self._jobs.values()):  # (idle workers are to take those)
            for w in self._workers:
                if w.state == "upload" and w.job is not None and w.ahead is None:
                    job = self._next_upload(start=False)
                    if job is None:
                        break
                    w.ahead, job.owner = job, w
                    w.outbox.put(("upload", job.id, str(job.path), job.user_id, job.submission_id, job.now))

    def _hand_out(self) -> None:
        for w in self._workers:
            if w.state != "idle":
                continue
            # the newest chunk: the upload's own worker checks its chunks from the oldest
            chunk = next(((job, job.pending.pop()) for job in self._jobs.values() if job.pending), None)
            if chunk is not None:
                helped, span = chunk
                w.state, w.task, w.heard = "check", chunk, time.monotonic()
                helped.helping[span.index] = w
                w.outbox.put(("check", helped.id, span))
                if helped.owner is not None:  # it checks this one no more
                    helped.owner.outbox.put(("taken", helped.id, span.index))
                continue
            job = self._next_upload()
            if job is None:
                break
            w.state, w.job, job.owner, w.heard = "upload", job, w, time.monotonic()
            self._jobs[job.id] = job
            w.outbox.put(("upload", job.id, str(job.path), job.user_id, job.submission_id, job.now))

    def _next_upload(self, *, start: bool = True) -> _Job | None:
        """The first upload waiting (``start``: its future running, no longer cancellable)."""
        while self._queue:
            job = self._queue.popleft()
            if job.future.set_running_or_notify_cancel() if start else not job.future.cancelled():
                return job
            self._later(self._discard, job)  # its client went away while it waited
        return None

    # -- uploads sent ahead (a worker starts the next one the moment it ends one)

    def _start_ahead(self, w: _Worker) -> None:
        """The worker ended its upload and started the one sent ahead: it is being checked."""
        job, w.ahead = w.ahead, None
        assert job is not None
        job.recalling = False
        w.state, w.job, w.heard = "upload", job, time.monotonic()
        self._jobs[job.id] = job
        job.future.set_running_or_notify_cancel()  # (cancelled since: it runs to its stored verdict all the same)

    def _recall(self, w: _Worker) -> bool:
        """Ask the worker for the upload sent ahead to it back, unless it is asked already."""
        job = w.ahead
        if job is None or job.recalling or w.state in ("leaving", "dead"):
            return False
        job.recalling = True
        w.outbox.put(("recall", job.id))
        return True

    def _cancelled(self, job: _Job) -> None:
        """The caller cancelled the upload: if it was sent ahead to a worker, it is asked back."""
        with self._lock:
            if job.owner is not None and job.owner.ahead is job:
                self._recall(job.owner)

    def _recalled(self, w: _Worker, job_id: int) -> None:
        job = w.ahead
        if job is None or job.id != job_id or not job.recalling:
            raise ValueError("an upload worker gave back an upload it was not sent ahead")
        w.ahead = None
        if w.job is None and w.state == "upload":
            w.state = "idle"
        self._requeue(job)

    def _requeue(self, job: _Job) -> None:
        """An upload sent ahead and not started waits again, first in line (refused once closing)."""
        job.owner, job.recalling = None, False
        if self._closed:
            self._later(self._refuse, job)
        else:
            self._queue.appendleft(job)

    def _refuse(self, job: _Job) -> None:
        if job.future.set_running_or_notify_cancel():
            self._settle(job, Busy("the verifier is shutting down"))
        else:
            self._discard(job)

    def _ask(self, w: _Worker, job_id: int, method: str, args: tuple[Any, ...]) -> None:
        job = self._jobs.get(job_id)
        if job is None or w.job is not job:
            raise ValueError("an upload worker asked about an upload it is not checking")
        if method not in SITE_METHODS:
            raise ValueError(f"an upload worker asked for {method!r}")
        w.asking = True
        self._later(self._answer, w, job, method, args)

    def _answer(self, w: _Worker, job: _Job, method: str, args: tuple[Any, ...]) -> None:
        """In the site's thread pool: the database, as in-process (pipeline.LocalSite)."""
        try:
            value = getattr(self._site, method)(*args)
            if method == "consume":
                job.challenge = self._site.claimed(job.submission_id)
        except BaseException as exc:  # e.g. db.Unavailable: the upload stops, the client is told
            job.error = exc
            reply: tuple[Any, ...] = ("abort", job.id)
        else:
            reply = ("answer", job.id, value)
        with self._lock:
            w.asking, w.heard = False, time.monotonic()
        w.outbox.put(reply)

    def _ended(self, w: _Worker, kind: str, message: tuple[Any, ...]) -> None:
        job = self._jobs.pop(message[1], None)
        if job is None or w.job is not job:
            raise ValueError("an upload worker ended an upload it was not checking")
        w.job = None
        if kind == "memory":
            w.state = "leaving"  # (it exits: the upload sent ahead goes to another worker)
        elif w.ahead is not None and not w.ahead.recalling:
            self._start_ahead(w)
        elif w.ahead is None:
            w.state = "idle"
        # else it says next whether it started the upload asked back or gives it back
        if kind == "done":
            self._later(self._settle, job, message[2])
        elif kind == "memory":
            self._later(self._fail, job, _describe_exit(EXIT_MEMORY, self.limits))
        elif kind == "aborted":
            self._later(self._settle, job, job.error or WorkerBug("the upload was aborted"))
        else:
            log.error("upload worker %s failed on an upload (the verifier's bug):\n%s", w.slot, message[2])
            self._later(self._settle, job, WorkerBug("an upload worker raised; see the log"))

    def _checked(self, w: _Worker, job_id: int, index: int, blob: bytes | None, error: str | None) -> None:
        task = w.task
        if task is None or task[0].id != job_id or task[1].index != index:
            raise ValueError("an upload worker reported a chunk it was not checking")
        w.task = None
        if w.state != "leaving":  # (closing: a chunk checked twice may come back after the stop was sent)
            w.state = "leaving" if error == "MemoryError" else "idle"
        job = self._jobs.get(job_id)
        if job is None or job.dropped or job.owner is None:
            return
        job.helping.pop(index, None)
        if blob is not None:
            job.owner.outbox.put(("report", job.id, index, blob))
            return
        log.info("a chunk of upload %s goes back to its worker: %s", job.submission_id, error)
        self._give_back(job, task[1])

    def _give_back(self, job: _Job, span: Span) -> None:
        """A chunk another worker failed to check: the upload's own worker checks it."""
        job.helping.pop(span.index, None)
        if not job.dropped and job.owner is not None:
            job.owner.heard = time.monotonic()
            job.owner.outbox.put(("back", job.id, span.index))

    # -- the end of an upload (in the site's thread pool)

    def _fail(self, job: _Job, why: str) -> None:
        """The worker died: the upload is stored as ``worker_failed``, its challenge left unused (the
        failure is the verifier's: the participant may upload the same bundle again)."""
        message = f"the worker process checking this upload died before it gave a verdict: {why}"
        job.challenge = None
        self._settle(job, pipeline.rejected(job.submission_id, Reason.WORKER_FAILED, message, _file_sha256(job.path)))

    def _settle(self, job: _Job, result: pipeline.Outcome | BaseException) -> None:
        """Store the verdict (step 14; with the use of the challenge it claimed), delete the file
        (15), free the place, then wake the caller."""
        error: BaseException | None = None
        try:
            if isinstance(result, BaseException):
                error = result
            else:
                result = pipeline.record(
                    result, job.path, self.settings, user_id=job.user_id, now=job.now, challenge=job.challenge
                )
        except BaseException as exc:
            error = exc
        finally:
            self._discard(job)
        if job.future.cancelled():
            pass  # its caller went away after a worker had started it: the verdict is stored all the same
        elif error is not None:
            job.future.set_exception(error)
        else:
            assert isinstance(result, pipeline.Outcome)
            job.future.set_result(result)
        with self._lock:
            self._settled.notify_all()

    def _discard(self, job: _Job) -> None:
        job.path.unlink(missing_ok=True)
        if job.ticket is not None:
            job.ticket.release()
