"""Batch-mode evaluation: ale-policy/v1 artifacts run in-process, official or not.

A policy artifact is data, never code: the evaluator refuses anything that is
not a well-formed, bounded, finite feed-forward network that fits the task.
"""

from __future__ import annotations

import json
import pickle
import random
import struct
import time

import grpc
import gymnasium as gym
import numpy as np
import pytest
import safetensors.numpy
from evaluator_helpers import code_of, commitment_of, wait_for_batch

from ale import catalog
from ale.client import AleEnvError
from ale.env.v1 import env_pb2 as pb
from ale.policy import MAX_POLICY_BYTES, linear_policy, load_policy, save_policy
from ale_evaluator.batch import LOCKSTEP_SLOTS
from ale_evaluator.domains import DOMAINS
from ale_evaluator.envs import make_env
from ale_evaluator.seeds import hidden_seed
from ale_evaluator.service import Limits

# CartPole: push toward the lean only (falls in a few dozen steps) / a balancing controller (500 steps).
FALLING = linear_policy(np.array([[0.0, 0.0, -1.0, 0.0], [0.0, 0.0, 1.0, 0.0]]), output="discrete")
BALANCING = linear_policy(np.array([[0.0, 0.0, 0.0, 0.0], [0.0, 0.5, 10.0, 2.0]]), output="discrete")


def local_rollouts(policy_bytes: bytes, task_id: str, seeds: list[int]) -> list[tuple[float, int, bool]]:
    """(return, length, terminated) of each episode, run here the way the documentation says."""
    policy = load_policy(policy_bytes)
    env = make_env(catalog.get_task(task_id))
    space = env.action_space
    discrete = isinstance(space, gym.spaces.Discrete)
    out = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        total, length = 0.0, 0
        while True:
            if discrete:
                action = int(policy.act(obs[None, :], start=int(space.start))[0])
            else:
                action = policy.act(obs[None, :], space.low.astype(np.float64), space.high.astype(np.float64))[0]
                action = action.astype(space.dtype)
            obs, reward, terminated, truncated, _ = env.step(action)
            total, length = total + float(reward), length + 1
            if terminated or truncated:
                out.append((total, length, bool(terminated)))
                break
    env.close()
    return out


def artifact(tensors: dict[str, np.ndarray], arch: dict | str) -> bytes:
    meta = arch if isinstance(arch, str) else json.dumps(arch)
    return safetensors.numpy.save(tensors, metadata={"ale-policy": meta})


def architecture(
    layers: list[tuple[str, str, str]], *, obs_dim: int = 4, output: dict | None = None, normalizer: dict | None = None
) -> dict:
    return {
        "format": "ale-policy/v1",
        "observation_dim": obs_dim,
        "normalizer": normalizer,
        "layers": [{"weight": w, "bias": b, "activation": a} for w, b, a in layers],
        "output": output or {"kind": "discrete"},
    }


def linear_tensors(out: int = 2, inp: int = 4, dtype=np.float64) -> dict[str, np.ndarray]:
    return {"w": np.zeros((out, inp), dtype=dtype), "b": np.zeros(out, dtype=dtype)}


# -- non-official batches ----------------------------------------------------------------------


def test_agent_batch_with_its_own_seed_reports_its_result_when_done(evaluator):
    ev, n, seed = evaluator, 3, 1000
    submitted = ev.agent.submit_batch_eval(FALLING, num_episodes=n, seed=seed)
    status = wait_for_batch(ev.agent, submitted.batch_id)
    assert status.state == pb.BATCH_STATE_DONE, status.error
    assert status.episodes_done == n == status.num_episodes
    assert status.error == ""
    result = status.result
    task = catalog.get_task("cartpole-balance")
    assert result.session_id == submitted.batch_id
    assert result.run_id == ev.config.run_id
    assert (result.task_id, result.task_digest) == ("cartpole-balance", task.digest)
    assert result.mode == "batch"
    assert not result.official
    assert result.complete
    assert result.num_episodes == n
    assert result.passed_episodes == n
    expected = local_rollouts(FALLING, "cartpole-balance", [seed + i for i in range(n)])
    for rec, (total, length, terminated) in zip(result.episodes, expected, strict=True):
        assert rec.seed_commitment == commitment_of(ev.config, seed + rec.index)
        assert (rec.episode_return, rec.length, rec.terminated) == (total, length, terminated)
        assert rec.headline_value == total
        assert not rec.aborted
    assert result.headline_value == pytest.approx(sum(e[0] for e in expected) / n)
    falls = next(s for s in result.safety if s.name == "falls")
    assert falls.count == sum(e[2] for e in expected)


