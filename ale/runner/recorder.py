"""The trajectory recorder: every producer's events, in one hash chain, written off the event loop.

``emit`` is synchronous and cheap (it builds the event and its line with the pure
:class:`~ale.core.trajectory.ChainBuilder`, so the chain order is the order of ``emit`` calls);
a writer task drains the lines to disk through a worker thread.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

import trio

from ale.core.trajectory import ChainBuilder
from ale.runner._groups import collapse

MAX_TEXT = 64 * 1024


def clip_text(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} characters truncated]"


class Recorder:
    def __init__(self, path: Path, send: trio.MemorySendChannel[bytes]) -> None:
        self.path = path
        self.chain = ChainBuilder()
        self._send = send
        self.counts: dict[str, int] = {}

    @property
    def head(self) -> str:
        return self.chain.head

    def emit(
        self,
        producer: str,
        kind: str,
        data: dict[str, Any] | None = None,
        *,
        monotonic: float | None = None,
        wall_time: float | None = None,
    ) -> None:
        """Append one event. ``monotonic`` defaults to the harness clock (for harness events)."""
        _, line = self.chain.append(
            producer,
            kind,
            data or {},
            wall_time=time.time() if wall_time is None else wall_time,
            monotonic=time.monotonic() if monotonic is None else monotonic,
        )
        self.counts[producer] = self.counts.get(producer, 0) + 1
        self._send.send_nowait(line)


async def _writer(receive: trio.MemoryReceiveChannel[bytes], fh: IO[bytes]) -> None:
    # Shielded: on cancellation (Ctrl-C, a deadline) the writer still drains every emitted line;
    # it ends when the recorder closes its sending side.
    with trio.CancelScope(shield=True):
        await _drain(receive, fh)


async def _drain(receive: trio.MemoryReceiveChannel[bytes], fh: IO[bytes]) -> None:
    async with receive:
        batch: list[bytes] = []
        async for line in receive:
            batch.append(line)
            while True:
                try:
                    batch.append(receive.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            data = b"".join(batch)
            batch.clear()
            await trio.to_thread.run_sync(fh.write, data)
        await trio.to_thread.run_sync(fh.flush)


@asynccontextmanager
async def open_recorder(path: Path) -> AsyncIterator[Recorder]:
    """A recorder writing to ``path``; on exit every emitted line is on disk."""
    fh = await trio.to_thread.run_sync(lambda: open(path, "xb"))  # noqa: SIM115 - closed below
    send, receive = trio.open_memory_channel[bytes](math.inf)
    try:
        with collapse():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_writer, receive, fh)
                try:
                    yield Recorder(path, send)
                finally:
                    send.close()
    finally:
        await trio.to_thread.run_sync(fh.close)
