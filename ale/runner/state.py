"""A run's state folder: what ``ale run --resume RUN`` continues from.

``<out>/<run_id>.state/`` (mode 0700) holds::

    run.json                  what the run is (its options, less any key), written once, atomically
    key                       32 random bytes (hex, 0600): the key of the records' MACs
    segments.json             the run's active segments, one per start or resume: {"started",
                              "last"} (epoch seconds; "last" rewritten every HEARTBEAT_S while the
                              segment runs, and when it stops), so a run's runtime is the time it ran
    tasks/<id>/spool.partial  the task's spool while it runs (ale.runner.spool)
    tasks/<id>/spool.jsonl    a finished task's spool, fsynced, then renamed into place
    tasks/<id>/record.json    a finished task's record: its outcome, its spool's size and SHA-256
                              and chain head, the run and the task, its span (when it started and
                              finished, epoch seconds), and an HMAC-SHA256 over them

A record is written atomically (a temporary file, fsync, rename, fsync of the folder) after its
spool, so a record names a whole spool. Resuming trusts a finished task only when its record
parses and its MAC verifies with the run's key, names this run and task (digest included), its
spool has that size and SHA-256, checks as a whole chain of this run's and this task's with a
finished window (ale.runner.spool.check), and the outcome agrees with the spool (its evaluator
result is the one the spool's evaluator logged). Anything else (a torn or truncated spool, garbage,
a spool or record of another run, a spool edited without its record) is not trusted: the task is
run again. A task that ended for the infrastructure or was cancelled is run again too. The MAC
cannot stop someone who can read the key and rewrite the folder (anyone who can also run a
modified harness); it keeps out what is not this run's own writing.

A run's runtime (the manifest's ``run.active_s``, :meth:`RunState.active_s`) is the length of
the union of its active spans: each segment's (a segment killed by SIGKILL counts until its last
heartbeat) and each finished task's own, so the time a run was stopped between a kill and its
resume is not counted.

Once the bundle is written, ``bundle`` names it and the folder is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from ale import __version__, catalog
from ale.core.canonical import canonical_json
from ale.core.parse import ParseError, parse_json
from ale.core.results import is_infrastructure
from ale.runner.outcome import TaskOutcome
from ale.runner.spool import Spool, SpoolError, check

RUN_STATE_SCHEMA = "ale-run-state/v1"
TASK_RECORD_SCHEMA = "ale-task-record/v1"
SUFFIX = ".state"
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
MAX_STATE_FILE = 64 * 1024 * 1024  # a record holds an evaluator result (its episodes)
HEARTBEAT_S = 2.0  # how often a running segment's "last" is rewritten
MAX_SEGMENTS = 10_000  # starts and resumes of one run


class StateError(ValueError):
    """A state folder that cannot be resumed (the message says why)."""


#: The file of a state folder whose lock its running harness holds (RunState.hold).
LOCK_FILE = "lock"


def folder_for(parent: Path, run_id: str) -> Path:
    return parent / f"{run_id}{SUFFIX}"


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """``path`` holds ``data`` whole or not at all, and is on disk (file and folder fsynced)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    sync_folder(path.parent)


def sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: Path, what: str) -> Any:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_STATE_FILE + 1)
    except OSError as exc:
        raise StateError(f"{what}: {exc.strerror or exc}") from None
    try:
        return parse_json(raw, what=what, max_bytes=MAX_STATE_FILE)
    except ParseError as exc:
        raise StateError(str(exc)) from None


@attrs.frozen
class Finished:
    """A finished task the state folder proves: its outcome, its checked spool and its span."""

    outcome: TaskOutcome
    spool: Spool
    span: tuple[float, float]


