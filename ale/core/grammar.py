"""The trajectory's grammar: which producer may emit which kind, when, and how often.

A run's trajectory is a sequence of *phases*; each event either may occur in some phases and
leaves the phase as it is (a *windowed* event: the agent's output, the evaluator's RPCs), or moves
the run from one phase to the next (a *structural* event: ``task_started``, ``agent_finished``,
...). Some events carry a *key* that the grammar checks: the task an event belongs to, the
(session, episode) an ``episode_end`` reports (each at most once). Every (producer, kind) pair
outside :data:`RULES` is refused: the lists are closed, so hidden reasoning (``thought``, ...),
kinds nobody emits and the reserved producer (``derived_verifier``) never appear in a bundle. The
LLM gateway's events (``trusted_network_proxy``, docs/gateway.md) may occur while the run is open;
each ``llm_request`` (by its ``request_id``) and each ``budget_exhausted`` (by its ``budget``) at
most once in a task.

The runner's recorder and the verifier share this module: the recorder asks it before writing
an event (so the harness never writes what a verifier refuses), and the verifier replays the
stream's events through it. :class:`GrammarState` is the whole state machine; the verifier feeds it
only the structural events and the first event of each windowed rule between two structural events,
which gives the same verdict as feeding every event (a windowed event's verdict depends only on
the phase, and only structural events change it). ``docs/formats.md`` ("The grammar") is the same
table in prose. A new event kind is a new row of :data:`RULES`, here and there.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

# -- phases ---------------------------------------------------------------------------------------

START, RUN, TASK, EVALUATOR, AGENT, AGENT_DONE, SNAPSHOT, OFFICIAL, ARTIFACT, POLICY, POLICY_DONE = range(11)
OFFICIAL_DONE, JUDGE, JUDGE_DONE, FINISHED, STOPPED = range(11, 16)
PHASES: Final = (
    "start", "run", "task", "evaluator", "agent", "agent_done", "snapshot", "official", "artifact", "policy",
    "policy_done", "official_done", "judge", "judge_done", "finished", "stopped",
)  # fmt: skip

_OPEN_RUN = frozenset(range(RUN, JUDGE_DONE + 1))  # run_started seen, no terminal event yet
_IN_TASK = frozenset(range(TASK, JUDGE_DONE + 1))
_EVALUATOR_UP = frozenset(range(EVALUATOR, OFFICIAL_DONE + 1))  # the judge runs once the evaluator is stopped
_SANDBOX = frozenset({AGENT, POLICY})
_TASK_BODY = frozenset(range(TASK, OFFICIAL_DONE + 1))  # a task before its judge and its end
_OFFICIAL_RUNNING = frozenset({OFFICIAL, ARTIFACT, POLICY, POLICY_DONE})

# -- keys ------------------------------------------------------------------------------------------

NO_KEY, TASKS_KEY, TASK_KEY, EPISODE_KEY, SESSION_KEY, REQUEST_KEY, BUDGET_KEY = range(7)
#: a key whose members are missing or of the wrong type (equal to no valid key: those hold strings
#: and integers only)
INVALID: Final = (None,)

# -- reasons (``ChainError.reason``; the verifier answers ``chain_invalid`` with them) -----------

FORBIDDEN_KIND = "forbidden_kind"
HIDDEN_REASONING = "hidden_reasoning"
RESERVED_PRODUCER = "reserved_producer"
OUT_OF_ORDER = "out_of_order"
DUPLICATE_EVENT = "duplicate_event"
BAD_KEY = "bad_key"
MISSING_RUN_FINISHED = "missing_run_finished"
REASONS: Final = frozenset(
    {FORBIDDEN_KIND, HIDDEN_REASONING, RESERVED_PRODUCER, OUT_OF_ORDER, DUPLICATE_EVENT, BAD_KEY, MISSING_RUN_FINISHED}
)

RESERVED_PRODUCERS: Final = frozenset({"derived_verifier"})
#: words that mark a kind as recording hidden reasoning (refused with their own reason)
HIDDEN_REASONING_WORDS: Final = ("thought", "reasoning", "thinking", "scratchpad", "monologue")


@attrs.frozen
class Rule:
    """One (producer, kind): the phases it may occur in, the phase it leads to, its key."""

    producer: str
    kind: str
    allowed: frozenset[int]
    then: int | None = None  # None: the phase stays
    key: int = NO_KEY

    @property
    def windowed(self) -> bool:
        return self.then is None and self.key == NO_KEY


def _h(kind: str, allowed: Iterable[int], then: int | None = None, key: int = NO_KEY) -> Rule:
    return Rule("trusted_harness", kind, frozenset(allowed), then, key)


def _e(kind: str, allowed: Iterable[int], key: int = NO_KEY) -> Rule:
    return Rule("trusted_evaluator", kind, frozenset(allowed), None, key)


def _a(kind: str, allowed: Iterable[int]) -> Rule:
    return Rule("untrusted_agent", kind, frozenset(allowed))


def _n(kind: str, key: int = NO_KEY) -> Rule:
    return Rule("trusted_network_proxy", kind, _OPEN_RUN, None, key)


#: The agent's event-channel kinds (``docs/agent-contract.md``), recorded in either sandbox phase.
AGENT_CHANNEL_KINDS: Final = ("message", "tool_call", "tool_result", "shell_command", "api_usage", "note")

#: Every event a v1 trajectory may hold. Index = the rule's code.
RULES: Final[tuple[Rule, ...]] = (
    # the run
    _h("run_started", {START}, RUN, TASKS_KEY),
    _h("task_started", {RUN}, TASK, TASK_KEY),
    _h("evaluator_started", {TASK}, EVALUATOR, TASK_KEY),
    _h("agent_started", {EVALUATOR}, AGENT, TASK_KEY),
    _h("agent_finished", {AGENT}, AGENT_DONE, TASK_KEY),
    _h("artifact_snapshot", {AGENT_DONE}, SNAPSHOT, TASK_KEY),
    _h("artifact_file", {SNAPSHOT}),
    _h("official_evaluation_started", {AGENT_DONE, SNAPSHOT}, OFFICIAL, TASK_KEY),
    _h("policy_artifact", {OFFICIAL}, ARTIFACT, TASK_KEY),
    _h("eval_session_opened", {OFFICIAL}, POLICY, TASK_KEY),
    _h("policy_finished", {POLICY}, POLICY_DONE, TASK_KEY),
    _h("official_evaluation_finished", {ARTIFACT, POLICY_DONE}, OFFICIAL_DONE, TASK_KEY),
    _h("official_evaluation_skipped", {OFFICIAL, ARTIFACT, POLICY_DONE}, OFFICIAL_DONE, TASK_KEY),
    _h("task_ended_early", _TASK_BODY, OFFICIAL_DONE, TASK_KEY),
    _h("judge_started", {OFFICIAL_DONE}, JUDGE, TASK_KEY),
    _h("judge_finished", {JUDGE}, JUDGE_DONE, TASK_KEY),
    _h("task_finished", {OFFICIAL_DONE, JUDGE_DONE}, RUN, TASK_KEY),
    _h("run_finished", {RUN}, FINISHED),
    _h("run_failed", _OPEN_RUN, STOPPED),
    _h("run_interrupted", _OPEN_RUN, STOPPED),
    # what the harness notes about the other producers' events
    _h("output_truncated", _SANDBOX),
    _h("rejected_agent_event", _SANDBOX),
    _h("unreadable_evaluator_event", _EVALUATOR_UP),
    _h("unreadable_gateway_event", _OPEN_RUN),
    _h("events_dropped", _EVALUATOR_UP),
    _h("refused_event", _OPEN_RUN),
    _h("infrastructure_retry", _TASK_BODY),
    # the evaluator's log, relayed
    _e("evaluator_ready", _EVALUATOR_UP),
    _e("rpc", _EVALUATOR_UP),
    _e("rpc_summary", _EVALUATOR_UP),
    _e("eval_session_start", _EVALUATOR_UP),
    _e("batch_submitted", _EVALUATOR_UP),
    _e("batch_progress", _EVALUATOR_UP),
    _e("episode_end", _OFFICIAL_RUNNING, EPISODE_KEY),
    _e("eval_result", _OFFICIAL_RUNNING, SESSION_KEY),
    # the LLM gateway's log, relayed (the gateway runs for the whole run)
    _n("gateway_started"),
    _n("llm_request", REQUEST_KEY),
    _n("policy_changed"),
    _n("budget_exhausted", BUDGET_KEY),
    _n("gateway_stopped"),
    # the agent
    _a("stdout", {AGENT}),
    _a("stderr", {AGENT}),
    _a("policy_stdout", {POLICY}),
    _a("policy_stderr", {POLICY}),
    *(_a(kind, _SANDBOX) for kind in AGENT_CHANNEL_KINDS),
)

#: The codes of refused pairs, after the rules' (key: the producer and kind, for the message).
RESERVED_CODE, HIDDEN_CODE, FORBIDDEN_CODE = len(RULES), len(RULES) + 1, len(RULES) + 2

#: producer -> kind -> code; what the verifier's hot loop looks up.
CODES: Final[Mapping[str, Mapping[str, int]]] = {
    producer: {rule.kind: code for code, rule in enumerate(RULES) if rule.producer == producer}
    for producer in (
        "trusted_harness",
        "trusted_evaluator",
        "trusted_network_proxy",
        "untrusted_agent",
        "derived_verifier",
    )
}
#: per code: a bit for a windowed rule (its first event in each run between structural events is
#: enough), 0 for a structural rule or a refused pair (every one counts)
WINDOW_BIT: Final = (*(1 << code if rule.windowed else 0 for code, rule in enumerate(RULES)), 0, 0, 0)
#: producer -> kind -> its rule's window bit (0: structural); what the verifier's hot loop looks up
BITS: Final[Mapping[str, Mapping[str, int]]] = {
    producer: {kind: WINDOW_BIT[code] for kind, code in kinds.items()} for producer, kinds in CODES.items()
}
#: per code: the key it carries
KEY_OF: Final = (*(rule.key for rule in RULES), NO_KEY, NO_KEY, NO_KEY)
KINDS: Final[Mapping[str, frozenset[str]]] = {producer: frozenset(kinds) for producer, kinds in CODES.items()}


def is_hidden_reasoning(kind: str) -> bool:
    lowered = kind.lower()
    return any(word in lowered for word in HIDDEN_REASONING_WORDS)


_NONE: Mapping[str, int] = {}


def code_of(producer: str, kind: str) -> int:
    """The rule's code, or the code of the reason the pair is refused."""
    code = CODES.get(producer, _NONE).get(kind)
    if code is not None:
        return code
    if producer in RESERVED_PRODUCERS:
        return RESERVED_CODE
    return HIDDEN_CODE if is_hidden_reasoning(kind) else FORBIDDEN_CODE