def test_batch_seed_changes_the_episodes(evaluator):
    a = wait_for_batch(evaluator.agent, evaluator.agent.submit_batch_eval(FALLING, num_episodes=2, seed=1).batch_id)
    b = wait_for_batch(evaluator.agent, evaluator.agent.submit_batch_eval(FALLING, num_episodes=2, seed=2).batch_id)
    # Episode 1 of seed 1 and episode 0 of seed 2 share seed 2.
    assert a.result.episodes[1].seed_commitment == b.result.episodes[0].seed_commitment
    assert a.result.episodes[1].episode_return == b.result.episodes[0].episode_return
    assert a.result.episodes[0].seed_commitment != b.result.episodes[0].seed_commitment


def test_a_multilayer_policy_with_a_normalizer_runs_as_documented(evaluator):
    rng = np.random.default_rng(3)
    policy = save_policy(
        [(rng.normal(size=(8, 4)), rng.normal(size=8), "tanh"), (rng.normal(size=(2, 8)), np.zeros(2), "relu")],
        output="discrete",
        normalizer=(np.zeros(4), np.array([1.0, 2.0, 0.2, 1.0]), 5.0),
    )
    status = wait_for_batch(evaluator.agent, evaluator.agent.submit_batch_eval(policy, num_episodes=2, seed=7).batch_id)
    assert status.state == pb.BATCH_STATE_DONE, status.error
    expected = local_rollouts(policy, "cartpole-balance", [7, 8])
    assert [(e.episode_return, e.length) for e in status.result.episodes] == [(t, n) for t, n, _ in expected]


def test_a_box_policy_on_a_mujoco_task_runs_as_documented(make_evaluator):
    ev = make_evaluator("pendulum-lqr")
    policy = linear_policy(np.array([[1.0, 10.0, 0.5, 1.0]]), output="clip")
    status = wait_for_batch(ev.agent, ev.agent.submit_batch_eval(policy, num_episodes=2, seed=11).batch_id)
    assert status.state == pb.BATCH_STATE_DONE, status.error
    expected = local_rollouts(policy, "pendulum-lqr", [11, 12])
    got = [(e.episode_return, e.length, e.terminated) for e in status.result.episodes]
    assert got == expected


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy reports the overflow the policy is built to cause
def test_a_policy_emitting_nan_actions_is_aborted_with_policy_error(make_evaluator):
    ev = make_evaluator("pendulum-lqr")
    w0, w1 = np.full((2, 4), 1e308), np.array([[1e308, -1e308]])
    policy = save_policy([(w0, np.zeros(2), "identity"), (w1, np.zeros(1), "identity")], output="clip")
    status = wait_for_batch(ev.agent, ev.agent.submit_batch_eval(policy, num_episodes=2, seed=0).batch_id)
    assert status.state == pb.BATCH_STATE_DONE, status.error
    result = status.result
    assert [(e.aborted, e.abort_reason) for e in result.episodes] == [(True, "policy_error")] * 2
    assert all(e.headline_value == DOMAINS["inverted_pendulum"].worst for e in result.episodes)
    assert result.passed_episodes == 0
    assert result.complete


def test_num_episodes_zero_means_the_official_count(evaluator):
    submitted = evaluator.agent.submit_batch_eval(FALLING, seed=0)
    assert submitted.num_episodes == catalog.get_task("cartpole-balance").spec.official_episodes
    status = wait_for_batch(evaluator.agent, submitted.batch_id)
    assert len(status.result.episodes) == submitted.num_episodes


def test_num_episodes_over_the_limit_is_invalid(make_evaluator):
    ev = make_evaluator(limits=Limits(max_episodes=5))
    with pytest.raises(AleEnvError) as info:
        ev.agent.submit_batch_eval(FALLING, num_episodes=6)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "limit" in info.value.details
    assert ev.agent.submit_batch_eval(FALLING, num_episodes=5).num_episodes == 5


