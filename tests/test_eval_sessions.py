"""Official interactive evaluations: eval sessions on hidden seeds, stepped by the agent through a handle.

The harness creates an official environment, opens a session and hands the
env_id to the agent's policy; the evaluator records every episode (seed
commitment, return, length, safety counts, aborts) and the harness reads the
authoritative result with GetEvalResult.
"""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
from evaluator_helpers import code_of, commitment_of

from ale import catalog
from ale.client import AleEnvError
from ale.env.v1 import env_pb2 as pb
from ale.protocol import decode_tensor
from ale_evaluator.domains import DOMAINS
from ale_evaluator.envs import make_env
from ale_evaluator.seeds import RunConfig, hidden_seed
from ale_evaluator.service import Limits

OTHER_CONFIG = RunConfig(run_id="test-run-0001", secret=bytes(range(1, 33)))


@pytest.fixture
def evaluator(make_evaluator):
    """CartPole's evaluator with the task made interactive: eval sessions on the cheapest simulator."""
    return make_evaluator("cartpole-balance", mode="interactive")


def falling(obs: np.ndarray) -> int:
    """Push toward the pole's lean only: the pole falls after a few dozen steps."""
    return int(obs[2] > 0)


def open_session(ev, num_episodes: int) -> pb.StartEvalSessionResponse:
    official = ev.harness.create_env(official=True)
    return ev.harness.start_eval_session(official.env_id, num_episodes=num_episodes)


def step(ev, env_id: str, action) -> tuple[np.ndarray, float, bool, bool, pb.StepResponse]:
    reply = ev.agent.step(env_id, np.asarray([action], dtype=np.int64))
    return (
        decode_tensor(reply.observation)[0],
        float(decode_tensor(reply.reward)[0]),
        bool(decode_tensor(reply.terminated)[0]),
        bool(decode_tensor(reply.truncated)[0]),
        reply,
    )


def play_to_end(ev, env_id: str, obs: np.ndarray) -> tuple[float, int, bool, pb.StepResponse]:
    """Run the falling policy to the episode's end; (return, length, terminated, last reply)."""
    total, length = 0.0, 0
    while True:
        obs, reward, terminated, truncated, reply = step(ev, env_id, falling(obs))
        total, length = total + reward, length + 1
        if terminated or truncated:
            return total, length, terminated, reply


def events(ev, kind: str) -> list[dict]:
    return [e for e in map(json.loads, ev.events.getvalue().splitlines()) if e["kind"] == kind]


# -- a complete session ------------------------------------------------------------------------


def test_a_complete_session_records_every_episode_with_its_seed_commitment(evaluator):
    ev, n = evaluator, 3
    session = open_session(ev, n)
    played = []
    for i in range(n):
        reset = ev.agent.reset(session.env_id)
        assert not reset.seed_ignored, "no seed was sent"
        assert reset.eval.session_id == session.session_id
        assert (reset.eval.episode_index, reset.eval.episodes_done, reset.eval.num_episodes) == (i, i, n)
        total, length, terminated, last = play_to_end(ev, session.env_id, decode_tensor(reset.observation)[0])
        assert last.eval.episodes_done == i + 1
        played.append((total, length, terminated))

    result = ev.harness.get_eval_result(session.session_id, finalize=True)
    task = ev.state.task
    assert result.session_id == session.session_id
    assert result.run_id == ev.config.run_id
    assert (result.task_id, result.task_version, result.task_digest) == (
        "cartpole-balance",
        task.spec.version,
        task.digest,
    )
    assert result.mode == "interactive"
    assert result.official
    assert result.complete
    assert result.num_episodes == n
    assert result.passed_episodes == n
    assert [e.index for e in result.episodes] == list(range(n))
    for rec, (total, length, terminated) in zip(result.episodes, played, strict=True):
        seed = hidden_seed(ev.config, "cartpole-balance", rec.index)
        assert rec.seed_commitment == commitment_of(ev.config, seed)
        assert (rec.episode_return, rec.length, rec.terminated) == (total, length, terminated)
        assert not rec.aborted
        assert rec.abort_reason == ""
        assert rec.headline_value == total, "cartpole's headline is the episode return"
        assert rec.safety_counts["falls"] == int(terminated)
    assert result.headline_metric == "mean_return"
    assert result.headline_direction == "higher"
    assert result.headline_value == pytest.approx(sum(p[0] for p in played) / n)
    falls = next(s for s in result.safety if s.name == "falls")
    assert falls.count == sum(p[2] for p in played)
    assert falls.rate == pytest.approx(falls.count / n)

    ends = events(ev, "episode_end")
    assert [(e["index"], e["aborted"]) for e in ends] == [(i, False) for i in range(n)]
    for e, rec in zip(ends, result.episodes, strict=True):
        assert e["seed_commitment"] == rec.seed_commitment.hex()
        assert e["length"] == rec.length
        assert e["session_id"] == session.session_id
    (summary,) = events(ev, "eval_result")
    assert summary["complete"]
    assert summary["passed_episodes"] == n


