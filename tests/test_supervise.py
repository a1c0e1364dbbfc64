"""Shared supervision (ale/runner/supervise.py) with a backend that is no sandbox at all.

A plain child process stands in for a backend's sandbox: if supervision decides the caps, the
watchdog, the wall time and the stop sequence by itself, then any backend that only starts,
observes and kills gets them. (The conformance suite checks the same through real backends.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
import trio
import trio.lowlevel

from ale.runner import supervise
from ale.runner.runtime import Limits, Network, SandboxSpec
from ale.runner.supervise import MAX_LINE, LineSplitter


@attrs.define
class PlainChild:
    """The least a backend does: start a process with three streams and signal it."""

    process: trio.Process
    stdout: trio.abc.ReceiveStream
    stderr: trio.abc.ReceiveStream
    events: trio.abc.ReceiveStream
    signals: list[int] = attrs.Factory(list)

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def wait(self) -> int:
        return await self.process.wait()

    def send_term(self) -> None:
        self.signals.append(signal.SIGTERM)
        self.process.send_signal(signal.SIGTERM)

    def send_kill(self) -> None:
        self.signals.append(signal.SIGKILL)
        self.process.send_signal(signal.SIGKILL)

    async def aclose(self) -> None:
        await self.events.aclose()


async def _start(code: str) -> PlainChild:
    read_fd, write_fd = os.pipe()
    try:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", code],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(write_fd,),
            env={**os.environ, "ALE_EVENT_FD": str(write_fd)},
        )
    finally:
        os.close(write_fd)
    assert process.stdout is not None
    assert process.stderr is not None
    return PlainChild(process, process.stdout, process.stderr, trio.lowlevel.FdStream(read_fd))


def _spec(workspace: Path, **kw: object) -> SandboxSpec:
    return SandboxSpec(
        command=("unused",),
        workspace=workspace,
        workspace_writable=True,
        task_dir=workspace,
        evaluator_socket=workspace / "unused.sock",
        env={},
        **kw,  # type: ignore[arg-type]
    )


class Sink:
    def __init__(self) -> None:
        self.lines: list[tuple[str, bytes]] = []

    def __call__(self, stream: str, line: bytes) -> None:
        self.lines.append((stream, line))


async def test_supervise_returns_the_exit_status_and_every_stream(tmp_path: Path) -> None:
    code = (
        "import os, sys\n"
        "print('out')\n"
        "print('err', file=sys.stderr)\n"
        "os.write(int(os.environ['ALE_EVENT_FD']), b'{\"kind\": \"note\"}\\n')\n"
        "sys.exit(3)\n"
    )
    sink = Sink()
    child = await _start(code)
    result = await supervise.supervise(_spec(tmp_path), child, sink, None, started=time.monotonic())
    assert (result.exit_status, result.stopped_for, result.dropped_output_bytes) == (3, "", 0)
    assert sorted(sink.lines) == [("event", b'{"kind": "note"}'), ("stderr", b"err"), ("stdout", b"out")]
    assert child.signals == []


async def test_supervise_stops_at_the_wall_time_with_term_then_kill(tmp_path: Path) -> None:
    """A child that ignores SIGTERM gets SIGKILL after the grace period."""
    code = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\n"
    code += "time.sleep(600)\n"
    child = await _start(code)
    sink = Sink()
    result = await supervise.supervise(_spec(tmp_path, wall_time_s=1.0), child, sink, None, started=time.monotonic())
    assert (result.exit_status, result.stopped_for) == (None, "wall_time")
    assert child.signals == [signal.SIGTERM, signal.SIGKILL]
    assert 1.0 + supervise.KILL_GRACE_S <= result.wall_time_s < 1.0 + supervise.KILL_GRACE_S + 3
    assert sink.lines == [("stdout", b"up")]


async def test_supervise_watches_the_workspace_size(tmp_path: Path) -> None:
    code = f"open({str(tmp_path / 'big')!r}, 'wb').write(b'x' * (2 << 20))\nimport time; time.sleep(600)\n"
    child = await _start(code)
    spec = _spec(tmp_path, wall_time_s=30.0, limits=Limits(workspace_bytes=1 << 20))
    result = await supervise.supervise(spec, child, Sink(), None, started=time.monotonic())
    assert (result.exit_status, result.stopped_for) == (None, "disk")
    assert child.signals[0] == signal.SIGTERM
    assert result.wall_time_s < 10


async def test_supervise_stops_for_should_stop_and_on_cancellation(tmp_path: Path) -> None:
    async def env_steps() -> str:
        return "env_steps"

    child = await _start("import time; time.sleep(600)")
    result = await supervise.supervise(_spec(tmp_path), child, Sink(), env_steps, started=time.monotonic())
    assert (result.exit_status, result.stopped_for) == (None, "env_steps")

    child = await _start("import time; time.sleep(600)")
    with trio.move_on_after(0.5):
        await supervise.supervise(_spec(tmp_path), child, Sink(), None, started=time.monotonic())
    assert child.returncode is not None  # the cancelled supervisor still stopped it
    assert child.signals[0] == signal.SIGTERM


def test_line_splitter_cuts_event_lines_and_splits_output_lines() -> None:
    sink = Sink()
    out, events = LineSplitter("stdout", sink), LineSplitter("event", sink, cut=True)
    long = b"a" * (2 * MAX_LINE + 10) + b"\nnext\n"
    out.feed(long)
    events.feed(long)
    out.close()
    events.close()
    assert [len(line) for s, line in sink.lines if s == "stdout"] == [MAX_LINE, MAX_LINE, 10, 4]
    assert [len(line) for s, line in sink.lines if s == "event"] == [MAX_LINE, 4]
    assert events.dropped == MAX_LINE + 10 + 1
    assert out.dropped == 0


def _split(data: bytes, chunk: int, *, cut: bool) -> tuple[list[bytes], int]:
    sink = Sink()
    splitter = LineSplitter("s", sink, cut=cut)
    for i in range(0, len(data), chunk):
        splitter.feed(data[i : i + chunk])
    splitter.close()
    return [line for _, line in sink.lines], splitter.dropped


@pytest.mark.parametrize("cut", [False, True], ids=["output", "events"])
def test_a_long_line_arriving_whole_is_split_as_if_it_came_in_pieces(cut: bool) -> None:
    """A line longer than MAX_LINE in one chunk was cut to MAX_LINE with the rest neither passed on
    nor counted as dropped; in small chunks it was split (output) or cut and counted (events)."""
    data = b"a" * (2 * MAX_LINE + 10) + b"\nnext\n" + b"b" * (MAX_LINE + 1) + b"\n" + b"c" * MAX_LINE + b"\n"
    results = {chunk: _split(data, chunk, cut=cut) for chunk in (len(data), 65536, 4096, 7)}
    assert len(set(map(repr, results.values()))) == 1, {k: ([len(x) for x in v[0]], v[1]) for k, v in results.items()}
    lines, dropped = results[len(data)]
    assert all(len(line) <= MAX_LINE for line in lines)
    if cut:
        assert [len(line) for line in lines] == [MAX_LINE, 4, MAX_LINE, MAX_LINE]
        assert dropped == (MAX_LINE + 10 + 1) + (1 + 1)
    else:
        assert [len(line) for line in lines] == [MAX_LINE, MAX_LINE, 10, 4, MAX_LINE, 1, MAX_LINE]
        assert dropped == 0


def test_a_gateway_attachment_needs_its_socket_and_none_has_none(tmp_path: Path) -> None:
    assert _spec(tmp_path).network is Network.NONE
    with pytest.raises(ValueError, match="gateway socket"):
        _spec(tmp_path, network=Network.GATEWAY)
    with pytest.raises(ValueError, match="gateway socket"):
        _spec(tmp_path, gateway_socket=tmp_path / "gw.sock")
    spec = _spec(tmp_path, network=Network.GATEWAY, gateway_socket=tmp_path / "gw.sock")
    assert spec.gateway_socket == tmp_path / "gw.sock"


async def test_until_ready_returns_on_ready_on_exit_or_at_the_deadline() -> None:
    child = await _start("import time; time.sleep(600)")
    ready = trio.Event()
    ready.set()
    assert await supervise.until_ready(child, ready, 30.0) is True
    with trio.fail_after(5):  # not ready: the deadline decides
        assert await supervise.until_ready(child, trio.Event(), 0.3) is False
    await supervise.stop(child)
    await child.aclose()
    exiting = await _start("pass")
    with trio.fail_after(10):  # it ended before it was ready: no waiting for the deadline
        assert await supervise.until_ready(exiting, trio.Event(), 600.0) is False
    assert exiting.returncode == 0
    await exiting.aclose()


def test_the_ready_sink_sets_only_at_a_ready_line_and_ignores_garbage() -> None:
    ready = trio.Event()
    sink = supervise.ready_sink(ready, "a child's stdout")
    for line in (b"not json", b"[" * 100_000, b'{"event": "ready"' + b" " * (supervise.MAX_LINE + 1) + b"}",
                 b'["ready"]', b'{"event": "starting"}', b"\xff\xfe"):  # fmt: skip
        sink("stdout", line)
        assert not ready.is_set(), line[:40]
    sink("stdout", b'{"event": "ready", "agent": "unix:/a.sock"}')
    assert ready.is_set()
