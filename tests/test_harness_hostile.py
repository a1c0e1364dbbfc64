"""Hostile agents through the real harness: every run ends with a bundle the offline checks (``ale
inspect``) accept, within the site's limits, with what was refused, cut or dropped recorded.

Each test is named for the defect an independent test found (issue 10, points 7, 8, 9 and 11) or
for its class. The agents are ``python -c`` programs, as in tests/test_harness_faults.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyrage
import pytest
import trio
from test_harness_faults import PENDULUM, Run, _options, _policy, run_harness

from ale.core import bundle, grammar
from ale.core.canonical import canonical_json
from ale.core.verify import Report
from ale.protocol import cut
from ale.runner import bundle_writer
from ale.runner.harness import EvaluatorTail
from ale.runner.inspect import offline_check
from ale.runner.recorder import BUDGETS, CAPS, open_recorder
from ale.schemas import validator
from ale_evaluator.events import MAX_STRING_CHARS

SITE_LIMIT = bundle.Limits().max_ciphertext
EVENT_FD = "import os, sys\nfd = int(os.environ['ALE_EVENT_FD'])\n"


async def _bundled(options: Any, tmp_path: Path) -> tuple[Run, bytes, Report]:
    """Run, write the bundle, and check it as ``ale inspect`` does."""
    identity = pyrage.x25519.Identity.generate()
    written: list[Path] = []

    def write(record: Any) -> None:
        path, _ = bundle_writer.write_bundle(record, [str(identity.to_public())], tmp_path)
        written.append(path)

    run = await run_harness(options, before_cleanup=write)
    (path,) = written
    data = await trio.Path(path).read_bytes()
    assert len(data) <= SITE_LIMIT, f"a bundle of {len(data)} bytes: the site takes at most {SITE_LIMIT}"
    report = offline_check(data, str(identity))
    assert report.chain.events == len(run.events)
    events = validator("trajectory_event")
    for number, event in enumerate(run.events, start=1):  # what was cut or refused still has its schema
        errors = [f"{e.json_path}: {e.message[:200]}" for e in events.iter_errors(event)]
        assert errors == [], f"line {number} ({event['producer']} {event['kind']}): {errors}"
    assert run.kinds()[-1] == "run_finished"
    assert run.of("refused_event") == []  # nothing of the harness's or the evaluator's was refused
    return run, data, report


def _line_bytes(run: Run, kind: str, producer: str | None = None) -> int:
    return sum(
        len(canonical_json(e)) + 1 for e in run.events if e["kind"] == kind and producer in (None, e["producer"])
    )


# -- point 7: the event fd ------------------------------------------------------------------------


async def test_event_fd_line_of_20000_brackets_is_a_recorded_refusal_not_a_recursion_error(tmp_path: Path) -> None:
    code = EVENT_FD + "os.write(fd, b'[' * 20000 + b'\\n')\nos.write(fd, b'{\"kind\": \"note\", \"data\": {}}\\n')\n"
    run, _, _ = await _bundled(_options(code), tmp_path)
    (refused,) = run.of("rejected_agent_event")
    assert "not JSON" in refused["reason"]
    assert "deeper than 64" in refused["reason"]
    assert run.of("note", "untrusted_agent") == [{}]  # the next line is recorded as usual


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b'{"kind": "thought", "data": {"text": "secret plan"}}', "hidden reasoning"),
        (b'{"kind": "chain_of_thought", "data": {}}', "hidden reasoning"),
        (b'{"kind": "Reasoning", "data": {}}', "hidden reasoning"),
        (b'{"kind": "stdout", "data": {"text": "forged output"}}', "recorded by the harness"),
        (b'{"kind": "run_finished", "data": {}}', "does not emit"),
        (b'{"kind": "made_up", "data": {}}', "does not emit"),
        (b'{"kind": "note", "data": []}', "data an object"),
        (b'{"kind": "note", "kind": "note", "data": {}}', "duplicate object key"),
        (b'{"kind": "note", "data": {"n": 123456789012345678901234567890}}', "outside"),
        (b'\xff\xfe{"kind": "note"}', "not JSON"),
        (b'{"a":' * 70 + b"1" + b"}" * 70, "deeper than 64"),
        (b'{"kind": "note", "data": {"deep": ' + b"[" * 63 + b"]" * 63 + b"}}", "deeper than 64"),
    ],
)
async def test_event_fd_lines_the_grammar_refuses_are_recorded_as_refusals(
    tmp_path: Path, line: bytes, why: str
) -> None:
    code = EVENT_FD + f"os.write(fd, {line!r} + b'\\n')\n"
    run, _, _ = await _bundled(_options(code), tmp_path)
    (refused,) = run.of("rejected_agent_event")
    assert why in refused["reason"], refused
    assert run.kinds("untrusted_agent") == []
    recorded = [e for e in run.events if e["kind"] not in ("run_started", "agent_started")]  # (the command)
    assert b"secret plan" not in canonical_json(recorded)


async def test_event_fd_line_over_64_kib_is_one_refusal_not_one_per_piece(tmp_path: Path) -> None:
    code = EVENT_FD + (
        "import json\nline = json.dumps({'kind': 'note', 'data': {'text': 'x' * (200 * 1024)}}).encode()\n"
        'os.write(fd, line + b\'\\n\')\nos.write(fd, b\'{"kind": "note", "data": {"after": 1}}\\n\')\n'
    )
    run, _, _ = await _bundled(_options(code), tmp_path)
    (refused,) = run.of("rejected_agent_event")
    assert "not JSON" in refused["reason"]
    assert run.of("note", "untrusted_agent") == [{"after": 1}]
    (truncated,) = run.of("output_truncated")
    assert truncated["dropped_bytes"] == len(b'{"kind": "note", "data": {"text": ""}}') + 200 * 1024 + 1 - 64 * 1024


async def test_event_fd_data_the_verifier_could_not_read_back_is_refused_not_written(tmp_path: Path) -> None:
    """1e16 is a float the agent may send; its canonical text is an integer past 2**53, which no
    verifier reads: the harness records a refusal instead of a line the verifier would reject."""
    code = EVENT_FD + 'os.write(fd, b\'{"kind": "api_usage", "data": {"tokens": 1e16}}\\n\')\n'
    run, _, _ = await _bundled(_options(code), tmp_path)
    (refused,) = run.of("rejected_agent_event")
    assert refused["reason"].startswith("unwritable: "), refused
    assert run.kinds("untrusted_agent") == []


async def test_event_fd_data_nested_64_levels_is_kept(tmp_path: Path) -> None:
    inner = "[" * 62 + "]" * 62  # the line object, its data object and 62 lists: 64 levels in all
    code = EVENT_FD + f'os.write(fd, b\'{{"kind": "note", "data": {{"deep": {inner}}}}}\\n\')\n'
    run, _, _ = await _bundled(_options(code), tmp_path)
    assert run.of("rejected_agent_event") == []
    (note,) = run.of("note", "untrusted_agent")
    assert json.dumps(note["deep"]).count("[") == 62


async def test_event_fd_flood_of_garbage_is_capped_and_counted(tmp_path: Path) -> None:
    code = EVENT_FD + "for i in range(60000):\n    os.write(fd, b'nonsense %d\\n' % i)\n"
    run, _, _ = await _bundled(_options(code, agent_time=60), tmp_path)
    refusals = run.of("rejected_agent_event")
    assert refusals
    (dropped,) = run.of("events_dropped")
    assert dropped["channel"] == "agent.event"
    assert len(refusals) + dropped["events"] == 60000
    assert BUDGETS["agent.event"] <= _line_bytes(run, "rejected_agent_event") <= BUDGETS["agent.event"] + 2048


# -- point 8: sizes -------------------------------------------------------------------------------

_CLIENT = (
    "from ale.client import AleEnvClient, AleEnvError\nc = AleEnvClient(os.environ['ALE_EVALUATOR'], timeout=60)\n"
)


def _assert_cut(recorded: str, original: str) -> None:
    """The evaluator cuts an echoed value at the source (``ale.protocol.cut`` to its event-log cap of
    256 characters); that is below the recorder's own 1 KiB cap, so it reaches the trajectory exactly so."""
    assert CAPS["trusted_evaluator"].string_bytes > MAX_STRING_CHARS
    assert recorded == cut(original, MAX_STRING_CHARS)


