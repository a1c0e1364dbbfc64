"""Shared fixtures: an in-process evaluator on two Unix sockets, and clients for each endpoint."""

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
