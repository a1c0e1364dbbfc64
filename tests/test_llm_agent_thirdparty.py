"""A third-party CLI agent from npm, OpenAI's Codex CLI, run by the recipe of docs/agents.md
(scripts/agents/codex.sh) and driven by the scripted upstream (tests/llm_upstream.py, Responses API).

The CLI must be installed on the host (``npm install -g @openai/codex@CODEX_VERSION``, as
``.ci/run`` does): without it these tests skip with the reason on a developer's machine and fail
in CI (``ALE_SITE_TOOLS_REQUIRED=1``, tests/sandbox_tools.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from llm_upstream import ToolCall, Turn, serve_upstream
from sandbox_tools import missing
from test_llm_agent import LQR_SCRIPT, PLACEHOLDER, contract_env, make_task_dir, official_batch

from ale.policy import load_policy

CODEX_VERSION = "0.171.0"  # .ci/run installs this version
RECIPE = Path(__file__).resolve().parent.parent / "scripts" / "agents" / "codex.sh"
TIMEOUT_S = 180


def need_codex() -> str:
    """The installed Codex CLI's path (skip, or fail in CI, without the pinned version)."""
    path = shutil.which("codex", path="/usr/bin:/usr/local/bin")
    if path is None:
        missing(f"the Codex CLI is not installed (npm install -g @openai/codex@{CODEX_VERSION})")
    assert path is not None
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, check=False).stdout
    if CODEX_VERSION not in version:
        missing(
            f"the Codex CLI is {version.strip()!r}, not {CODEX_VERSION} (npm install -g @openai/codex@{CODEX_VERSION})"
        )
    return path


def codex_session(python: str) -> list[Turn]:
    """What a capable model does through Codex's exec_command tool: write the LQR solver, run it, stop."""
    command = f"cat > lqr.py <<'PYEOF'\n{LQR_SCRIPT}PYEOF\n{python} lqr.py"
    return [
        Turn(text="Writing the paper's LQR solver.", tool_calls=[ToolCall("exec_command", {"cmd": command})]),
        Turn(text="Done: the LQR policy is in the workspace and balances every practice episode."),
    ]


def function_outputs(request: Any) -> list[str]:
    items = request.json.get("input") or []
    return [str(i.get("output")) for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]


def test_codex_by_the_recipe_writes_a_policy_through_an_openai_compatible_endpoint(
    make_evaluator: Any, tmp_path: Path
) -> None:
    codex = need_codex()
    ev = make_evaluator("cartpole-balance")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    task_dir = make_task_dir(tmp_path, "cartpole-balance")
    with serve_upstream(script=codex_session(sys.executable), api_key=PLACEHOLDER) as up:
        env = contract_env(ev, "cartpole-balance", workspace, task_dir, up.openai_base)
        env["PATH"] = f"{Path(codex).parent}:{env['PATH']}"
        proc = subprocess.run(
            ["sh", str(RECIPE), "scripted-model"],
            env=env,
            cwd=workspace,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
            start_new_session=True,
        )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    load_policy((workspace / "policy.safetensors").read_bytes())
    assert official_batch(ev, workspace, num_episodes=10).headline_value == 500.0
    responses = [r for r in up.requests if r.path == "/v1/responses"]
    assert len(responses) == 2
    first = responses[0]
    assert first.headers["authorization"] == f"Bearer {PLACEHOLDER}"
    assert first.json["model"] == "scripted-model"
    assert "Balancing a cart-pole" not in json.dumps(first.json)  # the recipe points at the paper
    assert str(task_dir / "paper.md") in json.dumps(first.json["input"])
    assert "practice: mean_return = 500.0 over 20 episodes" in function_outputs(responses[1])[0]
    assert not (workspace / ".codex").exists()  # CODEX_HOME is scratch space, not the workspace


def test_the_codex_recipe_without_a_gateway_says_so(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(["sh", str(RECIPE), "m"], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode != 0
    assert "no LLM gateway" in proc.stderr
    proc = subprocess.run(["sh", str(RECIPE)], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode != 0
    assert "usage: codex.sh MODEL" in proc.stderr


def test_ci_installs_the_pinned_codex() -> None:
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    assert f"CODEX_VERSION={CODEX_VERSION}" in ci
    assert f"@openai/codex@{CODEX_VERSION}" in RECIPE.read_text()
    docs = (Path(__file__).resolve().parent.parent / "docs" / "agents.md").read_text()
    assert f"@openai/codex@{CODEX_VERSION}" in docs
    assert os.access(RECIPE, os.X_OK)