# -- official batches ----------------------------------------------------------------------------


def test_official_batch_runs_on_hidden_seeds_and_reports_only_through_get_eval_result(evaluator):
    ev, n = evaluator, 3
    submitted = ev.harness.submit_batch_eval(FALLING, official=True, num_episodes=n, seed=12345)
    status = wait_for_batch(ev.harness, submitted.batch_id)
    assert status.state == pb.BATCH_STATE_DONE, status.error
    assert status.episodes_done == n
    assert not status.HasField("result"), "an official batch's result is read with GetEvalResult only"
    assert code_of(ev.agent.get_batch_eval_status, submitted.batch_id) == grpc.StatusCode.PERMISSION_DENIED
    assert code_of(ev.agent.get_eval_result, submitted.batch_id) == grpc.StatusCode.PERMISSION_DENIED

    result = ev.harness.get_eval_result(submitted.batch_id, finalize=True)
    assert result.official
    assert result.mode == "batch"
    assert result.complete
    assert result.num_episodes == n
    seeds = [hidden_seed(ev.config, "cartpole-balance", i) for i in range(n)]
    expected = local_rollouts(FALLING, "cartpole-balance", seeds)
    for rec, seed, (total, length, _) in zip(result.episodes, seeds, expected, strict=True):
        assert rec.seed_commitment == commitment_of(ev.config, seed), "hidden seeds, not the request's seed"
        assert (rec.episode_return, rec.length) == (total, length)
    summary = [json.loads(line) for line in ev.events.getvalue().splitlines() if '"eval_result"' in line]
    assert summary
    assert summary[-1]["session_id"] == submitted.batch_id
    assert summary[-1]["complete"]


def test_official_batch_episode_ends_are_in_the_event_log(evaluator):
    """events.py: episode ends of official evaluations are recorded with their seed commitment."""
    ev, n = evaluator, 3
    submitted = ev.harness.submit_batch_eval(FALLING, official=True, num_episodes=n)
    wait_for_batch(ev.harness, submitted.batch_id)
    result = ev.harness.get_eval_result(submitted.batch_id, finalize=True)
    lines = [json.loads(line) for line in ev.events.getvalue().splitlines()]
    (submit,) = [e for e in lines if e["kind"] == "batch_submitted"]
    assert submit["batch_id"] == submitted.batch_id
    assert submit["official"]
    assert submit["num_episodes"] == n
    ends = [e for e in lines if e["kind"] == "episode_end"]
    assert [e["index"] for e in ends] == list(range(n)), "one episode_end line per official batch episode"
    for line, rec in zip(ends, result.episodes, strict=True):
        assert line["seed_commitment"] == rec.seed_commitment.hex()


def test_get_eval_result_of_a_non_official_batch_from_the_harness(evaluator):
    submitted = evaluator.agent.submit_batch_eval(FALLING, num_episodes=2, seed=4)
    status = wait_for_batch(evaluator.agent, submitted.batch_id)
    assert evaluator.harness.get_eval_result(submitted.batch_id) == status.result


# -- queue limits --------------------------------------------------------------------------------


def test_pending_batch_limit_is_per_endpoint_and_resource_exhausted_until_the_queue_drains(make_evaluator):
    ev = make_evaluator(limits=Limits(max_pending_batches=1))
    long = ev.agent.submit_batch_eval(BALANCING, num_episodes=10_000, seed=0)
    with pytest.raises(AleEnvError) as info:
        ev.agent.submit_batch_eval(FALLING, num_episodes=1)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "queued" in info.value.details
    running = ev.agent.get_batch_eval_status(long.batch_id)
    assert running.state in (pb.BATCH_STATE_PENDING, pb.BATCH_STATE_RUNNING)
    assert running.episodes_done < running.num_episodes
    assert not running.HasField("result")
    # The harness's queue is its own: the agent's full queue does not touch it.
    own = ev.harness.submit_batch_eval(FALLING, num_episodes=1)
    assert wait_for_batch(ev.harness, own.batch_id).state == pb.BATCH_STATE_DONE

    partial = ev.harness.get_eval_result(long.batch_id, finalize=True)  # cancels the batch
    assert not partial.complete
    assert wait_for_batch(ev.agent, long.batch_id).state == pb.BATCH_STATE_FAILED
    again = ev.agent.submit_batch_eval(FALLING, num_episodes=1)
    assert wait_for_batch(ev.agent, again.batch_id).state == pb.BATCH_STATE_DONE


