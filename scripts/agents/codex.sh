#!/bin/sh
# OpenAI's Codex CLI as an ALE agent (docs/agents.md). Runs INSIDE the sandbox, through the run's
# LLM gateway: OPENAI_BASE_URL and OPENAI_API_KEY (the run's placeholder) are the gateway's.
# Install on the host (the sandbox shows /usr read-only): npm install -g --prefix /usr @openai/codex@0.171.0
# Usage: codex.sh MODEL        e.g. ale run TASK --agent-cmd "/usr/local/libexec/ale/codex.sh gpt-5.1-codex"
set -eu
model=${1:?usage: codex.sh MODEL}
: "${OPENAI_BASE_URL:?no LLM gateway: run ale with an upstream (OPENAI_BASE_URL, or --llm-upstream)}"
# Codex keeps its sessions and settings in CODEX_HOME: scratch space, not the workspace.
export CODEX_HOME=/tmp/codex
mkdir -p "$CODEX_HOME"
# A provider of its own: Codex's built-in "openai" provider does not read OPENAI_BASE_URL. No
# approvals and no sandbox of Codex's own: the ALE sandbox is the boundary, and nested namespaces
# are refused inside it anyway.
# On PATH (/usr/bin, npm's prefix /usr), or npm's other usual prefix /usr/local (not on the sandbox's PATH).
codex=$(command -v codex || echo /usr/local/bin/codex)
exec "$codex" exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox --cd "${ALE_WORKSPACE:-/workspace}" \
    --model "$model" \
    -c model_provider=ale -c model_providers.ale.name=ale \
    -c "model_providers.ale.base_url=$OPENAI_BASE_URL" \
    -c model_providers.ale.env_key=OPENAI_API_KEY -c model_providers.ale.wire_api=responses \
    "$(cat "${ALE_TASK_DIR:-/task}/README.md")

Read ${ALE_TASK_DIR:-/task}/paper.md and ${ALE_TASK_DIR:-/task}/task.json, implement the method, check the
policy on your own episodes, and leave it in ${ALE_WORKSPACE:-/workspace} before you stop." </dev/null
