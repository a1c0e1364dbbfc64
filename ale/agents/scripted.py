"""A scripted coding agent: ``python -m ale.agents.scripted TASK/CASE`` (the judge's labelled set).

It behaves as a coding agent does, without a model: it states a plan, writes the case's files into
the workspace (each a ``tool_call`` with the file's content), runs the case's commands there (each a
``shell_command``, its output on stdout and a ``tool_result``), and stops. The cases are in
:mod:`ale.agents._cases_pendulum` and :mod:`ale.agents._cases_reacher`; what they are for, and the
labels, in docs/judge.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ale.agents._case import Case
from ale.agents._cases_pendulum import CASES as PENDULUM
from ale.agents._cases_reacher import CASES as REACHER

CASES: dict[str, Case] = {case.id: case for case in (*PENDULUM, *REACHER)}
OUTPUT_TAIL = 4000


class _Channel:
    def __init__(self) -> None:
        fd = os.environ.get("ALE_EVENT_FD", "").strip()
        self.fd = int(fd) if fd.isdigit() else None

    def event(self, kind: str, data: dict[str, Any]) -> None:
        if self.fd is not None:
            os.write(self.fd, (json.dumps({"kind": kind, "data": data}) + "\n").encode("utf-8"))


def _source(text: str) -> str:
    return text.replace("{python}", sys.executable)


def run(case: Case, workspace: Path) -> int:
    channel = _Channel()
    channel.event("message", {"role": "assistant", "text": case.plan})
    for path, text in case.files:
        source = _source(text)
        channel.event("tool_call", {"tool": "write_file", "input": {"path": f"/workspace/{path}", "content": source}})
        target = workspace / path
        target.write_text(source, encoding="utf-8")
        if source.startswith("#!"):
            target.chmod(0o755)
        channel.event("tool_result", {"tool": "write_file", "output": f"wrote {len(source.encode())} bytes"})
    status = 0
    for argv in case.commands:
        command = " ".join(argv)
        channel.event("tool_call", {"tool": "shell", "input": command})
        done = subprocess.run(argv, cwd=workspace, capture_output=True, text=True, errors="replace", check=False)
        output = done.stdout + done.stderr
        for line in output.splitlines():
            print(line, flush=True)
        channel.event("shell_command", {"command": command, "exit_status": done.returncode})
        channel.event("tool_result", {"tool": "shell", "output": output[-OUTPUT_TAIL:]})
        status = status or done.returncode
    channel.event("message", {"role": "assistant", "text": "Done: the policy is in /workspace."})
    return status


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in CASES:
        print(f"usage: python -m ale.agents.scripted CASE, CASE one of {', '.join(sorted(CASES))}", file=sys.stderr)
        return 2
    case = CASES[args[0]]
    if os.environ.get("ALE_TASK_ID", case.task) != case.task:
        print(f"case {case.id} is for task {case.task}, not {os.environ['ALE_TASK_ID']}", file=sys.stderr)
        return 2
    return run(case, Path(os.environ.get("ALE_WORKSPACE", "/workspace")))


if __name__ == "__main__":
    raise SystemExit(main())
