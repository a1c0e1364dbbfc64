"""The built-in LLM coding agent: ``python -m ale.agents.llm --model MODEL`` (``ale run --agent llm``).

A tool loop over the OpenAI-compatible Chat Completions tool-call API (:mod:`ale.agents.llm_client`,
standard library only) with the tools of :mod:`ale.agents.llm_tools`, whose system prompt
(:mod:`ale.agents.llm_prompt`) gives the model the agent contract and the task's paper. It talks to
``$OPENAI_BASE_URL`` with ``$OPENAI_API_KEY``: inside a run the gateway sets both (the key is the
run's placeholder); a local llama.cpp or vLLM server speaks the same API.

The loop ends when the model calls ``finish``, at ``--max-turns``, when the wall-time budget is
nearly used, when the gateway refuses for budget (a clean stop), when the model stops calling
tools, or when the endpoint keeps failing. The conversation is kept under a context budget: old tool
outputs and long tool-call arguments are elided first, then the oldest turns dropped, each with a
marker. Each step is logged on stderr and recorded on ``ALE_EVENT_FD`` (``message``, ``tool_call``,
``tool_result``, ``shell_command``, ``api_usage``; never any reasoning text). The exit status is
0 when the policy the task needs is in place at the end, 1 when it is not, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import attrs

import ale
from ale.agents._common import EventChannel
from ale.agents.llm_client import (
    BudgetExhausted,
    ChatClient,
    Completion,
    ContextOverflow,
    UpstreamError,
    UpstreamFailed,
    clip,
)
from ale.agents.llm_prompt import TaskInfo, first_message, system_prompt
from ale.agents.llm_tools import ToolResult, Tools, cut
from ale.core.parse import ParseError, parse_json

NAME = "ale-llm"
DEFAULT_MAX_TURNS = 150
DEFAULT_CONTEXT_TOKENS = 100_000
DEFAULT_TOOL_OUTPUT_CHARS = 12_000
MAX_NUDGES = 3  # replies in a row without a tool call before the loop gives up
MAX_CALLS_PER_TURN = 32  # tool calls of one reply that are carried out (the rest get an error)
MAX_OVERFLOWS = 4  # context-length refusals in a row before the loop gives up
KEEP_RECENT = 4  # turns whose tool outputs are elided only when nothing older is left to elide
ELIDE_OVER = 400  # characters: shorter contents are never elided
INITIAL_CHARS_PER_TOKEN = 3.0
EVENT_TEXT_CHARS = 4000  # one string in an event (an event line must stay under 64 KiB)
LOG_CHARS = 300
STOP_MARGIN_S = 10.0  # wall time kept back at the end of the budget
NUDGE = (
    "Continue by calling the tools (run_shell, write_file, read_file, list_files). "
    "Call finish when the policy is in place and checked."
)


class Stopped(BaseException):
    """SIGTERM (the harness ends the agent phase): unwind, killing any running command."""


@attrs.frozen
class Settings:
    model: str
    base_url: str
    api_key: str = ""
    max_turns: int = DEFAULT_MAX_TURNS
    context_tokens: int = DEFAULT_CONTEXT_TOKENS
    tool_output_chars: int = DEFAULT_TOOL_OUTPUT_CHARS
    max_tokens: int | None = None
    temperature: float | None = None


@attrs.frozen
class Outcome:
    reason: str  # finished | turn limit | wall time | llm budget | upstream failed | no tool calls | context
    turns: int
    detail: str = ""


def _event_text(value: str) -> str:
    return cut(value, EVENT_TEXT_CHARS)


def _tool_input(name: str, arguments: str) -> str:
    """What the ``tool_call`` event shows: the command itself for run_shell, else the arguments."""
    if name == "run_shell":
        try:
            args = parse_json(arguments, what="arguments", max_bytes=1 << 20)
        except ParseError:
            return arguments
        if isinstance(args, dict) and isinstance(args.get("command"), str):
            return str(args["command"])
    return arguments


def _elide_arguments(arguments: str) -> str:
    """Tool-call arguments with every long string replaced by a marker (still one JSON object)."""
    try:
        args = parse_json(arguments, what="arguments", max_bytes=1 << 24)
    except ParseError:
        args = None
    if not isinstance(args, dict):
        return json.dumps({"elided": f"{len(arguments)} characters of arguments, elided to save context"})
    short = {
        k: f"[{len(v)} characters elided to save context; read the file to see it]"
        if isinstance(v, str) and len(v) > ELIDE_OVER
        else v
        for k, v in args.items()
    }
    return json.dumps(short, ensure_ascii=False)


def _size(message: Mapping[str, Any]) -> int:
    size = 16 + len(message.get("content") or "")
    for call in message.get("tool_calls") or ():
        size += 40 + len(call["function"]["name"]) + len(call["function"]["arguments"])
    return size


class Conversation:
    """The messages of the session, kept under a context budget (characters, calibrated to tokens).

    The head (system prompt, first user message) is always kept. Each turn is an assistant message
    and what answers it (tool results, a nudge), so dropping whole turns never leaves a tool result
    without its call.
    """

    def __init__(self, system: str, first: str, *, context_tokens: int) -> None:
        self.head: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": first}]
        self.turns: list[list[dict[str, Any]]] = []
        self.context_tokens = context_tokens
        self.chars_per_token = INITIAL_CHARS_PER_TOKEN
        self.squeeze = 1.0  # lowered after each context-length refusal
        self.dropped = 0
        self.elided = 0

    def start_turn(self, assistant: dict[str, Any]) -> None:
        self.turns.append([assistant])

    def add(self, message: dict[str, Any]) -> None:
        self.turns[-1].append(message)

    def budget(self) -> int:
        """Characters the messages may take: three quarters of the context (the rest: tools, the reply)."""
        return int(self.context_tokens * self.chars_per_token * 0.75 * self.squeeze)

    def size(self) -> int:
        return sum(_size(m) for m in self.head) + sum(_size(m) for turn in self.turns for m in turn)

    def observe(self, sent_chars: int, input_tokens: int) -> None:
        """Calibrate characters per token from a reply's reported prompt tokens."""
        if input_tokens > 0 and sent_chars > 0:
            self.chars_per_token = min(max(sent_chars / input_tokens, 1.0), 8.0)

    def overflowed(self) -> None:
        self.squeeze *= 0.6

    def messages(self) -> list[dict[str, Any]]:
        """The messages to send, compacted to the budget first."""
        self._compact()
        marker = []
        if self.dropped:
            marker = [
                {
                    "role": "user",
                    "content": f"[{self.dropped} earlier turns were removed to stay within the context budget. "
                    "Everything you wrote is still in the workspace: list_files and read_file show it.]",
                }
            ]
        return [*self.head, *marker, *(m for turn in self.turns for m in turn)]

    def _compact(self) -> None:
        budget = self.budget()
        if self.size() <= budget:
            return
        older = self.turns[:-KEEP_RECENT]
        if self._elide(older, budget) or self._elide(self.turns[:-1], budget):
            return
        while len(self.turns) > 1 and self.size() > budget:
            self.turns.pop(0)
            self.dropped += 1
        # Last resort, the newest turn alone is too large: its arguments (already carried out),
        # then its outputs.
        if not self._elide(self.turns, budget, outputs=False):
            self._elide(self.turns, budget)

    def _elide(self, turns: Sequence[list[dict[str, Any]]], budget: int, *, outputs: bool = True) -> bool:
        """Elide long tool-call arguments (and tool outputs) in ``turns``, oldest first, until the
        budget holds; True once it does."""
        for turn in turns:
            for message in turn:
                content = message.get("content") or ""
                if outputs and message["role"] == "tool" and len(content) > ELIDE_OVER and "[elided" not in content:
                    message["content"] = (
                        f"{content[:200]}\n[elided: {len(content) - 200} more characters of this old tool "
                        "output were removed to save context; run the tool again if you need them]"
                    )
                    self.elided += 1
                for call in message.get("tool_calls") or ():
                    function = call["function"]
                    if (
                        len(function["arguments"]) > ELIDE_OVER
                        and "elided to save context" not in function["arguments"]
                    ):
                        function["arguments"] = _elide_arguments(function["arguments"])
                        self.elided += 1
            if self.size() <= budget:
                return True
        return False


