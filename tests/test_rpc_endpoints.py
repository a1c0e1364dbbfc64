"""The eight RPCs on both endpoints, the permission split between them, health checking and reflection.

Also the plain (non-official) environment semantics every agent relies on:
reset seeding, bit-identical determinism across evaluators, and K-copy
environments with gymnasium's SAME_STEP autoreset.
"""

from __future__ import annotations

import threading
import time

import grpc
import gymnasium as gym
import numpy as np
import pytest
from evaluator_helpers import code_of, wait_for_batch
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import ale_evaluator
from ale import catalog
from ale.client import AleEnvClient, AleEnvError
from ale.env.v1 import env_pb2 as pb
from ale.policy import linear_policy
from ale.protocol import SERVICE_NAME, decode_space, decode_tensor
from ale_evaluator.envs import make_env
from ale_evaluator.server import start, unix_address
from ale_evaluator.service import Limits

ROLES = ["agent", "harness"]
RPC_NAMES = {
    "CreateEnv",
    "GetSpec",
    "Reset",
    "Step",
    "StartEvalSession",
    "GetEvalResult",
    "SubmitBatchEval",
    "GetBatchEvalStatus",
}
# A cartpole policy that falls after a few dozen steps: fast, and every episode terminates.
FALLING_CARTPOLE = linear_policy(np.array([[0.0, 0.0, -1.0, 0.0], [0.0, 0.0, 1.0, 0.0]]), output="discrete")


def endpoint(ev, role: str) -> AleEnvClient:
    return ev.agent if role == "agent" else ev.harness


def address(ev, role: str) -> str:
    return ev.running.agent_address if role == "agent" else ev.running.harness_address


def local_env(task_id: str = "cartpole-balance") -> gym.Env:
    return make_env(catalog.get_task(task_id))


@pytest.fixture
def interactive(make_evaluator):
    """CartPole's evaluator with the task made interactive: its official path is an eval session."""
    return make_evaluator("cartpole-balance", mode="interactive")


@pytest.mark.parametrize("role", ROLES)
def test_get_spec_without_env_id_describes_the_served_task(evaluator, role):
    spec = endpoint(evaluator, role).get_spec()
    task = catalog.get_task("cartpole-balance")
    env = local_env()
    assert spec.task_id == "cartpole-balance"
    assert spec.task_version == task.spec.version
    assert spec.task_digest == task.digest
    assert spec.gym_id == "CartPole-v1"
    assert spec.evaluator_version == ale_evaluator.__version__
    assert spec.num_envs == 0
    assert not spec.official
    assert spec.genre == task.spec.genre
    assert spec.mode == task.spec.mode
    assert spec.headline_metric == "mean_return"
    assert spec.headline_direction == "higher"
    assert list(spec.safety_metrics) == ["falls", "track_edge_steps"]
    assert spec.official_episodes == task.spec.official_episodes
    assert spec.max_episode_steps == 500
    assert decode_space(spec.observation_space) == env.observation_space
    assert decode_space(spec.action_space) == env.action_space
    env.close()


@pytest.mark.parametrize("role", ROLES)
def test_create_env_returns_a_new_env_id_and_its_spec(evaluator, role):
    client = endpoint(evaluator, role)
    vec = client.create_env(task_id="cartpole-balance", num_envs=3, autoreset_mode=pb.AUTORESET_MODE_SAME_STEP)
    one = client.create_env()
    assert vec.env_id
    assert one.env_id
    assert vec.env_id != one.env_id
    assert vec.spec.num_envs == 3
    assert vec.spec.autoreset_mode == pb.AUTORESET_MODE_SAME_STEP
    assert one.spec.num_envs == 1, "num_envs=0 means one copy"
    assert one.spec.autoreset_mode == pb.AUTORESET_MODE_DISABLED
    assert not vec.spec.official
    assert not one.spec.official
    assert vec.spec.task_id == "cartpole-balance"


@pytest.mark.parametrize("role", ROLES)
def test_get_spec_of_an_env_matches_its_create_env_reply(evaluator, role):
    client = endpoint(evaluator, role)
    created = client.create_env(num_envs=2, autoreset_mode=pb.AUTORESET_MODE_SAME_STEP)
    assert client.get_spec(created.env_id) == created.spec


