"""A harness's children cannot outlive it (ale.runner.lifeline): they die with the harness's
spawner thread, a SIGKILLed ``ale run`` leaves no process of its run, and what a dead harness
recorded is swept before the next run starts or resumes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fuzzing import fuzz_settings, hostile_json
from hypothesis import given
from hypothesis import strategies as st
from sandbox_tools import need_bwrap
from test_harness_faults import CARTPOLE

from ale.runner import agent_env, lifeline

WAIT_S = 30.0  # bounded waits: the kernel's kill and init's reaping, on a loaded machine


@pytest.fixture
def base() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="ale-ll-"))  # short: run folders hold Unix sockets
    yield folder
    for pid in _pids_with(str(folder)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)


def _pids_with(marker: str) -> list[int]:
    """Processes (not this one) whose environment or command line holds ``marker``: matched by a
    marker of the run's, not by a program's name."""
    needle, found = marker.encode(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            held = any(needle in Path(f"/proc/{entry}/{what}").read_bytes() for what in ("environ", "cmdline"))
        except OSError:
            continue
        if held and lifeline._running(int(entry)):
            found.append(int(entry))
    return found


def _argv0(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return ""


def _until(predicate: object, timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return bool(predicate())  # type: ignore[operator]


# -- the parent-death signal ----------------------------------------------------------------------------


def test_a_child_started_from_a_thread_that_ends_outlives_the_thread() -> None:
    """The parent-death signal follows the forking thread: children are forked by the spawner, so
    one started from a worker thread that then ends (as Trio's idle workers do) lives on."""
    started: list[lifeline.Child | object] = []

    def worker() -> None:
        started.append(lifeline.popen(["sleep", "600"], stdin=subprocess.DEVNULL))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    (process,) = started
    assert isinstance(process, subprocess.Popen)
    try:
        time.sleep(0.3)  # a signal from the ended thread would have come by now
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()


HARNESS = """
import subprocess, sys, threading
from ale.runner import lifeline
done = []
t = threading.Thread(target=lambda: done.append(lifeline.popen(["sleep", "600"], start_new_session=True)))
t.start(); t.join()
print(done[0].pid, flush=True)
sys.stdin.read()
"""


def test_a_sigkilled_harness_takes_the_children_it_started_with_it(base: Path) -> None:
    marker = f"ale-ll-child-{secrets.token_hex(4)}"
    harness = subprocess.Popen([sys.executable, "-c", HARNESS], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env={**os.environ, "ALE_LL_MARKER": marker})  # fmt: skip
    try:
        assert harness.stdout is not None
        child = int(harness.stdout.readline())
        assert sorted(_pids_with(marker)) == sorted([harness.pid, child])
        harness.kill()
        harness.wait()
        assert _until(lambda: not _pids_with(marker)), _pids_with(marker)
    finally:
        harness.kill()
        harness.communicate()
        for pid in _pids_with(marker):
            os.kill(pid, signal.SIGKILL)


# -- the sweep --------------------------------------------------------------------------------------------


def _ledger(folder: Path, name: str, entries: list[object]) -> Path:
    path = folder / f"{name}.jsonl"
    path.write_bytes(b"".join(json.dumps(e).encode() + b"\n" for e in entries) + b'{"torn": ')
    return path


def test_the_sweep_kills_what_a_dead_harness_recorded_and_nothing_else(base: Path) -> None:
    """A ledger nobody holds: its children still running with their recorded start time are killed
    (a group leader's whole group), its run folder removed; a pid whose start time differs (another
    process now) and a living harness's ledger are left alone."""
    ledgers = base / "ledgers"
    ledgers.mkdir(mode=0o700)
    marker = f"ale-ll-sweep-{secrets.token_hex(4)}"
    env = {**os.environ, "ALE_LL_MARKER": marker}
    leader = subprocess.Popen(["sh", "-c", "sleep 600 & exec sleep 600"], start_new_session=True, env=env)
    other = subprocess.Popen(["sleep", "600"], env=env)
    held = subprocess.Popen(["sleep", "600"], env=env)
    run_folder = base / "ale-run-left"
    (run_folder / "workspace").mkdir(parents=True)
    try:
        assert _until(lambda: len(_pids_with(marker)) == 4)
        start = lifeline.start_time(leader.pid)
        other_start = lifeline.start_time(other.pid)
        assert start is not None
        assert other_start is not None
        dead = _ledger(ledgers, "1-1", [
            {"pid": leader.pid, "start": start, "group": True},
            {"pid": other.pid, "start": other_start + 1, "group": False},  # the pid was reused
            {"folder": str(run_folder)},
            ["garbage"], {"pid": "1", "start": None},
        ])  # fmt: skip
        living = _ledger(ledgers, "2-2", [{"pid": held.pid, "start": lifeline.start_time(held.pid), "group": False}])
        fd = os.open(living, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            swept = lifeline.sweep(ledgers)
        finally:
            os.close(fd)
        assert swept.killed == [leader.pid]
        assert swept.folders == [str(run_folder)]
        assert leader.wait(timeout=WAIT_S) == -signal.SIGKILL
        assert _until(lambda: sorted(_pids_with(marker)) == sorted([other.pid, held.pid])), _pids_with(marker)
        assert not run_folder.exists()
        assert not dead.exists()
        assert living.exists()
    finally:
        for p in (leader, other, held):
            p.kill()
            p.wait()
        for pid in _pids_with(marker):
            os.kill(pid, signal.SIGKILL)


def test_the_sweep_ignores_a_ledger_folder_that_is_not_private(base: Path) -> None:
    folder = base / "open"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    process = subprocess.Popen(["sleep", "600"])
    try:
        _ledger(folder, "1-1", [{"pid": process.pid, "start": lifeline.start_time(process.pid), "group": False}])
        assert lifeline.sweep(folder) == lifeline.Swept([], [])
        assert process.poll() is None
    finally:
        process.kill()
        process.wait()


@pytest.mark.fuzz
@fuzz_settings
@given(raw=st.lists(st.one_of(hostile_json, st.binary(max_size=80)), max_size=6))
def test_ledger_lines_of_garbage_are_skipped_not_raised(raw: list[bytes]) -> None:
    entries = lifeline._entries(b"\n".join(raw))
    assert all(isinstance(e, dict) for e in entries)
    for entry in entries:
        assert lifeline._kill({**entry, "pid": 0}) is None  # no garbage entry names a process to kill


# -- the real thing: ale run, SIGKILL, resume ---------------------------------------------------------------


def test_a_sigkilled_harness_leaves_no_process_of_its_run_and_its_resume_completes(base: Path) -> None:
    """``ale run`` SIGKILLed while its agent runs (evaluator, sandbox and agent all up): within a
    bounded wait no process of that run is left (matched by the run's TMPDIR in environment or
    command line, and the agent's marker), and ``ale run --resume`` completes with a bundle. A
    resume while the first harness still runs is refused (its state folder's lock), and the run
    goes on."""
    need_bwrap()
    out, cwd, tmp = base / "out", base / "cwd", base / "tmp"
    for d in (cwd, tmp):
        d.mkdir()
    marker = f"ale-ll-agent-{secrets.token_hex(4)}"
    agent = f"{agent_env.PYTHON} -c \"print('{marker}', flush=True); import time; time.sleep(600)\""
    env = {k: v for k, v in os.environ.items() if k not in ("ALE_RECIPIENT", "CI")} | {"TMPDIR": str(tmp)}
    argv = [sys.executable, "-m", "ale.runner.cli", "run", CARTPOLE, "--plain", "--out", str(out), "--episodes", "1",
            "--agent-time", "5", "--agent-cmd", agent]  # fmt: skip
    err_path = base / "first.txt"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:

            def agents() -> list[int]:
                """The agent's own process: its program is the agent's interpreter. The harness's
                command line names the agent's command too, and so does every child the harness
                forks until that child execs (found in CI: a probe's child caught before exec, the
                harness then killed before its state folder was made)."""
                return [pid for pid in _pids_with(marker) if pid != proc.pid and _argv0(pid) == agent_env.PYTHON]

            assert _until(lambda: proc.poll() is not None or agents(), 240), err_path.read_text()
            (folder,) = out.glob("*.state")
            run_id = folder.name.removesuffix(".state")
            early = subprocess.run(
                [sys.executable, "-m", "ale.runner.cli", "run", "--resume", run_id, "--plain", "--out", str(out)],
                cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            assert early.returncode != 0, early.stderr  # a resume while the run still runs is refused ...
            assert "still running" in early.stderr, early.stderr
            assert f"pid {proc.pid}" in early.stderr, early.stderr
            assert proc.poll() is None
            assert agents()
            assert proc.poll() is None, err_path.read_text()
            running = [pid for pid in _pids_with(str(tmp)) if pid != proc.pid]
            assert len(running) >= 2, running  # at least the evaluator and the sandbox's first process
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=WAIT_S)
            assert _until(lambda: not _pids_with(str(tmp)) and not _pids_with(marker)), (
                _pids_with(str(tmp)),
                _pids_with(marker),
            )
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    second = subprocess.run(
        [sys.executable, "-m", "ale.runner.cli", "run", "--resume", run_id, "--plain", "--out", str(out)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert [p.name for p in out.glob("*.ale")] == [f"{run_id}.ale"]
    assert not _pids_with(str(tmp))
