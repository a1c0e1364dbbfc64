"""Host folders for one sandbox run through the local runtime (for the isolation tests): the
conformance suite's Box and Lines (``ale.runner.conformance``), with a folder of their own."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from ale.runner import conformance
from ale.runner.runtime import SandboxSpec

PY = conformance.PY  # the sandbox's own interpreter (docs/agent-contract.md)


class Box(conformance.Box):
    """A workspace, a task folder and a listening stand-in for the evaluator's agent socket, in a
    temporary folder that :meth:`close` removes."""

    def __init__(self) -> None:
        super().__init__(Path(tempfile.mkdtemp(prefix="ale-bx-")))  # short: Unix socket paths

    def spec(self, code: str, *, wall_time_s: float = 60.0, **kw: Any) -> SandboxSpec:
        return super().spec(code, wall_time_s=wall_time_s, **kw)

    def close(self) -> None:
        super().close()
        shutil.rmtree(self.folder, ignore_errors=True)


class Lines(conformance.Lines):
    """A sink that keeps every line with its stream name (undecodable bytes replaced)."""

    def of(self, stream: str) -> list[str]:
        return [line.decode(errors="replace") for s, line in self.lines if s == stream]