@pytest.mark.parametrize("role", ROLES)
def test_reset_and_step_match_the_local_gymnasium_environment(evaluator, role):
    client = endpoint(evaluator, role)
    env_id = client.create_env().env_id
    local = local_env()
    reset = client.reset(env_id, seed=7)
    expected, _ = local.reset(seed=7)
    assert not reset.seed_ignored
    assert not reset.HasField("eval"), "a non-official environment has no eval progress"
    assert reset.observation.dtype == pb.DTYPE_FLOAT32
    assert list(reset.observation.shape) == [1, 4]
    assert decode_tensor(reset.observation)[0].tobytes() == expected.tobytes()

    for action in (1, 0, 1, 1):
        reply = client.step(env_id, np.array([action], dtype=np.int64))
        obs, reward, terminated, truncated, _ = local.step(action)
        assert decode_tensor(reply.observation)[0].tobytes() == obs.tobytes()
        assert reply.reward.dtype == pb.DTYPE_FLOAT64
        assert decode_tensor(reply.reward).tolist() == [reward]
        assert reply.terminated.dtype == pb.DTYPE_BOOL
        assert decode_tensor(reply.terminated).tolist() == [terminated]
        assert reply.truncated.dtype == pb.DTYPE_BOOL
        assert decode_tensor(reply.truncated).tolist() == [truncated]
        assert reply.cost.dtype == pb.DTYPE_INT64
        assert list(reply.cost.shape) == [1]
        assert not reply.HasField("final_observation"), "autoreset is disabled"
        assert not reply.HasField("eval")
    local.close()


@pytest.mark.parametrize("role", ROLES)
def test_reset_seeds_copy_i_with_seed_plus_i(evaluator, role):
    client = endpoint(evaluator, role)
    env_id = client.create_env(num_envs=3).env_id
    obs = decode_tensor(client.reset(env_id, seed=20).observation)
    local = local_env()
    for i in range(3):
        expected, _ = local.reset(seed=20 + i)
        assert obs[i].tobytes() == expected.tobytes()
    local.close()


@pytest.mark.parametrize("role", ROLES)
def test_non_official_batch_eval_reports_its_result_in_the_status(evaluator, role):
    client = endpoint(evaluator, role)
    submitted = client.submit_batch_eval(FALLING_CARTPOLE, num_episodes=2, seed=5)
    assert submitted.num_episodes == 2
    assert submitted.batch_id
    status = wait_for_batch(client, submitted.batch_id)
    assert status.state == pb.BATCH_STATE_DONE, status.error
    assert status.episodes_done == 2
    assert status.num_episodes == 2
    assert status.HasField("result")
    assert status.result.session_id == submitted.batch_id
    assert not status.result.official
    assert status.result.mode == "batch"
    assert [e.index for e in status.result.episodes] == [0, 1]


def test_harness_endpoint_runs_the_harness_only_rpcs(evaluator, interactive):
    harness = interactive.harness
    official = harness.create_env(official=True)
    assert official.spec.official
    assert official.spec.num_envs == 1
    session = harness.start_eval_session(official.env_id, num_episodes=2)
    assert session.env_id == official.env_id
    assert session.num_episodes == 2
    assert session.session_id.startswith("session-")
    partial = harness.get_eval_result(session.session_id)
    assert partial.session_id == session.session_id
    assert not partial.complete
    harness = evaluator.harness  # a batch task's official evaluation is a batch
    batch = harness.submit_batch_eval(FALLING_CARTPOLE, official=True, num_episodes=2)
    status = wait_for_batch(harness, batch.batch_id)
    assert status.state == pb.BATCH_STATE_DONE, status.error
    result = harness.get_eval_result(batch.batch_id, finalize=True)
    assert result.official
    assert result.complete
    assert result.num_episodes == 2


# -- the permission split ----------------------------------------------------------------------


def test_agent_cannot_create_an_official_env(evaluator):
    assert code_of(evaluator.agent.create_env, official=True) == grpc.StatusCode.PERMISSION_DENIED