def test_many_small_agent_batches_do_not_grow_the_evaluators_memory_without_bound(make_evaluator):
    # issue 10 (evaluator report): every finished batch was kept, so an agent submitting many small
    # batches grew the evaluator without limit. The oldest finished agent batches are forgotten.
    ev = make_evaluator(limits=Limits(max_finished_batches=3))
    official = ev.harness.submit_batch_eval(FALLING, num_episodes=1)  # the harness's: never dropped
    wait_for_batch(ev.harness, official.batch_id)
    ids = []
    for i in range(8):
        ids.append(ev.agent.submit_batch_eval(FALLING, num_episodes=1, seed=i).batch_id)
        wait_for_batch(ev.agent, ids[-1])
    agent_kept = [b for b, job in ev.state.batches.items() if job.owner == "agent"]
    assert agent_kept == ids[-3:]
    assert code_of(ev.agent.get_batch_eval_status, ids[0]) == grpc.StatusCode.NOT_FOUND
    assert ev.harness.get_batch_eval_status(official.batch_id).state == pb.BATCH_STATE_DONE
    assert ev.agent.get_batch_eval_status(ids[-1]).state == pb.BATCH_STATE_DONE


def test_each_endpoint_queues_four_batches_and_runs_them_one_at_a_time(evaluator):
    ev = evaluator
    for client in (ev.agent, ev.harness):
        queued = [client.submit_batch_eval(BALANCING, num_episodes=10_000).batch_id for _ in range(4)]
        assert code_of(client.submit_batch_eval, FALLING, num_episodes=1) == grpc.StatusCode.RESOURCE_EXHAUSTED
        states = {ev.harness.get_batch_eval_status(b).state for b in queued}
        assert states <= {pb.BATCH_STATE_PENDING, pb.BATCH_STATE_RUNNING}
        assert pb.BATCH_STATE_PENDING in states, "an endpoint's jobs run one at a time"


# -- policies that do not fit the task -----------------------------------------------------------


@pytest.mark.parametrize(
    ("task_id", "policy", "message"),
    [
        pytest.param(
            "cartpole-balance",
            linear_policy(np.zeros((2, 3)), output="discrete"),
            "takes 3 observations",
            id="wrong-observation-dim",
        ),
        pytest.param(
            "cartpole-balance", linear_policy(np.zeros((2, 4)), output="clip"), "Discrete(2)", id="box-on-discrete"
        ),
        pytest.param(
            "cartpole-balance",
            linear_policy(np.zeros((3, 4)), output="discrete"),
            "Discrete(2)",
            id="too-many-discrete-outputs",
        ),
        pytest.param(
            "pendulum-lqr", linear_policy(np.zeros((2, 4)), output="discrete"), "Box of shape [1]", id="discrete-on-box"
        ),
        pytest.param(
            "pendulum-lqr", linear_policy(np.zeros((2, 4)), output="clip"), "Box of shape [1]", id="box-too-wide"
        ),
    ],
)
def test_a_policy_that_does_not_fit_the_task_is_invalid(make_evaluator, task_id, policy, message):
    ev = make_evaluator(task_id)
    for client in (ev.agent, ev.harness):
        with pytest.raises(AleEnvError) as info:
            client.submit_batch_eval(policy, num_episodes=1)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert message in info.value.details
    assert not ev.state.batches


# -- hostile artifacts -------------------------------------------------------------------------------


def _header_claiming(length: int, body: bytes = b"") -> bytes:
    return struct.pack("<Q", length) + body


def _too_many_parameters() -> bytes:
    # Within the byte limit (float32), beyond 2,000,000 parameters.
    shapes = [(1024, 4), (1024, 1024), (925, 1024), (2, 925)]
    tensors, layers = {}, []
    for i, (out, inp) in enumerate(shapes):
        tensors[f"w{i}"] = np.zeros((out, inp), dtype=np.float32)
        tensors[f"b{i}"] = np.zeros(out, dtype=np.float32)
        layers.append((f"w{i}", f"b{i}", "relu"))
    raw = artifact(tensors, architecture(layers))
    assert len(raw) < MAX_POLICY_BYTES
    return raw


