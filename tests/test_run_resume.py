"""``ale run --resume RUN``: an interrupted or failed run continued from its state folder, its
finished tasks not run again, and a state folder that is not the run's own writing not trusted
(ale.runner.state, ale.runner.resume)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pyrage
import pytest
import trio
from test_harness_faults import CARTPOLE, PENDULUM, _ale, _options
from test_run_endings import FAST, FlakyEvaluators

from ale.runner import agent_env, bundle_writer, state
from ale.runner.harness import Harness, RunError, RunRecord
from ale.runner.inspect import offline_check
from ale.runner.local import LocalRuntime
from ale.runner.progress import PlainProgress
from ale.runner.runtime import EvaluatorSpec

TASKS = (CARTPOLE, PENDULUM)


@pytest.fixture
def base() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="ale-res-"))  # short: run folders hold Unix sockets
    yield folder
    _kill_what_has(str(folder))
    shutil.rmtree(folder, ignore_errors=True)


def _kill_what_has(marker: str) -> None:
    """SIGKILL, by pid, every process whose environment or command line holds ``marker`` (what a
    killed harness left: its evaluators serve until stopped, a sandbox until its timeout)."""
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            found = any(needle in Path(f"/proc/{entry}/{what}").read_bytes() for what in ("environ", "cmdline"))
        except OSError:
            continue
        if found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry), signal.SIGKILL)


class Recording(LocalRuntime):
    """The local runtime, recording the tasks whose evaluator it started."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[str] = []

    @asynccontextmanager
    async def open_evaluator(self, spec: EvaluatorSpec) -> AsyncIterator[Any]:
        self.opened.append(spec.task_id)
        async with super().open_evaluator(spec) as handle:
            yield handle


async def _run(options: Any, runtime: LocalRuntime | None = None) -> tuple[RunRecord, str]:
    out = io.StringIO()
    record = await Harness(options, runtime or LocalRuntime(), PlainProgress(out=out)).run()
    return record, out.getvalue()


def _verified(record: RunRecord, folder: Path) -> Any:
    identity = pyrage.x25519.Identity.generate()
    try:
        path, _ = bundle_writer.write_bundle(record, [str(identity.to_public())], folder)
    finally:
        shutil.rmtree(record.root, ignore_errors=True)
    return offline_check(path.read_bytes(), str(identity))


# -- the real thing: SIGKILL the harness, resume ----------------------------------------------------


