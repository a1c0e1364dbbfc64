"""Small helpers the evaluator's test files share."""

from __future__ import annotations

import functools
import hashlib
import json
import time
from importlib import resources

import grpc
import pytest

from ale import catalog
from ale.client import AleEnvClient, AleEnvError
from ale.core.tasks import parse_task
from ale.env.v1 import env_pb2 as pb
from ale_evaluator.seeds import RunConfig


@functools.cache
def task_in_mode(task_id: str, mode: str) -> catalog.Task:
    """An installed task with its ``mode`` set to ``mode``, digest recomputed: a real task definition.

    The evaluator's official path follows the task's mode; CartPole (a batch task, fast) made
    interactive lets the eval-session tests run on the cheapest simulator.
    """
    task = catalog.get_task(task_id)
    if task.spec.mode == mode:
        return task
    raw = json.loads((resources.files("ale") / "tasks" / task_id / "task.json").read_bytes())
    raw["mode"] = mode
    spec, digest = parse_task(json.dumps(raw).encode(), paper=task.paper.encode("utf-8"))
    return catalog.Task(spec=spec, paper=task.paper, digest=digest)


def commitment_of(config: RunConfig, seed: int) -> bytes:
    """The documented formula, recomputed here: SHA256(seed as 8 bytes big-endian || run_id || secret)."""
    return hashlib.sha256(seed.to_bytes(8, "big") + config.run_id.encode("utf-8") + config.secret).digest()


def code_of(fn, *args, **kwargs) -> grpc.StatusCode:
    """The status code of a call that must fail."""
    with pytest.raises(AleEnvError) as info:
        fn(*args, **kwargs)
    return info.value.code


def wait_for_batch(client: AleEnvClient, batch_id: str, timeout: float = 30.0) -> pb.GetBatchEvalStatusResponse:
    deadline = time.monotonic() + timeout
    while True:
        status = client.get_batch_eval_status(batch_id)
        if status.state in (pb.BATCH_STATE_DONE, pb.BATCH_STATE_FAILED):
            return status
        assert time.monotonic() < deadline, f"batch {batch_id} still in state {status.state}"
        time.sleep(0.01)