class Agent:
    """One session: the loop between the model and the tools."""

    def __init__(
        self,
        settings: Settings,
        client: ChatClient,
        tools: Tools,
        conversation: Conversation,
        *,
        deadline: float = math.inf,
        events: EventChannel | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.settings, self.client, self.tools, self.conversation = settings, client, tools, conversation
        self.deadline = deadline
        self.events = events or EventChannel(NAME, None)
        self.started = time.monotonic()
        self.log = log or self._stderr
        self.input_tokens = self.output_tokens = self.cached_tokens = 0

    def _stderr(self, text: str) -> None:
        print(f"[{NAME} {time.monotonic() - self.started:7.1f}s] {text}", file=sys.stderr, flush=True)

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self) -> Outcome:
        """The session, to its end; the endpoint's connection is closed after it."""
        try:
            return self._loop()
        finally:
            self.client.close()

    def _loop(self) -> Outcome:
        nudges = overflows = 0
        tools = self.tools.definitions()
        for turn in range(1, self.settings.max_turns + 1):
            if self.time_left() < STOP_MARGIN_S:
                return Outcome("wall time", turn - 1, "the wall-time budget is nearly used")
            messages = self.conversation.messages()
            try:
                completion = self.client.complete(messages, tools, deadline=self.deadline)
            except BudgetExhausted as exc:
                return Outcome("llm budget", turn - 1, str(exc))
            except ContextOverflow as exc:
                overflows += 1
                self.log(f"turn {turn}: the endpoint says the context is too long ({exc}); compacting harder")
                if overflows >= MAX_OVERFLOWS:
                    return Outcome("context", turn, str(exc))
                self.conversation.overflowed()
                continue
            except UpstreamFailed as exc:
                return Outcome("upstream failed", turn - 1, str(exc))
            overflows = 0
            self._account(completion, messages)
            self.conversation.start_turn(completion.message())
            if not completion.tool_calls:
                nudges += 1
                if nudges > MAX_NUDGES:
                    return Outcome("no tool calls", turn, f"{nudges} replies in a row without a tool call")
                self.conversation.add({"role": "user", "content": NUDGE})
                continue
            nudges = 0
            if self._run_calls(turn, completion):
                return Outcome("finished", turn)
        return Outcome("turn limit", self.settings.max_turns, f"{self.settings.max_turns} turns")

    def _account(self, completion: Completion, messages: Sequence[dict[str, Any]]) -> None:
        u = completion.usage
        self.input_tokens += u.input_tokens
        self.output_tokens += u.output_tokens
        self.cached_tokens += u.cached_input_tokens
        self.conversation.observe(sum(_size(m) for m in messages), u.input_tokens)
        model = completion.model or self.settings.model
        self.log(
            f"model {model}: {u.input_tokens} tokens in ({u.cached_input_tokens} cached), {u.output_tokens} out; "
            f"{len(completion.tool_calls)} tool calls; finish_reason {completion.finish_reason or '-'}"
        )
        self.events.write(
            "api_usage",
            {"model": model, "input_tokens": u.input_tokens, "output_tokens": u.output_tokens},
        )
        if completion.content:
            self.log(f"assistant: {clip(completion.content, LOG_CHARS)}")
            self.events.write("message", {"role": "assistant", "text": _event_text(completion.content)})

    def _run_calls(self, turn: int, completion: Completion) -> bool:
        """Run the reply's tool calls (finish last); True when the session is finished."""
        finished = False
        calls = sorted(completion.tool_calls, key=lambda c: c.name == "finish")
        results: list[dict[str, Any]] = []
        for index, call in enumerate(calls):
            if index >= MAX_CALLS_PER_TURN:  # every call gets an answer, as the API requires
                text = f"error: not run: at most {MAX_CALLS_PER_TURN} tool calls are carried out per reply"
                results.append({"role": "tool", "tool_call_id": call.id, "content": text})
                continue
            shown = _tool_input(call.name, call.arguments)
            self.log(f"turn {turn}: -> {clip(call.name or '(no name)', 60)} {clip(shown, LOG_CHARS)}")
            self.events.write("tool_call", {"tool": call.name, "input": _event_text(shown)})
            result = self.tools.call(call.name, call.arguments)
            self._record(call.name, result)
            finished = finished or result.finish
            results.append({"role": "tool", "tool_call_id": call.id, "content": result.text})
        if not finished:
            status = f"\n[turn {turn} of {self.settings.max_turns}; {max(self.time_left(), 0):.0f} s of wall time left]"
            results[-1]["content"] += status
        for message in results:
            self.conversation.add(message)
        return finished

    def _record(self, name: str, result: ToolResult) -> None:
        first = result.text.split("\n", 1)[0]
        self.log(f"   <- {clip(first, LOG_CHARS)} ({len(result.text)} chars)")
        self.events.write("tool_result", {"tool": name, "output": _event_text(result.text)})
        if result.shell is not None:
            command, status = result.shell
            data: dict[str, Any] = {"command": _event_text(command)}
            if status is not None:
                data["exit_status"] = status
            self.events.write("shell_command", data)


