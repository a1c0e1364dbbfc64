"""The built-in LLM agent and a third-party CLI agent in a real sandbox, through the run's LLM gateway.

``ale run cartpole-balance --agent llm --model M --llm-upstream openai=URL`` with the scripted upstream
(tests/llm_upstream.py) as the model: the harness starts the gateway, the sandbox reaches it through
its relay, and the agent writes the paper's LQR policy, which the official evaluation scores. The
same for OpenAI's Codex CLI run by the recipe of docs/agents.md (scripts/agents/codex.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
from llm_upstream import ToolCall, Turn, Usage, serve_upstream
from sandbox_tools import need_bwrap
from test_llm_agent import lqr_session
from test_llm_agent_sandbox import agent_lines, llm_options, run_harness, workdir  # noqa: F401 - a fixture
from test_llm_agent_thirdparty import RECIPE, codex_session, need_codex

from ale.runner.gateway_proc import Upstream
from ale.runner.options import AgentSpec

CARTPOLE = "cartpole-balance"


def openai_upstream(up: Any) -> Upstream:
    return Upstream(name="openai", api="openai", base_url=up.openai_base, api_key=None)


def proxy_requests(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["producer"] == "trusted_network_proxy" and e["kind"] == "llm_request"]


def clean_env() -> dict[str, str]:
    """The test's environment without any LLM upstream of the developer's own."""
    drop = ("OPENAI_", "ANTHROPIC_", "ALE_RECIPIENT", "CI")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def test_ale_run_agent_llm_through_the_gateway_balances_every_official_episode(tmp_path: Path) -> None:
    need_bwrap()
    with serve_upstream(script=lqr_session("/task")) as up:
        proc = subprocess.run(
            [sys.executable, "-m", "ale.runner.cli", "run", CARTPOLE, "--agent", "llm", "--model", "scripted-model",
             "--llm-upstream", f"openai={up.openai_base}", "--plain", "--out", str(tmp_path / "out"),
             "--agent-time", "120", "--episodes", "10"],
            cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(up.requests) == 4
    assert all(r.path == "/v1/chat/completions" for r in up.requests)
    assert "authorization" not in up.requests[0].headers  # the placeholder never leaves the gateway
    assert "/task/paper.md" in json.dumps(up.requests[1].json)
    bundle = Path(proc.stdout.strip().splitlines()[-1])
    key = bundle.with_name(bundle.name.removesuffix(".ale") + ".key")
    inspect = subprocess.run(
        [sys.executable, "-m", "ale.runner.cli", "inspect", str(bundle), "--identity", str(key), "--json"],
        env=clean_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert inspect.returncode == 0, inspect.stderr
    (task,) = json.loads(inspect.stdout)["tasks"]
    assert task["status"] == "completed", task
    assert task["headline"] == {"mean_return": 500.0}
    assert task["passed_episodes"] == 10


async def test_agent_llm_through_the_gateway_is_recorded_by_the_proxy(workdir: Path) -> None:  # noqa: F811
    with serve_upstream(script=lqr_session("/task")) as up:
        record, events = await run_harness(llm_options(workdir=workdir, upstreams=(openai_upstream(up),)))
    (outcome,) = record.outcomes
    assert outcome.status == "completed", outcome.reason
    requests = proxy_requests(events)
    assert [r["decision"] for r in requests] == ["allowed"] * 4
    assert [r["path"] for r in requests] == ["/v1/chat/completions"] * 4
    assert {r["model"] for r in requests} == {"scripted-model"}
    assert all(r["usage"]["input_tokens"] > 0 for r in requests)
    stderr = "\n".join(agent_lines(events, "stderr"))
    assert "ended (finished) after 4 turns" in stderr
    assert "the policy is in place" in stderr
    shell = [e["data"] for e in events if e["producer"] == "untrusted_agent" and e["kind"] == "shell_command"]
    assert shell == [{"command": "python3 lqr.py", "exit_status": 0}]
    assert "HIDDEN-REASONING-MARKER" not in json.dumps(events)


async def test_a_budget_refusal_from_the_gateway_stops_the_agent_cleanly(workdir: Path) -> None:  # noqa: F811
    busy = Turn(tool_calls=[ToolCall("run_shell", {"command": "echo again"})], usage=Usage(400_000, 10))
    with serve_upstream(default=busy) as up:
        options = llm_options(workdir=workdir, upstreams=(openai_upstream(up),), agent_time=120)
        record, events = await run_harness(options)
    (outcome,) = record.outcomes
    assert outcome.status == "not_completed"
    assert "left no policy artifact" in outcome.reason
    stderr = "\n".join(agent_lines(events, "stderr"))
    assert "ended (llm budget: HTTP 429: the run's" in stderr, stderr[-2000:]
    assert "budget is exhausted" in stderr
    denied = [r for r in proxy_requests(events) if r["decision"] == "denied"]
    assert len(denied) == 1
    assert "retrying" not in stderr
    assert len(up.requests) == 3  # 3 x 400,000 input tokens: the fourth request is the gateway's to refuse


async def test_codex_by_the_recipe_through_the_gateway_balances_every_official_episode(workdir: Path) -> None:  # noqa: F811
    need_codex()
    agent = AgentSpec(
        name="codex",
        command=("/bin/sh", "-c", RECIPE.read_text(), "codex.sh", "scripted-model"),
        declared={"model": "scripted-model"},
    )
    with serve_upstream(script=codex_session("python3")) as up:
        options = llm_options(workdir=workdir, upstreams=(openai_upstream(up),), episodes=10)
        record, events = await run_harness(attrs.evolve(options, agent=agent))
    (outcome,) = record.outcomes
    assert outcome.status == "completed", outcome.reason
    requests = proxy_requests(events)
    assert [r["path"] for r in requests] == ["/v1/responses"] * 2
    assert all(r["decision"] == "allowed" and r["stream"] for r in requests)
    assert len(up.requests) == 2
    stderr = "\n".join(agent_lines(events, "stderr"))
    assert "practice: mean_return = 500.0 over 20 episodes" in stderr