def active_seconds(spans: list[tuple[float, float]]) -> float:
    """The length of the union of the (start, end) spans (a span that ends before it starts counts 0)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end <= max(start, reach):
            continue
        total += end - max(start, reach)
        reach = end
    return total


def _number(value: Any) -> bool:
    return type(value) in (int, float) and value == value and abs(value) != float("inf")


def _outcome_problem(outcome: TaskOutcome, spool: Spool) -> str:
    """Why a recorded outcome is not kept ("" when it is): it ended for the infrastructure or was
    cancelled (run again), or its evaluator result is not the one its spool's evaluator logged."""
    if outcome.ended is not None and (
        is_infrastructure(outcome.ended.category) or outcome.ended.category == "cancelled"
    ):
        return f"it ended for {outcome.ended.category}: run again"
    result = outcome.result
    if outcome.status == "completed" and result is not None:
        logged = spool.summary.eval_results.get(result["session_id"])
        claimed = (result["complete"], result["headline_value"], result["passed_episodes"])
        members = ("complete", "headline_value", "passed_episodes")
        if logged is None or tuple(logged.get(m) for m in members) != claimed:
            return "its outcome is not what its evaluator logged"
    return ""


def _span(value: Any) -> tuple[float, float] | None:
    """A record's ``span``: [started, finished], numbers, in that order; else None."""
    if not isinstance(value, list) or len(value) != 2 or not all(_number(t) for t in value) or value[1] < value[0]:
        return None
    return float(value[0]), float(value[1])


def parse_segments(raw: bytes) -> list[tuple[float, float]]:
    """segments.json's spans (StateError: it is not one)."""
    try:
        doc = parse_json(raw, what="segments.json", max_bytes=MAX_STATE_FILE, max_depth=4)
    except ParseError as exc:
        raise StateError(str(exc)) from None
    if not isinstance(doc, list) or len(doc) > MAX_SEGMENTS:
        raise StateError(f"segments.json is not a list of at most {MAX_SEGMENTS} segments")
    spans = []
    for entry in doc:
        if not isinstance(entry, dict) or set(entry) != {"started", "last"}:
            raise StateError('segments.json holds a segment that is not {"started", "last"}')
        started, last = entry["started"], entry["last"]
        if not (_number(started) and _number(last)) or last < started or started < 0:
            raise StateError("segments.json holds a segment whose times are not numbers, or end before they start")
        spans.append((float(started), float(last)))
    return spans