def test_official_episodes_start_from_the_hidden_seeds(evaluator):
    ev, n = evaluator, 3
    session = open_session(ev, n)
    local = make_env(catalog.get_task("cartpole-balance"))
    for i in range(n):
        obs = decode_tensor(ev.agent.reset(session.env_id, seed=i).observation)[0]
        expected, _ = local.reset(seed=hidden_seed(ev.config, "cartpole-balance", i))
        assert obs.tobytes() == expected.tobytes()
    local.close()


def test_client_seeds_are_ignored_in_an_eval_session(make_evaluator):
    n = 3
    first, second = make_evaluator(mode="interactive"), make_evaluator(mode="interactive")
    other_secret = make_evaluator(mode="interactive", config=OTHER_CONFIG)

    def first_observations(ev, seeds):
        session = open_session(ev, n)
        out = []
        for seed in seeds:
            reply = ev.agent.reset(session.env_id, seed=seed)
            assert reply.seed_ignored == (seed is not None)
            out.append(decode_tensor(reply.observation).tobytes())
        return out

    a = first_observations(first, [1, 2, 3])
    b = first_observations(second, [999, None, 2**64 - 1])
    c = first_observations(other_secret, [1, 2, 3])
    assert a == b, "the same run configuration gives the same hidden seeds, whatever the client sends"
    assert len(set(a)) == n
    assert all(x != y for x, y in zip(a, c, strict=True)), "another secret gives other hidden seeds"


def test_a_second_session_of_the_same_run_replays_the_same_hidden_seeds(evaluator):
    ev, n = evaluator, 2

    def run_session():
        session = open_session(ev, n)
        firsts = [decode_tensor(ev.agent.reset(session.env_id, seed=i * 17).observation).tobytes() for i in range(n)]
        result = ev.harness.get_eval_result(session.session_id, finalize=True)
        return session.session_id, firsts, [e.seed_commitment for e in result.episodes]

    first_id, first_obs, first_commitments = run_session()
    second_id, second_obs, second_commitments = run_session()
    assert first_id != second_id
    assert first_obs == second_obs
    assert first_commitments == second_commitments
    assert len(set(first_commitments)) == n


def test_reset_replies_carry_session_progress_and_step_replies_count_ended_episodes(evaluator):
    ev = evaluator
    session = open_session(ev, 2)
    reset = ev.agent.reset(session.env_id)
    _, _, _, _, reply = step(ev, session.env_id, 1)
    assert reply.eval.session_id == session.session_id
    assert (reply.eval.episode_index, reply.eval.episodes_done, reply.eval.num_episodes) == (0, 0, 2)
    _, _, _, last = play_to_end(ev, session.env_id, decode_tensor(reset.observation)[0])
    assert (last.eval.episode_index, last.eval.episodes_done) == (0, 1)


# -- aborted episodes ---------------------------------------------------------------------------


def test_aborted_episodes_have_their_reason_score_worst_and_do_not_pass(evaluator):
    ev, n = evaluator, 4
    session = open_session(ev, n)
    worst = DOMAINS["cartpole"].worst
    # Episode 0 runs to its end.
    reset = ev.agent.reset(session.env_id)
    total0, length0, _, _ = play_to_end(ev, session.env_id, decode_tensor(reset.observation)[0])
    # Episode 1 is abandoned by a Reset after three steps.
    ev.agent.reset(session.env_id)
    for _ in range(3):
        step(ev, session.env_id, 1)
    ev.agent.reset(session.env_id)
    # Episode 2 is running (two steps) when the harness finalizes; episode 3 never starts.
    for _ in range(2):
        step(ev, session.env_id, 0)
    result = ev.harness.get_eval_result(session.session_id, finalize=True)

    recs = {e.index: e for e in result.episodes}
    assert sorted(recs) == list(range(n))
    assert not recs[0].aborted
    assert recs[0].length == length0
    assert recs[0].headline_value == total0
    expected = {1: ("reset_mid_episode", 3), 2: ("session_closed", 2), 3: ("not_started", 0)}
    for index, (reason, length) in expected.items():
        rec = recs[index]
        assert rec.aborted, rec
        assert rec.abort_reason == reason
        assert rec.length == length
        assert rec.episode_return == float(length)
        assert rec.headline_value == worst, "an aborted episode scores the domain's worst value"
        assert not rec.success
        assert not rec.terminated
        assert not rec.truncated
        assert rec.seed_commitment == commitment_of(ev.config, hidden_seed(ev.config, "cartpole-balance", index))
        assert set(rec.safety_counts) == {"falls", "track_edge_steps"}
    assert result.complete
    assert result.passed_episodes == 1
    assert result.headline_value == pytest.approx((total0 + 3 * worst) / n)


