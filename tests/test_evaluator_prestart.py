"""The local runtime's prestarted evaluator (``ale-evaluator standby``): taken by the next
open_evaluator, replaced when it died, reaped by close()."""

from __future__ import annotations

import json
import os
import secrets
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from ale.client import AleEnvClient
from ale.runner.local import LocalRuntime
from ale.runner.runtime import EvaluatorSpec


@pytest.fixture
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ale-pre-") as d:  # short: Unix socket paths
        yield Path(d)


def spec(folder: Path) -> EvaluatorSpec:
    private = folder / "private"
    private.mkdir(mode=0o700)
    config = json.dumps({"run_id": "run-prestart", "secret": secrets.token_hex(32)}).encode()
    return EvaluatorSpec("cartpole-balance", config, folder / "a.sock", private / "h.sock", private / "e.jsonl")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_open_evaluator_takes_the_prestarted_process(folder: Path) -> None:
    runtime = LocalRuntime()
    runtime.prestart_evaluator()
    assert runtime._standby is not None
    pid = runtime._standby.process.pid
    async with runtime.open_evaluator(spec(folder)) as handle:
        assert handle.process.pid == pid  # the standby, not a new process
        client = AleEnvClient(handle.harness_target, timeout=10)
        try:
            assert (await trio.to_thread.run_sync(client.get_spec)).task_id == "cartpole-balance"
        finally:
            client.close()
        assert runtime._standby is None
    assert not alive(pid)


async def test_a_prestarted_evaluator_that_died_is_replaced(folder: Path) -> None:
    runtime = LocalRuntime()
    runtime.prestart_evaluator()
    assert runtime._standby is not None
    dead = runtime._standby.process
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    async with runtime.open_evaluator(spec(folder)) as handle:
        assert handle.process.pid != dead.pid
        assert handle.alive()


def test_close_ends_an_unused_prestarted_evaluator() -> None:
    runtime = LocalRuntime()
    runtime.prestart_evaluator()
    assert runtime._standby is not None
    process = runtime._standby.process
    runtime.close()
    assert process.returncode == 0  # it read an empty job and ended by itself
    assert runtime._standby is None
    runtime.close()


def test_prestart_keeps_one_process() -> None:
    runtime = LocalRuntime()
    runtime.prestart_evaluator()
    first = runtime._standby
    runtime.prestart_evaluator()
    assert runtime._standby is first
    runtime.close()


def test_a_prestart_that_cannot_spawn_leaves_the_error_to_open_evaluator(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    def fail(*_args: object, **_kw: object) -> None:
        raise OSError("no processes left")

    runtime = LocalRuntime()
    monkeypatch.setattr(subprocess, "Popen", fail)
    runtime.prestart_evaluator()  # best effort: no exception here
    assert runtime._standby is None


async def test_prestart_keeps_as_many_as_tasks_start_side_by_side_and_each_is_taken_once(tmp_path: Path) -> None:
    """Two tasks starting at once each take a prestarted process of their own (under a lock, from
    worker threads); a second call adds only what is missing."""
    runtime = LocalRuntime()
    runtime.prestart_evaluator(2)
    assert runtime._standby is not None
    pids = {runtime._standby.process.pid, *(s.process.pid for s in runtime._more)}
    assert len(pids) == 2
    runtime.prestart_evaluator(2)
    assert {runtime._standby.process.pid, *(s.process.pid for s in runtime._more)} == pids
    served: list[int] = []

    async def serve(name: str) -> None:
        folder = tmp_path / name
        folder.mkdir()
        async with runtime.open_evaluator(spec(folder)) as handle:
            served.append(handle.process.pid)

    async with trio.open_nursery() as nursery:
        for name in ("a", "b"):
            nursery.start_soon(serve, name)
    assert sorted(served) == sorted(pids)
    assert runtime._standby is None
    assert runtime._more == []
    runtime.close()