# -- the command line -------------------------------------------------------------------------------


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{raw} is not a positive integer")
    return value


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    p = argparse.ArgumentParser(prog="python -m ale.agents.llm", description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", default=env.get("ALE_LLM_MODEL"), help="the model name the endpoint serves")
    p.add_argument("--base-url", default=env.get("OPENAI_BASE_URL"), help="default: $OPENAI_BASE_URL")
    p.add_argument("--max-turns", type=_positive_int, default=DEFAULT_MAX_TURNS)
    p.add_argument("--context-tokens", type=_positive_int, default=DEFAULT_CONTEXT_TOKENS)
    p.add_argument("--tool-output-chars", type=_positive_int, default=DEFAULT_TOOL_OUTPUT_CHARS)
    p.add_argument("--max-tokens", type=_positive_int, help="the reply's token limit (not sent by default)")
    p.add_argument("--temperature", type=float, help="not sent by default")
    return p


def settings_from(argv: Sequence[str] | None, env: Mapping[str, str]) -> Settings:
    args = build_parser().parse_args(argv)
    if not args.model:
        raise SystemExit(f"{NAME}: no model: give --model (ale run --agent llm --model MODEL)")
    if not args.base_url:
        raise SystemExit(
            f"{NAME}: OPENAI_BASE_URL is not set: the run has no LLM gateway (ale run --llm-upstream, or set "
            "OPENAI_BASE_URL and OPENAI_API_KEY for the harness)"
        )
    return Settings(
        model=args.model,
        base_url=args.base_url,
        api_key=env.get("OPENAI_API_KEY", ""),
        max_turns=args.max_turns,
        context_tokens=args.context_tokens,
        tool_output_chars=args.tool_output_chars,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc.strerror})"