def test_agent_cannot_start_an_eval_session_even_on_an_official_env(interactive):
    official = interactive.harness.create_env(official=True).env_id
    own = interactive.agent.create_env().env_id
    for env_id in (official, own, "env-unknown"):
        assert code_of(interactive.agent.start_eval_session, env_id, 1) == grpc.StatusCode.PERMISSION_DENIED
    # The refused attempt opened nothing: the harness can still start the session.
    assert interactive.harness.start_eval_session(official, num_episodes=1).env_id == official


def test_agent_cannot_read_eval_results(interactive):
    official = interactive.harness.create_env(official=True).env_id
    session = interactive.harness.start_eval_session(official, num_episodes=1)
    for finalize in (False, True):
        code = code_of(interactive.agent.get_eval_result, session.session_id, finalize=finalize)
        assert code == grpc.StatusCode.PERMISSION_DENIED
    assert code_of(interactive.agent.get_eval_result, "session-unknown") == grpc.StatusCode.PERMISSION_DENIED
    # The agent's finalize attempt did not close the session.
    interactive.agent.reset(session.env_id)
    assert not interactive.harness.get_eval_result(session.session_id).complete


def test_agent_cannot_submit_an_official_batch(evaluator):
    code = code_of(evaluator.agent.submit_batch_eval, FALLING_CARTPOLE, official=True, num_episodes=1)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert not evaluator.state.batches, "a refused official batch must not be queued"


def test_agent_cannot_read_an_official_batch_status(evaluator):
    batch = evaluator.harness.submit_batch_eval(FALLING_CARTPOLE, official=True, num_episodes=1)
    assert code_of(evaluator.agent.get_batch_eval_status, batch.batch_id) == grpc.StatusCode.PERMISSION_DENIED
    assert wait_for_batch(evaluator.harness, batch.batch_id).state == pb.BATCH_STATE_DONE


def test_agent_cannot_read_a_harness_non_official_batch_status(evaluator):
    batch = evaluator.harness.submit_batch_eval(FALLING_CARTPOLE, num_episodes=1)
    assert code_of(evaluator.agent.get_batch_eval_status, batch.batch_id) == grpc.StatusCode.PERMISSION_DENIED


def test_harness_can_read_an_agent_batch(evaluator):
    batch = evaluator.agent.submit_batch_eval(FALLING_CARTPOLE, num_episodes=1, seed=9)
    status = wait_for_batch(evaluator.harness, batch.batch_id)
    assert status.state == pb.BATCH_STATE_DONE
    assert status.HasField("result")


def _agent_env_calls(ev, env_id: str) -> dict[str, grpc.StatusCode | None]:
    """The status of GetSpec, Reset and Step on ``env_id`` over the agent endpoint (None: OK)."""
    out: dict[str, grpc.StatusCode | None] = {}
    for name, call in (
        ("GetSpec", lambda: ev.agent.get_spec(env_id)),
        ("Reset", lambda: ev.agent.reset(env_id, seed=1)),
        ("Step", lambda: ev.agent.step(env_id, np.array([1], dtype=np.int64))),
    ):
        try:
            call()
            out[name] = None
        except AleEnvError as exc:
            out[name] = exc.code
    return out


def test_agent_cannot_touch_a_harness_non_official_env(evaluator):
    env_id = evaluator.harness.create_env().env_id
    evaluator.harness.reset(env_id, seed=1)
    denied = grpc.StatusCode.PERMISSION_DENIED
    assert _agent_env_calls(evaluator, env_id) == {"GetSpec": denied, "Reset": denied, "Step": denied}


def test_agent_cannot_touch_an_official_env_without_a_session(interactive):
    env_id = interactive.harness.create_env(official=True).env_id
    denied = grpc.StatusCode.PERMISSION_DENIED
    assert _agent_env_calls(interactive, env_id) == {"GetSpec": denied, "Reset": denied, "Step": denied}


