"""Serve one task on two endpoints (agent and harness), with health checking and reflection (v1 and v1alpha).

Each endpoint is its own gRPC server with its own threads: nothing the agent does on its
endpoint can take a thread from the harness's. Within an endpoint, at most half the threads may
hold a long poll (``ale_evaluator.service.LongPollGate``).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ale.env.v1 import env_pb2 as pb
from ale.protocol import MAX_MESSAGE_BYTES, SERVICE_NAME
from ale_evaluator import reflection
from ale_evaluator.service import AGENT, HARNESS, AleEnvServicer, EvaluatorState, generic_handler

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]


def unix_address(path: str | os.PathLike[str]) -> str:
    return f"unix:{os.fspath(path)}"


def default_rpc_cpu() -> int | None:
    """The CPU the RPC path keeps to by default: the last one this process may use, if it may use two
    or more (one CPU: nothing to choose)."""
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[-1] if len(cpus) >= 2 else None


def keep_to_cpu(cpu: int) -> frozenset[int]:
    """Keep the calling thread, and every thread it starts from now on, on ``cpu``; return the CPUs
    it had. (Linux affinity is per thread and inherited.) A Step is a round trip between two
    processes: a serving thread that stays on one core keeps its environments in that core's cache
    instead of following the client around (docs/protocol.md has what the bench measured)."""
    before = frozenset(os.sched_getaffinity(0))
    if cpu not in before:
        raise ValueError(f"CPU {cpu} is not one this process may use ({sorted(before)})")
    os.sched_setaffinity(0, {cpu})
    return before


def long_poll_slots(workers: int) -> int:
    """How many of an endpoint's ``workers`` threads may hold a long poll at once: half, rounded down
    (one worker: none, every long poll is answered at once)."""
    return workers // 2


def _serve_one(
    state: EvaluatorState, role: str, address: str, *, workers: int
) -> tuple[grpc.Server, str, AleEnvServicer]:
    server = grpc.server(
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"ale-{role}"),
        options=GRPC_OPTIONS,
        maximum_concurrent_rpcs=256,
    )
    servicer = AleEnvServicer(state, role, long_poll_slots=long_poll_slots(workers))
    server.add_generic_rpc_handlers([generic_handler(servicer)])
    health_servicer = health.HealthServicer()
    health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    services = [pb.DESCRIPTOR.services_by_name["AleEnv"].full_name, health.SERVICE_NAME]
    reflection.enable_server_reflection(services, server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind the {role} endpoint to {address}")
    if address.startswith(("localhost:", "127.0.0.1:", "[::1]:")) and address.endswith(":0"):
        address = address.rsplit(":", 1)[0] + f":{port}"
    server.start()
    return server, address, servicer


@attrs.define
class RunningEvaluator:
    state: EvaluatorState
    agent_address: str
    harness_address: str
    servers: list[grpc.Server]
    servicers: dict[str, AleEnvServicer] = attrs.Factory(dict)

    def stop(self, grace: float = 1.0) -> None:
        events = [s.stop(grace) for s in self.servers]
        for e in events:
            e.wait()
        self.state.shutdown()


def _chmod_socket(address: str, mode: int) -> None:
    if address.startswith("unix:"):
        path = Path(address[5:])
        if path.exists() and stat.S_ISSOCK(path.stat().st_mode):
            path.chmod(mode)


def start(
    state: EvaluatorState,
    *,
    agent_address: str,
    harness_address: str,
    workers: int = 4,
    agent_socket_mode: int = 0o666,
) -> RunningEvaluator:
    """Bind and start both endpoints. Unix sockets: the agent's is world-usable, the harness's 0600."""
    if agent_address == harness_address:
        raise ValueError("the agent and harness endpoints must differ")
    servers: list[grpc.Server] = []
    servicers: dict[str, AleEnvServicer] = {}
    try:
        harness_server, harness_address, servicers[HARNESS] = _serve_one(
            state, HARNESS, harness_address, workers=workers
        )
        servers.append(harness_server)
        _chmod_socket(harness_address, 0o600)
        agent_server, agent_address, servicers[AGENT] = _serve_one(state, AGENT, agent_address, workers=workers)
        servers.append(agent_server)
        _chmod_socket(agent_address, agent_socket_mode)
    except BaseException:
        for s in servers:
            s.stop(None)
        raise
    return RunningEvaluator(state, agent_address, harness_address, servers, servicers)


@contextlib.contextmanager
def serving(
    state: EvaluatorState, *, agent_address: str, harness_address: str, workers: int = 4
) -> Iterator[RunningEvaluator]:
    running = start(state, agent_address=agent_address, harness_address=harness_address, workers=workers)
    try:
        yield running
    finally:
        running.stop(0.5)
