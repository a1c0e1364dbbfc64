"""Fuzz targets of what a resumed run reads from its state folder: a spool (ale.runner.spool.check),
a task's record (RunState.finished, TaskOutcome.from_record), run.json and its options
(ale.runner.state.load, ale.runner.resume.parse). Whatever the bytes, each says why it refuses
them with its own error (or a reason to run the task again), never another exception."""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from fuzzing import fuzz_settings, hostile_json, json_values
from hypothesis import given
from hypothesis import strategies as st

from ale import catalog
from ale.core import grammar
from ale.core.parse import ParseError
from ale.runner import resume, spool, state
from ale.runner.outcome import TaskOutcome
from ale.runner.recorder import open_recorder

pytestmark = pytest.mark.fuzz
TASK = catalog.get_task("cartpole-balance")
RUN = "run-20000101T000000Z-0000f0f0"


async def _spool(path: Path) -> bytes:
    ref = TASK.spec.ref
    async with open_recorder(path) as rec:
        rec.emit("trusted_harness", "run_started", spool.header(RUN, ref))
        rec.emit("trusted_harness", "task_started", {"task": ref, "digest": TASK.digest, "mode": "batch"})
        rec.emit("trusted_harness", "evaluator_started", {"task": ref})
        rec.emit("untrusted_agent", "stdout", {"text": "hello"})  # (refused here: recorded as a refusal)
        rec.emit("trusted_harness", "task_ended_early", {"task": ref, "phase": "setup", "category": "cancelled",
                                                          "reason": "fuzz"})  # fmt: skip
    return await trio.Path(path).read_bytes()


@pytest.fixture(scope="module")
def good_spool() -> Iterator[bytes]:
    folder = Path(tempfile.mkdtemp(prefix="ale-fz-"))
    yield trio.run(_spool, folder / "spool")
    shutil.rmtree(folder, ignore_errors=True)


def _check(raw: bytes) -> None:
    with contextlib.suppress(spool.SpoolError):
        spool.check(raw, run_id=RUN, task_ref=TASK.spec.ref, digest=TASK.digest)


def test_the_good_spool_checks(good_spool: bytes) -> None:
    assert (
        spool.check(good_spool, run_id=RUN, task_ref=TASK.spec.ref, digest=TASK.digest).phase == grammar.OFFICIAL_DONE
    )


@fuzz_settings
@given(data=st.data())
def test_spool_check_refuses_mutated_spools_with_its_own_error(good_spool: bytes, data: st.DataObject) -> None:
    raw = bytearray(good_spool)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        action = data.draw(st.sampled_from(["flip", "cut", "insert", "duplicate-line"]))
        if action == "flip":
            raw[at] ^= data.draw(st.integers(1, 255))
        elif action == "cut":
            del raw[at:]
            if not raw:
                break
        elif action == "insert":
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=40))
        else:
            lines = bytes(raw).split(b"\n")
            lines.insert(data.draw(st.integers(0, len(lines))), data.draw(st.sampled_from(lines)))
            raw = bytearray(b"\n".join(lines))
    _check(bytes(raw))


@fuzz_settings
@given(raw=st.one_of(hostile_json, st.binary(max_size=300)))
def test_spool_check_refuses_garbage_with_its_own_error(raw: bytes) -> None:
    _check(raw)


@pytest.fixture(scope="module")
def run_state() -> Iterator[state.RunState]:
    folder = Path(tempfile.mkdtemp(prefix="ale-fz-")) / f"{RUN}.state"
    created = state.create(folder, RUN, {})
    (folder / "tasks" / TASK.spec.id).mkdir(parents=True)
    yield created
    shutil.rmtree(folder.parent, ignore_errors=True)


@fuzz_settings
@given(content=st.one_of(hostile_json, json_values.map(lambda v: json.dumps(v).encode())))
def test_a_garbage_record_is_a_reason_to_run_the_task_again(run_state: state.RunState, content: bytes) -> None:
    (run_state.task_folder(TASK.spec.id) / "record.json").write_bytes(content)
    assert isinstance(run_state.finished(TASK), str)


@fuzz_settings
@given(record=json_values)
def test_a_garbage_outcome_is_refused_with_a_value_error(record: object) -> None:
    with contextlib.suppress(ValueError):
        TaskOutcome.from_record(TASK, record, RUN)


@fuzz_settings
@given(options=json_values)
def test_garbage_options_are_refused_with_a_parse_error(options: object) -> None:
    with contextlib.suppress(ParseError):
        resume.parse(options)


@fuzz_settings
@given(content=st.one_of(hostile_json, json_values.map(lambda v: json.dumps(v).encode())))
def test_a_garbage_run_json_is_refused_with_a_state_error(content: bytes) -> None:
    folder = Path(tempfile.mkdtemp(prefix="ale-fz-")) / f"{RUN}.state"
    try:
        folder.mkdir()
        (folder / "key").write_text(secrets.token_hex(32))
        (folder / "run.json").write_bytes(content)
        with pytest.raises(state.StateError):
            state.load(folder)
    finally:
        shutil.rmtree(folder.parent, ignore_errors=True)


@pytest.mark.fuzz
@fuzz_settings
@given(raw=st.one_of(hostile_json, st.binary(max_size=300), json_values.map(lambda v: json.dumps(v).encode())))
def test_segments_json_of_garbage_is_a_state_error_or_spans(raw: bytes) -> None:
    """segments.json (ale.runner.state.parse_segments) parses into spans that each end after they
    start, or raises StateError: nothing else."""
    try:
        spans = state.parse_segments(raw)
    except state.StateError:
        return
    assert all(0 <= a <= b for a, b in spans)
    assert state.active_seconds(spans) >= 0