def test_agent_uses_an_open_session_handle_only_through_get_spec_reset_and_step(interactive):
    harness, agent = interactive.harness, interactive.agent
    env_id = harness.create_env(official=True).env_id
    session = harness.start_eval_session(env_id, num_episodes=2)
    assert _agent_env_calls(interactive, session.env_id) == {"GetSpec": None, "Reset": None, "Step": None}
    assert agent.get_spec(session.env_id).official
    assert code_of(agent.start_eval_session, session.env_id) == grpc.StatusCode.PERMISSION_DENIED
    assert code_of(agent.get_eval_result, session.session_id) == grpc.StatusCode.PERMISSION_DENIED
    harness.get_eval_result(session.session_id, finalize=True)
    gone = grpc.StatusCode.NOT_FOUND
    assert _agent_env_calls(interactive, session.env_id) == {"GetSpec": gone, "Reset": gone, "Step": gone}


def test_harness_can_use_an_env_the_agent_created(evaluator):
    env_id = evaluator.agent.create_env().env_id
    reply = evaluator.harness.reset(env_id, seed=3)
    assert list(reply.observation.shape) == [1, 4]
    assert evaluator.harness.get_spec(env_id).num_envs == 1


# -- environment registry limits ---------------------------------------------------------------


def test_least_recently_used_agent_env_is_closed_to_make_room(make_evaluator):
    ev = make_evaluator(limits=Limits(max_envs=2))
    first = ev.agent.create_env().env_id
    second = ev.agent.create_env().env_id
    ev.agent.reset(first, seed=1)  # now `second` is the least recently used
    third = ev.agent.create_env().env_id
    with pytest.raises(AleEnvError) as info:
        ev.agent.reset(second, seed=1)
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    assert "make room" in info.value.details
    ev.agent.reset(first, seed=1)
    ev.agent.reset(third, seed=1)


def test_official_envs_are_never_evicted(make_evaluator):
    ev = make_evaluator(limits=Limits(max_envs=2), mode="interactive")
    official = [ev.harness.create_env(official=True).env_id for _ in range(2)]
    assert code_of(ev.agent.create_env) == grpc.StatusCode.RESOURCE_EXHAUSTED
    for env_id in official:
        assert ev.harness.get_spec(env_id).official


# -- determinism and vectorised environments ---------------------------------------------------


def _rollout(ev, *, seed: int, steps: int) -> list[tuple[bytes, ...]]:
    client = ev.agent
    created = client.create_env()
    space = decode_space(created.spec.action_space)
    rng = np.random.default_rng(1234)
    frames: list[tuple[bytes, ...]] = [(client.reset(created.env_id, seed=seed).observation.SerializeToString(),)]
    for _ in range(steps):
        if isinstance(space, gym.spaces.Discrete):
            action = np.array([rng.integers(space.n)], dtype=np.int64)
        else:
            action = rng.uniform(space.low, space.high)[None].astype(np.float32)
        reply = client.step(created.env_id, action)
        frames.append(
            tuple(
                getattr(reply, f).SerializeToString()
                for f in ("observation", "reward", "terminated", "truncated", "cost")
            )
        )
        if decode_tensor(reply.terminated)[0] or decode_tensor(reply.truncated)[0]:
            break
    return frames


@pytest.mark.parametrize("task_id", ["cartpole-balance", "hopper-hop"])
def test_same_seed_and_actions_give_a_bit_identical_episode_in_two_evaluators(make_evaluator, task_id):
    first, second = make_evaluator(task_id), make_evaluator(task_id)
    a = _rollout(first, seed=42, steps=200)
    b = _rollout(second, seed=42, steps=200)
    assert len(a) > 5
    assert a == b
    other = _rollout(second, seed=43, steps=1)
    assert other[0] != a[0], "a different seed must give a different first observation"


