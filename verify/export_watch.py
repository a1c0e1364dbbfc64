"""``ale-verify export-site DIR --every SECONDS``: the static board kept current beside a live site.

The exporter container of ``deploy/compose.yaml`` runs this next to ``ale-verify serve``: it
exports once at start, then looks at the database every ``SECONDS`` and exports again when its
bytes changed (the SQLite file's and its write-ahead log's size and modification time), so an
idle site costs a ``stat`` a period and a new upload reaches the board within one. Each export
is incremental (unchanged files are linked from the previous one, docs/leaderboard-export.md).

A database that does not exist yet (the verifier has not started) is waited for; an export that
fails for a reason that cannot pass by itself (``DIR`` is not a previous export) ends the loop.
SIGTERM ends it between two exports: as a container's first process it would otherwise ignore it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

from ale_verify import db

Snapshot = tuple[tuple[int, int] | None, ...]  # a file's, or (PostgreSQL) one (submissions, last audit seq)


def database_state(where: db.Location) -> Snapshot | None:
    """What changes whenever a transaction commits: a SQLite file's :func:`file_state`, or for
    PostgreSQL the number of submissions and the last audit entry; None while there is no database."""
    if isinstance(where, db.SqliteUrl):
        return file_state(where.path)
    if not db.exists(where):
        return None
    return (db.change_marker(where),)


def file_state(database: Path) -> Snapshot | None:
    """A SQLite database's state: what changes whenever a transaction commits (the file's and its
    write-ahead log's size and modification time); None while the file does not exist."""
    out: list[tuple[int, int] | None] = []
    for path in (database, database.with_name(database.name + "-wal")):
        try:
            st = path.stat()
        except FileNotFoundError:
            out.append(None)
        else:
            out.append((st.st_size, st.st_mtime_ns))
    return None if out[0] is None else tuple(out)


def watch(
    export: Callable[[], Any],
    state: Callable[[], Hashable | None],
    every: float,
    *,
    stop: threading.Event,
    report: Callable[[Any], None],
    waiting: Callable[[], None],
) -> int:
    """Export when ``state()`` changed, looking every ``every`` seconds until ``stop`` is set;
    returns the number of exports. ``state()`` is None while there is no database yet (then
    ``waiting`` is told once); ``export`` raises to end the loop (the caller reports why)."""
    last: Hashable | None = None
    exports = 0
    told_waiting = False
    while not stop.is_set():
        now = state()
        if now is None:
            if not told_waiting:
                waiting()
                told_waiting = True
        elif now != last:
            last = now  # taken before the export: a commit during it is seen next period
            report(export())
            exports += 1
        stop.wait(every)
    return exports


def stop_on_sigterm() -> threading.Event:
    """An event set by SIGTERM or SIGINT (installed in the main thread)."""
    stop = threading.Event()

    def handler(_signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop
