"""What every bundled agent shares: the run's environment variables, logging, budgets, outputs.

Everything here follows docs/agent-contract.md: the agent learns where the evaluator, the task and
the workspace are from ``ALE_*`` variables only, writes progress lines to stdout (recorded in the
trajectory) and, when ``ALE_EVENT_FD`` is set, a few JSON ``note`` events to that descriptor.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import gymnasium as gym

from ale.client import AleEnvClient
from ale.env.v1 import env_pb2 as pb
from ale.protocol import decode_space

POLICY_SCRIPT = "policy"
POLICY_ARTIFACT = "policy.safetensors"
#: the workspace folder a bundled agent writes the source of its derivation into
SOURCE_DIR = "derivation"
DEFAULT_SEED = 0


def box(space: gym.Space[Any]) -> gym.spaces.Box:
    """``space`` as a Box; an agent for continuous tasks stops with this message on any other space."""
    if not isinstance(space, gym.spaces.Box):
        raise SystemExit(f"unsupported space {space}: this agent needs a Box")
    return space


class BudgetExhausted(RuntimeError):
    """The next piece of work would exceed the environment-step or wall-time budget."""


def _float_env(name: str) -> float | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"{name}={raw!r} is not a number") from None
    return value if math.isfinite(value) and value > 0 else None


class EventChannel:
    """The event channel (``ALE_EVENT_FD``) when the harness gave one: one JSON line per event.

    A channel that fails is reported once on stdout and dropped; without one, writes do nothing.
    """

    def __init__(self, name: str, fd: int | None) -> None:
        self.name, self.fd = name, fd

    @classmethod
    def from_env(cls, name: str) -> EventChannel:
        fd = os.environ.get("ALE_EVENT_FD", "").strip()
        return cls(name, int(fd) if fd.isdigit() else None)

    def write(self, kind: str, data: dict[str, Any]) -> None:
        if self.fd is None:
            return
        line = json.dumps({"kind": kind, "data": data}, separators=(",", ":")) + "\n"
        try:
            os.write(self.fd, line.encode("utf-8"))
        except OSError as exc:
            print(f"[{self.name}] event channel fd {self.fd} failed ({exc.strerror}); not using it", flush=True)
            self.fd = None


class AgentContext:
    """One agent run: configuration from the environment, a client, budget bookkeeping."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = time.monotonic()
        try:
            self.evaluator = os.environ["ALE_EVALUATOR"]
        except KeyError:
            raise SystemExit("ALE_EVALUATOR is not set: this agent runs inside an ALE sandbox") from None
        self.task_id = os.environ.get("ALE_TASK_ID", "")
        self.task_dir = Path(os.environ.get("ALE_TASK_DIR", "/task"))
        self.workspace = Path(os.environ.get("ALE_WORKSPACE", "/workspace"))
        self.wall_time_s = _float_env("ALE_BUDGET_WALL_TIME_S")
        steps = _float_env("ALE_BUDGET_ENV_STEPS")
        self.env_step_budget = int(steps) if steps is not None else None
        self.steps_used = 0
        self.seed = int(os.environ.get("ALE_AGENT_SEED", DEFAULT_SEED))
        self.events = EventChannel.from_env(name)
        self.client = AleEnvClient(self.evaluator)
        self.spec: pb.EnvSpec = self.client.get_spec()
        if self.task_id and self.spec.task_id != self.task_id:
            raise SystemExit(f"the evaluator serves {self.spec.task_id!r}, not ALE_TASK_ID={self.task_id!r}")
        self.task_id = self.spec.task_id
        self.mode = os.environ.get("ALE_MODE", "") or self.spec.mode
        self.observation_space: gym.spaces.Box | gym.spaces.Discrete = decode_space(self.spec.observation_space)
        self.action_space: gym.spaces.Box | gym.spaces.Discrete = decode_space(self.spec.action_space)

    # -- output ----------------------------------------------------------------------------

    def log(self, text: str) -> None:
        """A progress line on stdout (the harness records stdout line by line)."""
        print(f"[{self.name} {self.elapsed():6.1f}s] {text}", flush=True)

    def event(self, kind: str, data: dict[str, Any]) -> None:
        """One JSON line on the event channel, if there is one; a broken channel is dropped."""
        self.events.write(kind, data)

    def note(self, text: str) -> None:
        """A progress line that also goes to the event channel as a ``note``."""
        self.log(text)
        self.event("note", {"text": text})

    # -- budgets ---------------------------------------------------------------------------

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def time_budget(self, default: float | None = None, *, env_var: str | None = None) -> float:
        """Seconds this agent allows itself: the wall budget less a margin, capped by ``env_var``/``default``."""
        limits = []
        if self.wall_time_s is not None:
            margin = min(60.0, max(5.0, 0.1 * self.wall_time_s))
            limits.append(max(self.wall_time_s - margin, 0.5 * self.wall_time_s))
        own = _float_env(env_var) if env_var else None
        if own is not None:
            limits.append(own)
        elif default is not None:
            limits.append(default)
        return min(limits) if limits else math.inf

    def steps_left(self) -> float:
        return math.inf if self.env_step_budget is None else self.env_step_budget - self.steps_used

    def reserve_steps(self, n: int) -> None:
        """Raise BudgetExhausted unless ``n`` more environment steps fit in the step budget."""
        if n > self.steps_left():
            raise BudgetExhausted(
                f"{n} more environment steps would exceed the budget ({self.steps_used} of {self.env_step_budget} used)"
            )

    def count_steps(self, n: int) -> None:
        self.steps_used += n

    # -- what the agent leaves behind ------------------------------------------------------

    def _write(self, name: str, data: bytes, mode: int) -> Path:
        """Write ``workspace/name`` atomically (a killed agent never leaves half a policy)."""
        path = self.workspace / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        return path

    def write_artifact(self, raw: bytes) -> Path:
        """The batch-mode policy artifact, ``$ALE_WORKSPACE/policy.safetensors``."""
        return self._write(POLICY_ARTIFACT, raw, 0o644)

    def write_policy_script(self, body: str) -> Path:
        """The interactive-mode entrypoint, an executable ``$ALE_WORKSPACE/policy`` run by this interpreter."""
        return self._write(POLICY_SCRIPT, f"#!{sys.executable}\n{body.lstrip()}".encode(), 0o755)

    def write_sources(self, *modules: ModuleType) -> list[Path]:
        """The source of the modules that derive the policy, as they run, into
        ``$ALE_WORKSPACE/derivation/`` (one file per module, named as in the package): the
        workspace is what the harness snapshots for the faithfulness judge, so the code that
        computed the policy is among the artifacts, not only the policy it wrote."""
        paths = []
        for module in modules:
            name = Path(inspect.getfile(module)).name
            paths.append(self._write(f"{SOURCE_DIR}/{name}", inspect.getsource(module).encode(), 0o644))
        return paths

    # -- feedback on the agent's own seeds -------------------------------------------------

    def practice_batch_eval(self, raw: bytes, *, episodes: int, seed: int, timeout: float = 300.0) -> pb.EvalResult:
        """Run a non-official batch evaluation of an artifact on the agent's own seeds; return its result."""
        batch = self.client.submit_batch_eval(raw, official=False, num_episodes=episodes, seed=seed)
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            status = self.client.get_batch_eval_status(batch.batch_id)
            if status.state == pb.BATCH_STATE_DONE:
                return status.result
            if status.state == pb.BATCH_STATE_FAILED:
                raise RuntimeError(f"practice batch evaluation failed: {status.error}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"practice batch evaluation not done after {timeout:.0f} s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def close(self) -> None:
        self.client.close()


def describe_result(result: pb.EvalResult) -> str:
    """One line: the headline and the safety rates of an evaluation result."""
    safety = ", ".join(f"{s.name} {s.rate:.3g}/episode" for s in result.safety)
    return (
        f"{result.headline_metric} = {result.headline_value:.4f} ({result.headline_direction} is better) "
        f"over {result.num_episodes} episodes, {result.passed_episodes} ran to their end"
        + (f"; {safety}" if safety else "")
    )


def run_main(name: str, body: Any) -> int:
    """Run ``body(ctx)`` with a context; report failures on stdout and as a note; return an exit status."""
    ctx = AgentContext(name)
    try:
        ctx.note(
            f"task {ctx.task_id} ({ctx.mode} mode, {ctx.spec.gym_id}); headline {ctx.spec.headline_metric} "
            f"({ctx.spec.headline_direction} is better); budgets: wall {ctx.wall_time_s} s, "
            f"env steps {ctx.env_step_budget}"
        )
        body(ctx)
        ctx.note(f"done in {ctx.elapsed():.1f} s, {ctx.steps_used} environment steps on the agent endpoint")
        return 0
    except BudgetExhausted as exc:
        ctx.note(f"stopped: {exc}")
        return 1
    except Exception as exc:
        ctx.note(f"failed: {type(exc).__name__}: {exc}")
        raise
    finally:
        ctx.close()