def _nine_layers() -> bytes:
    tensors = {"w0": np.zeros((4, 4)), "b0": np.zeros(4)}
    layers = [("w0", "b0", "relu")] * 8 + [("w0", "b0", "identity")]
    return artifact(tensors, architecture(layers))


def _hostile_cases() -> list:
    valid = BALANCING
    nan_w = linear_tensors()
    nan_w["w"][0, 1] = np.nan
    inf_b = linear_tensors()
    inf_b["b"][1] = np.inf
    lying_shape = json.dumps(
        {
            "__metadata__": {"ale-policy": json.dumps(architecture([("w", "b", "identity")]))},
            "w": {"dtype": "F64", "shape": [1 << 31, 1 << 31], "data_offsets": [0, 64]},
            "b": {"dtype": "F64", "shape": [2], "data_offsets": [64, 80]},
        }
    ).encode()
    cases = [
        ("random-bytes", random.Random(0).randbytes(4096), "safetensors"),
        ("empty", b"", "too short"),
        ("truncated-data", valid[:-10], "not a valid safetensors file"),
        ("truncated-header", valid[:40], "header length is out of range"),
        ("huge-header-length", _header_claiming(2**64 - 1, b"{}"), "header length is out of range"),
        ("header-over-1mib", _header_claiming((1 << 20) + 1, b" " * ((1 << 20) + 1)), "header length is out of range"),
        ("header-not-json", _header_claiming(8, b"not json"), "safetensors header: not valid JSON"),
        ("header-not-an-object", _header_claiming(2, b"[]"), "header is not a JSON object"),
        ("pickle", pickle.dumps({"layer0.weight": np.zeros((2, 4))}), "safetensors"),
        ("no-metadata", safetensors.numpy.save(linear_tensors()), "ale-policy"),
        ("architecture-not-json", artifact(linear_tensors(), "{"), "policy architecture: not valid JSON"),
        ("architecture-a-list", artifact(linear_tensors(), "[1, 2]"), "policy architecture"),
        (
            "wrong-format",
            artifact(linear_tensors(), {**architecture([("w", "b", "identity")]), "format": "v0"}),
            "format",
        ),
        ("unknown-activation", artifact(linear_tensors(), architecture([("w", "b", "sigmoid")])), "activation"),
        ("extra-field", artifact(linear_tensors(), {**architecture([("w", "b", "identity")]), "code": "x"}), "extra"),
        ("nan-weights", artifact(nan_w, architecture([("w", "b", "identity")])), "NaN or infinity"),
        ("inf-bias", artifact(inf_b, architecture([("w", "b", "identity")])), "NaN or infinity"),
        (
            "float16",
            artifact(linear_tensors(dtype=np.float16), architecture([("w", "b", "identity")])),
            "float32 and float64",
        ),
        (
            "int-weights",
            artifact(linear_tensors(dtype=np.int64), architecture([("w", "b", "identity")])),
            "float32 and float64",
        ),
        ("too-many-layers", _nine_layers(), "1..8 layers"),
        ("no-layers", artifact({}, architecture([])), "1..8 layers"),
        ("too-many-parameters", _too_many_parameters(), "parameters exceeds the limit"),
        ("too-wide", artifact(linear_tensors(out=1025), architecture([("w", "b", "identity")])), "do not fit"),
        ("missing-tensor", artifact({"w": np.zeros((2, 4))}, architecture([("w", "b", "identity")])), "missing"),
        (
            "unused-tensor",
            artifact({**linear_tensors(), "payload": np.zeros(3)}, architecture([("w", "b", "identity")])),
            "not used",
        ),
        (
            "layer-shape-mismatch",
            artifact(linear_tensors(inp=5), architecture([("w", "b", "identity")])),
            "layer 0: weight takes 5 inputs, the previous layer gives 4",
        ),
        (
            "bad-normalizer-std",
            artifact(
                {**linear_tensors(), "m": np.zeros(4), "s": np.array([1.0, 0.0, 1.0, 1.0])},
                architecture([("w", "b", "identity")], normalizer={"mean": "m", "std": "s", "clip": 5.0}),
            ),
            "std must be positive",
        ),
        ("lying-tensor-shape", _header_claiming(len(lying_shape), lying_shape + bytes(80)), "not a valid safetensors"),
        ("oversize", bytes(MAX_POLICY_BYTES + 1), f"the limit is {MAX_POLICY_BYTES}"),
        (
            "box-without-squash",
            artifact(linear_tensors(), architecture([("w", "b", "identity")], output={"kind": "box"})),
            "squash",
        ),
    ]
    return [pytest.param(raw, message, id=name) for name, raw, message in cases]


