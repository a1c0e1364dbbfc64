"""Hidden seeds and the evaluator secret never leave the evaluator.

A whole run's worth of traffic (an official interactive session driven over
the agent endpoint, an official batch, non-official practice, refused
requests) is recorded reply by reply; every reply (serialized and as text),
every error message, the event log, the captured log records and the
process's stdout/stderr are searched for the hidden seeds in every encoding
and for the secret. Only the seed *commitments* may appear.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import time

import grpc
import numpy as np
import pytest

from ale.client import AleEnvClient, AleEnvError, RemoteEnv
from ale.env.v1 import env_pb2 as pb
from ale.policy import linear_policy
from ale_evaluator import seeds
from ale_evaluator.seeds import RunConfig, RunConfigError, hidden_seed

TASK = "cartpole-balance"
# A secret with no structure, so a chance match is impossible and a real one unmistakable.
SECRET_CONFIG = RunConfig(run_id="secrecy-run.7", secret=hashlib.sha256(b"ale secrecy test").digest())
FALLING = linear_policy(np.array([[0.0, 0.0, -1.0, 0.0], [0.0, 0.0, 1.0, 0.0]]), output="discrete")


class RecordingClient(AleEnvClient):
    """An AleEnvClient that keeps every reply and every error it receives."""

    def __init__(self, target: str, transcript: list[tuple[bytes, str]]) -> None:
        super().__init__(target, timeout=30)
        self.transcript = transcript

    def _call(self, method, request):
        try:
            reply = super()._call(method, request)
        except AleEnvError as exc:
            self.transcript.append((exc.details.encode(), f"{method} error {exc}"))
            raise
        self.transcript.append((reply.SerializeToString(), f"{method} reply {reply}"))
        return reply


def seed_needles(seed: int) -> tuple[list[bytes], list[str]]:
    """A seed as raw bytes (big- and little-endian) and as text (decimal and hex)."""
    be, le = seed.to_bytes(8, "big"), seed.to_bytes(8, "little")
    return [be, le], [str(seed), f"{seed:x}", be.hex(), le.hex()]


def secret_needles(secret: bytes) -> tuple[list[bytes], list[str]]:
    return [secret], [secret.hex(), base64.b64encode(secret).decode(), base64.urlsafe_b64encode(secret).decode()]


def find_leaks(sources: dict[str, tuple[bytes, str]], needles: dict[str, tuple[list[bytes], list[str]]]) -> list[str]:
    leaks = []
    for where, (raw, text) in sources.items():
        lowered = text.lower()
        for what, (raw_needles, text_needles) in needles.items():
            hits = [n.hex() for n in raw_needles if n in raw or n in text.encode("utf-8", "surrogateescape")]
            hits += [n for n in text_needles if n.lower() in lowered]
            if hits:
                leaks.append(f"{what} found in {where}: {hits}")
    return leaks


def expect_error(fn, *args, **kwargs) -> grpc.StatusCode:
    with pytest.raises(AleEnvError) as info:
        fn(*args, **kwargs)
    return info.value.code


def wait_done(client: AleEnvClient, batch_id: str) -> None:
    deadline = time.monotonic() + 30
    while client.get_batch_eval_status(batch_id).state not in (pb.BATCH_STATE_DONE, pb.BATCH_STATE_FAILED):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def run_a_whole_evaluation(ev, batch_ev, transcript) -> tuple[list[pb.EvalResult], int]:
    """Everything a run does, over recording clients; returns the official results and episode count.

    ``ev`` runs the task as an interactive one (an eval session), ``batch_ev`` as a batch one (an
    official batch): the task's mode decides which official path an evaluator takes.
    """
    agent = RecordingClient(ev.running.agent_address, transcript)
    harness = RecordingClient(ev.running.harness_address, transcript)
    batch_agent = RecordingClient(batch_ev.running.agent_address, transcript)
    batch_harness = RecordingClient(batch_ev.running.harness_address, transcript)
    n = 5
    try:
        # Practice on the agent's own environment.
        practice = agent.create_env(num_envs=2, autoreset_mode=pb.AUTORESET_MODE_SAME_STEP).env_id
        agent.reset(practice, seed=3)
        for _ in range(30):
            agent.step(practice, np.array([1, 0], dtype=np.int64))
        agent.get_spec()

        # The official interactive session, stepped through the handle.
        official = harness.create_env(official=True)
        session = harness.start_eval_session(official.env_id, num_episodes=n)
        policy_env = RemoteEnv(ev.running.agent_address, env_id=session.env_id, client=agent)
        for episode in range(n - 1):
            obs, info = policy_env.reset(seed=episode)
            assert info["eval"]["episode_index"] == episode
            for _ in range(500 if episode < 2 else 3):  # episodes 2 and 3 are abandoned mid-way
                obs, _, terminated, truncated, _ = policy_env.step(int(obs[2] > 0))
                if terminated or truncated:
                    break
            if episode == 0:
                expect_error(agent.step, session.env_id, np.array([1]))  # finished: Reset first
        # Refused requests on the official environment, with the seeds in play.
        expect_error(agent.step, session.env_id, np.array([7]))
        expect_error(agent.step, session.env_id, np.array([0.5]))
        expect_error(agent.start_eval_session, session.env_id, 1)
        expect_error(agent.get_eval_result, session.session_id)
        expect_error(harness.start_eval_session, session.env_id, 1)
        harness.get_spec(session.env_id)
        harness.get_eval_result(session.session_id)
        interactive = harness.get_eval_result(session.session_id, finalize=True)
        expect_error(agent.reset, session.env_id)

        # A non-official batch (practice), then the official one.
        own = batch_agent.submit_batch_eval(FALLING, num_episodes=2, seed=77)
        wait_done(batch_agent, own.batch_id)
        batch = batch_harness.submit_batch_eval(FALLING, official=True, num_episodes=n)
        wait_done(batch_harness, batch.batch_id)
        expect_error(batch_agent.get_batch_eval_status, batch.batch_id)
        batch_result = batch_harness.get_eval_result(batch.batch_id, finalize=True)
    finally:
        for client in (agent, harness, batch_agent, batch_harness):
            client.close()
    return [interactive, batch_result], n


def test_no_reply_log_or_output_reveals_a_hidden_seed_or_the_secret(make_evaluator, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    ev = make_evaluator(TASK, config=SECRET_CONFIG, mode="interactive")
    batch_ev = make_evaluator(TASK, config=SECRET_CONFIG)
    transcript: list[tuple[bytes, str]] = []
    results, n = run_a_whole_evaluation(ev, batch_ev, transcript)
    ev.running.stop(0)  # flush everything the evaluator would write
    batch_ev.running.stop(0)
    out, err = capfd.readouterr()

    assert len(transcript) > 100
    assert [e.abort_reason for e in results[0].episodes] == [
        "",
        "",
        "reset_mid_episode",
        "session_closed",
        "not_started",
    ]
    sources: dict[str, tuple[bytes, str]] = {f"reply {i} ({t[1][:40]!r})": t for i, t in enumerate(transcript)}
    events = ev.events.getvalue() + batch_ev.events.getvalue()
    sources["event log"] = (events.encode(), events)
    logs = "\n".join(f"{r.name} {r.levelname} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    sources["log records"] = (logs.encode(), logs)
    sources["stdout"] = (out.encode(), out)
    sources["stderr"] = (err.encode(), err)

    needles = {f"hidden seed {i}": seed_needles(hidden_seed(SECRET_CONFIG, TASK, i)) for i in range(n + 4)}
    needles["secret"] = secret_needles(SECRET_CONFIG.secret)
    assert find_leaks(sources, needles) == []

    # The search itself works: the commitments the harness receives are in the transcript and the log.
    commitment = seeds.commitment(SECRET_CONFIG, hidden_seed(SECRET_CONFIG, TASK, 0))
    assert any(commitment in raw for raw, _ in transcript)
    assert commitment.hex() in events
    planted = {"planted": (b"x" + hidden_seed(SECRET_CONFIG, TASK, 1).to_bytes(8, "little"), "")}
    assert [leak.split(" found")[0] for leak in find_leaks(planted, needles)] == ["hidden seed 1"]


def test_each_record_commits_to_its_hidden_seed_with_the_documented_formula(make_evaluator):
    ev = make_evaluator(TASK, config=SECRET_CONFIG, mode="interactive")
    session = ev.harness.start_eval_session(ev.harness.create_env(official=True).env_id, num_episodes=3)
    ev.agent.reset(session.env_id)
    result = ev.harness.get_eval_result(session.session_id, finalize=True)
    batch_ev = make_evaluator(TASK, config=SECRET_CONFIG)
    batch = batch_ev.harness.submit_batch_eval(FALLING, official=True, num_episodes=3)
    wait_done(batch_ev.harness, batch.batch_id)
    batch_result = batch_ev.harness.get_eval_result(batch.batch_id)
    for res in (result, batch_result):
        assert len(res.episodes) == 3
        for rec in res.episodes:
            seed = hidden_seed(SECRET_CONFIG, TASK, rec.index)
            expected = hashlib.sha256(
                seed.to_bytes(8, "big") + SECRET_CONFIG.run_id.encode("utf-8") + SECRET_CONFIG.secret
            ).digest()
            assert rec.seed_commitment == expected == seeds.commitment(SECRET_CONFIG, seed)
    assert len({rec.seed_commitment for rec in result.episodes}) == 3


def test_hidden_seeds_follow_the_documented_hmac_derivation():
    for i in (0, 1, 99):
        msg = (
            b"ale/hidden-seed/v1\x00"
            + SECRET_CONFIG.run_id.encode()
            + b"\x00"
            + TASK.encode()
            + b"\x00"
            + str(i).encode()
        )
        digest = hmac.new(SECRET_CONFIG.secret, msg, hashlib.sha256).digest()
        assert hidden_seed(SECRET_CONFIG, TASK, i) == int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)
    assert hidden_seed(SECRET_CONFIG, TASK, 0) != hidden_seed(SECRET_CONFIG, "pendulum-lqr", 0)
    other_run = RunConfig(run_id="secrecy-run.8", secret=SECRET_CONFIG.secret)
    assert hidden_seed(SECRET_CONFIG, TASK, 0) != hidden_seed(other_run, TASK, 0)


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"\xff\xfe" + SECRET_CONFIG.secret, id="not-utf8"),
        pytest.param(b'{"run_id": "r", "secret": "' + SECRET_CONFIG.secret.hex().encode() + b'ab"}', id="too-long"),
        pytest.param(b'{"run_id": "r", "secret": "' + SECRET_CONFIG.secret.hex()[:-1].encode() + b'g"}', id="not-hex"),
        pytest.param(b'["' + SECRET_CONFIG.secret.hex().encode() + b'"]', id="a-list"),
        pytest.param(b'{"run_id": 5, "secret": "' + SECRET_CONFIG.secret.hex().encode() + b'"}', id="run-id-not-str"),
        pytest.param(b'{"run_id": "r", "secret": "' + SECRET_CONFIG.secret.hex().encode() + b'", "x": 0}', id="extra"),
        pytest.param(b'{"run_id": "r", "secret": "' + b"0" * 5000 + b'"}', id="oversized"),
    ],
)
def test_a_refused_run_config_message_quotes_nothing_of_the_input(raw):
    with pytest.raises(RunConfigError) as info:
        RunConfig.from_json(raw)
    message = str(info.value)
    assert SECRET_CONFIG.secret.hex()[:16] not in message
    assert "000000" not in message
    assert len(message) < 120


def test_run_config_never_shows_its_secret():
    text = repr(SECRET_CONFIG) + str(SECRET_CONFIG)
    assert SECRET_CONFIG.secret.hex() not in text
    assert "redacted" in text
    bad = b'{"run_id": "x", "secret": "' + b"ab" * 31 + b'zz"}'
    with pytest.raises(RunConfigError) as info:
        RunConfig.from_json(bad)
    assert "ab" * 31 not in str(info.value)
    with pytest.raises(RunConfigError) as info:
        RunConfig.from_json(b'{"run_id": "bad id!", "secret": "' + SECRET_CONFIG.secret.hex().encode() + b'"}')
    assert SECRET_CONFIG.secret.hex() not in str(info.value)
