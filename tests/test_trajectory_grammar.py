"""The trajectory's grammar (ale.core.grammar) checked on whole bundles.

Each hostile bundle is a real ``ale run`` bundle whose trajectory a forger changed, then recomputed
everything a forger can (seq, producer_sequence, every hash and link, the manifest's summary, the
integrity root), so that only the grammar can refuse it: offline (``ale inspect``'s checks) and by
the verifier's upload pipeline, with ``chain_invalid`` and the grammar's reason at the right
line. The real bundles pass the same checks.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyrage
import pytest
import verifier_helpers as h
from test_verifier_pipeline import _assert_rejected, _upload

from ale.core import grammar
from ale.core.trajectory import event_hash, verify_chain
from ale.core.verify import VerificationError
from ale.runner.inspect import offline_check

Events = list[dict[str, Any]]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> h.World:
    return h.get_world(tmp_path_factory, request.config)


def _forge(events: Events) -> Events:
    """Renumber seq and producer_sequence, keep each producer's clock from going back, re-chain."""
    head, per, clock = "0" * 64, {}, {}
    out = []
    for seq, event in enumerate(events):
        e = {k: v for k, v in copy.deepcopy(event).items() if k != "hash"}
        producer = e["producer"]
        e["seq"], e["producer_sequence"] = seq, per.get(producer, 0)
        e["monotonic"] = max(e["monotonic"], clock.get(producer, e["monotonic"]))
        per[producer], clock[producer] = e["producer_sequence"] + 1, e["monotonic"]
        e["prev_hash"] = head
        e["hash"] = head = event_hash(e)
        out.append(e)
    return out


def _index(events: Events, kind: str, *, last: bool = False) -> int:
    found = [i for i, e in enumerate(events) if e["kind"] == kind]
    assert found, f"the real trajectory has no {kind}"
    return found[-1] if last else found[0]


def _insert(events: Events, at: int, producer: str, kind: str, data: dict[str, Any]) -> None:
    near = events[at - 1]
    events.insert(at, {**copy.deepcopy(near), "producer": producer, "kind": kind, "data": data})


def _task(events: Events) -> str:
    return str(events[_index(events, "task_started")]["data"]["task"])


def _in_agent_phase(producer: str, kind: str) -> Callable[[Events], int]:
    def change(events: Events) -> int:
        at = _index(events, "agent_finished")
        _insert(events, at, producer, kind, {"task": _task(events), "text": "hidden"})
        return at

    return change


def _drop_last(events: Events) -> int:
    events.pop()
    return len(events) - 1  # the fault is named at the last line


def _drop_tail(events: Events) -> int:
    del events[_index(events, "official_evaluation_finished") :]
    return len(events) - 1


def _run_failed_instead(events: Events) -> int:
    events[-1] = {**events[-1], "kind": "run_failed", "data": {"reason": "pretend"}}
    return len(events) - 1


def _duplicate(kind: str, edit: Callable[[dict[str, Any]], None] = lambda d: None) -> Callable[[Events], int]:
    def change(events: Events) -> int:
        at = _index(events, kind)
        twin = copy.deepcopy(events[at])
        edit(twin["data"])
        events.insert(at + 1, twin)
        return at + 1

    return change


def _after(anchor: str, producer: str, kind: str, data: Callable[[Events], dict[str, Any]]) -> Callable[[Events], int]:
    def change(events: Events) -> int:
        at = _index(events, anchor) + 1
        _insert(events, at, producer, kind, data(events))
        return at

    return change


def _move_after(kind: str, anchor: str) -> Callable[[Events], int]:
    def change(events: Events) -> int:
        event = events.pop(_index(events, kind))
        at = _index(events, anchor) + 1
        events.insert(at, event)
        return at

    return change


def _finished_before_started(events: Events) -> int:
    events.insert(_index(events, "agent_started"), events.pop(_index(events, "agent_finished")))
    return _index(events, "agent_finished")


def _edit(kind: str, edit: Callable[[dict[str, Any]], None]) -> Callable[[Events], int]:
    def change(events: Events) -> int:
        at = _index(events, kind)
        edit(events[at]["data"])
        return at

    return change


