"""The gateway's event log: JSON lines the harness turns into ``trusted_network_proxy`` events.

Each line is ``{"kind", "wall_time", "monotonic", "seq", ...fields}`` (the evaluator's envelope),
within the caps of :func:`ale.gateway.recording.fit_line`, written whole with one ``write`` to a
file opened for appending (so a reader never sees half a line, and nothing waits in a buffer when
the process stops). Every secret the gateway holds is redacted from every line.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from typing import Any

from ale.gateway.recording import clip, fit_line


class EventLog:
    def __init__(self, path: str, secrets: Iterable[str]) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._redact = sorted({s for s in secrets if s}, key=len, reverse=True)  # longest first
        self._seq = 0

    def write(self, kind: str, **fields: Any) -> None:
        self._seq += 1
        record = {"kind": kind, "wall_time": time.time(), "monotonic": time.monotonic(), "seq": self._seq, **fields}
        line = memoryview(fit_line(record, self._redact))
        while line:
            line = line[os.write(self._fd, line) :]

    def defect(self, error: BaseException) -> None:
        """Report an unexpected error on stderr (its type and message, secrets redacted)."""
        message = clip(f"{type(error).__name__}: {error}", 1024, self._redact)
        print(f"ale.gateway: internal error: {message}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
