"""The recorder on its own: caps, budgets and the grammar's last word before a line is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ale.core.canonical import canonical_json
from ale.core.trajectory import ChainError, verify_chain
from ale.runner.recorder import CAPS, LineQueue, Recorder, clip_text

TASK = "cartpole-balance@1.0.0"


def _recorder(**kw: Any) -> tuple[Recorder, LineQueue]:
    queue = LineQueue()
    rec = Recorder(Path("unused"), queue, **kw)
    rec.emit("trusted_harness", "run_started", {"nonce": None, "run_id": "r", "tasks": [TASK]})
    return rec, queue


def _open_agent_phase(rec: Recorder) -> None:
    for kind in ("task_started", "evaluator_started", "agent_started"):
        rec.emit("trusted_harness", kind, {"task": TASK})


def _events(queue: LineQueue) -> list[dict[str, Any]]:
    """The lines written since the last call, as events."""
    lines, queue.pending = queue.pending, []
    return [json.loads(line) for line in lines]


def test_clip_text_keeps_whole_characters_and_says_how_many_bytes_were_cut() -> None:
    assert clip_text("abc", 3) == "abc"
    assert clip_text("abcdef", 4) == "abcd... [2 bytes cut]"
    assert clip_text("é" * 5, 5) == "éé... [6 bytes cut]"  # 10 bytes; a cut inside a character drops it
    assert clip_text("😀x", 3) == "... [5 bytes cut]"


def test_harness_event_out_of_order_is_refused_and_the_refusal_recorded() -> None:
    rec, receive = _recorder()
    assert rec.emit("trusted_harness", "task_finished", {"task": TASK}) is False
    events = _events(receive)
    assert [e["kind"] for e in events] == ["run_started", "refused_event"]
    refused = events[1]["data"]
    assert (refused["producer"], refused["kind"], refused["task"]) == ("trusted_harness", "task_finished", None)
    assert refused["reason"].startswith("out_of_order: ")


def test_an_evaluator_episode_end_twice_is_written_once() -> None:
    rec, receive = _recorder()
    _open_agent_phase(rec)
    for kind in ("agent_finished", "official_evaluation_started", "policy_artifact"):
        rec.emit("trusted_harness", kind, {"task": TASK})
    end = {"task": TASK, "session_id": "batch-1", "index": 0}
    assert rec.emit("trusted_evaluator", "episode_end", end, wall_time=1.0, monotonic=1.0) is True
    assert rec.emit("trusted_evaluator", "episode_end", end, wall_time=1.0, monotonic=1.0) is False
    kinds = [e["kind"] for e in _events(receive)]
    assert kinds[-2:] == ["episode_end", "refused_event"]


def test_strings_are_cut_to_the_producers_cap_and_deep_data_noted() -> None:
    rec, receive = _recorder()
    _open_agent_phase(rec)
    deep: Any = "bottom"
    for _ in range(80):
        deep = [deep]
    rec.emit("untrusted_agent", "note", {"text": "y" * (100 * 1024), "deep": deep})
    rec.emit("trusted_evaluator", "rpc", {"task": TASK, "env_id": "e" * 5000}, wall_time=1.0, monotonic=1.0)
    note, rpc = _events(receive)[-2:]
    cap = CAPS["untrusted_agent"].string_bytes
    assert note["data"]["text"] == "y" * cap + f"... [{100 * 1024 - cap} bytes cut]"
    assert "nested deeper than 64 levels" in json.dumps(note["data"]["deep"])
    assert rpc["data"]["env_id"].endswith(f"... [{5000 - CAPS['trusted_evaluator'].string_bytes} bytes cut]")


def test_data_whose_line_is_still_too_long_becomes_the_truncated_form() -> None:
    rec, receive = _recorder()
    _open_agent_phase(rec)
    data = {f"k{i}": "z" * 1000 for i in range(400)}  # 400 KB of short strings
    rec.emit("untrusted_agent", "note", data)
    (note,) = _events(receive)[-1:]
    truncated = note["data"]
    assert set(truncated) == {"truncated", "original_bytes", "json"}
    assert truncated["original_bytes"] == len(canonical_json(data))
    assert json.dumps(data, sort_keys=True, separators=(",", ":")).startswith(truncated["json"][:1000])
    assert len(canonical_json(note)) <= CAPS["untrusted_agent"].line_bytes


def test_a_channel_past_its_budget_counts_and_says_what_it_dropped() -> None:
    rec, receive = _recorder(budgets={"agent.stdout": 2000})
    _open_agent_phase(rec)
    rec.open_channel("agent", TASK)
    written = 0
    for i in range(100):
        if rec.admit("agent.stdout", 6):
            written += rec.emit("untrusted_agent", "stdout", {"text": f"line {i}"}, channel="agent.stdout")
    rec.close_channel("agent")
    events = _events(receive)
    kept = [e for e in events if e["kind"] == "stdout"]
    assert len(kept) == written
    assert 2000 <= sum(len(canonical_json(e)) + 1 for e in kept) < 2000 + 300
    (dropped,) = [e["data"] for e in events if e["kind"] == "events_dropped"]
    assert dropped == {"task": TASK, "channel": "agent.stdout", "budget_bytes": 2000, "events": 100 - written,
                       "bytes": 6 * (100 - written)}  # fmt: skip


def test_a_kept_incomplete_trajectory_verifies_only_as_incomplete() -> None:
    rec, receive = _recorder()
    _open_agent_phase(rec)
    rec.emit("trusted_harness", "run_failed", {"reason": "the evaluator died"})
    stream = b"".join(canonical_json(e) + b"\n" for e in _events(receive))
    assert verify_chain(stream, incomplete=True).events == 5
    with pytest.raises(ChainError) as err:
        verify_chain(stream)
    assert (err.value.reason, err.value.line) == ("missing_run_finished", 5)
    with pytest.raises(RuntimeError, match="refusal"):  # nothing may follow the end, not even a refusal
        rec.emit("trusted_harness", "task_started", {"task": TASK})