@pytest.mark.parametrize(("raw", "message"), _hostile_cases())
def test_a_hostile_artifact_is_refused_with_a_clear_message(evaluator, raw, message):
    with pytest.raises(AleEnvError) as info:
        evaluator.agent.submit_batch_eval(raw, num_episodes=1)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details, info.value.details
    assert len(info.value.details) < 1000, "the message explains; it does not dump the artifact"
    assert not evaluator.state.batches, "a refused artifact is never queued"
    # The evaluator still takes a good artifact.
    good = evaluator.agent.submit_batch_eval(FALLING, num_episodes=1)
    assert wait_for_batch(evaluator.agent, good.batch_id).state == pb.BATCH_STATE_DONE


def test_the_policy_size_limit_is_the_evaluators(make_evaluator):
    ev = make_evaluator(limits=Limits(max_policy_bytes=len(FALLING) - 1))
    with pytest.raises(AleEnvError) as info:
        ev.agent.submit_batch_eval(FALLING, num_episodes=1)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"the limit is {len(FALLING) - 1}" in info.value.details


def test_an_unknown_batch_id_is_not_found(evaluator):
    for client in (evaluator.agent, evaluator.harness):
        assert code_of(client.get_batch_eval_status, "batch-nope") == grpc.StatusCode.NOT_FOUND
    assert code_of(evaluator.harness.get_eval_result, "batch-nope") == grpc.StatusCode.NOT_FOUND


def test_status_with_wait_ms_answers_when_the_batch_finishes(evaluator):
    policy = linear_policy(np.array([[0.0, 0, 0, 0], [0.0, 0.5, 10.0, 2.0]]), output="discrete")
    batch = evaluator.agent.submit_batch_eval(policy, num_episodes=3, seed=5)
    started = time.monotonic()
    status = evaluator.agent.get_batch_eval_status(batch.batch_id, wait_ms=10_000)
    assert status.state == pb.BATCH_STATE_DONE
    assert status.episodes_done == 3
    assert time.monotonic() - started < 9.0  # answered on completion, not at the deadline


def test_wait_ms_over_the_limit_is_refused(evaluator):
    policy = linear_policy(np.zeros((2, 4)), output="discrete")
    batch = evaluator.agent.submit_batch_eval(policy, num_episodes=1, seed=5)
    assert code_of(evaluator.agent.get_batch_eval_status, batch.batch_id, wait_ms=10_001) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )


# -- issue 10: hostile headers, non-finite outputs, the task's mode, the agent's phase and budget -------


def _with_header(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param(_with_header(b"[" * 200_000 + b"]" * 200_000), "nested deeper", id="header-200k-nested"),
        pytest.param(_with_header(b'{"__metadata__": {"ale-policy": 7}}'), "must be a string", id="ale-policy-number"),
        pytest.param(
            _with_header(b'{"__metadata__": {"ale-policy": "{\\"observation_dim\\": ' + b"9" * 5000 + b'}"}}'),
            "policy architecture: not valid JSON",
            id="architecture-integer-of-5000-digits",
        ),
        pytest.param(
            _with_header(b'{"__metadata__": {"ale-policy": "{}"}, "x": ' + b"9" * 5000 + b"}"),
            "safetensors header: not valid JSON",
            id="header-integer-of-5000-digits",
        ),
    ],
)
@pytest.mark.parametrize("role", ["agent", "harness"])
def test_submit_batch_eval_with_a_hostile_policy_header_is_invalid_argument_not_internal(evaluator, role, raw, message):
    """Point 13: these gave INTERNAL (RecursionError, TypeError, ValueError out of json.loads)."""
    client = evaluator.agent if role == "agent" else evaluator.harness
    with pytest.raises(AleEnvError) as info:
        client.submit_batch_eval(raw, official=role == "harness", num_episodes=1)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details
    assert not evaluator.state.batches


