"""Progress display for ``ale run``: a live panel on a terminal, plain lines for CI logs."""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol, TextIO

PHASES = ("evaluator", "agent", "official evaluation", "scoring", "bundle")


class Progress(Protocol):
    def phase(self, task: str, phase: str, detail: str = "") -> None: ...
    def update(self, task: str, detail: str) -> None: ...
    def note(self, message: str) -> None: ...
    def close(self) -> None: ...


class PlainProgress:
    """One line per phase change; updates at most every ``interval`` seconds per task."""

    def __init__(self, out: TextIO | None = None, interval: float = 5.0) -> None:
        self.out = out or sys.stderr
        self.interval = interval
        self._last: dict[str, float] = {}

    def _write(self, line: str) -> None:
        self.out.write(f"[{time.strftime('%H:%M:%S')}] {line}\n")
        self.out.flush()

    def phase(self, task: str, phase: str, detail: str = "") -> None:
        self._last[task] = time.monotonic()
        self._write(f"{task}: {phase}" + (f": {detail}" if detail else ""))

    def update(self, task: str, detail: str) -> None:
        now = time.monotonic()
        if now - self._last.get(task, 0.0) >= self.interval:
            self._last[task] = now
            self._write(f"{task}:   {detail}")

    def note(self, message: str) -> None:
        self._write(message)

    def close(self) -> None:
        pass


class LiveProgress:
    """A rich live table: one row per task with its phase and what it is doing."""

    def __init__(self, tasks: list[str]) -> None:
        from rich.console import Console
        from rich.live import Live

        self._console = Console(stderr=True)
        self._rows: dict[str, list[str]] = {t: ["waiting", ""] for t in tasks}
        self._started: dict[str, float] = {}
        self._live = Live(self._render(), console=self._console, refresh_per_second=4, transient=False)
        self._live.start()

    def _render(self) -> Any:
        from rich.table import Table

        table = Table(title="ale run", expand=True)
        table.add_column("task", no_wrap=True)
        table.add_column("phase", no_wrap=True)
        table.add_column("elapsed", justify="right", no_wrap=True)
        table.add_column("progress")
        now = time.monotonic()
        for task, (phase, detail) in self._rows.items():
            started = self._started.get(task)
            elapsed = f"{now - started:5.0f}s" if started else ""
            table.add_row(task, phase, elapsed, detail)
        return table

    def phase(self, task: str, phase: str, detail: str = "") -> None:
        self._started.setdefault(task, time.monotonic())
        self._rows[task] = [phase, detail]
        self._live.update(self._render())

    def update(self, task: str, detail: str) -> None:
        self._rows[task][1] = detail
        self._live.update(self._render())

    def note(self, message: str) -> None:
        self._live.console.print(message)

    def close(self) -> None:
        self._live.update(self._render())
        self._live.stop()
