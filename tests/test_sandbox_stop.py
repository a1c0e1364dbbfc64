"""Stopping a sandbox: SIGTERM reaches the agent's processes, and only them, before any SIGKILL."""

from __future__ import annotations

import trio
from sandbox_box import Box, Lines

from ale.runner.local import LocalRuntime


async def test_sigterm_goes_to_the_sandboxed_processes_not_bwrap_so_a_slow_handler_finishes(box: Box) -> None:
    """SIGTERM to timeout(1) or the outer bwrap killed the PID namespace at once, so an agent that
    needs a moment to save its work lost it (and a fast one only won a race)."""
    code = (
        "import signal, sys, time\n"
        "def on_term(*_):\n"
        "    time.sleep(1.0)\n"
        "    open('/workspace/saved', 'w').write('ok')\n"
        "    print('saved', flush=True)\n"
        "    sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('waiting', flush=True)\n"
        "time.sleep(600)\n"
    )
    runtime = LocalRuntime()
    runtime.check()
    started = trio.current_time()

    async def should_stop() -> str:
        return "test_stop" if trio.current_time() - started > 1.5 else ""

    lines = Lines()
    result = await runtime.run_sandboxed(box.spec(code), lines, should_stop=should_stop)
    assert result.stopped_for == "test_stop"
    assert lines.of("stdout") == ["waiting", "saved"]
    assert (box.workspace / "saved").read_text() == "ok"