#: name -> (the change, returning the 0-based index of the event at fault; the grammar's reason)
CASES: dict[str, tuple[Callable[[Events], int], str]] = {
    "truncated-tail-without-run-finished": (_drop_last, grammar.MISSING_RUN_FINISHED),
    "truncated-in-the-official-phase": (_drop_tail, grammar.MISSING_RUN_FINISHED),
    "run-failed-in-a-bundle": (_run_failed_instead, grammar.MISSING_RUN_FINISHED),
    "episode-end-duplicated-rehashed": (_duplicate("episode_end"), grammar.DUPLICATE_EVENT),
    "eval-result-duplicated-with-other-numbers": (
        _duplicate("eval_result", lambda d: d.update(headline_value=0, passed_episodes=0)),
        grammar.DUPLICATE_EVENT,
    ),
    "agent-thought-event": (_in_agent_phase("untrusted_agent", "thought"), grammar.HIDDEN_REASONING),
    "agent-reasoning-event": (_in_agent_phase("untrusted_agent", "reasoning"), grammar.HIDDEN_REASONING),
    "agent-chain-of-thought-event": (_in_agent_phase("untrusted_agent", "chain_of_thought"), grammar.HIDDEN_REASONING),
    "harness-thinking-event": (_in_agent_phase("trusted_harness", "thinking"), grammar.HIDDEN_REASONING),
    "derived-verifier-event-inside-a-bundle": (
        _in_agent_phase("derived_verifier", "note"),
        grammar.RESERVED_PRODUCER,
    ),
    "network-proxy-kind-it-does-not-emit": (
        _in_agent_phase("trusted_network_proxy", "request"),
        grammar.FORBIDDEN_KIND,
    ),
    "unknown-agent-kind": (_in_agent_phase("untrusted_agent", "made_up"), grammar.FORBIDDEN_KIND),
    "agent-claims-a-harness-kind": (_in_agent_phase("untrusted_agent", "agent_finished"), grammar.FORBIDDEN_KIND),
    "evaluator-kind-from-the-harness": (_in_agent_phase("trusted_harness", "eval_result"), grammar.FORBIDDEN_KIND),
    "agent-stdout-after-agent-finished": (
        _after("agent_finished", "untrusted_agent", "stdout", lambda ev: {"text": "late"}),
        grammar.OUT_OF_ORDER,
    ),
    "second-run-started": (
        _after("task_started", "trusted_harness", "run_started", lambda ev: copy.deepcopy(ev[0]["data"])),
        grammar.OUT_OF_ORDER,
    ),
    "event-after-run-finished": (
        lambda ev: (_insert(ev, len(ev), "trusted_harness", "task_started", {"task": _task(ev)}), len(ev) - 1)[1],
        grammar.OUT_OF_ORDER,
    ),
    "episode-end-after-official-evaluation-finished": (
        _move_after("episode_end", "official_evaluation_finished"),
        grammar.OUT_OF_ORDER,
    ),
    "agent-finished-before-agent-started": (_finished_before_started, grammar.OUT_OF_ORDER),
    "task-finished-names-another-task": (
        _edit("task_finished", lambda d: d.update(task="hopper-hop@1.0.0")),
        grammar.OUT_OF_ORDER,
    ),
    "run-started-lists-no-tasks": (
        lambda ev: (ev[0]["data"].pop("tasks"), 0)[1],
        grammar.BAD_KEY,
    ),
    "episode-end-without-an-index": (_edit("episode_end", lambda d: d.pop("index")), grammar.BAD_KEY),
}


def _hostile(world: h.World, case: str) -> tuple[dict[str, bytes], int, str]:
    change, reason = CASES[case]
    events = h.read_events(world.files("plain"))
    at = change(events)
    return h.seal(h.with_events(world.files("plain"), _forge(events))), at + 1, reason


@pytest.mark.parametrize("case", sorted(CASES))
def test_forbidden_trajectory_is_refused_offline_with_its_reason_and_line(world: h.World, case: str) -> None:
    files, line, reason = _hostile(world, case)
    identity = pyrage.x25519.Identity.generate()
    with pytest.raises(VerificationError) as err:
        offline_check(h.encrypt_files(files, str(identity.to_public())), str(identity))
    assert err.value.reason == "chain_invalid"
    assert f"line {line}: " in str(err.value), str(err.value)
    assert str(err.value).endswith(f"({reason})"), str(err.value)


@pytest.mark.parametrize("case", sorted(CASES))
def test_forbidden_trajectory_is_refused_by_the_verifier_pipeline(world: h.World, tmp_path: Path, case: str) -> None:
    files, line, reason = _hostile(world, case)
    reply, _ = _upload(world, tmp_path, h.encrypt_files(files, world.keys.recipient))
    _assert_rejected(reply, "chain_invalid")
    message = reply.json["reasons"][0]["message"]
    assert f"line {line}: " in message, message
    assert message.endswith(f"({reason})"), message


def test_control_a_forged_copy_of_the_real_trajectory_is_accepted(world: h.World, tmp_path: Path) -> None:
    """The forging is sound: re-chained without a change, the bundle passes."""
    files = h.seal(h.with_events(world.files("plain"), _forge(h.read_events(world.files("plain")))))
    reply, _ = _upload(world, tmp_path, h.encrypt_files(files, world.keys.recipient))
    assert reply.status == 201, reply.body


@pytest.mark.parametrize("name", ["plain", "site", "signed"])
def test_every_real_trajectory_follows_the_grammar(world: h.World, name: str) -> None:
    events = h.read_events(world.files(name))
    summary = verify_chain(h.events_bytes(events))  # chain and grammar
    assert summary.events == len(events)
    state = grammar.GrammarState()
    for number, e in enumerate(events, start=1):
        assert state.feed(number, *grammar.classify(e["producer"], e["kind"], e["data"])) is None
    assert state.finish(len(events)) is None
    assert {e["kind"] for e in events} & {"refused_event", "rejected_agent_event", "events_dropped"} == set()