def refusal(producer: str, kind: str) -> tuple[str, str] | None:
    """(reason, message) if the pair is refused wherever it occurs, else None."""
    code = code_of(producer, kind)
    return None if code < len(RULES) else _refused(code, (producer, kind))


def _refused(code: int, key: Any) -> tuple[str, str]:
    producer, kind = key if isinstance(key, tuple) and len(key) == 2 else ("?", "?")
    if code == RESERVED_CODE:
        return RESERVED_PRODUCER, f"{producer} is reserved: no bundle holds its events ({kind})"
    if code == HIDDEN_CODE:
        return HIDDEN_REASONING, f"{producer} {kind}: hidden reasoning is never recorded"
    return FORBIDDEN_KIND, f"{producer} does not emit {kind!r} events"


def _string(value: Any) -> Any:
    return value if type(value) is str else INVALID


def key_of(code: int, data: Mapping[str, Any]) -> Any:
    """What the grammar checks of an event's data (only structural rules carry a key)."""
    kind = KEY_OF[code]
    if kind == NO_KEY:
        return None
    if kind == TASK_KEY:
        return _string(data.get("task"))
    if kind == SESSION_KEY:
        return _string(data.get("session_id"))
    if kind == REQUEST_KEY:
        return _string(data.get("request_id"))
    if kind == BUDGET_KEY:
        return _string(data.get("budget"))
    if kind == EPISODE_KEY:
        session, index = data.get("session_id"), data.get("index")
        return (session, index) if type(session) is str and type(index) is int else INVALID
    tasks = data.get("tasks")  # TASKS_KEY
    if type(tasks) is not list or not all(type(t) is str for t in tasks) or len(set(tasks)) != len(tasks):
        return INVALID
    return tuple(tasks)


