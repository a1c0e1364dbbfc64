"""What ``ale view`` shows: a checked bundle's documents and its trajectory, as the page's data.

:func:`build` takes what the offline checks proved (``ale inspect``'s
:class:`~ale.core.verify.Report`) and the trajectory's events, parsed by the core's strict reader
(:func:`ale.core.trajectory.iter_events`), and makes a :class:`RunView`: the run's header, checks
and scores (``ale inspect``'s own report), the evaluator's episodes (official ones from
``task_results.json``, practice batches from the trajectory), the agent's transcript (its commands,
messages and output, consecutive output lines grouped), the LLM gateway's calls with their tokens,
and the timeline (every event in columns, with its phase and task from :mod:`ale.core.grammar`).

Everything taken from the bundle is untrusted: strings are cut to the page's caps and made
:func:`visible` (control and bidirectional-override characters shown as symbols), and nothing here
formats HTML. No I/O.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, NamedTuple

import attrs
import orjson

from ale.core import grammar
from ale.core.verify import Report, plain

#: Lanes of the timeline, in this order; a producer outside it gets a lane after them.
PRODUCERS: Final = (
    "trusted_harness",
    "trusted_evaluator",
    "trusted_network_proxy",
    "untrusted_agent",
    "derived_verifier",
)
#: Agent output kinds: one line of a stream each; consecutive lines are one block of the transcript.
OUTPUT_KINDS: Final = frozenset({"stdout", "stderr", "policy_stdout", "policy_stderr"})
#: Harness events about the agent, shown in its transcript besides the agent's own.
TRANSCRIPT_HARNESS_KINDS: Final = frozenset(
    {
        "task_started",
        "agent_started",
        "agent_finished",
        "official_evaluation_started",
        "eval_session_opened",
        "policy_finished",
        "official_evaluation_finished",
        "official_evaluation_skipped",
        "output_truncated",
        "rejected_agent_event",
        "events_dropped",
    }
)
#: Caps of the page, in characters (JavaScript string lengths): a one-line summary; the text of a
#: text event (stdout, stderr, note: the harness cuts those at 64 KiB already); one event's data as
#: JSON; all events' text and data together (past it, an event keeps only its summary).
SUMMARY_CHARS: Final = 300
TEXT_CHARS: Final = 64 * 1024
DETAIL_CHARS: Final = 64 * 1024
PAGE_BUDGET_CHARS: Final = 64 * 1024 * 1024
#: Lines of one output block of the transcript (a longer run of lines continues in the next block).
BLOCK_LINES: Final = 500
#: What an event's detail says once the page's budget is spent.
NOT_KEPT: Final = (
    "(not kept: this page holds at most 64 Mi characters of event data; "
    "the bundle holds the event in full: age -d -i KEY BUNDLE | zstd -d | tar -x)"
)

# -- text ------------------------------------------------------------------------------------------

_BIDI = "\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
#: Characters never shown as themselves: C0 controls but tab and newline (as their Unicode
#: control pictures, U+2400...), DEL, C1 controls, bidirectional overrides and lone surrogates.
_SPECIAL = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}\ud800-\udfff]")


def _shown(match: re.Match[str]) -> str:
    ch = match.group()
    code = ord(ch)
    if code < 0x20:
        return chr(0x2400 + code)
    if code == 0x7F:
        return "\u2421"
    if 0xD800 <= code <= 0xDFFF:
        return "\ufffd"
    return f"\u27e8U+{code:04X}\u27e9"


def visible(text: str) -> str:
    """``text`` with every control character (but tab and newline), bidirectional override and lone
    surrogate replaced by a visible stand-in: ``\\x1b`` is ``␛``, U+202E is ``⟨U+202E⟩``."""
    return _SPECIAL.sub(_shown, text) if _SPECIAL.search(text) else text


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how many were cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} characters cut by the viewer]"


def compact(value: Any) -> str:
    """A JSON value on one line: a string as itself, a number in short form, the rest as JSON."""
    kind = type(value)
    if kind is str:
        return str(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is float:
        return f"{value:.6g}"
    if value is None:
        return "null"
    if kind is list and all(type(v) is str for v in value):
        return " ".join(value)
    try:
        return orjson.dumps(value).decode()
    except (TypeError, orjson.JSONEncodeError):
        return repr(value)


def pretty(value: Any) -> str:
    """A JSON value as indented JSON (``repr`` for what JSON cannot hold)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
    except (TypeError, orjson.JSONEncodeError):
        return repr(value)