def test_a_run_killed_after_its_first_task_resumes_without_running_it_again(base: Path) -> None:
    """``ale run`` of two tasks with the demo agent, SIGKILLed once the first task's record is
    durable; ``ale run --resume RUN`` runs the second only (the first task's evaluator is not
    started again: its events in the bundle are the killed run's, from before the resume began)
    and writes a bundle that ale inspect accepts."""
    out, cwd, tmp = base / "out", base / "cwd", base / "tmp"
    for d in (cwd, tmp):
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("ALE_RECIPIENT", "CI")} | {"TMPDIR": str(tmp)}
    argv = [sys.executable, "-m", "ale.runner.cli", "run", *TASKS, "--plain", "--out", str(out), "--episodes", "1"]
    first_err = base / "first.txt"
    with open(first_err, "wb") as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + 240
            while not list(out.glob(f"*.state/tasks/{CARTPOLE}/record.json")):
                assert proc.poll() is None, first_err.read_text()
                assert time.monotonic() < deadline, "the first task never finished"
                time.sleep(0.02)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    _kill_what_has(str(tmp))
    (folder,) = out.glob("*.state")
    run_id = folder.name.removesuffix(".state")
    assert not list(out.glob("*.ale"))
    assert not (folder / "tasks" / PENDULUM / "record.json").exists(), "killed too late: the second task finished"
    first_spool = (folder / "tasks" / CARTPOLE / "spool.jsonl").read_bytes()
    resumed_at = time.time()
    second = subprocess.run(
        [sys.executable, "-m", "ale.runner.cli", "run", "--resume", run_id, "--plain", "--out", str(out)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert f"{CARTPOLE}: finished before" in second.stderr
    assert f"{CARTPOLE}: evaluator: starting" not in second.stderr  # not run again
    assert f"{PENDULUM}: evaluator: starting" in second.stderr
    (bundle,) = out.glob("*.ale")
    assert bundle.name == f"{run_id}.ale"
    assert not folder.exists()  # the bundle is written: the state folder went
    (key,) = out.glob("*.key")
    identity = next(line for line in key.read_text().splitlines() if line.startswith("AGE-SECRET-KEY-"))
    report = offline_check(bundle.read_bytes(), identity)
    assert [t.status for t in report.docs.results.tasks] == ["completed", "completed"]
    events = [json.loads(line) for line in report.docs.events.splitlines()]
    ready = [e for e in events if e["kind"] == "evaluator_ready"]
    assert [e["data"]["task_id"] for e in ready] == list(TASKS)
    from datetime import datetime

    def at(e: dict[str, Any]) -> float:
        return datetime.strptime(e["wall_time"], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()

    assert at(ready[0]) < resumed_at < at(ready[1])  # the first task's evaluator ran before the resume only
    spooled = [json.loads(line) for line in first_spool.splitlines()[1:]]
    placed = events[1 : 1 + len(spooled)]
    assert [(e["kind"], e["data"], e["wall_time"]) for e in placed] == [
        (e["kind"], e["data"], e["wall_time"]) for e in spooled
    ]
    inspected = subprocess.run(
        [sys.executable, "-m", "ale.runner.cli", "inspect", str(bundle), "--identity", str(key)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert inspected.returncode == 0, inspected.stderr


# -- a failed run resumed ------------------------------------------------------------------------------


async def test_a_run_failed_for_the_infrastructure_resumes_running_only_that_task(base: Path) -> None:
    """Side by side, cartpole's evaluator never starts (three attempts) while pendulum runs: the run
    fails after pendulum finished, naming cartpole's category; resumed with a working runtime it runs
    cartpole only."""
    options = attrs.evolve(
        _options("pass", episodes=1, retry=FAST, workdir=base), tasks=TASKS, jobs=2, state_parent=base
    )
    with pytest.raises(RunError, match=r"1 of 2 tasks ended for the infrastructure.*infrastructure/evaluator_start"):
        await _run(options, FlakyEvaluators(fails=99))
    (folder,) = await trio.to_thread.run_sync(lambda: list(base.glob("*.state")))
    run_id = folder.name.removesuffix(".state")
    recording = Recording()
    record, progress = await _run(attrs.evolve(options, resume=run_id), recording)
    assert recording.opened == [CARTPOLE]
    assert f"{PENDULUM}: finished before" in progress
    report = _verified(record, base)
    assert [t.ended.category if t.ended else None for t in report.docs.results.tasks] == ["agent/no_policy"] * 2


# -- what is not trusted -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    """A run of two tasks whose state folder is kept (the Harness, unlike ``ale run``, leaves it)."""
    folder = Path(tempfile.mkdtemp(prefix="ale-fin-"))
    options = attrs.evolve(_options("pass", episodes=1, workdir=folder), tasks=TASKS, state_parent=folder / "states")
    (folder / "states").mkdir()
    record, _ = trio.run(_run, options)
    shutil.rmtree(record.root, ignore_errors=True)
    yield folder, options
    shutil.rmtree(folder, ignore_errors=True)


def _copy(finished_state: tuple[Path, Any], target: Path) -> tuple[Path, Any, str]:
    source, options = finished_state
    (folder,) = (source / "states").glob("*.state")
    shutil.copytree(folder, target / folder.name)
    run_id = folder.name.removesuffix(".state")
    return target / folder.name, attrs.evolve(options, state_parent=target, resume=run_id, workdir=target), run_id


def _truncate(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(b"\x00\xff garbage {{{" * 100)


def _edit_spool(path: Path) -> None:
    path.write_bytes(path.read_bytes().replace(b'"mode":"batch"', b'"mode":"BATCH"', 1))


def _forge_record(path: Path) -> None:
    """The record claims another outcome (its MAC kept: it no longer verifies)."""
    record = json.loads(path.read_text())
    record["outcome"]["reason"] = "forged"
    path.write_text(json.dumps(record))


@pytest.mark.parametrize(
    ("file", "spoil"),
    [
        ("spool.jsonl", _truncate),
        ("spool.jsonl", _garbage),
        ("spool.jsonl", _edit_spool),
        ("spool.jsonl", Path.unlink),
        ("record.json", _garbage),
        ("record.json", _truncate),
        ("record.json", _forge_record),
        ("record.json", lambda p: p.write_text("[]")),
    ],
    ids=["truncated-spool", "garbage-spool", "edited-spool", "no-spool", "garbage-record", "truncated-record",
         "forged-record", "record-not-an-object"],
)  # fmt: skip
async def test_a_spoilt_task_folder_is_run_again_not_trusted(
    finished_state: tuple[Path, Any], base: Path, file: str, spoil: Any
) -> None:
    folder, options, _ = _copy(finished_state, base)
    spoil(folder / "tasks" / CARTPOLE / file)
    recording = Recording()
    record, progress = await _run(options, recording)
    assert recording.opened == [CARTPOLE]  # pendulum's record holds: kept
    assert f"{CARTPOLE}: runs again: its state is not trusted" in progress
    _verified(record, base)


async def test_a_spool_and_record_of_another_run_are_not_trusted(finished_state: tuple[Path, Any], base: Path) -> None:
    folder, options, _ = _copy(finished_state, base)
    other = base / "other"
    other.mkdir()
    other_options = attrs.evolve(options, state_parent=other, resume=None, workdir=other)
    record, _ = await _run(other_options)
    shutil.rmtree(record.root, ignore_errors=True)
    (other_folder,) = other.glob("*.state")
    shutil.rmtree(folder / "tasks" / CARTPOLE)
    shutil.copytree(other_folder / "tasks" / CARTPOLE, folder / "tasks" / CARTPOLE)
    recording = Recording()
    record, progress = await _run(options, recording)
    assert recording.opened == [CARTPOLE]
    assert "MAC does not verify with this run's key" in progress
    _verified(record, base)


async def test_a_record_with_a_recomputed_mac_of_another_key_and_a_garbage_folder_are_not_trusted(
    finished_state: tuple[Path, Any], base: Path
) -> None:
    folder, options, _ = _copy(finished_state, base)
    (folder / "key").write_text(secrets.token_hex(32) + "\n")  # every record's MAC now fails
    (folder / "tasks" / "garbage").mkdir()
    (folder / "tasks" / "garbage" / "record.json").write_bytes(b"{")
    recording = Recording()
    record, _ = await _run(options, recording)
    assert recording.opened == list(TASKS)
    _verified(record, base)


async def test_resuming_with_other_options_is_refused(finished_state: tuple[Path, Any], base: Path) -> None:
    _, options, _ = _copy(finished_state, base)
    with pytest.raises(RunError, match=r"cannot resume .*: this run's episodes differ from the run's"):
        await _run(attrs.evolve(options, episodes=2))
    with pytest.raises(RunError, match="there is no run state"):
        await _run(attrs.evolve(options, resume="run-20000101T000000Z-00000000"))


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return _ale("run", *args, "--plain", cwd=cwd)


def _refused(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("ale: error: "), proc.stderr
    assert needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_resume_of_a_run_that_is_not_there(base: Path) -> None:
    out = base / "out"
    _refused(_cli("--resume", "run-20000101T000000Z-00000000", "--out", str(out), cwd=base), "no run to resume at")
    _refused(_cli("--resume", "not a run id!", "--out", str(out), cwd=base), "not a run id")
    _refused(_cli("--resume", str(base / "nowhere.state"), "--out", str(out), cwd=base), "no run to resume at")


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "run.json"),
        (b"\x00garbage{", "not valid JSON"),
        (b"[]", "is not a run's state"),
        (b'{"schema": "ale-run-state/v1", "run_id": "run-other-1", "started": 1, "options": {}}', "another run's"),
        (b'{"schema": "ale-run-state/v1", "run_id": "RUN", "started": 1, "options": {}, "harness_version": "0.0.1"}',
         "cannot be continued by other code"),
        (b"[" * 100_000, "nested"),
    ],
    ids=["no-run-json", "garbage", "not-an-object", "another-runs", "another-version", "deep"],
)  # fmt: skip
def test_a_resume_folder_with_garbage_is_refused(base: Path, content: bytes | None, needle: str) -> None:
    out = base / "out"
    folder = out / "run-20000101T000000Z-0000dead.state"
    folder.mkdir(parents=True)
    (folder / "key").write_text(secrets.token_hex(32))
    if content is not None:
        (folder / "run.json").write_bytes(content.replace(b"RUN", b"run-20000101T000000Z-0000dead"))
    proc = _cli("--resume", "run-20000101T000000Z-0000dead", "--out", str(out), cwd=base)
    _refused(proc, "cannot resume from")
    assert needle in proc.stderr, proc.stderr
    assert folder.exists()  # nothing of it was removed


def test_resume_with_the_options_that_say_what_the_run_is_is_refused(base: Path) -> None:
    for extra in (["cartpole-balance"], ["--all"], ["--episodes", "3"], ["--agent", "random"], ["--runtime", "podman"]):
        proc = _cli("--resume", "run-20000101T000000Z-00000000", *extra, "--out", str(base / "out"), cwd=base)
        _refused(proc, "--resume continues the run as it was started")


def test_resume_of_a_run_whose_bundle_was_written_is_refused(base: Path) -> None:
    folder = base / "out" / "run-20000101T000000Z-0000beef.state"
    folder.mkdir(parents=True)
    (folder / "bundle").write_text("/somewhere/run.ale\n")
    proc = _cli("--resume", "run-20000101T000000Z-0000beef", "--out", str(base / "out"), cwd=base)
    _refused(proc, "the run is complete: its bundle was written")


def test_a_state_folder_is_loaded_strictly() -> None:
    with pytest.raises(state.StateError, match="no run state"):
        state.load(Path("/nonexistent/run-x.state"))


@pytest.fixture(autouse=True)
def _cwd(base: Path) -> Iterator[None]:
    here = os.getcwd()
    os.chdir(base)  # the kept .incomplete.jsonl trajectories of failed runs land here
    yield
    os.chdir(here)


def test_sigterm_with_two_tasks_side_by_side_keeps_both_windows_each_cancelled(base: Path) -> None:
    """Interrupted while both tasks' agents run: no bundle, the state folder kept, and the kept
    trajectory holds both windows in task order, each ended early as cancelled in its agent phase."""
    out, cwd, tmp = base / "out", base / "cwd", base / "tmp"
    for d in (cwd, tmp):
        d.mkdir()
    marker = f"ale-both-{secrets.token_hex(4)}"
    agent = f"{agent_env.PYTHON} -c \"print('{marker}', flush=True); import time; time.sleep(600)\""
    env = {k: v for k, v in os.environ.items() if k not in ("ALE_RECIPIENT", "CI")} | {"TMPDIR": str(tmp)}
    argv = [sys.executable, "-m", "ale.runner.cli", "run", *TASKS, "--jobs", "2", "--plain", "--out", str(out)]
    proc = subprocess.Popen([*argv, "--agent-cmd", agent], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while _agents_with(marker) < 2:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the two agents never ran at once"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "ale run --resume" in err
    (kept,) = cwd.glob("*.incomplete.jsonl")
    events = [json.loads(line) for line in kept.read_bytes().splitlines()]
    ended = [
        (e["data"]["task"], e["data"]["phase"], e["data"]["category"])
        for e in events
        if e["kind"] == "task_ended_early"
    ]
    assert ended == [(f"{t}@1.0.0", "agent", "cancelled") for t in TASKS]
    assert events[-1]["kind"] == "run_interrupted"
    assert events[-1]["data"]["completed_tasks"] == 0
    assert [p.suffix for p in out.iterdir()] == [".state"]


def _agents_with(marker: str) -> int:
    """How many sandboxed agents print ``marker`` (processes that are the agent's own Python)."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            count += argv[0] == agent_env.PYTHON.encode() and any(marker.encode() in a for a in argv)
    return count


# -- a resumed run's runtime ---------------------------------------------------------------------------


def test_active_seconds_is_the_length_of_the_union_of_the_spans() -> None:
    assert state.active_seconds([]) == 0
    assert state.active_seconds([(0, 10), (20, 25)]) == 15  # apart
    assert state.active_seconds([(0, 10), (5, 12), (2, 3)]) == 12  # overlapping and nested
    assert state.active_seconds([(20, 25), (0, 10), (10, 20)]) == 25  # touching, in any order
    assert state.active_seconds([(5, 1)]) == 0  # one that ends before it starts counts nothing


def test_a_resumed_runs_runtime_is_its_active_spans_not_the_time_it_was_stopped(base: Path) -> None:
    """A recorded state folder: the run's first segment ran from 1000 to its last heartbeat at 1010
    and was SIGKILLed; resumed at 5000 and ending at 5020 it ran 30 s, not 4020."""
    folder = base / "run-x.state"
    first = state.create(folder, "run-x", {})
    assert len(first.segments) == 1  # a new run's first segment is its start
    first.run["started"] = 1000.0
    first.write_run()
    first.segments = [(1000.0, 1000.0)]
    first.heartbeat(1010.0)  # then SIGKILL: nothing more is written
    resumed = state.load(folder)
    assert resumed.segments == [(1000.0, 1010.0)]
    resumed.begin_segment(5000.0)
    assert resumed.active_s(5020.0) == 30.0
    assert state.load(folder).segments == [(1000.0, 1010.0), (5000.0, 5000.0)]  # durable as it began
    resumed.heartbeat(4999.0)  # a clock that stepped back never shortens a segment
    assert resumed.active_s(5000.0) == 10.0


def test_a_state_folder_held_by_a_live_harness_cannot_be_held_again_until_it_dies(base: Path) -> None:
    """Two harnesses never run one run's state at once: the second's hold is a StateError naming
    the first's pid; once the first process is gone (here SIGKILLed) the folder can be held."""
    folder = base / "run-l.state"
    state.create(folder, "run-l", {})
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from ale.runner import state; "
         "state.load(Path(sys.argv[1])).hold(); print('held', flush=True); time.sleep(600)", str(folder)],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"held\n"
        with pytest.raises(state.StateError, match=rf"still running: another harness \(pid {holder.pid}\)"):
            state.load(folder).hold()
    finally:
        holder.kill()
        holder.communicate()
    kept = state.load(folder)
    kept.hold()
    kept.hold()  # (held already: nothing to do)
    kept.release()
    again = state.load(folder)
    again.hold()  # (released: another may hold it)
    again.release()


def test_the_runtime_never_exceeds_the_runs_wall_clock_span(base: Path) -> None:
    """A last heartbeat later than the run's stop, or a task span reaching before its start (a clock
    stepped back and forth), adds nothing outside [started, now]: a verifier refuses a manifest
    whose active_s exceeds finished - started."""
    folder = base / "run-w.state"
    kept = state.create(folder, "run-w", {})
    kept.run["started"] = 1000.0
    kept.write_run()
    kept.segments = [(1000.0, 1000.0)]
    kept.heartbeat(1100.0)  # written after the clock stepped forward
    kept._spans["x"] = (900.0, 1010.0)
    assert kept.active_s(1050.0) == 50.0
    assert state.load(folder).active_s(1050.0) == 50.0


@pytest.mark.parametrize(
    "content",
    [b"{", b"{}", b'[{"started": 1}]', b'[{"started": 2, "last": 1}]', b'[{"started": "1", "last": 2}]',
     b'[{"started": 1, "last": 2, "more": 3}]', b"[" * 100_000, b'[{"started": -5, "last": 2}]'],
)  # fmt: skip
def test_a_garbage_segments_file_is_a_clear_state_error(base: Path, content: bytes) -> None:
    folder = base / "run-y.state"
    state.create(folder, "run-y", {})
    (folder / "segments.json").write_bytes(content)
    with pytest.raises(state.StateError, match=r"segments\.json"):
        state.load(folder)


def _shift(folder: Path, by: float) -> None:
    """The state folder as if the run had started ``by`` seconds earlier and been stopped since:
    its start, its segments and its tasks' spans moved back (the records' MACs made again with the
    run's key: the folder stays the run's own writing)."""
    run = json.loads((folder / "run.json").read_text())
    run["started"] -= by
    (folder / "run.json").write_text(json.dumps(run))
    segments = json.loads((folder / "segments.json").read_text())
    (folder / "segments.json").write_text(json.dumps([{k: v - by for k, v in s.items()} for s in segments]))
    kept = state.load(folder)
    for path in folder.glob("tasks/*/record.json"):
        record = json.loads(path.read_text())
        del record["mac"]
        record["span"] = [t - by for t in record["span"]]
        record["mac"] = kept._mac(record)
        path.write_text(json.dumps(record))


async def test_a_run_resumed_an_hour_after_it_stopped_records_the_time_it_ran(
    finished_state: tuple[Path, Any], base: Path
) -> None:
    """The recorded run's segment and tasks moved an hour back: the resumed run keeps its finished
    tasks, its manifest's run.started is an hour back, and run.active_s is the sum of the two
    segments (the first's tasks inside it), not the hour."""
    folder, options, _ = _copy(finished_state, base)
    (earlier,) = state.parse_segments((folder / "segments.json").read_bytes())
    _shift(folder, 3600.0)
    recording = Recording()
    record, _ = await _run(options, recording)
    assert recording.opened == []  # both tasks kept
    assert record.finished - record.started > 3600
    segments = state.parse_segments((folder / "segments.json").read_bytes())
    assert len(segments) == 2
    assert segments[0] == pytest.approx((earlier[0] - 3600, earlier[1] - 3600))
    assert segments[1][1] == record.finished  # the resumed segment ends where the run did
    assert record.active_s == pytest.approx(sum(b - a for a, b in segments))
    assert record.active_s is not None
    assert record.active_s < 600
    report = _verified(record, base)
    assert report.docs.manifest.run.active_s == round(record.active_s, 6)


def test_the_boards_runtime_is_the_manifests_active_seconds_never_more_than_its_wall_time() -> None:
    from ale_verify.export import _runtime_s

    assert _runtime_s(1000.0, 5020.0, 30.0) == 30.0  # a resumed run: the time it ran
    assert _runtime_s(1000.0, 1010.0, 99.0) == 10.0  # never more than finished - started
    assert _runtime_s(1000.0, 1010.0, None) == 10.0  # a bundle before active_s
    for garbage in ("30", -1.0, float("inf"), True, [30]):
        assert _runtime_s(1000.0, 1010.0, garbage) == 10.0
    assert _runtime_s(None, 1010.0, 30.0) is None