def classify(producer: str, kind: str, data: Mapping[str, Any]) -> tuple[int, Any]:
    """An event's (code, key) for :meth:`GrammarState.feed` (a refused pair's key names it)."""
    code = code_of(producer, kind)
    return code, (producer, kind) if code >= len(RULES) else key_of(code, data)


@attrs.frozen
class GrammarFault:
    line: int
    reason: str
    message: str


@attrs.define
class GrammarState:
    """Where a run's trajectory stands; :meth:`feed` each event in order, then :meth:`finish`."""

    phase: int = START
    tasks: tuple[str, ...] = ()
    done: int = 0  # tasks finished (they run in the order run_started lists them)
    task: str | None = None  # the open task
    seen: set[tuple[Any, ...]] = attrs.Factory(set)  # (kind, task, key...) of the events recorded once

    def event(self, line: int, producer: str, kind: str, data: Mapping[str, Any]) -> GrammarFault | None:
        """:meth:`feed` an event given as it is (the recorder's way)."""
        code = CODES.get(producer, _NONE).get(kind)
        if code is not None and WINDOW_BIT[code] and self.phase in RULES[code].allowed:
            return None  # the common case, without building its token
        return self.feed(line, *classify(producer, kind, data))

    def feed(self, line: int, code: int, key: Any) -> GrammarFault | None:
        """Check the event at ``line``; if it is allowed, advance and return None (else change nothing)."""
        if code >= len(RULES):
            return GrammarFault(line, *_refused(code, key))
        rule = RULES[code]
        if WINDOW_BIT[code] and self.phase in rule.allowed:  # the common case: nothing to check or change
            return None
        if self.phase not in rule.allowed:
            return GrammarFault(line, OUT_OF_ORDER, f"{rule.producer} {rule.kind} may not occur {_where(self.phase)}")
        if rule.key != NO_KEY:
            fault = self._key_fault(rule, key)
            if fault is not None:
                return GrammarFault(line, *fault)
        elif code == _RUN_FINISHED and self.done != len(self.tasks):
            missing = ", ".join(self.tasks[self.done :])
            return GrammarFault(line, OUT_OF_ORDER, f"run_finished before every listed task ran (left: {missing})")
        self._advance(rule, key)
        return None

    def _key_fault(self, rule: Rule, key: Any) -> tuple[str, str] | None:
        if key == INVALID:
            return BAD_KEY, f"{rule.producer} {rule.kind}: {_KEY_TEXT[rule.key]}"
        if rule.key == TASK_KEY:
            expected = self.task if rule.kind != "task_started" else _next(self.tasks, self.done)
            if key != expected:
                return OUT_OF_ORDER, f"{rule.kind} names task {_clip(key)!r} where {expected!r} is due"
        elif rule.key in _ONCE_KEYS and self._seen_key(rule, key) in self.seen:
            return DUPLICATE_EVENT, f"a second {rule.kind} for {_clip(str(key))} (each is recorded once)"
        return None

    def _seen_key(self, rule: Rule, key: Any) -> tuple[Any, ...]:
        return (rule.kind, self.task, *(key if rule.key == EPISODE_KEY else (key,)))

    def _advance(self, rule: Rule, key: Any) -> None:
        if rule.key == TASKS_KEY:
            self.tasks = key
        elif rule.key in _ONCE_KEYS:
            self.seen.add(self._seen_key(rule, key))
        elif rule.kind == "task_started":
            self.task = key
        elif rule.kind == "task_finished":
            self.task, self.done = None, self.done + 1
        if rule.then is not None:
            self.phase = rule.then

    def finish(self, lines: int, *, incomplete: bool = False) -> GrammarFault | None:
        """The end of a bundle's trajectory: its last event must be run_finished (``incomplete``: or
        run_failed or run_interrupted, as in a kept ``.incomplete.jsonl``)."""
        if self.phase == FINISHED or (incomplete and self.phase == STOPPED):
            return None
        if self.phase == STOPPED:
            message = "the trajectory ends with run_failed or run_interrupted: the run did not finish"
        else:
            message = "the trajectory ends without run_finished: it is truncated"
        return GrammarFault(max(lines, 1), MISSING_RUN_FINISHED, message)