# -- summaries -------------------------------------------------------------------------------------

_FIELD = re.compile(r"\{([a-z_.]+)\}")
_OPTIONAL = re.compile(r"\[([^\[\]]*)\]")

#: One line per kind: ``{field}`` (dotted for nested members) is the member in short form;
#: ``[...]`` is left out when any member in it is missing, null, false, 0 or empty.
TEMPLATES: Final[Mapping[str, str]] = {
    # trusted_harness
    "run_started": "run {run_id}: {tasks}[; agent {agent.name}][; runtime {runtime}][/{sandbox}]",
    "task_started": "{task} ({mode})",
    "evaluator_started": "{task}",
    "agent_started": "{task}: {command}[ (budget {wall_time_budget_s} s)]",
    "agent_finished": "{task}: exit {exit_status}[, stopped for {stopped_for}][, {wall_time_s} s]"
    "[, {env_steps} env steps][, {oom_kills} OOM kills]",
    "official_evaluation_started": "{task}: {mode}, {episodes} episodes",
    "policy_artifact": "{path}: {bytes} bytes[, sha256 {sha256}]",
    "eval_session_opened": "{task}: {episodes} episodes",
    "policy_finished": "{task}: exit {exit_status}[, stopped for {stopped_for}][, {oom_kills} OOM kills]",
    "official_evaluation_finished": "{task}: {headline_metric} = {headline_value}, "
    "passed {passed_episodes}/{num_episodes}",
    "official_evaluation_skipped": "{task}: {reason}",
    "task_finished": "{task}: {status}[ in {ended.phase}: {ended.category}][ ({reason})]",
    "task_ended_early": "{task}: ended in {phase}: {category} ({reason})",
    "infrastructure_retry": "{task}: {what} failed (attempt {attempt} of {attempts}), again in {backoff_s} s: {error}",
    "run_finished": "{tasks}",
    "run_failed": "{reason}",
    "run_interrupted": "completed: {completed_tasks}",
    "output_truncated": "[{task}: ]{dropped_bytes} bytes of output dropped",
    "rejected_agent_event": "{reason}",
    "unreadable_evaluator_event": "{reason}",
    "events_dropped": "{channel}: {events} events ({bytes} bytes) past its budget of {budget_bytes} bytes",
    "refused_event": "{producer} {kind}: {reason}",
    # trusted_evaluator
    "evaluator_ready": "{task_id}@{task_version}",
    "rpc": "{endpoint} {method} -> {code}[ in {duration_ms} ms][ env {env_id}][ session {session_id}]"
    "[ batch {batch_id}]",
    "rpc_summary": "{endpoint} {method} x{calls} -> {code}[, {env_steps} env steps][ env {env_id}]",
    "eval_session_start": "{session_id}[ on {env_id}]: {num_episodes} episodes",
    "batch_submitted": "{batch_id}: {num_episodes} episodes[ (official: {official})]",
    "batch_progress": "{batch_id} {state}: {episodes_done}/{num_episodes} episodes[, {env_steps} env steps][: {error}]",
    "episode_end": "{session_id} #{index}: length {length}[, aborted: {abort_reason}]",
    "eval_result": "{session_id}: headline {headline_value}, passed {passed_episodes}[, complete: {complete}]",
    # trusted_network_proxy (the LLM gateway, docs/gateway.md)
    "gateway_started": "upstreams {upstreams}, policy {policy}",
    "llm_request": "{method} {path} -> {status}[ {model}][ {decision}][ ({reason})]"
    "[, {usage.input_tokens} in][, {usage.output_tokens} out][, {duration_ms} ms]",
    "policy_changed": "policy {policy}[ (phase {phase})]",
    "budget_exhausted": "{budget}: {used} used of {limit}",
    "gateway_stopped": "requests {requests}, usage {usage}",
    # untrusted_agent (its event channel, docs/agent-contract.md)
    "message": "{role}: {text}",
    "tool_call": "{tool}: {input}",
    "tool_result": "{tool}: {output}",
    "shell_command": "$ {command}[ -> exit {exit_status}]",
    "api_usage": "{model}: {input_tokens} in, {output_tokens} out (the agent's own claim)",
}
#: Members a summary built from every member leaves out (they are in the columns already).
_NOT_SUMMARISED: Final = frozenset({"task", "evaluator_seq"})


