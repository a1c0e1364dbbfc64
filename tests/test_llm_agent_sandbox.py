"""``ale run --agent llm`` in a real sandbox: the agent's own environment holds everything it
imports, and it reaches a model only through the run's LLM gateway."""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from sandbox_tools import need_bwrap

from ale import catalog
from ale.core.trajectory import verify_chain
from ale.runner import cli
from ale.runner.harness import Harness, RunRecord
from ale.runner.local import LocalRuntime
from ale.runner.options import RunOptions
from ale.runner.progress import PlainProgress

CARTPOLE = "cartpole-balance"


def llm_options(*, model: str = "scripted-model", agent_time: float = 60.0, episodes: int = 5, **kw: Any) -> RunOptions:
    """What ``ale run cartpole-balance --agent llm --model MODEL`` asks the harness for."""
    args = cli.build_parser().parse_args(["run", CARTPOLE, "--agent", "llm", "--model", model])
    release, sha = catalog.release()
    return RunOptions(
        tasks=(CARTPOLE,),
        agent=cli._agent(args),
        release=release,
        release_sha256=sha,
        release_name=release.release,
        episodes=episodes,
        agent_time_s=agent_time,
        **kw,
    )


async def run_harness(options: RunOptions) -> tuple[RunRecord, list[dict[str, Any]]]:
    need_bwrap()
    record = await Harness(options, LocalRuntime(), PlainProgress(out=io.StringIO())).run()
    try:
        raw = await trio.Path(record.trajectory).read_bytes()
    finally:
        shutil.rmtree(record.root, ignore_errors=True)
    verify_chain(raw)
    return record, [json.loads(line) for line in raw.splitlines()]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short run folder (it holds Unix sockets); an incomplete trajectory lands in tmp_path."""
    monkeypatch.chdir(tmp_path)
    folder = Path(tempfile.mkdtemp(prefix="ale-llm-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def agent_lines(events: list[dict[str, Any]], stream: str) -> list[str]:
    return [e["data"]["text"] for e in events if e["producer"] == "untrusted_agent" and e["kind"] == stream]


async def test_agent_llm_without_a_gateway_says_so_and_leaves_no_policy(workdir: Path) -> None:
    record, events = await run_harness(llm_options(workdir=workdir))
    (outcome,) = record.outcomes
    assert outcome.status == "not_completed"
    assert "left no policy artifact" in outcome.reason
    stderr = "\n".join(agent_lines(events, "stderr"))
    assert "OPENAI_BASE_URL is not set: the run has no LLM gateway" in stderr
    assert "Traceback" not in stderr  # every module it imports is in the agent's environment
    started = next(e for e in events if e["kind"] == "run_started")
    assert started["data"]["agent"]["command"][-4:] == ["-m", "ale.agents.llm", "--model", "scripted-model"]