def test_an_aborted_reacher_episode_contributes_the_worst_distance(make_evaluator):
    ev = make_evaluator("reacher-jacobian")
    official = ev.harness.create_env(official=True)
    session = ev.harness.start_eval_session(official.env_id, num_episodes=2)
    zero = np.zeros((1, 2), dtype=np.float32)
    ev.agent.reset(session.env_id)
    done, length = False, 0
    while not done:
        reply = ev.agent.step(session.env_id, zero)
        done = bool(decode_tensor(reply.terminated)[0] or decode_tensor(reply.truncated)[0])
        length += 1
    ev.agent.reset(session.env_id)
    ev.agent.step(session.env_id, zero)
    result = ev.harness.get_eval_result(session.session_id, finalize=True)
    finished, aborted = result.episodes
    assert not finished.aborted
    assert finished.length == length == 50
    assert 0.0 < finished.headline_value < DOMAINS["reacher"].worst
    assert aborted.aborted
    assert aborted.abort_reason == "session_closed"
    assert aborted.headline_value == DOMAINS["reacher"].worst == 0.5
    assert result.headline_direction == "lower"
    assert result.passed_episodes == 1
    assert result.headline_value == pytest.approx((finished.headline_value + 0.5) / 2)


def test_partial_result_counts_unrecorded_episodes_as_worst(evaluator):
    ev, n = evaluator, 3
    session = open_session(ev, n)
    reset = ev.agent.reset(session.env_id)
    total, _, _, _ = play_to_end(ev, session.env_id, decode_tensor(reset.observation)[0])
    result = ev.harness.get_eval_result(session.session_id)
    assert not result.complete
    assert result.num_episodes == n
    assert [e.index for e in result.episodes] == [0]
    assert result.passed_episodes == 1
    assert result.headline_value == pytest.approx(total / n)
    # Reading without finalize changes nothing: the session goes on.
    assert ev.agent.reset(session.env_id).eval.episode_index == 1
    assert not events(ev, "eval_result"), "only a finalizing read is logged as the result"


# -- preconditions ------------------------------------------------------------------------------


def test_reset_after_all_episodes_fails_with_failed_precondition(evaluator):
    ev = evaluator
    session = open_session(ev, 2)
    for _ in range(2):
        reset = ev.agent.reset(session.env_id)
        play_to_end(ev, session.env_id, decode_tensor(reset.observation)[0])
    with pytest.raises(AleEnvError) as info:
        ev.agent.reset(session.env_id)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "complete" in info.value.details
    assert ev.harness.get_eval_result(session.session_id).passed_episodes == 2


def test_step_after_the_episode_ended_fails_until_reset(evaluator):
    ev = evaluator
    session = open_session(ev, 2)
    reset = ev.agent.reset(session.env_id)
    play_to_end(ev, session.env_id, decode_tensor(reset.observation)[0])
    assert code_of(ev.agent.step, session.env_id, np.array([1])) == grpc.StatusCode.FAILED_PRECONDITION
    ev.agent.reset(session.env_id)
    step(ev, session.env_id, 1)
    result = ev.harness.get_eval_result(session.session_id)
    assert len(result.episodes) == 1
    assert result.episodes[0].length >= 1


def test_step_before_the_first_reset_fails(evaluator):
    session = open_session(evaluator, 1)
    assert code_of(evaluator.agent.step, session.env_id, np.array([1])) == grpc.StatusCode.FAILED_PRECONDITION


def test_official_env_runs_only_inside_a_session(evaluator):
    env_id = evaluator.harness.create_env(official=True).env_id
    assert code_of(evaluator.harness.reset, env_id) == grpc.StatusCode.FAILED_PRECONDITION
    assert code_of(evaluator.harness.reset, env_id, seed=5) == grpc.StatusCode.FAILED_PRECONDITION
    assert code_of(evaluator.harness.step, env_id, np.array([1])) == grpc.StatusCode.FAILED_PRECONDITION
    assert evaluator.harness.get_spec(env_id).official


def test_official_env_has_one_copy_and_no_autoreset(evaluator):
    harness = evaluator.harness
    assert code_of(harness.create_env, official=True, num_envs=2) == grpc.StatusCode.INVALID_ARGUMENT
    code = code_of(harness.create_env, official=True, autoreset_mode=pb.AUTORESET_MODE_SAME_STEP)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    spec = harness.create_env(official=True, num_envs=1).spec
    assert spec.num_envs == 1
    assert spec.autoreset_mode == pb.AUTORESET_MODE_DISABLED
    assert spec.official


