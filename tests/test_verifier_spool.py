"""An upload's file (ale_verify.bodies): made in a thread with the rate limit's take, and never left
behind by a request cancelled (its client gone) while the thread makes it."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from ale_verify.bodies import new_spool, spool_in_thread


def test_an_upload_cancelled_while_its_file_is_made_leaves_no_file_and_no_descriptor(tmp_path: Path) -> None:
    entered, release = threading.Event(), threading.Event()
    made: list[tuple[int, str]] = []

    def make() -> tuple[int, str]:  # the rate limit's take waits for its commit, then the file
        entered.set()
        assert release.wait(30)
        made.append(new_spool(tmp_path))
        return made[0]

    async def go() -> None:
        request = asyncio.ensure_future(spool_in_thread(make))
        await asyncio.to_thread(entered.wait, 30)
        request.cancel()
        try:
            await request
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("the request was not cancelled")
        release.set()
        for _ in range(300):
            if made and not await asyncio.to_thread(os.listdir, tmp_path):
                return
            await asyncio.sleep(0.01)

    asyncio.run(go())
    assert len(made) == 1
    assert list(tmp_path.iterdir()) == []
    fd = made[0][0]
    assert not os.path.exists(f"/proc/self/fd/{fd}") or os.readlink(f"/proc/self/fd/{fd}") != made[0][1]


def test_a_spool_made_for_a_request_that_goes_on_is_its_own(tmp_path: Path) -> None:
    async def go() -> tuple[int, str] | None:
        return await spool_in_thread(lambda: new_spool(tmp_path))

    spool = asyncio.run(go())
    assert spool is not None
    fd, name = spool
    os.write(fd, b"body")
    os.close(fd)
    assert Path(name).read_bytes() == b"body"
    assert oct(Path(name).stat().st_mode & 0o777) == "0o600"