class RunState:
    """One run's state folder (:func:`create` a new one, :func:`load` one to resume)."""

    def __init__(self, folder: Path, run: dict[str, Any], key: bytes, segments: list[tuple[float, float]]) -> None:
        self.folder, self.run, self._key = folder, run, key
        self.segments = segments  # the earlier segments', and (once begun) this one's last
        self._spans: dict[str, tuple[float, float]] = {}  # each finished task's (this segment's and reused)
        self._lock = -1  # the folder's lock while this process runs the run (hold)

    def hold(self) -> None:
        """This process runs the run: it holds the folder's lock (``lock``, flock) until
        :meth:`release` or its exit, however it ends (the kernel lets go of a dead process's lock).
        StateError when another harness holds it: one run's state is never run twice at once."""
        if self._lock >= 0:
            return
        path = self.folder / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise StateError(f"{path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            pid = f" (pid {holder})" if holder.isdigit() else ""
            raise StateError(
                f"the run is still running: another harness{pid} holds {self.folder}; wait for it to end "
                "or stop it, then resume"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock = fd

    def release(self) -> None:
        """Let go of the folder's lock (:meth:`hold`)."""
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1

    @property
    def run_id(self) -> str:
        return str(self.run["run_id"])

    @property
    def started(self) -> float:
        return float(self.run["started"])

    def task_folder(self, task_id: str) -> Path:
        return self.folder / "tasks" / task_id

    def spool_partial(self, task_id: str) -> Path:
        return self.task_folder(task_id) / "spool.partial"

    def begin_task(self, task_id: str) -> Path:
        """A fresh task folder (whatever an earlier attempt left goes) and where its spool goes."""
        folder = self.task_folder(task_id)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(mode=0o700, parents=True)
        return self.spool_partial(task_id)

    def _mac(self, record: Mapping[str, Any]) -> str:
        return hmac.new(self._key, canonical_json(dict(record)), hashlib.sha256).hexdigest()

    def begin_segment(self, now: float) -> None:
        """This start or resume of the run is a segment of it, from ``now``."""
        self.segments.append((now, now))
        self._write_segments()

    def heartbeat(self, now: float) -> None:
        """This segment ran until ``now`` (not fsynced: a heartbeat lost with the machine costs at
        most a few seconds of the run's recorded runtime)."""
        if self.segments:
            self.segments[-1] = (self.segments[-1][0], max(now, self.segments[-1][1]))
            self._write_segments(durable=False)

    def _write_segments(self, *, durable: bool = True) -> None:
        doc = [{"started": a, "last": b} for a, b in self.segments]
        data = json.dumps(doc).encode() + b"\n"
        if durable:
            write_atomic(self.folder / "segments.json", data)
            return
        tmp = self.folder / f".segments.json.{secrets.token_hex(4)}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.folder / "segments.json")

    def active_s(self, now: float) -> float:
        """The run's runtime until ``now``: the union of its segments (this one until ``now``) and
        of its finished tasks' spans, within the run's wall-clock span (from its start to ``now``:
        a verifier refuses a manifest whose ``active_s`` is more, docs/formats.md)."""
        spans = list(self.segments)
        if spans:
            spans[-1] = (spans[-1][0], max(now, spans[-1][1]))
        clipped = [(max(start, self.started), min(end, now)) for start, end in spans + list(self._spans.values())]
        return active_seconds(clipped)

    def finish_task(self, task: catalog.Task, outcome: TaskOutcome, head: str, span: tuple[float, float]) -> None:
        """The task's spool (complete, at spool_partial) and its record, durably; ``span`` is when
        the task started and finished (epoch seconds)."""
        folder = self.task_folder(task.spec.id)
        partial, spool = self.spool_partial(task.spec.id), folder / "spool.jsonl"
        with open(partial, "rb") as fh:
            os.fsync(fh.fileno())
            raw = partial.read_bytes()
        os.replace(partial, spool)
        sync_folder(folder)
        record: dict[str, Any] = {
            "schema": TASK_RECORD_SCHEMA,
            "run_id": self.run_id,
            "task": task.spec.ref,
            "digest": task.digest,
            "spool_sha256": hashlib.sha256(raw).hexdigest(),
            "spool_bytes": len(raw),
            "chain_head": head,
            "outcome": outcome.record(),
            "span": [span[0], span[1]],
        }
        record["mac"] = self._mac(record)
        write_atomic(folder / "record.json", canonical_json(record) + b"\n")
        self._spans[task.spec.id] = span

    def finished(self, task: catalog.Task) -> Finished | str:
        """The task's finished record and spool, or why there is none to trust (it is run again)."""
        folder = self.task_folder(task.spec.id)
        if not (folder / "record.json").exists():
            return "not finished"
        try:
            record = _read(folder / "record.json", "record.json")
            return self._check(task, record, folder / "spool.jsonl")
        except (StateError, SpoolError, ValueError) as exc:
            return str(exc)

    def _check(self, task: catalog.Task, record: Any, spool_path: Path) -> Finished | str:
        members = {
            "schema", "run_id", "task", "digest", "spool_sha256", "spool_bytes", "chain_head", "outcome", "span", "mac",
        }  # fmt: skip
        if not isinstance(record, dict) or set(record) != members:
            return "record.json is not a task record"
        mac = record.pop("mac")
        if type(mac) is not str or not hmac.compare_digest(mac, self._mac(record)):
            return "record.json's MAC does not verify with this run's key (edited, or another run's)"
        if (record["schema"], record["run_id"], record["task"], record["digest"]) != (
            TASK_RECORD_SCHEMA, self.run_id, task.spec.ref, task.digest,
        ):  # fmt: skip
            return "record.json is another run's or another task's"
        try:
            raw = spool_path.read_bytes()
        except OSError as exc:
            return f"its spool cannot be read: {exc.strerror or exc}"
        if len(raw) != record["spool_bytes"] or hashlib.sha256(raw).hexdigest() != record["spool_sha256"]:
            return f"its spool is not the one recorded ({len(raw)} bytes, {record['spool_bytes']} recorded)"
        spool = check(raw, run_id=self.run_id, task_ref=task.spec.ref, digest=task.digest)
        if spool.summary.head != record["chain_head"]:
            return "its spool's chain head is not the one recorded"
        outcome = TaskOutcome.from_record(task, record["outcome"], self.run_id)
        if problem := _outcome_problem(outcome, spool):
            return problem
        span = _span(record["span"])
        if span is None:
            return "record.json's span is not [started, finished]"
        self._spans[task.spec.id] = span
        return Finished(outcome, spool, span)

    def write_run(self) -> None:
        write_atomic(self.folder / "run.json", canonical_json(self.run) + b"\n")

    def note(self, **members: Any) -> None:
        """Add members to run.json (the attestation, the agent environment's digest, once known)."""
        self.run.update(members)
        self.write_run()

    def bundle_written(self, path: Path) -> None:
        """The bundle is written: say so (a resume is refused from now on), then remove the folder."""
        with contextlib.suppress(OSError):
            write_atomic(self.folder / "bundle", f"{path}\n".encode())
        shutil.rmtree(self.folder, ignore_errors=True)
        self.release()


def create(folder: Path, run_id: str, options: dict[str, Any]) -> RunState:
    """A new run's state folder (``folder`` must not exist)."""
    folder.mkdir(mode=0o700)
    (folder / "tasks").mkdir(mode=0o700)
    key = secrets.token_bytes(32)
    write_atomic(folder / "key", key.hex().encode() + b"\n")
    now = time.time()
    run = {
        "schema": RUN_STATE_SCHEMA,
        "run_id": run_id,
        "harness_version": __version__,
        "started": now,
        "options": options,
    }
    state = RunState(folder, run, key, [])
    state.write_run()
    state.begin_segment(now)
    return state


def load(folder: Path) -> RunState:
    """A run's state folder to resume (StateError: it is none, or cannot be resumed)."""
    if not folder.is_dir():
        raise StateError(f"there is no run state at {folder}")
    if (folder / "bundle").exists():
        raise StateError(f"the run is complete: its bundle was written ({(folder / 'bundle').read_text().strip()})")
    run = _read(folder / "run.json", f"{folder}/run.json")
    if not isinstance(run, dict) or run.get("schema") != RUN_STATE_SCHEMA:
        raise StateError(f"{folder}/run.json is not a run's state ({RUN_STATE_SCHEMA})")
    run_id, started, options = run.get("run_id"), run.get("started"), run.get("options")
    if type(run_id) is not str or not RUN_ID.fullmatch(run_id) or folder.name != f"{run_id}{SUFFIX}":
        raise StateError(f"{folder}/run.json names no run id, or another run's than its folder's")
    if type(started) not in (int, float) or not isinstance(options, dict):
        raise StateError(f"{folder}/run.json lacks the run's start or its options")
    if run.get("harness_version") != __version__:
        raise StateError(
            f"the run was started by ale {run.get('harness_version')!r}, this is {__version__}: its tasks "
            "cannot be continued by other code (start a new run)"
        )
    try:
        text = (folder / "key").read_text().strip()
        key = bytes.fromhex(text)
    except (OSError, ValueError):
        raise StateError(f"{folder}/key is missing or not hex") from None
    if len(key) != 32:
        raise StateError(f"{folder}/key is not 32 bytes")
    return RunState(folder, run, key, _load_segments(folder))


def _load_segments(folder: Path) -> list[tuple[float, float]]:
    try:
        with open(folder / "segments.json", "rb") as fh:
            raw = fh.read(MAX_STATE_FILE + 1)
    except FileNotFoundError:
        raw = b"[]"  # a folder of a harness before segments: its earlier time counts by its tasks' spans
    except OSError as exc:
        raise StateError(f"{folder}/segments.json: {exc.strerror or exc}") from None
    return parse_segments(raw)