async def test_rpc_with_a_1_2_mib_session_id_is_cut_in_the_trajectory_not_a_crash(tmp_path: Path) -> None:
    code = (
        "import os\n" + _CLIENT + "try:\n    c.get_eval_result('s' * (1200 * 1024))\nexcept AleEnvError as e:\n"
        "    print('refused', e.code.name, flush=True)\n"
    )
    run, _, _ = await _bundled(_options(code), tmp_path)
    calls = [d for d in run.of("rpc", "trusted_evaluator") if d["method"] == "GetEvalResult"]
    (call,) = calls
    _assert_cut(call["session_id"], "s" * (1200 * 1024))
    assert run.stdout() == ["refused INVALID_ARGUMENT"]  # ids past 128 characters are refused first


async def test_120_calls_with_900_kib_ids_give_a_bundle_within_the_site_limit(tmp_path: Path) -> None:
    code = (
        "import os\n" + _CLIENT + "for i in range(120):\n    try:\n"
        "        c.get_spec(('%03d' % i) * (300 * 1024))\n    except AleEnvError:\n        pass\n"
        "print('done', flush=True)\n"
    )
    run, data, _ = await _bundled(_options(code, agent_time=120), tmp_path)
    assert run.stdout() == ["done"]
    specs = [d for d in run.of("rpc", "trusted_evaluator") if d["method"] == "GetSpec" and d.get("env_id")]
    assert len(specs) == 120
    for d, i in zip(specs, range(120), strict=True):
        _assert_cut(d["env_id"], f"{i:03d}" * (300 * 1024))
    assert len(data) < 1024 * 1024  # 120 calls cost 120 short lines, not 81.7 MB