def test_start_eval_session_checks_its_environment(make_evaluator):
    ev = make_evaluator(limits=Limits(max_episodes=10), mode="interactive")
    harness = ev.harness
    plain = harness.create_env().env_id
    assert code_of(harness.start_eval_session, plain, 1) == grpc.StatusCode.FAILED_PRECONDITION
    assert code_of(harness.start_eval_session, "env-nope", 1) == grpc.StatusCode.NOT_FOUND
    official = harness.create_env(official=True).env_id
    assert code_of(harness.start_eval_session, official, 11) == grpc.StatusCode.INVALID_ARGUMENT
    harness.start_eval_session(official, 2)
    assert code_of(harness.start_eval_session, official, 2) == grpc.StatusCode.FAILED_PRECONDITION


def test_start_eval_session_defaults_to_the_official_episode_count(evaluator):
    session = open_session(evaluator, 0)
    official_episodes = catalog.get_task("cartpole-balance").spec.official_episodes
    assert session.num_episodes == official_episodes
    assert evaluator.agent.reset(session.env_id).eval.num_episodes == official_episodes


def test_get_eval_result_of_an_unknown_session_is_not_found(evaluator):
    assert code_of(evaluator.harness.get_eval_result, "session-nope") == grpc.StatusCode.NOT_FOUND
    assert code_of(evaluator.harness.get_eval_result, "session-nope", finalize=True) == grpc.StatusCode.NOT_FOUND


# -- finalize -------------------------------------------------------------------------------------


def test_finalize_releases_the_environment_and_the_result_stays_readable(evaluator):
    ev = evaluator
    session = open_session(ev, 2)
    ev.agent.reset(session.env_id)
    step(ev, session.env_id, 1)
    result = ev.harness.get_eval_result(session.session_id, finalize=True)
    for call in (
        lambda: ev.agent.reset(session.env_id),
        lambda: ev.agent.step(session.env_id, np.array([1])),
        lambda: ev.harness.reset(session.env_id),
        lambda: ev.harness.get_spec(session.env_id),
    ):
        with pytest.raises(AleEnvError) as info:
            call()
        assert info.value.code == grpc.StatusCode.NOT_FOUND
        assert "finalized" in info.value.details
    assert ev.harness.get_eval_result(session.session_id) == result
    assert ev.harness.get_eval_result(session.session_id, finalize=True) == result


# -- the record is authoritative and logged ------------------------------------------------------


def test_every_episode_end_including_aborts_is_in_the_event_log(evaluator):
    """Each episode of a finalized session has exactly one episode_end event matching its record."""
    ev, n = evaluator, 3
    session = open_session(ev, n)
    ev.agent.reset(session.env_id)
    step(ev, session.env_id, 1)
    ev.agent.reset(session.env_id)  # aborts episode 0: reset_mid_episode
    step(ev, session.env_id, 1)
    result = ev.harness.get_eval_result(session.session_id, finalize=True)  # 1: session_closed, 2: not_started
    logged = {e["index"]: e for e in events(ev, "episode_end")}
    assert len(events(ev, "episode_end")) == n
    assert sorted(logged) == list(range(n)), f"episode_end events for indices {sorted(logged)} of {n}"
    for rec in result.episodes:
        line = logged[rec.index]
        assert line["seed_commitment"] == rec.seed_commitment.hex()
        assert line["aborted"] is True
        assert line["abort_reason"] == rec.abort_reason


def test_a_reported_episode_record_never_changes(evaluator):
    """A Reset refused past the last episode must not leave a record that later Steps rewrite."""
    ev, n = evaluator, 2
    session = open_session(ev, n)
    ev.agent.reset(session.env_id)
    ev.agent.reset(session.env_id)  # episode 1, the last, is now running
    step(ev, session.env_id, 1)
    assert code_of(ev.agent.reset, session.env_id) == grpc.StatusCode.FAILED_PRECONDITION
    before = {e.index: e for e in ev.harness.get_eval_result(session.session_id).episodes}
    for _ in range(500):
        try:
            _, _, terminated, truncated, _ = step(ev, session.env_id, 1)
        except AleEnvError as exc:
            refusal = exc.code
            break
        if terminated or truncated:
            refusal = None
            break
    assert refusal in (None, grpc.StatusCode.FAILED_PRECONDITION)
    after = {e.index: e for e in ev.harness.get_eval_result(session.session_id, finalize=True).episodes}
    for index, rec in before.items():
        assert after[index] == rec, f"episode {index} changed after it was reported"