#: A compiled template: literal text, a member (a dotted path), or an optional part.
_Part = tuple[str, Any]


def _compile(template: str) -> tuple[_Part, ...]:
    parts: list[_Part] = []
    at = 0
    for match in _OPTIONAL.finditer(template):
        parts.extend(_fields(template[at : match.start()]))
        parts.append(("optional", _fields(match.group(1))))
        at = match.end()
    parts.extend(_fields(template[at:]))
    return tuple(parts)


def _fields(text: str) -> tuple[_Part, ...]:
    parts: list[_Part] = []
    at = 0
    for match in _FIELD.finditer(text):
        if match.start() > at:
            parts.append(("text", text[at : match.start()]))
        parts.append(("member", tuple(match.group(1).split("."))))
        at = match.end()
    if at < len(text):
        parts.append(("text", text[at:]))
    return tuple(parts)


def _member(data: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = data
    for name in path:
        if type(value) is not dict:
            return None
        value = value.get(name)
    return value


def _empty(value: Any) -> bool:
    return value is None or value is False or value == 0 or value == "" or value == [] or value == {}


def _fill(parts: tuple[_Part, ...], data: Mapping[str, Any]) -> str:
    out: list[str] = []
    for what, value in parts:
        if what == "text":
            out.append(value)
        elif what == "member":
            out.append(compact(_member(data, value)))
        elif not any(_empty(_member(data, path)) for kind, path in value if kind == "member"):
            out.append(_fill(value, data))
    return "".join(out)


_COMPILED: Final = {kind: _compile(template) for kind, template in TEMPLATES.items()}


def summary(kind: str, data: Mapping[str, Any]) -> str:
    """One line about an event: by its kind's template, else its members ``name=value``."""
    parts = _COMPILED.get(kind)
    if parts is not None:
        return _fill(parts, data)
    return ", ".join(f"{k}={compact(v)}" for k, v in data.items() if k not in _NOT_SUMMARISED)


def text_only(data: Mapping[str, Any]) -> str | None:
    """The text of an event whose data is exactly ``{"text": str}`` (stdout, stderr, note), else None."""
    if len(data) == 1:
        text = data.get("text")
        if type(text) is str:
            return text
    return None


# -- wall times ------------------------------------------------------------------------------------

_EPOCH_SECONDS: dict[str, int] = {}
_WALL = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def wall_micros(wall_time: Any) -> int | None:
    """Microseconds since the epoch of an RFC 3339 wall time as the trajectory writes it, or None."""
    if type(wall_time) is not str or not _WALL.fullmatch(wall_time):
        return None
    second = wall_time[:19]
    seconds = _EPOCH_SECONDS.get(second)
    if seconds is None:
        try:
            moment = dt.datetime.fromisoformat(second).replace(tzinfo=dt.UTC)
        except ValueError:
            return None
        seconds = _EPOCH_SECONDS[second] = int(moment.timestamp())
    return seconds * 1_000_000 + int(wall_time[20:26])


# -- the model -------------------------------------------------------------------------------------


@attrs.frozen
class Timeline:
    """Every event, in chain order, as columns (index ``i`` is the event with ``seq`` i)."""

    producers: tuple[str, ...]  # the names the ``producer`` column indexes
    kinds: tuple[str, ...]
    phases: tuple[str, ...]
    tasks: tuple[str, ...]
    start_us: int  # the earliest wall time, microseconds since the epoch
    seq: tuple[int, ...]
    producer: tuple[int, ...]
    kind: tuple[int, ...]
    time_us: tuple[int, ...]  # wall time minus start_us
    phase: tuple[int, ...]
    task: tuple[int, ...]  # -1: none
    text: tuple[str, ...]  # the summary, or a text event's whole text
    #: the data (None: it is ``{"text": text}``), or as JSON cut to DETAIL_CHARS when longer, or NOT_KEPT
    detail: tuple[Any, ...]
    by_time: tuple[int, ...]  # indices in wall-time order (then the producer's sequence)
    not_kept: int  # events whose text and data the page's budget left out

    def __len__(self) -> int:
        return len(self.seq)


class Entry(NamedTuple):
    """A transcript entry: a block of consecutive output lines, or one event (a tuple: there may be
    one per event)."""

    type: str  # "output" or "event"
    event: int  # the (first) event's index
    lines: tuple[int, ...] = ()  # output: the lines' event indices
    title: str = ""
    body: str = ""


@attrs.frozen
class LlmCall:
    """One ``llm_request`` of the gateway (docs/gateway.md): what went where, and its tokens."""

    event: int
    request_id: str
    method: str
    path: str
    upstream: str
    model: str
    status: int | None
    decision: str
    reason: str
    stream: bool | None
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    usage_source: str
    duration_ms: float | None
    ttfb_ms: float | None
    bytes_in: int | None
    bytes_out: int | None


@attrs.frozen
class ModelUsage:
    model: str
    calls: int
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int


@attrs.frozen
class LlmTotals:
    calls: int
    allowed: int
    denied: int
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    by_model: tuple[ModelUsage, ...]


@attrs.frozen
class Batch:
    """A batch evaluation the trajectory records: the agent's practice, or the official one."""

    task: str
    batch_id: str
    official: bool | None
    num_episodes: int | None
    state: str
    episodes_done: int | None
    env_steps: int | None
    error: str


@attrs.frozen
class AgentCalls:
    """What the agent did on its own endpoint in a task, from the evaluator's RPC summaries."""

    task: str
    resets: int
    steps: int
    env_steps: int
    rpcs: int


@attrs.frozen
class RunView:
    report: dict[str, Any]  # ``ale inspect --json``'s report
    manifest: dict[str, Any]
    results: list[dict[str, Any]]  # task_results.json's tasks
    network: dict[str, Any]  # network_summary.json
    faithfulness: dict[str, Any]
    timeline: Timeline
    transcript: tuple[Entry, ...]
    llm: tuple[LlmCall, ...]
    llm_totals: LlmTotals
    batches: tuple[Batch, ...]
    agent_calls: tuple[AgentCalls, ...]


class _Index:
    """Names to small integers, in first-seen order after a fixed head."""

    def __init__(self, head: Iterable[str] = ()) -> None:
        self.names: list[str] = list(head)
        self.codes = {name: i for i, name in enumerate(self.names)}

    def __call__(self, name: str) -> int:
        code = self.codes.get(name)
        if code is None:
            code = self.codes[name] = len(self.names)
            self.names.append(name)
        return code


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def _count(value: Any) -> int:
    return value if type(value) is int and value > 0 else 0


def _number(value: Any) -> float | None:
    return float(value) if type(value) in (int, float) else None


def _text(value: Any) -> str:
    return "" if value is None else visible(clip(compact(value), SUMMARY_CHARS))


def _content(kind: str, data: Mapping[str, Any]) -> tuple[str, Any, int]:
    """An event's text (its summary, or a text event's whole text), its detail (the data itself,
    or its JSON cut to :data:`DETAIL_CHARS` when longer; None for a text event) and their size."""
    whole = text_only(data)
    if whole is not None:
        text = visible(clip(whole, TEXT_CHARS))
        return text, None, len(text)
    text = visible(clip(summary(kind, data), SUMMARY_CHARS))
    try:
        encoded = orjson.dumps(data)
    except (TypeError, orjson.JSONEncodeError):  # not JSON (never so in a bundle)
        detail: Any = clip(repr(data), DETAIL_CHARS)
        return text, detail, len(text) + len(detail)
    if len(encoded) > DETAIL_CHARS:
        detail = clip(encoded.decode(), DETAIL_CHARS)
        return text, detail, len(text) + len(detail)
    return text, data, len(text) + len(encoded)


def _not_kept(kind: str, data: Mapping[str, Any]) -> str:
    whole = text_only(data)
    return visible(clip(whole if whole is not None else summary(kind, data), SUMMARY_CHARS))


def build_timeline(events: Iterable[Mapping[str, Any]], tasks: Sequence[str] = ()) -> Timeline:
    """The timeline of ``events`` (in chain order); ``tasks`` come first in its task names. The
    phase is the grammar's after the event (a refused event leaves it as it was); the task is the
    open one (or the one ``task_started`` opens, ``task_finished`` closes)."""
    producers, kinds, task_names = _Index(PRODUCERS), _Index(), _Index(tasks)
    state = grammar.GrammarState()
    seqs: list[int] = []
    producer_col: list[int] = []
    kind_col: list[int] = []
    times: list[int] = []
    phases: list[int] = []
    task_col: list[int] = []
    texts: list[str] = []
    details: list[Any] = []
    order: list[tuple[int, int, int]] = []
    budget, not_kept, last_us = PAGE_BUDGET_CHARS, 0, 0
    for i, event in enumerate(events):
        producer, kind, data = event.get("producer"), event.get("kind"), event.get("data")
        producer = producer if type(producer) is str else "?"
        kind = kind if type(kind) is str else "?"
        data = data if type(data) is dict else {}
        before = state.task
        state.event(i + 1, producer, kind, data)  # a refusal leaves the phase as it was
        task = data.get("task") if kind == "task_started" else (state.task or before)
        micros = wall_micros(event.get("wall_time"))
        if micros is not None:
            last_us = micros
        if budget > 0:
            text, detail, size = _content(kind, data)
            budget -= size
        else:
            text, detail, not_kept = _not_kept(kind, data), NOT_KEPT, not_kept + 1
        seq, sequence = event.get("seq"), event.get("producer_sequence")
        seqs.append(seq if type(seq) is int else i)
        producer_col.append(producers(producer))
        kind_col.append(kinds(kind))
        times.append(last_us)
        phases.append(state.phase)
        task_col.append(task_names(task) if type(task) is str else -1)
        texts.append(text)
        details.append(detail)
        order.append((last_us, sequence if type(sequence) is int else i, i))
    start = min(times, default=0)
    order.sort()
    return Timeline(
        producers=tuple(producers.names),
        kinds=tuple(kinds.names),
        phases=grammar.PHASES,
        tasks=tuple(task_names.names),
        start_us=start,
        seq=tuple(seqs),
        producer=tuple(producer_col),
        kind=tuple(kind_col),
        time_us=tuple(t - start for t in times),
        phase=tuple(phases),
        task=tuple(task_col),
        text=tuple(texts),
        detail=tuple(details),
        by_time=tuple(key[2] for key in order),
        not_kept=not_kept,
    )


# -- the transcript --------------------------------------------------------------------------------

#: Per kind: the members whose text is an event entry's body (the first one present), and its title.
_BODY: Final[Mapping[str, tuple[str, ...]]] = {
    "message": ("text", "content"),
    "tool_call": ("input", "arguments"),
    "tool_result": ("output", "content"),
    "shell_command": ("command",),
    "note": ("text",),
}
_TITLES: Final = {
    kind: _compile(template)
    for kind, template in {
        "message": "{role}",
        "tool_call": "{tool}",
        "tool_result": "{tool}",
        "shell_command": "exit status {exit_status}",
        "note": "",
    }.items()
}


def _body(kind: str, data: Mapping[str, Any]) -> str:
    for name in _BODY.get(kind, ()):
        value = data.get(name)
        if value is not None:
            text = value if type(value) is str else pretty(value)
            return visible(clip(f"$ {text}" if kind == "shell_command" else text, TEXT_CHARS))
    return ""


def _title(kind: str, data: Mapping[str, Any], text: str, body: str) -> str:
    """An event entry's first line: its kind's title when it has a body, else the event's summary."""
    parts = _TITLES.get(kind)
    if parts is None or not body:
        return text
    return visible(clip(_fill(parts, data), SUMMARY_CHARS))


def in_transcript(producer: str, kind: str) -> bool:
    """Whether an event is part of the agent's transcript."""
    if producer == "untrusted_agent":
        return True
    if producer == "trusted_harness":
        return kind in TRANSCRIPT_HARNESS_KINDS
    return producer == "trusted_network_proxy" and kind == "llm_request"


def build_transcript(events: Sequence[Mapping[str, Any]], timeline: Timeline) -> tuple[Entry, ...]:
    """The agent's commands, messages, tool calls, LLM calls and output, in chain order: each run of
    consecutive lines of one output stream in one task is one block (at most :data:`BLOCK_LINES`)."""
    entries: list[Entry] = []
    block: list[int] = []
    block_key: tuple[int, int] | None = None

    def flush() -> None:
        nonlocal block, block_key
        if block:
            entries.append(Entry("output", block[0], tuple(block)))
        block, block_key = [], None

    for i, event in enumerate(events):
        producer, kind = event.get("producer"), event.get("kind")
        if type(producer) is not str or type(kind) is not str or not in_transcript(producer, kind):
            continue
        if producer == "untrusted_agent" and kind in OUTPUT_KINDS:
            key = (timeline.kind[i], timeline.task[i])
            if key != block_key or len(block) >= BLOCK_LINES:
                flush()
                block_key = key
            block.append(i)
            continue
        flush()
        raw = event.get("data")
        data: Mapping[str, Any] = raw if type(raw) is dict else {}
        body = _body(kind, data)
        entries.append(Entry("event", i, (), _title(kind, data, timeline.text[i], body), body))
    flush()
    return tuple(entries)


# -- the gateway's calls ---------------------------------------------------------------------------


def llm_call(index: int, data: Mapping[str, Any]) -> LlmCall:
    """An ``llm_request`` event's data as a call (members of the wrong type read as unknown)."""
    raw_usage = data.get("usage")
    usage: Mapping[str, Any] = raw_usage if type(raw_usage) is dict else {}
    stream = data.get("stream")
    return LlmCall(
        event=index,
        request_id=_text(data.get("request_id")),
        method=_text(data.get("method")),
        path=_text(data.get("path")),
        upstream=_text(data.get("upstream")),
        model=_text(data.get("model")),
        status=_int(data.get("status")),
        decision=_text(data.get("decision")),
        reason=_text(data.get("reason")),
        stream=stream if type(stream) is bool else None,
        input_tokens=_count(usage.get("input_tokens")),
        output_tokens=_count(usage.get("output_tokens")),
        cached_input_tokens=_count(usage.get("cached_input_tokens")),
        usage_source=_text(data.get("usage_source")),
        duration_ms=_number(data.get("duration_ms")),
        ttfb_ms=_number(data.get("ttfb_ms")),
        bytes_in=_int(data.get("bytes_in")),
        bytes_out=_int(data.get("bytes_out")),
    )


def llm_totals(calls: Sequence[LlmCall]) -> LlmTotals:
    """Calls and tokens in all, and per model (most calls first)."""
    per: dict[str, list[int]] = {}
    for call in calls:
        row = per.setdefault(call.model or "(none)", [0, 0, 0, 0])
        row[0] += 1
        row[1] += call.input_tokens
        row[2] += call.output_tokens
        row[3] += call.cached_input_tokens
    by_model = sorted((ModelUsage(m, *row) for m, row in per.items()), key=lambda u: (-u.calls, u.model))
    return LlmTotals(
        calls=len(calls),
        allowed=sum(1 for c in calls if c.decision == "allowed"),
        denied=sum(1 for c in calls if c.decision == "denied"),
        input_tokens=sum(c.input_tokens for c in calls),
        output_tokens=sum(c.output_tokens for c in calls),
        cached_input_tokens=sum(c.cached_input_tokens for c in calls),
        by_model=tuple(by_model),
    )


# -- the evaluator's practice ----------------------------------------------------------------------


def _batches(events: Sequence[Mapping[str, Any]], producer_name: str) -> tuple[Batch, ...]:
    found: dict[str, dict[str, Any]] = {}
    for event in events:
        kind = event.get("kind")
        if event.get("producer") != producer_name or kind not in ("batch_submitted", "batch_progress"):
            continue
        data = event.get("data")
        if type(data) is not dict or type(data.get("batch_id")) is not str:
            continue
        batch = found.setdefault(data["batch_id"], {"state": "submitted"})
        batch.update({k: v for k, v in data.items() if v is not None})
    return tuple(
        Batch(
            task=_text(b.get("task")),
            batch_id=_text(batch_id),
            official=b.get("official") if type(b.get("official")) is bool else None,
            num_episodes=_int(b.get("num_episodes")),
            state=_text(b.get("state")),
            episodes_done=_int(b.get("episodes_done")),
            env_steps=_int(b.get("env_steps")),
            error=_text(b.get("error")),
        )
        for batch_id, b in found.items()
    )


def _agent_calls(events: Sequence[Mapping[str, Any]]) -> tuple[AgentCalls, ...]:
    per: dict[str, list[int]] = {}
    for event in events:
        data = event.get("data")
        if event.get("producer") != "trusted_evaluator" or type(data) is not dict or data.get("endpoint") != "agent":
            continue
        row = per.setdefault(_text(data.get("task")), [0, 0, 0, 0])
        kind = event.get("kind")
        if kind == "rpc":
            row[3] += 1
        elif kind == "rpc_summary":
            calls = _count(data.get("calls"))
            row[0 if data.get("method") == "Reset" else 1] += calls
            row[2] += _count(data.get("env_steps"))
            row[3] += calls
    return tuple(AgentCalls(task, *row) for task, row in per.items())


# -- the whole view --------------------------------------------------------------------------------


def build(report: Report, events: Sequence[Mapping[str, Any]], report_doc: dict[str, Any]) -> RunView:
    """The view of a checked bundle: ``report`` and ``report_doc`` (its JSON form, ``ale inspect
    --json``) and the trajectory's ``events`` in chain order."""
    docs = report.docs
    tasks = [t.task for t in docs.results.tasks]
    timeline = build_timeline(events, tasks)
    calls = tuple(
        llm_call(i, e["data"] if type(e.get("data")) is dict else {})
        for i, e in enumerate(events)
        if e.get("producer") == "trusted_network_proxy" and e.get("kind") == "llm_request"
    )
    return RunView(
        report=report_doc,
        manifest=plain(docs.manifest),
        results=plain(docs.results)["tasks"],
        network=plain(docs.network),
        faithfulness=plain(docs.faithfulness),
        timeline=timeline,
        transcript=build_transcript(events, timeline),
        llm=calls,
        llm_totals=llm_totals(calls),
        batches=_batches(events, "trusted_evaluator"),
        agent_calls=_agent_calls(events),
    )


def _columns(timeline: Timeline) -> dict[str, Any]:
    return {
        "producers": timeline.producers,
        "kinds": timeline.kinds,
        "phases": timeline.phases,
        "tasks": timeline.tasks,
        "start_us": timeline.start_us,
        "seq": timeline.seq,
        "producer": timeline.producer,
        "kind": timeline.kind,
        "time_us": timeline.time_us,
        "phase": timeline.phase,
        "task": timeline.task,
        "text": timeline.text,
        "detail": timeline.detail,
        "by_time": timeline.by_time,
    }


def page_data(view: RunView) -> dict[str, Any]:
    """What the page's script reads (the timeline's columns, the transcript, the calls)."""
    return {
        "timeline": _columns(view.timeline),
        "transcript": {
            "event": [e.event for e in view.transcript],
            "lines": [e.lines if e.type == "output" else None for e in view.transcript],
            "title": [e.title for e in view.transcript],
            "body": [e.body for e in view.transcript],
        },
        "llm": [attrs.asdict(c) for c in view.llm],
    }


#: (pattern, replacement) pairs that keep JSON inert inside ``<script type="application/json">``:
#: no ``<`` (so neither ``</script`` nor ``<!--``), ``>`` or ``&`` outside an escape; U+2028/9 too.
_SCRIPT_SAFE: Final = (
    (b"<", b"\\u003c"),
    (b">", b"\\u003e"),
    (b"&", b"\\u0026"),
    ("\u2028".encode(), b"\\u2028"),
    ("\u2029".encode(), b"\\u2029"),
)
#: What HTML calls a parse error in any text (DEL, C1 controls, noncharacters; JSON leaves them raw),
#: as UTF-8, and the bytes that can start it (a quick test before the slower search).
_HTML_ERRORS: Final = re.compile(
    rb"\x7f|\xc2[\x80-\x9f]|\xef\xb7[\x90-\xaf]|\xef\xbf[\xbe\xbf]|[\xf0-\xf4][\x8f\x9f\xaf\xbf]\xbf[\xbe\xbf]"
)
_HTML_ERROR_LEADS: Final = (b"\x7f", b"\xc2", b"\xef", b"\xf0", b"\xf1", b"\xf2", b"\xf3", b"\xf4")


def _escape(match: re.Match[bytes]) -> bytes:
    code = ord(match.group().decode())
    if code > 0xFFFF:  # as a surrogate pair, as JSON writes one
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}".encode()
    return f"\\u{code:04x}".encode()


def script_json(value: Any) -> str:
    """``value`` as JSON text that is safe inside a ``<script type="application/json">`` element:
    every ``<``, ``>`` and ``&`` (which JSON has only inside strings) written as a ``\\u`` escape,
    and so is every character HTML's parser would report (DEL, C1 controls, noncharacters)."""
    raw = orjson.dumps(value)
    for old, new in _SCRIPT_SAFE:
        if old in raw:
            raw = raw.replace(old, new)
    if any(lead in raw for lead in _HTML_ERROR_LEADS):
        raw = _HTML_ERRORS.sub(_escape, raw)
    return raw.decode()
