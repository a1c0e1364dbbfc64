"""Malformed, hostile and out-of-contract requests: a precise status code, never a crash.

After every bad request the evaluator must still answer a good one: the
health check reports SERVING on both endpoints and a real Reset works.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import grpc
import numpy as np
import pytest
import safetensors.numpy
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ale import catalog
from ale.client import AleEnvClient, AleEnvError
from ale.env.v1 import env_pb2 as pb
from ale.env.v1 import env_pb2_grpc
from ale.protocol import ECHO_CHARS, MAX_ID_CHARS, MAX_MESSAGE_BYTES, SERVICE_NAME, decode_tensor, encode_tensor
from ale_evaluator.envs import make_env
from ale_evaluator.errors import MAX_STATUS_CHARS
from ale_evaluator.events import MAX_STRING_CHARS
from ale_evaluator.server import long_poll_slots
from ale_evaluator.service import METHODS, AleEnvServicer, Limits

ROLES = ("agent", "harness")
OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
# What a refused request may get; INTERNAL, UNKNOWN and UNAVAILABLE mean the evaluator broke.
REFUSALS = {
    INVALID,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def address(ev, role: str) -> str:
    return ev.running.agent_address if role == "agent" else ev.running.harness_address


def endpoint(ev, role: str) -> AleEnvClient:
    return ev.agent if role == "agent" else ev.harness


def raw_call(target: str, method: str, payload: bytes, *, max_send: int | None = None) -> tuple[grpc.StatusCode, str]:
    """Send ``payload`` as the request bytes of ``method``, unparsed; the status code and details."""
    options = [("grpc.max_send_message_length", max_send)] if max_send else []
    with grpc.insecure_channel(target, options=options) as channel:
        call = channel.unary_unary(f"/{SERVICE_NAME}/{method}", request_serializer=None, response_deserializer=None)
        try:
            call(payload, timeout=30, wait_for_ready=True)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
    return OK, ""


def stub_call(ev, role: str, method: str, request: Message) -> tuple[grpc.StatusCode, str]:
    stub = env_pb2_grpc.AleEnvStub(endpoint(ev, role).channel)
    try:
        getattr(stub, method)(request, timeout=30)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return OK, ""


def assert_alive(ev) -> None:
    """The evaluator still serves: SERVING on both endpoints, and a fresh environment resets."""
    for role in ROLES:
        health = health_pb2_grpc.HealthStub(endpoint(ev, role).channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    env_id = ev.agent.create_env().env_id
    obs = decode_tensor(ev.agent.reset(env_id, seed=0).observation)
    assert obs.shape[0] == 1
    assert np.all(np.isfinite(obs))


def refused(fn, *args, **kwargs) -> AleEnvError:
    with pytest.raises(AleEnvError) as info:
        fn(*args, **kwargs)
    return info.value


@pytest.fixture
def pendulum(make_evaluator):
    """An evaluator with a Box action space (InvertedPendulum: one float32 in [-3, 3])."""
    return make_evaluator("pendulum-lqr")


def step_request(env_id: str, *, dtype: int, shape: list[int], data: bytes) -> pb.StepRequest:
    return pb.StepRequest(env_id=env_id, action=pb.Tensor(dtype=dtype, shape=shape, data=data))


# -- actions that do not fit the action space -----------------------------------------------------


@pytest.mark.parametrize(
    ("action", "message"),
    [
        pytest.param(np.array([1, 0], dtype=np.int64), "shape", id="two-actions-for-one-copy"),
        pytest.param(np.array([[1]], dtype=np.int64), "shape", id="extra-dimension"),
        pytest.param(np.array(1, dtype=np.int64), "shape", id="scalar"),
        pytest.param(np.array([1.0], dtype=np.float64), "dtype", id="float-for-discrete"),
        pytest.param(np.array([1.0], dtype=np.float32), "dtype", id="float32-for-discrete"),
        pytest.param(np.array([True]), "dtype", id="bool-for-discrete"),
        pytest.param(np.array([1], dtype=np.uint8), "int32 or int64", id="uint8-for-discrete"),
        pytest.param(np.array([2], dtype=np.int64), "out of range", id="too-large"),
        pytest.param(np.array([-1], dtype=np.int32), "out of range", id="negative"),
        pytest.param(np.array([np.iinfo(np.int64).max], dtype=np.int64), "out of range", id="int64-max"),
    ],
)
def test_a_discrete_action_that_does_not_fit_is_invalid_and_changes_nothing(evaluator, action, message):
    env_id = evaluator.agent.create_env().env_id
    evaluator.agent.reset(env_id, seed=5)
    exc = refused(evaluator.agent.step, env_id, action)
    assert exc.code == INVALID
    assert message in exc.details
    # The refused Step did not advance the episode.
    local = make_env(catalog.get_task("cartpole-balance"))
    local.reset(seed=5)
    expected, *_ = local.step(1)
    got = decode_tensor(evaluator.agent.step(env_id, np.array([1], dtype=np.int64)).observation)[0]
    assert got.tobytes() == expected.tobytes()
    local.close()
    assert_alive(evaluator)


@pytest.mark.parametrize(
    ("action", "message"),
    [
        pytest.param(np.array([[1]], dtype=np.int64), "dtype", id="int-for-box"),
        pytest.param(np.array([[1]], dtype=np.uint8), "dtype", id="uint8-for-box"),
        pytest.param(np.array([[True]]), "dtype", id="bool-for-box"),
        pytest.param(np.array([[np.nan]], dtype=np.float32), "NaN", id="nan"),
        pytest.param(np.array([[np.inf]], dtype=np.float64), "NaN or infinity", id="inf"),
        pytest.param(np.array([[-np.inf]], dtype=np.float32), "NaN or infinity", id="minus-inf"),
        pytest.param(np.array([0.5], dtype=np.float32), "shape", id="missing-copy-dimension"),
        pytest.param(np.array([[0.5, 0.5]], dtype=np.float32), "shape", id="too-wide"),
        pytest.param(np.zeros((2, 1), dtype=np.float32), "shape", id="two-copies"),
    ],
)
def test_a_box_action_that_does_not_fit_is_invalid(pendulum, action, message):
    env_id = pendulum.agent.create_env().env_id
    pendulum.agent.reset(env_id, seed=1)
    exc = refused(pendulum.agent.step, env_id, action)
    assert exc.code == INVALID
    assert message in exc.details
    pendulum.agent.step(env_id, np.zeros((1, 1), dtype=np.float32))
    assert_alive(pendulum)


def test_a_box_action_out_of_bounds_is_clipped_not_refused(pendulum):
    env_id = pendulum.agent.create_env().env_id
    pendulum.agent.reset(env_id, seed=2)
    local = make_env(catalog.get_task("pendulum-lqr"))
    local.reset(seed=2)
    for raw, clipped in ((100.0, 3.0), (-1e30, -3.0)):
        reply = pendulum.agent.step(env_id, np.array([[raw]], dtype=np.float64))
        expected, *_ = local.step(np.array([clipped], dtype=np.float32))
        assert decode_tensor(reply.observation)[0].tobytes() == expected.tobytes()
    local.close()


# -- tensors that break the encoding ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "shape", "data", "message"),
    [
        pytest.param(pb.DTYPE_INT64, [1], b"\x01\x00\x00\x00", "data bytes", id="byte-length-mismatch"),
        pytest.param(pb.DTYPE_INT64, [1], b"", "data bytes", id="no-data"),
        pytest.param(pb.DTYPE_UNSPECIFIED, [1], bytes(8), "unspecified", id="unspecified-dtype"),
        pytest.param(99, [1], bytes(8), "unknown tensor dtype", id="unknown-dtype"),
        pytest.param(pb.DTYPE_INT64, [-1], b"", "negative", id="negative-shape"),
        pytest.param(pb.DTYPE_INT64, [2, -2], bytes(32), "negative", id="negative-pair"),
        pytest.param(pb.DTYPE_INT64, [1] * 9, bytes(8), "dimensions", id="nine-dimensions"),
        pytest.param(pb.DTYPE_UINT8, [1 << 31, 1 << 31], b"", "exceeds the limit", id="huge-shape"),
        pytest.param(pb.DTYPE_UINT8, [2**62, 2**62, 2**62], b"", "exceeds the limit", id="overflowing-shape"),
    ],
)
def test_a_malformed_action_tensor_is_invalid(evaluator, dtype, shape, data, message):
    env_id = evaluator.agent.create_env().env_id
    evaluator.agent.reset(env_id, seed=0)
    code, details = stub_call(evaluator, "agent", "Step", step_request(env_id, dtype=dtype, shape=shape, data=data))
    assert code == INVALID, details
    assert message in details
    assert_alive(evaluator)


def test_a_step_without_an_action_is_invalid(evaluator):
    env_id = evaluator.agent.create_env().env_id
    evaluator.agent.reset(env_id, seed=0)
    code, details = stub_call(evaluator, "agent", "Step", pb.StepRequest(env_id=env_id))
    assert code == INVALID
    assert "action" in details
    assert_alive(evaluator)


# -- ids, tasks and options the evaluator does not know ---------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_unknown_ids_are_not_found(evaluator, make_evaluator, role):
    client = endpoint(evaluator, role)
    for call in (
        lambda: client.get_spec("env-0000"),
        lambda: client.reset("env-0000", seed=1),
        lambda: client.step("env-0000", np.array([1])),
        lambda: client.reset(""),
        lambda: client.get_batch_eval_status("batch-0000"),
        lambda: client.get_batch_eval_status(""),
    ):
        exc = refused(call)
        assert exc.code == grpc.StatusCode.NOT_FOUND, exc
    assert refused(evaluator.harness.get_eval_result, "session-0000").code == grpc.StatusCode.NOT_FOUND
    interactive = make_evaluator(mode="interactive")  # where an eval session is the official path
    assert refused(interactive.harness.start_eval_session, "env-0000").code == grpc.StatusCode.NOT_FOUND
    assert_alive(evaluator)


@pytest.mark.parametrize("role", ROLES)
def test_an_unknown_task_id_is_not_found(evaluator, role):
    exc = refused(endpoint(evaluator, role).create_env, task_id="hopper-hop")
    assert exc.code == grpc.StatusCode.NOT_FOUND
    assert "cartpole-balance" in exc.details
    assert "hopper-hop" in exc.details
    assert refused(endpoint(evaluator, role).create_env, task_id="no-such-task").code == grpc.StatusCode.NOT_FOUND
    assert_alive(evaluator)


def test_num_envs_over_the_limit_is_invalid(make_evaluator):
    ev = make_evaluator(limits=Limits(max_copies=4))
    exc = refused(ev.agent.create_env, num_envs=5)
    assert exc.code == INVALID
    assert "limit" in exc.details
    assert ev.agent.create_env(num_envs=4).spec.num_envs == 4
    assert refused(ev.harness.create_env, num_envs=2**32 - 1).code == INVALID
    assert_alive(ev)


def test_num_envs_over_the_default_limit_is_invalid(evaluator):
    exc = refused(evaluator.agent.create_env, num_envs=Limits().max_copies + 1)
    assert exc.code == INVALID
    assert_alive(evaluator)


@pytest.mark.parametrize("mode", [2, 7, 2**31 - 1, -1])
def test_an_unknown_autoreset_mode_is_invalid(evaluator, mode):
    exc = refused(evaluator.agent.create_env, autoreset_mode=mode)
    assert exc.code == INVALID
    assert "autoreset_mode" in exc.details
    assert_alive(evaluator)


# -- Step out of order -------------------------------------------------------------------------------


def test_step_before_reset_is_a_failed_precondition(evaluator):
    env_id = evaluator.agent.create_env().env_id
    exc = refused(evaluator.agent.step, env_id, np.array([1]))
    assert exc.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "Reset" in exc.details
    assert_alive(evaluator)


def test_step_after_the_episode_ended_is_a_failed_precondition(evaluator):
    env_id = evaluator.agent.create_env().env_id
    evaluator.agent.reset(env_id, seed=0)
    done = False
    while not done:
        reply = evaluator.agent.step(env_id, np.array([1]))
        done = bool(decode_tensor(reply.terminated)[0] or decode_tensor(reply.truncated)[0])
    exc = refused(evaluator.agent.step, env_id, np.array([1]))
    assert exc.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "Reset" in exc.details
    evaluator.agent.reset(env_id)
    evaluator.agent.step(env_id, np.array([1]))


# -- undecodable and oversized messages --------------------------------------------------------------

GARBAGE = [
    pytest.param(b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", id="endless-varint"),
    pytest.param(b"\x0a\x10short", id="length-past-the-end"),
    pytest.param(b"\x07", id="invalid-wire-type"),
    pytest.param(b"\x00\x01", id="field-number-zero"),
    pytest.param(b"\x0a\x02\xc3\x28", id="invalid-utf8-or-bad-artifact"),
]


@pytest.mark.parametrize("payload", GARBAGE)
@pytest.mark.parametrize("role", ROLES)
def test_undecodable_request_bytes_are_invalid_for_every_method(evaluator, role, payload):
    for method in METHODS:
        code, details = raw_call(address(evaluator, role), method, payload)
        assert code == INVALID, (method, code, details)
    assert_alive(evaluator)


@pytest.mark.parametrize("role", ROLES)
def test_a_message_over_16_mib_is_resource_exhausted(evaluator, role):
    big = pb.SubmitBatchEvalRequest(policy=bytes(MAX_MESSAGE_BYTES + 1)).SerializeToString()
    code, details = raw_call(address(evaluator, role), "SubmitBatchEval", big, max_send=4 * MAX_MESSAGE_BYTES)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
    # The client refuses to send it, too.
    exc = refused(endpoint(evaluator, role).submit_batch_eval, bytes(MAX_MESSAGE_BYTES + 1))
    assert exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert not evaluator.state.batches
    assert_alive(evaluator)


def test_an_unknown_method_is_unimplemented(evaluator):
    code, _ = raw_call(evaluator.running.agent_address, "Render", b"")
    assert code == grpc.StatusCode.UNIMPLEMENTED
    assert_alive(evaluator)


# -- fuzzing -------------------------------------------------------------------------------------------

FUZZ = settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FUZZ
@given(payload=st.binary(max_size=256))
def test_random_bytes_to_every_method_get_a_clean_status(evaluator, payload):
    for role in ROLES:
        for method in METHODS:
            code, details = raw_call(address(evaluator, role), method, payload)
            assert code == OK or code in REFUSALS, (role, method, payload, code, details)
            assert "Traceback" not in details


@FUZZ
@given(
    dtype=st.integers(min_value=-2, max_value=9),
    shape=st.lists(st.integers(min_value=-2, max_value=4), max_size=10),
    data=st.binary(max_size=64),
    env=st.sampled_from(["vector", "single", "unknown"]),
)
def test_garbage_step_tensors_get_a_clean_status(evaluator, dtype, shape, data, env):
    if env == "unknown":
        env_id = "env-fuzz"
    else:
        k = 3 if env == "vector" else 1
        env_id = evaluator.agent.create_env(num_envs=k, autoreset_mode=pb.AUTORESET_MODE_SAME_STEP).env_id
        evaluator.agent.reset(env_id, seed=0)
    code, details = stub_call(evaluator, "agent", "Step", step_request(env_id, dtype=dtype, shape=shape, data=data))
    allowed = {OK, INVALID} if env != "unknown" else {grpc.StatusCode.NOT_FOUND}
    assert code in allowed, (code, details)
    if code == OK:
        assert dtype in (pb.DTYPE_INT32, pb.DTYPE_INT64), "a Discrete action is INT32 or INT64"
        assert len(data) == math.prod(shape) * {pb.DTYPE_INT32: 4, pb.DTYPE_INT64: 8}[dtype]


@FUZZ
@given(
    method=st.sampled_from(sorted(METHODS)),
    role=st.sampled_from(ROLES),
    fields=st.dictionaries(
        st.sampled_from(
            ["env_id", "session_id", "batch_id", "task_id", "num_envs", "num_episodes", "seed", "official"]
        ),
        st.one_of(st.text(max_size=20), st.integers(min_value=0, max_value=2**32 - 1), st.booleans()),
        max_size=4,
    ),
)
def test_well_formed_requests_with_arbitrary_fields_get_a_clean_status(evaluator, method, role, fields):
    request_cls = METHODS[method][0]
    request = request_cls()
    for name, value in fields.items():
        field = request_cls.DESCRIPTOR.fields_by_name.get(name)
        if field is None:
            continue
        try:
            setattr(request, name, value)
        except (TypeError, ValueError):
            continue  # not this field's type
    code, details = stub_call(evaluator, role, method, request)
    assert code == OK or code in REFUSALS, (method, role, request, code, details)


def test_a_full_episode_runs_after_a_burst_of_bad_requests(evaluator):
    # A compact replay of one bad request of each kind, then a full good episode.
    env_id = evaluator.agent.create_env().env_id
    for method in METHODS:
        raw_call(evaluator.running.agent_address, method, b"\xff" * 16)
    refused(evaluator.agent.step, env_id, np.array([1]))
    request = pb.StepRequest(env_id=env_id)
    encode_tensor(np.array([1], dtype=np.int64), request.action)
    request.action.data = b"\x00"
    stub_call(evaluator, "agent", "Step", request)
    evaluator.agent.reset(env_id, seed=3)
    steps, done = 0, False
    while not done:
        reply = evaluator.agent.step(env_id, np.array([steps % 2]))
        done = bool(decode_tensor(reply.terminated)[0] or decode_tensor(reply.truncated)[0])
        steps += 1
    assert steps > 5
    assert_alive(evaluator)


# -- issue 10: INVALID_ARGUMENT where it is due, never INTERNAL; every echoed value capped -------------


@pytest.mark.parametrize(
    "shape",
    [pytest.param([0, 2**63 - 1], id="0-by-int64-max"), pytest.param([2**63 - 1, 0], id="int64-max-by-0")],
)
@pytest.mark.parametrize("task", ["cartpole-balance", "pendulum-lqr"])
def test_step_with_a_zero_element_tensor_of_a_huge_shape_is_invalid_not_internal(make_evaluator, task, shape):
    """Point 12: zero elements pass every size check; the decoder bounds each dimension first."""
    ev = make_evaluator(task)
    env_id = ev.agent.create_env().env_id
    ev.agent.reset(env_id, seed=0)
    for dtype in (pb.DTYPE_INT64, pb.DTYPE_FLOAT32):
        code, details = stub_call(ev, "agent", "Step", step_request(env_id, dtype=dtype, shape=shape, data=b""))
        assert code == INVALID, details
        assert "exceeds the limit" in details
    assert_alive(ev)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    ("method", "field"),
    [
        ("GetSpec", "env_id"),
        ("Reset", "env_id"),
        ("Step", "env_id"),
        ("GetEvalResult", "session_id"),
        ("GetBatchEvalStatus", "batch_id"),
        ("StartEvalSession", "env_id"),
        ("CreateEnv", "task_id"),
    ],
)
def test_an_id_of_20_kib_is_invalid_argument_with_a_short_message_not_resource_exhausted(
    evaluator, role, method, field
):
    """Point 14: NOT_FOUND echoed the whole id; past ~16 KiB the client got RESOURCE_EXHAUSTED instead."""
    request = METHODS[method][0](**{field: "e" * (20 * 1024)})
    code, details = stub_call(evaluator, role, method, request)
    assert code == INVALID, (code, details[:200])
    assert f"{field} 'eeee" in details
    assert "(20480 characters)" in details
    assert len(details) < 300
    assert_alive(evaluator)


@pytest.mark.parametrize("role", ROLES)
def test_an_unknown_id_is_echoed_cut_to_its_first_64_characters(evaluator, role):
    env_id = "env-" + "f" * 124  # 128 characters: the longest id a request may carry
    exc = refused(endpoint(evaluator, role).get_spec, env_id)
    assert exc.code == grpc.StatusCode.NOT_FOUND
    assert exc.details == f"unknown env_id {env_id[:64]!r}... (128 characters)"
    exc = refused(endpoint(evaluator, role).create_env, task_id="t" * 100)
    assert exc.code == grpc.StatusCode.NOT_FOUND
    assert "... (100 characters)" in exc.details


def test_a_policy_naming_a_100k_character_tensor_gets_a_short_message(evaluator):
    name = "w" * 100_000
    arch = {
        "format": "ale-policy/v1",
        "observation_dim": 4,
        "normalizer": None,
        "layers": [{"weight": name, "bias": "b", "activation": "identity"}],
        "output": {"kind": "discrete"},
    }
    raw = safetensors.numpy.save({"b": np.zeros(2)}, metadata={"ale-policy": json.dumps(arch)})
    exc = refused(evaluator.agent.submit_batch_eval, raw, num_episodes=1)
    assert exc.code == INVALID
    assert "(100000 characters)" in exc.details
    assert len(exc.details) < 300


def test_an_unexpected_exception_is_internal_logged_and_tells_the_caller_nothing_of_it(
    make_evaluator, caplog, monkeypatch
):
    """Point 13: only the evaluator's refusals reach the caller; anything else is a bug, logged."""

    def broken(self, request):
        raise KeyError("private detail of the evaluator")

    monkeypatch.setattr(AleEnvServicer, "GetSpec", broken)
    ev = make_evaluator()
    for role in ROLES:
        exc = refused(endpoint(ev, role).get_spec)
        assert exc.code == grpc.StatusCode.INTERNAL
        assert exc.details == "internal evaluator error in GetSpec; see the evaluator log"
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert [r.getMessage() for r in errors] == ["agent endpoint: GetSpec failed", "harness endpoint: GetSpec failed"]
    assert all("private detail of the evaluator" in (r.exc_text or "") for r in errors)
    assert_alive(ev)


def test_an_event_log_that_cannot_be_written_is_internal_and_logged(evaluator, caplog, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(evaluator.state.events, "rpc", broken)
    exc = refused(evaluator.agent.get_spec)
    assert exc.code == grpc.StatusCode.INTERNAL
    assert "No space" not in exc.details
    assert any("the event log could not be written" in r.getMessage() for r in caplog.records)


def test_the_caps_docs_protocol_md_states_are_the_codes():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "protocol.md").read_text(encoding="utf-8")
    caps = f"{ECHO_CHARS} / {MAX_STATUS_CHARS} / {MAX_STRING_CHARS} characters"
    assert f"| a caller's value echoed in a message / a status message / a string in an event line | {caps} |" in doc
    assert f"`env_id`, `session_id`, `batch_id`, `task_id`) | {MAX_ID_CHARS} characters |" in doc
    assert f"| half its worker threads ({long_poll_slots(4)} of 4) |" in doc
    assert f"queued or running batch evaluations | {Limits().max_pending_batches} per endpoint |" in doc
