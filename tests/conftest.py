"""Shared fixtures: an in-process evaluator on two Unix sockets, and clients for each endpoint;
the verifier's database engines (SQLite, and a throwaway PostgreSQL cluster)."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from evaluator_helpers import task_in_mode

from ale import catalog
from ale.client import AleEnvClient
from ale_evaluator.events import EventLog
from ale_evaluator.seeds import RunConfig
from ale_evaluator.server import RunningEvaluator, start, unix_address
from ale_evaluator.service import EvaluatorState, Limits

FIXED_CONFIG = RunConfig(run_id="test-run-0001", secret=bytes(range(32)))
#: The verifier's database engines: every verifier test that uses the database runs on each.
DB_ENGINES = ("sqlite", "postgresql")


@attrs.define
class Evaluator:
    """A running evaluator with a client on each endpoint and its event log."""

    running: RunningEvaluator
    agent: AleEnvClient
    harness: AleEnvClient
    events: io.StringIO
    config: RunConfig

    @property
    def state(self) -> EvaluatorState:
        return self.running.state

    @property
    def agent_address(self) -> str:
        return self.running.agent_address


@pytest.fixture
def short_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short directory: Unix socket paths are limited to about 100 bytes."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="ale-t-"))
    yield path
    import shutil

    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_evaluator(short_tmp: Path) -> Iterator[Callable[..., Evaluator]]:
    started: list[Evaluator] = []

    def factory(
        task_id: str = "cartpole-balance",
        *,
        config: RunConfig = FIXED_CONFIG,
        limits: Limits | None = None,
        mode: str | None = None,
        **options: Any,
    ) -> Evaluator:
        """``mode``: run the task as if its definition said that mode (``task_in_mode``);
        ``options``: more ``EvaluatorState`` keywords (e.g. ``env_step_budget``)."""
        events = io.StringIO()
        task = catalog.get_task(task_id) if mode is None else task_in_mode(task_id, mode)
        state = EvaluatorState(task, config, events=EventLog(events), limits=limits, **options)
        n = len(started)
        running = start(
            state,
            agent_address=unix_address(short_tmp / f"a{n}.sock"),
            harness_address=unix_address(short_tmp / f"h{n}.sock"),
        )
        ev = Evaluator(
            running,
            AleEnvClient(running.agent_address, timeout=30),
            AleEnvClient(running.harness_address, timeout=30),
            events,
            config,
        )
        started.append(ev)
        return ev

    yield factory
    for ev in started:
        ev.agent.close()
        ev.harness.close()
        ev.running.stop(0)


@pytest.fixture
def evaluator(make_evaluator: Callable[..., Evaluator]) -> Evaluator:
    """The CartPole task's evaluator (fast), with a fixed run configuration."""
    return make_evaluator("cartpole-balance")


@pytest.fixture
def box() -> Iterator[Any]:
    """Host folders for one sandbox (tests/sandbox_box.py), removed after the test; skips without
    bubblewrap (and fails in CI, tests/sandbox_tools.py)."""
    from sandbox_box import Box
    from sandbox_tools import need_bwrap

    need_bwrap()
    made = Box()
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Any]:
    """A PostgreSQL cluster for the session (tests/pg_cluster.py); skips without PostgreSQL or
    psycopg (and fails in CI, tests/sandbox_tools.py)."""
    import pg_cluster as pgc
    from sandbox_tools import missing

    reason = pgc.unavailable()
    if reason is not None:
        missing(reason)
    cluster = pgc.start()
    try:
        yield cluster
    finally:
        from ale_verify import db

        db.close()
        cluster.stop()


@pytest.fixture(scope="session", params=DB_ENGINES)
def db_engine(request: pytest.FixtureRequest) -> Any:
    """New databases of one engine (``.new(tmp)``): the session runs its verifier tests on each."""
    from pg_cluster import Databases

    if request.param == "sqlite":
        return Databases("sqlite")
    return Databases("postgresql", request.getfixturevalue("pg_cluster"))