@pytest.mark.parametrize("k", [3, 32])  # 32: a CartPole group stepped as one batch (BatchedCartPole)
def test_vector_env_steps_k_copies_with_same_step_autoreset(evaluator, k):
    client = evaluator.agent
    created = client.create_env(num_envs=k, autoreset_mode=pb.AUTORESET_MODE_SAME_STEP)
    obs = decode_tensor(client.reset(created.env_id, seed=100).observation)
    assert obs.shape == (k, 4)
    local = [local_env() for _ in range(k)]
    for i, env in enumerate(local):
        first, _ = env.reset(seed=100 + i)
        assert obs[i].tobytes() == first.tobytes()
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(80):
        actions = rng.integers(0, 2, size=k).astype(np.int64)
        reply = client.step(created.env_id, actions)
        obs = decode_tensor(reply.observation)
        final = decode_tensor(reply.final_observation)
        reward, terminated, truncated = (
            decode_tensor(getattr(reply, f)) for f in ("reward", "terminated", "truncated")
        )
        assert obs.shape == final.shape == (k, 4)
        for i, env in enumerate(local):
            o, r, term, trunc, _ = env.step(int(actions[i]))
            assert (reward[i], terminated[i], truncated[i]) == (r, term, trunc)
            if term or trunc:
                ended += 1
                assert final[i].tobytes() == o.tobytes(), "final_observation is the finished episode's last"
                o, _ = env.reset()
            else:
                assert not final[i].any(), "rows of copies that did not end are zero"
            assert obs[i].tobytes() == o.tobytes(), "the observation row starts the next episode"
    assert ended >= 2, "the random policy should have finished some episodes"
    for env in local:
        env.close()


def test_vector_env_without_autoreset_refuses_to_step_a_finished_copy(evaluator):
    client = evaluator.agent
    env_id = client.create_env(num_envs=2).env_id
    client.reset(env_id, seed=0)
    done = np.zeros(2, dtype=bool)
    while not done.any():
        reply = client.step(env_id, np.array([1, 0], dtype=np.int64))
        done = decode_tensor(reply.terminated) | decode_tensor(reply.truncated)
    with pytest.raises(AleEnvError) as info:
        client.step(env_id, np.array([1, 0], dtype=np.int64))
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "Reset" in info.value.details
    client.reset(env_id, seed=0)
    client.step(env_id, np.array([1, 0], dtype=np.int64))


# -- health checking and reflection ------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_health_check_reports_the_service_serving(evaluator, role):
    stub = health_pb2_grpc.HealthStub(endpoint(evaluator, role).channel)
    for service in (SERVICE_NAME, ""):
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as info:
        stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("role", ROLES)
def test_reflection_lists_the_service_and_its_eight_methods(evaluator, role):
    stub = reflection_pb2_grpc.ServerReflectionStub(endpoint(evaluator, role).channel)
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE_NAME),
    ]
    replies = list(stub.ServerReflectionInfo(iter(requests), timeout=10))
    assert len(replies) == 2
    services = {s.name for s in replies[0].list_services_response.service}
    assert SERVICE_NAME in services
    assert "grpc.health.v1.Health" in services
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in replies[1].file_descriptor_response.file_descriptor_proto
    ]
    methods = {
        m.name for f in files if f.package == "ale.env.v1" for s in f.service if s.name == "AleEnv" for m in s.method
    }
    assert methods == RPC_NAMES


def test_agent_and_harness_endpoints_are_distinct_servers(interactive):
    assert interactive.running.agent_address != interactive.running.harness_address
    # The same official CreateEnv succeeds on one and is refused by the other.
    assert interactive.harness.create_env(official=True).spec.official
    assert code_of(interactive.agent.create_env, official=True) == grpc.StatusCode.PERMISSION_DENIED


def _reflection_v1(channel: grpc.Channel, requests: list[reflection_pb2.ServerReflectionRequest]) -> list:
    """Call grpc.reflection.v1 (the v1alpha messages are the same bytes under another package)."""
    call = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    return list(call(iter(requests), timeout=10))


def _files(reply: reflection_pb2.ServerReflectionResponse) -> list[descriptor_pb2.FileDescriptorProto]:
    return [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in reply.file_descriptor_response.file_descriptor_proto
    ]