# -- point 9: amplification -----------------------------------------------------------------------


async def test_320_kib_of_empty_stdout_lines_do_not_amplify_the_trajectory(tmp_path: Path) -> None:
    code = "import sys\nsys.stdout.buffer.write(b'\\n' * (320 * 1024))\nsys.stdout.flush()\n"
    run, data, _ = await _bundled(_options(code), tmp_path)
    kept = run.stdout()
    (dropped,) = run.of("events_dropped")
    assert (dropped["channel"], len(kept) + dropped["events"]) == ("agent.stdout", 320 * 1024)
    assert _line_bytes(run, "stdout") <= BUDGETS["agent.stdout"] + 1024
    assert len(data) < 2 * 1024 * 1024  # not 121 MB of trajectory and a 19.96 MB bundle


async def test_incompressible_floods_on_every_stream_stay_within_the_site_limit(tmp_path: Path) -> None:
    """The worst case for the budgets: random text (zstd cannot shrink it) on stdout, stderr and
    the event channel at once, each past its budget."""
    code = EVENT_FD + (
        "import base64, json\n"
        "for i in range(2600):\n"
        "    text = base64.b85encode(os.urandom(3000)).decode()\n"
        "    print(text, flush=False)\n"
        "    print(text[::-1], file=sys.stderr, flush=False)\n"
        "    line = json.dumps({'kind': 'message', 'data': {'role': 'assistant', 'text': text}})\n"
        "    os.write(fd, line.encode() + b'\\n')\n"
        "sys.stdout.flush()\n"
    )
    run, data, _ = await _bundled(_options(code, agent_time=120), tmp_path)
    dropped = {d["channel"]: d for d in run.of("events_dropped")}
    assert set(dropped) == {"agent.stdout", "agent.stderr", "agent.event"}
    for channel, kind in (("agent.stdout", "stdout"), ("agent.stderr", "stderr"), ("agent.event", "message")):
        assert _line_bytes(run, kind, "untrusted_agent") <= BUDGETS[channel] + 8 * 1024
    assert len(data) <= SITE_LIMIT


