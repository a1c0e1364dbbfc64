"""Host folders for one sandbox run through the local runtime (for the isolation tests)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

from ale.runner import agent_env, sandbox
from ale.runner.runtime import SandboxSpec, sandbox_path

PY = agent_env.PYTHON  # the sandbox's own interpreter (docs/agent-contract.md)


class Box:
    """A workspace, a task folder and a listening stand-in for the evaluator's agent socket."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="ale-bx-"))  # short: Unix socket paths
        self.workspace = self.folder / "workspace"
        self.workspace.mkdir()
        if os.geteuid() == 0:
            os.chown(self.workspace, sandbox.SANDBOX_UID, sandbox.SANDBOX_UID)
        self.task_dir = self.folder / "task"
        self.task_dir.mkdir()
        (self.task_dir / "task.json").write_text("{}\n")
        self.folder.chmod(0o755)
        self.task_dir.chmod(0o755)
        self.socket_path = self.folder / "evaluator.sock"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.socket_path))
        self.listener.listen(8)
        self.socket_path.chmod(0o666)

    def spec(self, code: str, *, wall_time_s: float = 60.0, **kw: Any) -> SandboxSpec:
        return SandboxSpec(
            command=(PY, "-c", code),
            workspace=self.workspace,
            workspace_writable=kw.pop("writable", True),
            task_dir=self.task_dir,
            evaluator_socket=self.socket_path,
            env={"HOME": "/workspace", "PATH": sandbox_path()},
            wall_time_s=wall_time_s,
            **kw,
        )

    def close(self) -> None:
        self.listener.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class Lines:
    """A sink that keeps every line with its stream name."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, bytes]] = []

    def __call__(self, stream: str, line: bytes) -> None:
        self.lines.append((stream, line))

    def of(self, stream: str) -> list[str]:
        return [line.decode(errors="replace") for s, line in self.lines if s == stream]