def _overflowing(inputs: int, outputs: int, *, nan: bool) -> list[tuple[np.ndarray, np.ndarray, str]]:
    """Two layers whose output is +inf (or, with ``nan``, inf - inf) for any small observation."""
    w1 = np.full((outputs, 2), 1e200)
    if nan:
        w1[:, 1] = -1e200
    return [(np.zeros((2, inputs)), np.full(2, 1e200), "identity"), (w1, np.zeros(outputs), "identity")]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy reports the overflow the policy is built to cause
@pytest.mark.parametrize("squash", ["clip", "tanh"])
def test_a_box_policy_whose_output_overflows_to_inf_aborts_with_policy_error_not_clipped(make_evaluator, squash):
    """Point 16: +inf on a Box output was clipped to the bound (tanh: squashed to it) and the episode ran on."""
    ev = make_evaluator("pendulum-lqr")
    policy = save_policy(_overflowing(4, 1, nan=False), output=squash)
    status = wait_for_batch(ev.agent, ev.agent.submit_batch_eval(policy, num_episodes=2, seed=0).batch_id)
    assert status.state == pb.BATCH_STATE_DONE, status.error
    assert [(e.aborted, e.abort_reason, e.length) for e in status.result.episodes] == [(True, "policy_error", 0)] * 2
    assert status.result.passed_episodes == 0


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("nan", [False, True], ids=["inf", "nan"])
@pytest.mark.parametrize("episodes", [2, 40], ids=["one-at-a-time", "side-by-side"])
def test_a_discrete_policy_whose_output_is_not_finite_aborts_with_policy_error(evaluator, nan, episodes):
    """Point 16: discrete outputs never aborted: the arg-max of [inf, inf] or [nan, nan] is action 0."""
    policy = save_policy(_overflowing(4, 2, nan=nan), output="discrete")
    status = wait_for_batch(evaluator.agent, evaluator.agent.submit_batch_eval(policy, num_episodes=episodes).batch_id)
    assert status.state == pb.BATCH_STATE_DONE, status.error
    reasons = {(e.aborted, e.abort_reason, e.length) for e in status.result.episodes}
    assert reasons == {(True, "policy_error", 0)}
    assert len(status.result.episodes) == episodes


def test_an_interactive_task_refuses_an_official_batch_and_records_no_batch_result(make_evaluator):
    """Point 17: an interactive task accepted an official SubmitBatchEval and recorded a mode=batch result."""
    ev = make_evaluator("pendulum-lqr")
    policy = linear_policy(np.array([[1.0, 10.0, 0.5, 1.0]]), output="clip")
    with pytest.raises(AleEnvError) as info:
        ev.harness.submit_batch_eval(policy, official=True, num_episodes=2)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "pendulum-lqr is an interactive task" in info.value.details
    assert "eval session" in info.value.details
    assert not ev.state.batches
    assert '"batch_submitted"' not in ev.events.getvalue()


def test_a_batch_task_refuses_official_environments_and_eval_sessions(evaluator):
    for call in (lambda: evaluator.harness.create_env(official=True),
                 lambda: evaluator.harness.start_eval_session("env-0000")):  # fmt: skip
        with pytest.raises(AleEnvError) as info:
            call()
        assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "cartpole-balance is a batch task" in info.value.details
    assert not evaluator.state.sessions
    assert not any(g.official for g in evaluator.state.groups.values())


def test_practice_batches_run_on_any_task_from_either_endpoint(make_evaluator):
    """The agent may try a policy artifact on an interactive task too (its own seeds, never official)."""
    ev = make_evaluator("pendulum-lqr")
    policy = linear_policy(np.array([[1.0, 10.0, 0.5, 1.0]]), output="clip")
    for client in (ev.agent, ev.harness):
        status = wait_for_batch(client, client.submit_batch_eval(policy, num_episodes=2, seed=3).batch_id)
        assert status.state == pb.BATCH_STATE_DONE, status.error
        assert status.result.mode == "batch"
        assert not status.result.official


