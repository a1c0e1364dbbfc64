"""A task's spool: the events of one task, recorded while it runs, before they join the run's chain.

Each task of a run records into a file of its own (:func:`ale.runner.recorder.open_recorder`), a
hash chain of its own that begins with a ``run_started`` naming the run and only that task
(:func:`header`) followed by the task's window: ``task_started`` up to the end of its official
evaluation (``official_done``: its judge and its ``task_finished`` are recorded when the window is
placed). So a spool is checked with the very functions a verifier runs (:func:`check`): every line,
link and counter of the chain, the grammar from the header on, the run and the task it names.
:meth:`ale.runner.recorder.Recorder.place` then appends its events after the header to the run's
chain, in task order (docs/decisions.md, "Tasks side by side").
"""

from __future__ import annotations

from typing import Any

import attrs

from ale.core import grammar
from ale.core.trajectory import ChainError, ChainSummary, iter_events, verify_chain

#: ``run_started``'s ``spool`` member: marks a spool's header (a run's own never has one)
SPOOL_MARK = "ale-task-spool/v1"


class SpoolError(ValueError):
    """A spool that cannot be placed: the message says what is wrong with it."""


def header(run_id: str, task_ref: str) -> dict[str, Any]:
    """The data of a spool's first event (``run_started``)."""
    return {"nonce": None, "run_id": run_id, "tasks": [task_ref], "spool": SPOOL_MARK}


@attrs.frozen
class Spool:
    """A checked spool: its lines after the header (without newlines) and the chain's summary."""

    lines: list[bytes]
    summary: ChainSummary
    phase: int  # the grammar phase its last event leaves the task in


def check(raw: bytes, *, run_id: str, task_ref: str, digest: str, complete: bool = True) -> Spool:
    """Check a spool of ``task_ref`` (whose task digest is ``digest``) of run ``run_id``: a whole
    chain (no torn or edited line), its header this run's and this task's, its grammar (the
    header's run of one task), and, when ``complete``, ending where a finished task's window ends
    (its official evaluation done). Raises SpoolError."""
    try:
        summary = verify_chain(raw, check_grammar=False)
    except ChainError as exc:
        raise SpoolError(f"not a whole chain: {exc} ({exc.reason})") from None
    state = grammar.GrammarState()
    lines = raw.split(b"\n")[:-1]
    for number, event in iter_events(raw):
        if number == 1 and event["data"] != header(run_id, task_ref):
            raise SpoolError(f"its first event is not this run's spool header for {task_ref}")
        if number == 2 and (event["kind"] != "task_started" or event["data"].get("digest") != digest):
            raise SpoolError(f"its window does not begin with {task_ref}'s task_started (digest {digest})")
        fault = state.event(number, event["producer"], event["kind"], event["data"])
        if fault is not None:
            raise SpoolError(f"line {fault.line}: {fault.message} ({fault.reason})")
    if len(lines) < 2:
        raise SpoolError("it holds no task window")
    if complete and state.phase != grammar.OFFICIAL_DONE:
        raise SpoolError(f"it ends in phase {grammar.PHASES[state.phase]}, not where a finished task's window ends")
    return Spool(lines[1:], summary, state.phase)


#: the grammar's phases of a task as the phase a task that ended there is recorded in
_END_PHASES = {
    grammar.TASK: "setup",
    grammar.EVALUATOR: "setup",
    grammar.AGENT: "agent",
    grammar.AGENT_DONE: "agent",
    grammar.SNAPSHOT: "agent",
}


def end_phase(phase: int) -> str:
    """The phase (``setup``, ``agent``, ``official``) of a task whose window stopped in ``phase``."""
    return _END_PHASES.get(phase, "official")