def _wall_time(env: Mapping[str, str]) -> float | None:
    try:
        value = float(env.get("ALE_BUDGET_WALL_TIME_S", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def task_info(env: Mapping[str, str]) -> TaskInfo:
    task_dir = Path(env.get("ALE_TASK_DIR", "/task"))
    task_json = _read(task_dir / "task.json")
    try:
        task = parse_json(task_json, what="task.json")
    except ParseError:
        task = {}
    task = task if isinstance(task, dict) else {}
    budgets: dict[str, Any] = task["budgets"] if isinstance(task.get("budgets"), dict) else {}
    lib = Path(ale.__file__).resolve().parent.parent  # the agent environment's site-packages
    return TaskInfo(
        task_id=env.get("ALE_TASK_ID") or str(task.get("id", "?")),
        mode=env.get("ALE_MODE") or str(task.get("mode", "batch")),
        python=sys.executable,
        python_prefix=sys.prefix,
        python_lib=str(lib),
        workspace=env.get("ALE_WORKSPACE", "/workspace"),
        task_dir=str(task_dir),
        evaluator=env.get("ALE_EVALUATOR", "unix:/ale/evaluator.sock"),
        wall_time=env.get("ALE_BUDGET_WALL_TIME_S") or str(budgets.get("wall_time_s", "?")),
        env_steps=env.get("ALE_BUDGET_ENV_STEPS") or str(budgets.get("env_steps", "?")),
        llm_tokens=env.get("ALE_BUDGET_LLM_TOKENS") or str(budgets.get("llm_tokens", "?")),
        episodes=str(task.get("official_episodes", "the task's")),
        task_json=task_json,
        paper=_read(task_dir / "paper.md"),
        readme=_read(task_dir / "README.md") if (task_dir / "README.md").exists() else "",
    )


def build_agent(settings: Settings, env: Mapping[str, str], *, started: float | None = None) -> Agent:
    """The session of a run: tools on ``$ALE_WORKSPACE``, the prompt from the task folder."""
    started = time.monotonic() if started is None else started
    info = task_info(env)
    wall = _wall_time(env)
    deadline = started + wall if wall is not None else math.inf
    workspace = Path(info.workspace)
    shell_env = {k: v for k, v in env.items() if k != "ALE_EVENT_FD"}
    tools = Tools(
        workspace=workspace,
        readable=(Path(info.task_dir),),
        output_limit=settings.tool_output_chars,
        time_left=lambda: deadline - time.monotonic() - STOP_MARGIN_S,
        env=shell_env,
        required=workspace / ("policy" if info.mode == "interactive" else "policy.safetensors"),
        required_executable=info.mode == "interactive",
    )
    extra: dict[str, Any] = {}
    if settings.max_tokens is not None:
        extra["max_tokens"] = settings.max_tokens
    if settings.temperature is not None:
        extra["temperature"] = settings.temperature
    agent = Agent(
        settings,
        ChatClient(base_url=settings.base_url, api_key=settings.api_key, model=settings.model, extra=extra),
        tools,
        Conversation(system_prompt(info), first_message(info), context_tokens=settings.context_tokens),
        deadline=deadline,
        events=EventChannel.from_env(NAME),
    )
    agent.client.log = agent.log
    return agent


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Stopped


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    env = dict(os.environ)
    try:
        settings = settings_from(argv, env)
        agent = build_agent(settings, env, started=started)
    except ValueError as exc:
        print(f"{NAME}: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _on_sigterm)
    agent.log(
        f"model {settings.model} at {agent.client.endpoint.url('chat/completions')}; task {env.get('ALE_TASK_ID')}"
    )
    try:
        outcome = agent.run()
    except Stopped:
        outcome = Outcome("stopped", 0, "SIGTERM: the harness ended the agent phase")
    except UpstreamError as exc:  # pragma: no cover - complete() raises only the subclasses handled in run()
        outcome = Outcome("upstream failed", 0, str(exc))
    finally:
        agent.client.close()
    problem = agent.tools.policy_problem()
    agent.log(
        f"ended ({outcome.reason}{': ' + outcome.detail if outcome.detail else ''}) after {outcome.turns} turns; "
        f"tokens {agent.input_tokens} in, {agent.output_tokens} out; "
        + (f"policy not in place: {problem}" if problem else "the policy is in place")
    )
    agent.events.write(
        "note", {"text": _event_text(f"llm agent ended: {outcome.reason}; {problem or 'policy in place'}")}
    )
    return 1 if problem else 0


if __name__ == "__main__":
    raise SystemExit(main())