def test_a_full_agent_queue_never_delays_or_refuses_the_official_batch(evaluator):
    """Point 10: an agent queued huge batches and left; the official batch sat at 0/3, or was refused."""
    ev = evaluator
    agent_jobs = [ev.agent.submit_batch_eval(BALANCING, num_episodes=10_000).batch_id for _ in range(4)]
    assert code_of(ev.agent.submit_batch_eval, FALLING, num_episodes=1) == grpc.StatusCode.RESOURCE_EXHAUSTED
    official = ev.harness.submit_batch_eval(FALLING, official=True, num_episodes=3)
    status = wait_for_batch(ev.harness, official.batch_id)
    assert status.state == pb.BATCH_STATE_DONE, status.error
    assert ev.harness.get_eval_result(official.batch_id, finalize=True).complete
    for batch_id in agent_jobs:
        ended = wait_for_batch(ev.agent, batch_id)
        assert ended.state == pb.BATCH_STATE_FAILED
        assert ended.error == "cancelled: the agent phase is over (the official evaluation started)"
        assert ended.episodes_done < 10_000


@pytest.mark.parametrize("official_call", ["CreateEnv", "StartEvalSession", "SubmitBatchEval"])
def test_the_first_official_call_on_the_harness_endpoint_ends_the_agent_phase(make_evaluator, official_call):
    ev = make_evaluator(mode="batch" if official_call == "SubmitBatchEval" else "interactive")
    running = ev.agent.submit_batch_eval(BALANCING, num_episodes=10_000).batch_id
    assert ev.harness.submit_batch_eval(FALLING, num_episodes=1)  # non-official: the agent's phase goes on
    assert ev.agent.get_batch_eval_status(running).state in (pb.BATCH_STATE_PENDING, pb.BATCH_STATE_RUNNING)
    if official_call == "CreateEnv":
        ev.harness.create_env(official=True)
    elif official_call == "StartEvalSession":
        assert code_of(ev.harness.start_eval_session, "env-0000") == grpc.StatusCode.NOT_FOUND
    else:
        ev.harness.submit_batch_eval(FALLING, official=True, num_episodes=1)
    assert wait_for_batch(ev.agent, running).error.startswith("cancelled: the agent phase is over")
    with pytest.raises(AleEnvError) as info:
        ev.agent.submit_batch_eval(FALLING, num_episodes=1)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "the agent phase is over" in info.value.details
    # The policy's own environments still work (an interactive policy may create them).
    env_id = ev.agent.create_env().env_id
    ev.agent.reset(env_id, seed=1)


def test_an_agent_batch_past_the_env_step_budget_is_stopped_and_more_work_refused(make_evaluator):
    """Point 10: the budget is enforced for batches too (counted as each episode ends)."""
    ev = make_evaluator(env_step_budget=2_000)
    env_id = ev.agent.create_env().env_id
    ev.agent.reset(env_id, seed=0)
    ev.agent.step(env_id, np.array([1]))
    batch = ev.agent.submit_batch_eval(BALANCING, num_episodes=100, seed=0)  # 500 steps an episode
    status = wait_for_batch(ev.agent, batch.batch_id)
    assert status.state == pb.BATCH_STATE_FAILED
    assert status.error.startswith("stopped: the agent's env-step budget of 2000 steps is used up")
    used = ev.state.budget.used
    assert 2_000 < used <= 2_000 + 1 + LOCKSTEP_SLOTS * 500, "the overshoot is at most the episodes in flight"
    assert status.episodes_done < 100
    for call in (lambda: ev.agent.step(env_id, np.array([1])),
                 lambda: ev.agent.submit_batch_eval(FALLING, num_episodes=1)):  # fmt: skip
        with pytest.raises(AleEnvError) as info:
            call()
        assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "env-step budget of 2000 steps is used up" in info.value.details
    assert ev.state.budget.used == used, "refused work takes no steps"
    # The harness is not the agent: its steps and batches are never refused for the agent's budget.
    harness_env = ev.harness.create_env().env_id
    ev.harness.reset(harness_env, seed=0)
    ev.harness.step(harness_env, np.array([1]))
    assert wait_for_batch(ev.harness, ev.harness.submit_batch_eval(FALLING, num_episodes=1).batch_id).state == (
        pb.BATCH_STATE_DONE
    )
