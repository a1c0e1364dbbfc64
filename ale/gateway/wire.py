"""What the gateway knows of the OpenAI and Anthropic wire formats (docs/gateway.md). Pure: no I/O.

* :func:`route`: the allow-list, an api kind's (method, path) pairs, each named by its endpoint;
* :func:`error_body` / :func:`stream_error`: the gateway's own errors in that API's format;
* :func:`inspect_request`: a request body's model, stream flag, output limit and visible messages;
  :func:`prepare_body`: the body as forwarded (output limit clamped to the budget, stream usage asked for);
* :func:`read_response`: a whole response's usage and visible content;
* :class:`SseSplitter`, :func:`event_fields` and :class:`StreamReader`: a stream cut into events as
  they arrive, and what its events say (usage, visible text and tool calls, an estimate of the output
  so far).

Hidden reasoning (Chat ``reasoning_content``, Responses ``reasoning`` items, Anthropic ``thinking``
and ``redacted_thinking`` blocks, any member or part whose name or type holds one of
:data:`ale.core.grammar.HIDDEN_REASONING_WORDS`) is dropped from everything this module returns for
recording; it only counts towards the output estimate.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

import attrs
import orjson

from ale.core.grammar import is_hidden_reasoning
from ale.core.parse import SAFE_INTEGER, ParseError, parse_json

CHAT, RESPONSES, MESSAGES, COUNT_TOKENS, MODELS = "chat", "responses", "messages", "count_tokens", "models"
#: endpoints that generate (and are metered: usage, budgets, recorded messages)
GENERATION: Final = frozenset({CHAT, RESPONSES, MESSAGES})
#: (method, path below the upstream's base) -> endpoint, per api kind; ``models/{id}`` apart
ROUTES: Final[Mapping[str, Mapping[tuple[str, str], str]]] = {
    "openai": {("POST", "chat/completions"): CHAT, ("POST", "responses"): RESPONSES, ("GET", "models"): MODELS},
    "anthropic": {
        ("POST", "v1/messages"): MESSAGES,
        ("POST", "v1/messages/count_tokens"): COUNT_TOKENS,
        ("GET", "v1/models"): MODELS,
    },
}
_MODEL_PREFIX: Final = {"openai": "models/", "anthropic": "v1/models/"}
_MODEL_ID = re.compile(r"[A-Za-z0-9._:@+-]+(?:/[A-Za-z0-9._:@+-]+)*")
_QUERY = re.compile(r"[A-Za-z0-9._~=&+-]{0,512}")
MAX_MODEL_ID = 256
#: the field that limits a request's output, per endpoint (Chat: the first one present)
LIMIT_FIELDS: Final = {
    CHAT: ("max_completion_tokens", "max_tokens"),
    RESPONSES: ("max_output_tokens",),
    MESSAGES: ("max_tokens",),
}
#: below this remaining output budget, a request that sets no output limit gets one (docs/gateway.md)
CLAMP_UNSET_BELOW = 16384
CHARS_PER_TOKEN = 4  # the live estimate of a stream's output (only for cutting one that goes over)
#: request bodies (and upstream responses) nested deeper are refused (400) or left unread
MAX_BODY_DEPTH = 48


def route(api: str, method: str, rest: str, query: str) -> tuple[str, str | None] | None:
    """(endpoint, model id of ``models/{id}`` or None) if ``method rest?query`` is allowed for ``api``."""
    if query and not _QUERY.fullmatch(query):
        return None
    endpoint = ROUTES[api].get((method, rest))
    if endpoint is not None:
        return endpoint, None
    prefix = _MODEL_PREFIX[api]
    model = rest.removeprefix(prefix)
    if method != "GET" or model == rest or len(model) > MAX_MODEL_ID or not _MODEL_ID.fullmatch(model):
        return None
    return None if {".", ".."} & set(model.split("/")) else (MODELS, model)


def allowed_paths(api: str) -> str:
    paths = [f"{method} {path}" for method, path in ROUTES[api]]
    return ", ".join([*paths, f"GET {_MODEL_PREFIX[api]}{{id}}"])


# -- errors in each API's format -----------------------------------------------------------------

_ANTHROPIC_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    502: "api_error",
    504: "api_error",
}
_OPENAI_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "server_error",
    504: "server_error",
}


def error_object(api: str, status: int, message: str, code: str, param: str | None = None) -> dict[str, Any]:
    if api == "anthropic":
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}
    kind = _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_body(api: str, status: int, message: str, code: str, param: str | None = None) -> bytes:
    """The body of a gateway error (``api``: "openai" or "anthropic"; unknown upstreams get OpenAI's)."""
    return orjson.dumps(error_object(api, status, message, code, param))


def stream_error(api: str, status: int, message: str, code: str, param: str | None = None) -> bytes:
    """The SSE event that ends a stream the gateway cuts: an ``error`` event, as both APIs send one
    (the official SDKs raise it as an API error)."""
    value = error_object(api, status, message, code, param)
    if api == "openai":
        value = {"type": "error", "code": code, "message": message, "param": param, **value}
    return b"event: error\ndata: " + orjson.dumps(value) + b"\n\n"


# -- requests --------------------------------------------------------------------------------------


@attrs.frozen
class RequestInfo:
    model: str | None
    stream: bool
    limit: int | None  # the output limit the request sets (None: none)
    limit_field: str | None  # which field set it
    stream_usage: bool  # a Chat stream that asked for usage itself


def parse_body(raw: bytes, max_bytes: int) -> dict[str, Any]:
    """A request body: a JSON object (:func:`ale.core.parse.parse_json`), else ParseError."""
    value = parse_json(raw, what="request body", max_bytes=max_bytes, max_depth=MAX_BODY_DEPTH)
    if type(value) is not dict:
        raise ParseError(f"request body: expected a JSON object, got {_json_type(value)}")
    return value


def _json_type(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")


def _count(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value <= SAFE_INTEGER else None


def inspect_request(endpoint: str, body: Mapping[str, Any]) -> RequestInfo:
    """What the gateway reads of a body; ParseError if a member it relies on has the wrong type."""
    model, stream = body.get("model"), body.get("stream", False)
    if model is not None and type(model) is not str:
        raise ParseError("request body: model must be a string")
    if stream is not None and type(stream) is not bool:
        raise ParseError("request body: stream must be true or false")
    limit = limit_field = None
    for name in LIMIT_FIELDS.get(endpoint, ()):
        value = body.get(name)
        if value is not None:
            if _count(value) is None:
                raise ParseError(f"request body: {name} must be a non-negative integer")
            limit, limit_field = value, name
            break
    options = body.get("stream_options")
    stream_usage = type(options) is dict and options.get("include_usage") is True
    return RequestInfo(model, stream is True, limit, limit_field, stream_usage)


def output_clamp(endpoint: str, info: RequestInfo, remaining: int | None) -> int | None:
    """The output limit to set so that the request cannot use more than ``remaining`` tokens, or None
    to leave the request as it is (docs/gateway.md: a request without a limit gets one only when the
    remaining budget is below :data:`CLAMP_UNSET_BELOW`)."""
    if remaining is None or endpoint not in LIMIT_FIELDS:
        return None
    if info.limit is None:
        return remaining if remaining < CLAMP_UNSET_BELOW else None
    return remaining if remaining < info.limit else None


def prepare_body(endpoint: str, body: dict[str, Any], info: RequestInfo, clamp: int | None) -> bytes | None:
    """The body to forward if it must change (None: forward the agent's bytes as they are): the
    output limit set to ``clamp``, and a Chat stream made to report its usage."""
    changes: dict[str, Any] = {}
    if clamp is not None:
        changes[info.limit_field or LIMIT_FIELDS[endpoint][0]] = clamp
    if endpoint == CHAT and info.stream and not info.stream_usage:
        options = body.get("stream_options")
        changes["stream_options"] = {**(options if type(options) is dict else {}), "include_usage": True}
    return orjson.dumps({**body, **changes}) if changes else None


def _visible(value: Any) -> Any:
    """``value`` less every member and list item that names hidden reasoning (by key or ``type``);
    descends through content structure (not into tool inputs, whose keys are the agent's own)."""
    if type(value) is list:
        return [_visible(item) for item in value if not _hidden_item(item)]
    if type(value) is not dict:
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if is_hidden_reasoning(key):
            continue
        out[key] = item if key in _OPAQUE else _visible(item)
    return out


_OPAQUE: Final = frozenset({"input", "arguments", "parameters", "input_schema", "schema", "data", "url"})


def _hidden_item(item: Any) -> bool:
    kind = item.get("type") if type(item) is dict else None
    return type(kind) is str and is_hidden_reasoning(kind)


def visible_messages(endpoint: str, body: Mapping[str, Any]) -> list[Any]:
    """The system-visible messages of a generation request, in order: the system prompt (Anthropic
    ``system``, Responses ``instructions``) first as ``{"role": "system", "content": ...}``, then
    each message or input item, hidden reasoning dropped."""
    head: list[Any] = []
    if endpoint == MESSAGES and body.get("system") not in (None, "", []):
        head = [{"role": "system", "content": _visible(body["system"])}]
    if endpoint == RESPONSES:
        if isinstance(body.get("instructions"), str) and body["instructions"]:
            head = [{"role": "system", "content": body["instructions"]}]
        items = body.get("input")
        if isinstance(items, str):
            return [*head, {"role": "user", "content": items}]
    else:
        items = body.get("messages")
    if type(items) is not list:
        return head
    return head + [_visible(item) for item in items if not _hidden_item(item)]


# -- responses -----------------------------------------------------------------------------------


@attrs.define
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_input_tokens": self.cached_input_tokens,
        }


def _path(value: Any, *names: str) -> Any:
    for name in names:
        if type(value) is not dict:
            return None
        value = value.get(name)
    return value


def usage_of(api: str, usage: Any) -> Usage | None:
    """A usage object normalised: input = every prompt token (Anthropic's cache reads and writes
    added to its ``input_tokens``), cached = the prompt tokens read from cache."""
    if type(usage) is not dict:
        return None
    if api == "anthropic":
        base = _count(usage.get("input_tokens")) or 0
        read = _count(usage.get("cache_read_input_tokens")) or 0
        written = _count(usage.get("cache_creation_input_tokens")) or 0
        return Usage(base + read + written, _count(usage.get("output_tokens")) or 0, read)
    prompt = _count(usage.get("prompt_tokens"))
    if prompt is not None or "completion_tokens" in usage:  # Chat Completions
        cached = _count(_path(usage, "prompt_tokens_details", "cached_tokens")) or 0
        return Usage(prompt or 0, _count(usage.get("completion_tokens")) or 0, cached)
    cached = _count(_path(usage, "input_tokens_details", "cached_tokens")) or 0
    return Usage(_count(usage.get("input_tokens")) or 0, _count(usage.get("output_tokens")) or 0, cached)


@attrs.define
class Visible:
    """A response's visible content, as recorded: text, tool calls, why it stopped, or an error."""

    text: list[str] = attrs.Factory(list)
    calls: dict[Any, dict[str, Any]] = attrs.Factory(dict)  # key -> {"id", "name", "arguments"}
    stop: str | None = None
    error: str | None = None
    chars: int = 0  # text kept (bounded by ``cap``)
    cap: int = 1 << 20

    def add_text(self, text: Any) -> None:
        if type(text) is str and text and self.chars < self.cap:
            self.text.append(text[: self.cap - self.chars])
            self.chars += len(self.text[-1])

    def call(self, key: Any, call_id: Any = None, name: Any = None) -> dict[str, Any]:
        entry = self.calls.get(key)
        if entry is None:
            entry = self.calls[key] = {"id": None, "name": None, "arguments": ""}
        if type(call_id) is str:
            entry["id"] = call_id
        if type(name) is str:
            entry["name"] = name
        return entry

    def add_arguments(self, key: Any, text: Any) -> None:
        entry = self.call(key)
        if type(text) is str and len(entry["arguments"]) < self.cap:
            entry["arguments"] += text[: self.cap - len(entry["arguments"])]

    def as_dict(self) -> dict[str, Any]:
        if self.error is not None:
            return {"error": self.error}
        calls = [dict(c) for c in self.calls.values()]
        return {"text": "".join(self.text), "tool_calls": calls, "stop": self.stop}


def read_response(api: str, endpoint: str, status: int, body: Any) -> tuple[Usage | None, Visible | None]:
    """A whole (not streamed) response's usage and visible content (None for model listings)."""
    if endpoint not in GENERATION:
        return None, None
    seen = Visible()
    if status >= 400 or type(body) is not dict:
        seen.error = _error_message(body) if status >= 400 else "the response is not a JSON object"
        return None, seen
    if endpoint == CHAT:
        message = _first_choice(body)
        seen.add_text(_path(message, "message", "content"))
        seen.stop = _text_or_none(_path(message, "finish_reason"))
        for i, call in enumerate(_list(_path(message, "message", "tool_calls"))):
            seen.call(i, _path(call, "id"), _path(call, "function", "name"))
            seen.add_arguments(i, _path(call, "function", "arguments"))
    elif endpoint == RESPONSES:
        seen.stop = _text_or_none(body.get("status"))
        for i, item in enumerate(_list(body.get("output"))):
            _response_item(seen, i, item)
    else:
        seen.stop = _text_or_none(body.get("stop_reason"))
        for i, block in enumerate(_list(body.get("content"))):
            _anthropic_block(seen, i, block)
    return usage_of(api, body.get("usage")), seen


def _first_choice(body: Mapping[str, Any]) -> Any:
    choices = body.get("choices")
    return choices[0] if type(choices) is list and choices else None


def _list(value: Any) -> list[Any]:
    return value if type(value) is list else []


def _text_or_none(value: Any) -> str | None:
    return value if type(value) is str else None


def _error_message(body: Any) -> str:
    error = _path(body, "error")
    message = _path(error, "message") if type(error) is dict else error
    return message if type(message) is str else "the upstream answered with an error"


def _response_item(seen: Visible, key: Any, item: Any) -> None:
    kind = _path(item, "type")
    if kind == "message":
        for part in _list(_path(item, "content")):
            if _path(part, "type") in ("output_text", "refusal"):
                seen.add_text(_path(part, "text") or _path(part, "refusal"))
    elif kind == "function_call":
        seen.call(key, _path(item, "call_id"), _path(item, "name"))
        seen.add_arguments(key, _path(item, "arguments"))


def _anthropic_block(seen: Visible, key: Any, block: Any) -> None:
    kind = _path(block, "type")
    if kind == "text":
        seen.add_text(_path(block, "text"))
    elif kind in ("tool_use", "server_tool_use"):
        seen.call(key, _path(block, "id"), _path(block, "name"))
        arguments = _path(block, "input")
        seen.add_arguments(key, orjson.dumps(arguments).decode() if arguments is not None else "")


# -- streams ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def _hidden(name: str) -> bool:
    """:func:`is_hidden_reasoning`, remembered (a stream asks it of the same few names in every event)."""
    return is_hidden_reasoning(name)


_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")


class Unread(bytes):
    """Bytes of an event too large to read (over ``max_pending``): passed on as they are."""


@attrs.define
class SseSplitter:
    """Cuts a byte stream into whole SSE events as they arrive. ``feed`` returns the events complete
    so far, each as its bytes (up to and with the blank line that ends it). A pending event larger
    than ``max_pending`` bytes is given back as :class:`Unread` (forwarded, not read) and the rest of
    it is passed through unread up to its end. Boundaries are found with ``bytes.find`` (a regular
    expression only when the stream holds a carriage return), and a long pending event is not
    searched again from its start at each piece."""

    max_pending: int = 8 << 20
    _buffer: bytes = b""
    _skipping: bool = False

    @property
    def pending(self) -> bool:
        """Whether an unfinished event is held back."""
        return bool(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        old = len(self._buffer)
        buffer = self._buffer + data if old else data
        search = max(0, old - 3)  # no boundary ended inside the old buffer; one may end just past it
        out: list[bytes] = []
        start = 0
        if b"\r" in buffer:
            for match in _BOUNDARY.finditer(buffer, search):
                out.append(buffer[start : match.end()])
                start = match.end()
        else:
            while (found := buffer.find(b"\n\n", search)) >= 0:
                search = found + 2
                out.append(buffer[start:search])
                start = search
        if self._skipping and out:
            self._skipping = False
            out[0] = Unread(out[0])
        rest = buffer[start:] if start else buffer
        if len(rest) > self.max_pending or (self._skipping and rest):
            out.append(Unread(rest))
            self._skipping, rest = True, b""
        self._buffer = rest
        return out

    def flush(self) -> bytes:
        """Whatever is left at the end of the stream (an unterminated event), as it is."""
        rest, self._buffer = self._buffer, b""
        return rest


def event_fields(raw: bytes) -> tuple[str | None, bytes | None]:
    """An event's name (None: none) and data (its ``data`` lines joined by newlines; None: none).
    The usual event, one ``data:`` line and nothing else, is cut out without splitting lines."""
    if raw.startswith(b"data: ") and raw.endswith(b"\n\n") and raw.find(b"\n", 6) == len(raw) - 2:
        data = raw[6:-2]
        if b"\r" not in data:
            return None, data
    name: str | None = None
    lines: list[bytes] = []
    for line in raw.splitlines():
        field, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if field == b"event":
            name = value.decode("utf-8", "replace")
        elif field == b"data":
            lines.append(value)
    return name, b"\n".join(lines) if lines else None


@attrs.define
class StreamReader:
    """What one stream's events say: usage, visible content, an estimate of the output so far."""

    api: str
    endpoint: str
    drop_usage_chunk: bool = False  # a Chat stream whose usage the gateway asked for (not the agent)
    usage: Usage | None = None
    seen: Visible = attrs.Factory(Visible)
    output_chars: int = 0
    max_event_bytes: int = 8 << 20
    _anthropic_usage: dict[str, int] = attrs.Factory(dict)

    @property
    def estimated_output(self) -> int:
        return -(-self.output_chars // CHARS_PER_TOKEN)

    def take(self, events: list[bytes]) -> list[bytes]:
        """Read whole events (a :class:`SseSplitter`'s); the ones to forward (``events`` itself when
        that is all of them)."""
        dropped = None
        for index, raw in enumerate(events):
            if type(raw) is not Unread and not self.event(*event_fields(raw)):
                dropped = [*(dropped or ()), index]
        return events if dropped is None else [raw for i, raw in enumerate(events) if i not in dropped]

    def event(self, name: str | None, data: bytes | None) -> bool:
        """Read one event; False if it is not to be forwarded (the usage chunk the agent did not ask for)."""
        if data is None or data == b"[DONE]" or len(data) > self.max_event_bytes:
            return True
        try:
            value = parse_json(
                data, what="stream event", max_bytes=self.max_event_bytes, max_depth=MAX_BODY_DEPTH, unique_keys=False
            )
        except ParseError:
            return True
        if type(value) is not dict:
            return True
        if name == "error" or value.get("type") == "error":
            self.seen.error = _error_message(value) if "error" in value else _text_or_none(value.get("message"))
            return True
        if self.endpoint == CHAT:
            return self._chat(value)
        if self.endpoint == RESPONSES:
            self._responses(value)
        elif self.endpoint == MESSAGES:
            self._messages(value)
        return True

    def _chat(self, value: dict[str, Any]) -> bool:
        usage = usage_of(self.api, value.get("usage"))
        if usage is not None:
            self.usage = usage
        choice = _first_choice(value)
        if choice is None:
            return not (usage is not None and self.drop_usage_chunk)
        delta = _path(choice, "delta")
        if type(delta) is dict:
            self._chars(delta.get("content"))
            self.seen.add_text(delta.get("content"))
            for key, item in delta.items():
                if _hidden(key):
                    self._chars(item)
            for call in _list(delta.get("tool_calls")):
                key = _path(call, "index")
                self.seen.call(key, _path(call, "id"), _path(call, "function", "name"))
                arguments = _path(call, "function", "arguments")
                self._chars(arguments)
                self.seen.add_arguments(key, arguments)
        if _text_or_none(_path(choice, "finish_reason")):
            self.seen.stop = choice["finish_reason"]
        return True

    def _responses(self, value: dict[str, Any]) -> None:
        kind = value.get("type")
        if type(kind) is not str:
            return
        if kind == "response.output_text.delta" or kind == "response.refusal.delta":
            self._chars(value.get("delta"))
            self.seen.add_text(value.get("delta"))
        elif kind == "response.output_item.added" and _path(value, "item", "type") == "function_call":
            self.seen.call(_path(value, "item", "id"), _path(value, "item", "call_id"), _path(value, "item", "name"))
        elif kind == "response.function_call_arguments.delta":
            self._chars(value.get("delta"))
            self.seen.add_arguments(value.get("item_id"), value.get("delta"))
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            response = value.get("response")
            self.usage = usage_of(self.api, _path(response, "usage")) or self.usage
            self.seen.stop = _text_or_none(_path(response, "status"))
        elif _hidden(kind) and kind.endswith(".delta"):
            self._chars(value.get("delta"))

    def _messages(self, value: dict[str, Any]) -> None:
        kind = value.get("type")
        if kind == "message_start":
            self._merge_usage(_path(value, "message", "usage"))
        elif kind == "content_block_start":
            block = value.get("content_block")
            if _path(block, "type") in ("tool_use", "server_tool_use"):
                self.seen.call(value.get("index"), _path(block, "id"), _path(block, "name"))
            elif _path(block, "type") == "text":
                self.seen.add_text(_path(block, "text"))
        elif kind == "content_block_delta":
            self._block_delta(value.get("index"), value.get("delta"))
        elif kind == "message_delta":
            self._message_delta(value)

    def _block_delta(self, index: Any, delta: Any) -> None:
        kind = _path(delta, "type")
        if kind == "text_delta":
            self._chars(_path(delta, "text"))
            self.seen.add_text(_path(delta, "text"))
        elif kind == "input_json_delta":
            self._chars(_path(delta, "partial_json"))
            self.seen.add_arguments(index, _path(delta, "partial_json"))
        elif type(kind) is str and _hidden(kind):
            self._chars(_path(delta, "thinking"))

    def _message_delta(self, value: dict[str, Any]) -> None:
        self.seen.stop = _text_or_none(_path(value, "delta", "stop_reason")) or self.seen.stop
        self._merge_usage(value.get("usage"))

    def _merge_usage(self, raw: Any) -> None:
        """Anthropic's counts are cumulative: a message_delta's replace what message_start said."""
        if type(raw) is dict:
            self._anthropic_usage.update({k: v for k, v in raw.items() if _count(v) is not None})
            self.usage = usage_of(self.api, self._anthropic_usage)

    def _chars(self, text: Any) -> None:
        if type(text) is str:
            self.output_chars += len(text)


def events_of(splitter: SseSplitter, chunks: Iterator[bytes]) -> Iterator[tuple[bytes, str | None, bytes | None]]:
    """Every event of a whole byte stream with its name and data (tests and the fuzz target); an
    unread one (:class:`Unread`) or the unterminated rest as (its bytes, None, None)."""
    for chunk in chunks:
        for raw in splitter.feed(chunk):
            yield (raw, None, None) if type(raw) is Unread else (raw, *event_fields(raw))
    rest = splitter.flush()
    if rest:
        yield rest, None, None
