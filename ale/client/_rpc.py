"""The eight RPCs, typed, without gymnasium: what the harness's own connection needs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar, cast

import grpc

from ale.env.v1 import env_pb2 as pb
from ale.env.v1 import env_pb2_grpc
from ale.protocol import MAX_MESSAGE_BYTES, encode_tensor

if TYPE_CHECKING:
    import numpy as np

_Reply = TypeVar("_Reply")


class AleEnvError(RuntimeError):
    """The evaluator refused a call; ``code`` is the gRPC status code, the text its reason."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{method}: {code.name}: {details}")
        self.method, self.code, self.details = method, code, details


class AleEnvClient:
    """Thin, typed access to the eight RPCs with errors raised as :class:`AleEnvError`."""

    def __init__(self, target: str, *, timeout: float | None = 120.0, channel: grpc.Channel | None = None) -> None:
        self.target = target
        self.timeout = timeout
        self._own_channel = channel is None
        self.channel = channel or grpc.insecure_channel(
            target,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self._stub = env_pb2_grpc.AleEnvStub(self.channel)

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            raise AleEnvError(method, exc.code(), exc.details() or "") from None

    def _reply(self, method: str, request: Any, reply: type[_Reply]) -> _Reply:
        """:meth:`_call`, typed: ``reply`` is the message type the stub decodes ``method``'s answer to."""
        return cast(_Reply, self._call(method, request))  # the generated stub is untyped

    def create_env(self, **kw: Any) -> pb.CreateEnvResponse:
        return self._reply("CreateEnv", pb.CreateEnvRequest(**kw), pb.CreateEnvResponse)

    def get_spec(self, env_id: str = "") -> pb.EnvSpec:
        return self._reply("GetSpec", pb.GetSpecRequest(env_id=env_id), pb.GetSpecResponse).spec

    def reset(self, env_id: str, seed: int | None = None) -> pb.ResetResponse:
        req = pb.ResetRequest(env_id=env_id)
        if seed is not None:
            req.seed = seed
        return self._reply("Reset", req, pb.ResetResponse)

    def step(self, env_id: str, action: np.ndarray) -> pb.StepResponse:
        req = pb.StepRequest(env_id=env_id)
        encode_tensor(action, req.action)
        return self._reply("Step", req, pb.StepResponse)

    def start_eval_session(self, env_id: str, num_episodes: int = 0) -> pb.StartEvalSessionResponse:
        return self._reply(
            "StartEvalSession",
            pb.StartEvalSessionRequest(env_id=env_id, num_episodes=num_episodes),
            pb.StartEvalSessionResponse,
        )

    def get_eval_result(self, session_id: str, *, finalize: bool = False) -> pb.EvalResult:
        return self._reply(
            "GetEvalResult",
            pb.GetEvalResultRequest(session_id=session_id, finalize=finalize),
            pb.GetEvalResultResponse,
        ).result

    def submit_batch_eval(
        self, policy: bytes, *, official: bool = False, num_episodes: int = 0, seed: int = 0
    ) -> pb.SubmitBatchEvalResponse:
        return self._reply(
            "SubmitBatchEval",
            pb.SubmitBatchEvalRequest(policy=policy, official=official, num_episodes=num_episodes, seed=seed),
            pb.SubmitBatchEvalResponse,
        )

    def get_batch_eval_status(self, batch_id: str, *, wait_ms: int = 0) -> pb.GetBatchEvalStatusResponse:
        """Progress of a batch; with ``wait_ms`` the evaluator answers as soon as it finishes."""
        return self._reply(
            "GetBatchEvalStatus",
            pb.GetBatchEvalStatusRequest(batch_id=batch_id, wait_ms=wait_ms),
            pb.GetBatchEvalStatusResponse,
        )

    def close(self) -> None:
        if self._own_channel:
            self.channel.close()
