"""A task's network: its LLM gateway (one per task), its log's tail, and its policy per phase.

Without upstreams a run has no network at all (every sandbox ``Network.NONE``). With them, each
task's :func:`open_network` starts a gateway of the task's own, closed, with the task's own token
budgets, and relays its log into the task's recorder (:class:`~ale.runner.tails.GatewayTail`);
the task's agent phase is bracketed by
:meth:`RunNetwork.open_for` (policy open, the ``gateway`` channels charged to the task) and
:meth:`RunNetwork.close_for` (policy closed, in-flight requests cut and recorded); the official
evaluation runs with the gateway closed and its sandbox not attached to it at all. Each boundary
drains the log, so the gateway's events fall in the phase they happened in.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from ale import __version__
from ale.runner._groups import collapse
from ale.runner.gateway_proc import PROXY_NAME, Gateway, GatewayError, GatewaySpec, Upstream, open_gateway, routes
from ale.runner.recorder import Recorder
from ale.runner.runtime import GATEWAY_URL
from ale.runner.tails import GatewayTail

#: each phase's network policy as the manifest records it (docs/formats.md)
NO_NETWORK = {"agent": "none", "official": "none"}
GATEWAY_PHASES = {"agent": "open", "official": "closed"}
DRAIN_TIMEOUT_S = 10.0


class NetworkError(RuntimeError):
    """The gateway failed: it did not start, it died, or it stopped answering (the run fails)."""


@attrs.define
class RunNetwork:
    gateway: Gateway
    tail: GatewayTail
    recorder: Recorder

    @property
    def agent_socket(self) -> Path:
        return self.gateway.agent_socket

    def alive(self) -> bool:
        return self.gateway.alive()

    def died(self) -> NetworkError:
        return NetworkError(f"the LLM gateway died mid-run:\n{self.gateway.stderr_tail()}")

    def sandbox_env(self) -> dict[str, str]:
        """What the agent's environment gets (docs/agent-contract.md, "The LLM gateway")."""
        upstreams = self.gateway.spec.upstreams
        env = {
            "OPENAI_API_KEY": self.gateway.spec.placeholder,
            "ANTHROPIC_API_KEY": self.gateway.spec.placeholder,
            "ALE_GATEWAY_UPSTREAMS": ",".join(f"{u.name}:{u.api}" for u in upstreams),
        }
        for api, name in routes(upstreams).items():
            env[f"{api.upper()}_BASE_URL"] = f"{GATEWAY_URL}/{name}"
        return env

    async def open_for(self, task_ref: str) -> None:
        """The agent phase of ``task_ref`` begins: the policy is open."""
        self.tail.task_ref = task_ref
        self.recorder.open_channel("gateway", task_ref)
        await self._policy("open", "agent")

    async def close_for(self) -> None:
        """The agent phase ends: the policy is closed. The gateway answers once every request it
        cut (or whose agent went with the sandbox) is recorded, so the drain after it has them all."""
        try:
            await self._policy("closed", "official")
        finally:
            self.recorder.close_channel("gateway")
            self.tail.task_ref = None

    async def abandon(self) -> None:
        """The agent phase ends with the gateway dead: keep what it wrote, charge nothing more."""
        await self.drain()
        self.recorder.close_channel("gateway")
        self.tail.task_ref = None

    async def _policy(self, policy: str, phase: str) -> None:
        if not self.alive():
            await self.drain()
            raise self.died()
        try:
            await self.gateway.set_policy(policy, phase)
        except GatewayError as exc:
            await self.drain()
            raise NetworkError(str(exc)) from None
        await self.drain()

    async def drain(self) -> None:
        with trio.move_on_after(DRAIN_TIMEOUT_S):
            await self.tail.drain()

    def progress(self) -> str:
        usage = self.tail.usage
        return f"{usage['input_tokens']}+{usage['output_tokens']} LLM tokens"


def budgets(llm_tokens: int) -> dict[str, int | None]:
    """A task's gateway's budgets from the task's LLM token budget (docs/decisions.md): it bounds
    the input tokens and, separately, the output tokens; requests are not limited."""
    return {"requests": None, "input_tokens": llm_tokens, "output_tokens": llm_tokens}


def proxy_description(upstreams: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """network_summary.json's ``proxy``: what the gateway said it forwards to (its gateway_started)."""
    return {"name": PROXY_NAME, "version": __version__, "upstreams": [dict(u) for u in upstreams]}


@asynccontextmanager
async def open_network(
    run_id: str,
    upstreams: Sequence[Upstream],
    llm_tokens: int,
    sockets: tuple[Path, Path],
    events_path: Path,
    recorder: Recorder,
) -> AsyncIterator[RunNetwork | None]:
    """A task's gateway while the context lasts (None without upstreams), with the task's LLM token
    budget (``llm_tokens``); its log (at ``events_path``) drained after it stops. ``sockets``: where
    its agent socket (in a folder made here) and control socket go. Whether the gateway is still
    alive is the caller's to watch (:meth:`RunNetwork.alive`): its end stops it either way."""
    if not upstreams:
        yield None
        return
    agent_socket, control_socket = sockets  # (the gateway's agent socket, its control socket)
    agent_socket.parent.parent.mkdir(mode=0o700, exist_ok=True)
    # the sandbox gets the socket bound in; nobody lists or reaches it here (a retried start reuses it)
    agent_socket.parent.mkdir(mode=0o700, exist_ok=True)
    spec = GatewaySpec(
        run_id=run_id,
        upstreams=tuple(upstreams),
        budgets=budgets(llm_tokens),
        agent_socket=agent_socket,
        control_socket=control_socket,
        events_path=events_path,
    )
    tail = GatewayTail(spec.events_path, recorder)
    try:
        with collapse():
            async with open_gateway(spec) as gateway, trio.open_nursery() as nursery:
                network = RunNetwork(gateway, tail, recorder)
                await network.drain()  # gateway_started
                nursery.start_soon(tail.run)
                yield network
                nursery.cancel_scope.cancel()
    except GatewayError as exc:
        raise NetworkError(str(exc)) from None
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(DRAIN_TIMEOUT_S):
            await tail.drain()  # what it wrote until it stopped (gateway_stopped)
