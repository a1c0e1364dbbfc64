"""``ale run --jobs N``: tasks side by side, each with its own evaluator, sandbox, uid and spool, and
one trajectory of a sequential run's shape (ale.runner.harness, ale.runner.schedule,
ale.runner.recorder.Recorder.place)."""

from __future__ import annotations

import io
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import attrs
import pyrage
import pytest
import trio
from test_harness_faults import CARTPOLE, PENDULUM, PY, PrestartRecordingRuntime, _ale, _options, run_harness

from ale.core import grammar
from ale.core.trajectory import verify_chain
from ale.runner import bundle_writer, schedule
from ale.runner.harness import Harness
from ale.runner.inspect import offline_check
from ale.runner.local import LocalRuntime
from ale.runner.progress import PlainProgress
from ale.runner.recorder import open_recorder
from ale.runner.runtime import Limits
from ale.runner.spool import SpoolError, check, header

#: small enough that two tasks fit side by side on any machine of at least one CPU and 2 GiB
SMALL = Limits(cpus=0.5, sandbox_memory_bytes=512 * 2**20, memory_bytes=4 * 2**30)
SLEEP = "import time; time.sleep(3)"  # long enough to overlap, leaves no policy


def _micros(wall: str) -> float:
    return datetime.strptime(wall, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


def _windows(events: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Each task's window (task_started to task_finished), in the order they are in the stream."""
    out: list[tuple[str, list[dict[str, Any]]]] = []
    for e in events:
        if e["producer"] == "trusted_harness" and e["kind"] == "task_started":
            out.append((e["data"]["task"], []))
        if out and (not out[-1][1] or out[-1][1][-1]["kind"] != "task_finished"):
            out[-1][1].append(e)
    return out


def _span(window: list[dict[str, Any]], start: str, end: str) -> tuple[float, float]:
    first = next(e for e in window if e["kind"] == start)
    last = next(e for e in window if e["kind"] == end)
    return _micros(first["wall_time"]), _micros(last["wall_time"])


# -- two tasks side by side ---------------------------------------------------------------------


async def test_two_tasks_side_by_side_give_one_chain_of_a_sequential_runs_shape(tmp_path: Path) -> None:
    """--jobs 2: both agents run at once (their agent phases overlap in wall time), each task with an
    evaluator of its own; the trajectory holds each task's window whole, in task order, its chain and
    grammar valid, every producer's monotonic time never running backwards; the bundle verifies."""
    options = attrs.evolve(_options(SLEEP, episodes=1, limits=SMALL), tasks=(CARTPOLE, PENDULUM), jobs=2)
    identity = pyrage.x25519.Identity.generate()
    written: list[Path] = []

    def write(record: Any) -> None:
        written.append(bundle_writer.write_bundle(record, [str(identity.to_public())], tmp_path)[0])

    run = await run_harness(options, before_cleanup=write)
    windows = _windows(run.events)
    assert [task for task, _ in windows] == [f"{CARTPOLE}@1.0.0", f"{PENDULUM}@1.0.0"]
    for task, window in windows:  # every event of a task's window names it (or is the agent's own)
        assert all(e["data"].get("task", task) == task for e in window if e["producer"] != "untrusted_agent")
    (a0, a1), (b0, b1) = (_span(w, "agent_started", "agent_finished") for _, w in windows)
    assert b0 < a1, "the agent phases did not overlap: the tasks ran one after another"
    assert a0 < b1, "the agent phases did not overlap: the tasks ran one after another"
    ready = [e for e in run.events if e["kind"] == "evaluator_ready"]
    assert [e["data"]["task_id"] for e in ready] == [CARTPOLE, PENDULUM]  # one evaluator each
    last: dict[str, float] = {}
    for e in run.events:
        assert e["monotonic"] >= last.get(e["producer"], e["monotonic"]), e
        last[e["producer"]] = e["monotonic"]
    (path,) = written
    report = offline_check(path.read_bytes(), str(identity))
    assert report.chain.events == len(run.events)
    assert [o.ended.category if o.ended else None for o in run.record.outcomes] == ["agent/no_policy"] * 2
    assert "running up to 2 of 2 tasks at once" in run.progress


async def test_the_monotonic_shift_keeps_each_windows_intervals(tmp_path: Path) -> None:
    """The second window ran at the same time as the first: its harness times are shifted by one
    amount so they follow the first window's, and the intervals within it are the recorded ones."""
    options = attrs.evolve(_options(SLEEP, episodes=1, limits=SMALL), tasks=(CARTPOLE, PENDULUM), jobs=2)
    run = await run_harness(options)
    (_, first), (_, second) = _windows(run.events)
    harness = [e for e in second if e["producer"] == "trusted_harness"]
    assert harness[0]["monotonic"] >= max(e["monotonic"] for e in first if e["producer"] == "trusted_harness")
    started = next(e for e in harness if e["kind"] == "agent_started")
    finished = next(e for e in harness if e["kind"] == "agent_finished")
    measured = finished["data"]["wall_time_s"]
    assert abs((finished["monotonic"] - started["monotonic"]) - measured) < 0.5


async def test_jobs_1_runs_the_tasks_one_after_another_as_before() -> None:
    runtime = PrestartRecordingRuntime()
    options = attrs.evolve(_options("pass", episodes=1), tasks=(CARTPOLE, PENDULUM))
    run = await run_harness(options, runtime)
    (_, first), (_, second) = _windows(run.events)
    # the second task starts once the first's window is whole (its task_finished is recorded as it is placed)
    assert _micros(second[0]["wall_time"]) >= _micros(first[-2]["wall_time"])
    assert len(runtime.prestarted) == 1
    assert runtime.served[1] == runtime.prestarted[0]
    assert "tasks at once" not in run.progress


async def test_each_task_beside_another_runs_as_a_uid_of_its_own(tmp_path: Path) -> None:
    """As root the run's tasks side by side have a uid each (their process counts and files apart);
    a task after them takes a uid that is free again."""
    code = "import os, time; print('uid', os.getuid(), flush=True); time.sleep(2)"
    options = attrs.evolve(_options(code, episodes=1, limits=SMALL), tasks=(CARTPOLE, PENDULUM), jobs=2)
    run = await run_harness(options)
    uids = [int(t.split()[1]) for t in run.stdout() if t.startswith("uid ")]
    assert len(uids) == 2
    import os

    if os.geteuid() == 0:
        assert uids[0] != uids[1]


def test_tasks_side_by_side_get_uids_of_their_own_and_a_freed_one_is_taken_again() -> None:
    """uids.TaskUids, which both runtimes use: the run's own uid for the first open workspace, one
    claimed for each beside it, the claim of a workspace closed kept for the next; none left is an
    OSError (the task ends for the infrastructure, never sharing a uid)."""
    from ale.runner import uids

    class Fake(uids.Claim):
        def __init__(self, uid: int) -> None:
            super().__init__(uid, -1)

    made = iter([Fake(11), Fake(12)])

    def claimer() -> uids.Claim:
        try:
            return next(made)
        except StopIteration:
            raise uids.NoFreeUid("none left") from None

    pool = uids.TaskUids(Fake(10), claimer)
    a, b, c = Path("/w/a"), Path("/w/b"), Path("/w/c")
    assert [pool.open(a), pool.open(b), pool.open(c)] == [10, 11, 12]
    assert pool.open(b) == 11  # opened again: the same
    assert pool.uid_for(Path("/w/none")) == 10
    pool.close(b)
    assert pool.open(Path("/w/d")) == 11  # b's, free again
    with pytest.raises(OSError, match="none left"):
        pool.open(Path("/w/e"))
    pool.close(a)
    assert pool.open(Path("/w/e")) == 10


# -- the admission rule ---------------------------------------------------------------------------


def test_the_admission_rule() -> None:
    machine = schedule.Machine(cpus=2, memory_bytes=16 * schedule.GIB)
    one = schedule.Demand(cpus=1, memory_bytes=4 * schedule.GIB)
    assert schedule.fits([], one, 1, machine)
    assert not schedule.fits([one], one, 1, machine)  # --jobs 1
    assert schedule.fits([one], one, 4, machine)
    assert not schedule.fits([one, one], one, 4, machine)  # the CPUs are taken
    big = schedule.Demand(cpus=1, memory_bytes=13 * schedule.GIB)
    assert not schedule.fits([big], one, 4, machine)  # the memory is taken
    huge = schedule.Demand(cpus=64, memory_bytes=1 << 50)
    assert schedule.fits([], huge, 4, machine)  # alone, a task bigger than the machine still runs
    assert schedule.concurrency(10**30, 4, one, machine) == 2
    assert schedule.concurrency(3, 1, one, machine) == 1
    with pytest.raises(ValueError, match="at least 1"):
        schedule.Admission(0, machine)


def test_the_machine_offers_what_this_process_may_use() -> None:
    import os

    offer = schedule.machine()
    assert offer.cpus == len(os.sched_getaffinity(0))
    assert offer.memory_bytes > 0


async def test_admission_lets_tasks_in_as_others_leave() -> None:
    admission = schedule.Admission(2, schedule.Machine(cpus=8, memory_bytes=1 << 40))
    demand = schedule.Demand(1, 1)
    await admission.enter(demand)
    await admission.enter(demand)
    entered = trio.Event()

    async def third() -> None:
        await admission.enter(demand)
        entered.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(third)
        await trio.sleep(0.05)
        assert not entered.is_set()
        admission.leave(demand)
        await entered.wait()
    assert admission.most == 2


# -- placing spools -------------------------------------------------------------------------------


async def _spool(path: Path, task: str, times: list[float], run_id: str = "run-x") -> bytes:
    async with open_recorder(path) as rec:
        rec.emit("trusted_harness", "run_started", header(run_id, task), monotonic=times[0])
        rec.emit("trusted_harness", "task_started", {"task": task, "digest": "d" * 64, "mode": "batch"},
                 monotonic=times[0])  # fmt: skip
        for t in times[1:]:
            rec.emit("trusted_harness", "refused_event", {"task": task, "producer": "x", "kind": "y", "reason": "z"},
                     monotonic=t)  # fmt: skip
    return await trio.Path(path).read_bytes()


async def test_place_shifts_an_overlapping_window_once_and_leaves_a_later_one(tmp_path: Path) -> None:
    a = await _spool(tmp_path / "a", "a-task@1.0.0", [10.0, 11.0, 15.0])
    b = await _spool(tmp_path / "b", "b-task@1.0.0", [12.0, 12.5, 14.0])  # ran beside a
    c = await _spool(tmp_path / "c", "c-task@1.0.0", [100.0, 101.0])  # ran after both
    async with open_recorder(tmp_path / "run") as rec:
        rec.emit("trusted_harness", "run_started", {"nonce": None, "run_id": "run-x",
                 "tasks": ["a-task@1.0.0", "b-task@1.0.0", "c-task@1.0.0"]}, monotonic=1.0)  # fmt: skip
        for raw, task in ((a, "a-task@1.0.0"), (b, "b-task@1.0.0"), (c, "c-task@1.0.0")):
            spool = check(raw, run_id="run-x", task_ref=task, digest="d" * 64, complete=False)
            rec.place(spool.lines)
            rec.emit("trusted_harness", "task_ended_early", {"task": task, "phase": "setup", "category": "cancelled",
                     "reason": "test"}, monotonic=0.0)  # fmt: skip
            rec.emit("trusted_harness", "task_finished", {"task": task, "status": "not_completed", "reason": "test",
                     "ended": {"phase": "setup", "category": "cancelled"}}, monotonic=0.0)  # fmt: skip
        rec.emit("trusted_harness", "run_finished", {"tasks": {}}, monotonic=0.0)
    raw = (tmp_path / "run").read_bytes()
    verify_chain(raw)  # chain and grammar
    times = [json.loads(line)["monotonic"] for line in raw.splitlines()]
    # run_started 1; a: 10 11 15 (+ its end, clamped: 15 15); b shifted by 15-12=3: 15 15.5 17 (17 17);
    # c after them all: not shifted
    assert times == [1.0, 10.0, 11.0, 15.0, 15.0, 15.0, 15.0, 15.5, 17.0, 17.0, 17.0, 100.0, 101.0, 101.0, 101.0,
                     101.0]  # fmt: skip


async def test_a_spool_is_refused_for_another_run_a_torn_line_or_a_broken_grammar(tmp_path: Path) -> None:
    raw = await _spool(tmp_path / "a", "a-task@1.0.0", [1.0, 2.0])
    good = {"run_id": "run-x", "task_ref": "a-task@1.0.0", "digest": "d" * 64, "complete": False}
    assert len(check(raw, **good).lines) == 2  # type: ignore[arg-type]
    with pytest.raises(SpoolError, match="not this run's"):
        check(raw, **{**good, "run_id": "run-y"})  # type: ignore[arg-type]
    with pytest.raises(SpoolError, match="task_started"):
        check(raw, **{**good, "digest": "e" * 64})  # type: ignore[arg-type]
    with pytest.raises(SpoolError, match="not a whole chain"):
        check(raw[:-10], **good)  # type: ignore[arg-type]
    with pytest.raises(SpoolError, match="not a whole chain"):
        check(raw.replace(b'"reason":"z"', b'"reason":"Z"'), **good)  # type: ignore[arg-type]
    with pytest.raises(SpoolError, match="ends in phase task"):
        check(raw, **{**good, "complete": True})  # type: ignore[arg-type]
    with pytest.raises(SpoolError):
        check(b"", **good)  # type: ignore[arg-type]
    with pytest.raises(SpoolError):
        check(b"\x00garbage\n", **good)  # type: ignore[arg-type]


# -- --jobs on the command line -----------------------------------------------------------------------


@pytest.mark.parametrize("jobs", ["0", "-3", "two", "1.5", ""])
def test_jobs_that_are_not_a_positive_integer_are_refused_before_anything_runs(tmp_path: Path, jobs: str) -> None:
    proc = _ale("run", CARTPOLE, "--jobs", jobs, "--plain", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("ale: error: --jobs must be a positive integer"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_a_huge_jobs_runs_no_more_tasks_than_there_are(tmp_path: Path) -> None:
    proc = _ale(
        "run", CARTPOLE, "--jobs", "1" + "0" * 40, "--plain", "--out", str(tmp_path / "out"), "--episodes", "1",
        "--agent-cmd", f"{PY} -c pass", cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (bundle,) = (tmp_path / "out").glob("*.ale")
    assert proc.stdout.strip() == str(bundle)
    assert sorted(p.suffix for p in (tmp_path / "out").iterdir()) == [".ale", ".key"]  # the state folder is gone


def _run_started_members() -> list[str]:
    harness = Harness(_options("pass"), LocalRuntime(), PlainProgress(out=io.StringIO()))
    harness.runtime.check()
    return list(harness._run_started())


async def test_the_run_started_event_and_the_grammar_know_nothing_of_jobs() -> None:
    """A run's trajectory does not say how its tasks were scheduled: the same kinds as ever."""
    options = attrs.evolve(_options("pass", episodes=1, limits=SMALL), tasks=(CARTPOLE, PENDULUM), jobs=2)
    run = await run_harness(options)
    assert set(run.kinds("trusted_harness")) <= grammar.KINDS["trusted_harness"]
    assert set(run.events[0]["data"]) == set(_run_started_members())