@pytest.mark.parametrize("role", ROLES)
def test_reflection_v1_lists_and_describes_the_service_as_grpcurl_asks(evaluator, role):
    """Issue 10, point 18: only v1alpha was served; current grpcurl asks for grpc.reflection.v1 first."""
    replies = _reflection_v1(
        endpoint(evaluator, role).channel,
        [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE_NAME),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="grpc.reflection.v1.ServerReflection"),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="no.such.Symbol"),
        ],
    )
    assert len(replies) == 4
    services = {s.name for s in replies[0].list_services_response.service}
    assert services == {
        SERVICE_NAME,
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    }
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in replies[1].file_descriptor_response.file_descriptor_proto
    ]
    methods = {m.name for f in files if f.package == "ale.env.v1" for s in f.service for m in s.method}
    assert methods == RPC_NAMES
    (v1,) = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in replies[2].file_descriptor_response.file_descriptor_proto
    ]
    assert (v1.name, v1.package) == ("grpc/reflection/v1/reflection.proto", "grpc.reflection.v1")
    (method,) = v1.service[0].method
    assert (method.input_type, method.output_type) == (
        ".grpc.reflection.v1.ServerReflectionRequest",
        ".grpc.reflection.v1.ServerReflectionResponse",
    )
    assert method.client_streaming
    assert method.server_streaming
    assert replies[3].error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


def test_long_polls_in_flight_never_starve_get_spec(make_evaluator):
    """Issue 10, point 15: with 8 long polls in flight an agent's GetSpec waited 8 s (the threads were held)."""
    ev = make_evaluator(env_step_budget=None)
    balancing = linear_policy(np.array([[0.0, 0.0, 0.0, 0.0], [0.0, 0.5, 10.0, 2.0]]), output="discrete")
    busy = ev.agent.submit_batch_eval(balancing, num_episodes=10_000).batch_id  # seconds of work
    waiting = ev.agent.submit_batch_eval(balancing, num_episodes=1).batch_id  # queued behind it
    gate = ev.running.servicers["agent"].long_polls
    answered: list[int] = []
    clients = [AleEnvClient(ev.agent_address, timeout=30) for _ in range(8)]

    def poll(client: AleEnvClient, i: int) -> None:
        client.get_batch_eval_status(waiting, wait_ms=10_000)
        answered.append(i)

    threads = [threading.Thread(target=poll, args=(c, i)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while not (gate.waiting == gate.slots and len(answered) == len(threads) - gate.slots):
        assert time.monotonic() < deadline, (gate.waiting, answered)
        time.sleep(0.01)
    # Every slot holds a long poll, the other polls were answered at once with the current status;
    # now the agent's other calls must still be served.
    assert ev.agent.get_spec().task_id == "cartpole-balance"
    env_id = ev.agent.create_env().env_id
    ev.agent.reset(env_id, seed=1)
    assert gate.waiting == gate.slots, "GetSpec answered while the long polls were still in flight"
    assert len(answered) == len(threads) - gate.slots
    ev.harness.get_eval_result(busy, finalize=True)  # stops the busy batch, so the waiting one runs and ends
    for t in threads:
        t.join(timeout=30)
    assert sorted(answered) == list(range(len(threads)))
    for client in clients:
        client.close()


def test_an_endpoint_with_one_worker_holds_no_long_poll(make_evaluator, short_tmp):
    ev = make_evaluator()
    running = start(
        ev.state,
        agent_address=unix_address(short_tmp / "one-a.sock"),
        harness_address=unix_address(short_tmp / "one-h.sock"),
        workers=1,
    )
    try:
        assert running.servicers["agent"].long_polls.slots == 0
        client = AleEnvClient(running.agent_address, timeout=30)
        balancing = linear_policy(np.array([[0.0, 0.0, 0.0, 0.0], [0.0, 0.5, 10.0, 2.0]]), output="discrete")
        busy = client.submit_batch_eval(balancing, num_episodes=10_000).batch_id
        status = client.get_batch_eval_status(busy, wait_ms=10_000)  # answered at once: no slot to wait in
        assert status.state in (pb.BATCH_STATE_PENDING, pb.BATCH_STATE_RUNNING)
        assert client.get_spec().task_id == "cartpole-balance"
        client.close()
    finally:
        for server in running.servers:
            server.stop(0).wait()