async def test_interactive_policy_flood_is_capped_in_its_own_channels(tmp_path: Path) -> None:
    body = "sys.stdout.buffer.write(b'p\\n' * 400000)\nsys.stdout.flush()\n"
    run, _, _ = await _bundled(_options(_policy(body), task=PENDULUM, episodes=1), tmp_path)
    (dropped,) = run.of("events_dropped")
    assert dropped["channel"] == "policy.stdout"
    assert _line_bytes(run, "policy_stdout") <= BUDGETS["policy.stdout"] + 1024


# -- point 11: the order of the official phase -----------------------------------------------------


async def test_interactive_evaluator_events_of_the_policy_phase_come_before_official_evaluation_finished(
    tmp_path: Path,
) -> None:
    body = (
        "import numpy as np\n"
        "env = RemoteEnv(os.environ['ALE_EVALUATOR'], env_id=os.environ['ALE_ENV_ID'])\n"
        "for _ in range(int(os.environ['ALE_NUM_EPISODES'])):\n"
        "    env.reset()\n"
        "    done = False\n"
        "    while not done:\n"
        "        _, _, term, trunc, _ = env.step(np.zeros(env.action_space.shape, dtype=np.float32))\n"
        "        done = term or trunc\n"
    )
    run, _, report = await _bundled(_options(_policy(body), task=PENDULUM, episodes=2), tmp_path)
    kinds = run.kinds()
    finished = kinds.index("official_evaluation_finished")
    ends = [i for i, e in enumerate(run.events) if e["kind"] in ("episode_end", "eval_result")]
    assert len(ends) == 3
    assert max(ends) < finished
    opened = kinds.index("eval_session_opened")
    policy_calls = [
        i for i, e in enumerate(run.events) if i > opened and e["producer"] == "trusted_evaluator"
        and e["data"].get("endpoint") == "agent"
    ]  # fmt: skip
    assert policy_calls
    assert max(policy_calls) < finished
    assert report.results.tasks[0].result is not None


async def test_concurrent_polls_of_the_evaluator_log_record_each_line_once(tmp_path: Path) -> None:
    """The background tail, the watchdog and a drain may poll at once: each line is recorded once."""
    log = tmp_path / "evaluator.jsonl"
    lines = [
        json.dumps({"seq": i + 1, "kind": "rpc", "wall_time": 1.0 + i, "monotonic": 1.0 + i, "endpoint": "agent"})
        for i in range(2000)
    ]
    log.write_text("\n".join(lines) + "\n")
    async with open_recorder(tmp_path / "t.jsonl") as rec:
        rec.emit("trusted_harness", "run_started", {"nonce": None, "run_id": "r", "tasks": ["t@1"]})
        rec.emit("trusted_harness", "task_started", {"task": "t@1"})
        rec.emit("trusted_harness", "evaluator_started", {"task": "t@1"})
        tail = EvaluatorTail(log, rec, "t@1")

        def slow_read() -> bytes:  # a read that takes a while between taking the offset and moving it
            import time

            start = tail.offset
            time.sleep(0.02)
            with open(log, "rb") as fh:
                fh.seek(start)
                data = fh.read(64 * 1024)
            tail.offset = start + len(data)
            return data

        tail._read = slow_read  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(tail.poll)
            nursery.start_soon(tail.drain)
    recorded = [json.loads(line) for line in (tmp_path / "t.jsonl").read_bytes().splitlines()]
    seqs = [e["data"]["evaluator_seq"] for e in recorded if e["producer"] == "trusted_evaluator"]
    assert seqs == list(range(1, 2001))


def test_every_kind_the_harness_emits_is_in_the_grammar() -> None:
    """A new harness event kind must be a row of ale.core.grammar.RULES (or the recorder refuses it)."""

    from ale.runner import harness, recorder, retry, task_run

    source = "".join(Path(m.__file__).read_text() for m in (harness, recorder, task_run, retry))
    emitted = set(re.findall(r'"trusted_harness",\s*"([a-z_]+)"', source))
    assert emitted <= grammar.KINDS["trusted_harness"], emitted - grammar.KINDS["trusted_harness"]
    assert grammar.KINDS["untrusted_agent"] >= harness.AGENT_EVENT_KINDS