_RUN_FINISHED = next(code for code, rule in enumerate(RULES) if rule.kind == "run_finished")
_KEY_TEXT = {
    TASKS_KEY: "tasks must list distinct task references (strings)",
    TASK_KEY: "task must be a string",
    EPISODE_KEY: "session_id must be a string and index an integer",
    SESSION_KEY: "session_id must be a string",
    REQUEST_KEY: "request_id must be a string",
    BUDGET_KEY: "budget must be a string",
}
#: keys whose event is recorded at most once (per task)
_ONCE_KEYS: Final = frozenset({EPISODE_KEY, SESSION_KEY, REQUEST_KEY, BUDGET_KEY})


def _next(tasks: tuple[str, ...], done: int) -> str | None:
    return tasks[done] if done < len(tasks) else None


def _where(phase: int) -> str:
    if phase == START:
        return "before run_started"
    if phase == FINISHED:
        return "after run_finished"
    if phase == STOPPED:
        return "after run_failed or run_interrupted"
    return f"in phase {PHASES[phase]}"


def _clip(value: Any, limit: int = 80) -> Any:
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + "..."
    return value


def replay(tokens: Iterable[tuple[int, int, Any]], lines: int, *, incomplete: bool = False) -> GrammarFault | None:
    """The verdict on a whole trajectory from its (line, code, key) tokens in order."""
    state = GrammarState()
    for line, code, key in tokens:
        fault = state.feed(line, code, key)
        if fault is not None:
            return fault
    return state.finish(lines, incomplete=incomplete)
