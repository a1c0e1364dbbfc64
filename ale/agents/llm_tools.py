"""The LLM agent's tools: list, read and write files, run a shell command, finish.

Every call gets a :class:`ToolResult`, never an exception: arguments that are not a JSON object
(read with :func:`ale.core.parse.parse_json`, size- and depth-bounded), unknown or mistyped
arguments, paths outside the allowed folders (after resolving symlinks), files too large, a
command that runs too long or prints too much, all come back as a clear error text the model can
act on. Reads may look at the workspace and the task folder; writes go to the workspace only.
"""

from __future__ import annotations

import math
import os
import selectors
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from ale.core.parse import JsonLimitError, ParseError, parse_json
from ale.policy import MAX_POLICY_BYTES, PolicyError, load_policy

MAX_ARGUMENT_BYTES = 8 * 1024 * 1024  # a tool call's arguments (write_file's content inside)
MAX_ARGUMENT_DEPTH = 8
MAX_WRITE_BYTES = 4 * 1024 * 1024
MAX_PATH_CHARS = 4096
MAX_LIST_ENTRIES = 400
MAX_LIST_DEPTH = 6
DEFAULT_READ_LINES = 2000
KILL_GRACE_S = 2.0  # SIGTERM, then SIGKILL to the command's process group after this long
DRAIN_S = 0.5  # after the command exits, how long to keep reading what its children still print


@attrs.frozen
class ToolResult:
    text: str
    error: bool = False
    finish: bool = False
    shell: tuple[str, int | None] | None = None  # (command, exit status or None when killed)


class ToolError(Exception):
    """A call that cannot be carried out; the text goes back to the model."""


def _fail(text: str) -> ToolResult:
    return ToolResult(text=f"error: {text}", error=True)


def cut(text: str, limit: int, *, hint: str = "") -> str:
    """``text`` at most ``limit`` characters: its head and tail around a marker naming what was cut."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = max(limit - head, 0)
    omitted = len(text) - head - tail
    marker = f"\n[... {omitted} characters cut{'; ' + hint if hint else ''} ...]\n"
    return text[:head] + marker + (text[-tail:] if tail else "")


class _Capture:
    """A command's output as its first and last ``limit`` bytes, counting what was dropped between."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.limit:
                del self.tail[: len(self.tail) - self.limit]

    def text(self) -> str:
        dropped = self.total - len(self.head) - len(self.tail)
        head = self.head.decode("utf-8", "replace")
        if not self.tail:
            return head
        tail = self.tail.decode("utf-8", "replace")
        if dropped <= 0:
            return head + tail
        return f"{head}\n[... {dropped} bytes of output cut; print less, or write it to a file ...]\n{tail}"


# -- the tool definitions the model sees -----------------------------------------------------------


def _function(name: str, description: str, properties: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(required),
                "additionalProperties": False,
            },
        },
    }


def definitions(*, max_timeout_s: float) -> list[dict[str, Any]]:
    """The tools in the Chat Completions ``tools`` format."""
    path = {"type": "string", "description": "a path; relative paths are relative to the workspace"}
    return [
        _function(
            "list_files",
            "List the files under a folder of the workspace or of /task, with their sizes.",
            {"path": path, "depth": {"type": "integer", "description": f"levels to descend, 1-{MAX_LIST_DEPTH}"}},
            [],
        ),
        _function(
            "read_file",
            "Read a text file of the workspace or of /task, a range of lines at a time.",
            {
                "path": path,
                "offset": {"type": "integer", "description": "the first line to read, from 1"},
                "limit": {"type": "integer", "description": f"how many lines (default {DEFAULT_READ_LINES})"},
            },
            ["path"],
        ),
        _function(
            "write_file",
            "Create or replace a file in the workspace with the given content (parent folders are made).",
            {
                "path": path,
                "content": {
                    "type": "string",
                    "description": f"the whole new content (at most {MAX_WRITE_BYTES} bytes)",
                },
                "executable": {"type": "boolean", "description": "make the file executable (chmod 755)"},
            },
            ["path", "content"],
        ),
        _function(
            "run_shell",
            "Run a bash command in the workspace folder; returns its exit status and output (stdout and "
            "stderr together; long output is cut in the middle). Nothing is interactive: stdin is empty. "
            "On a timeout the command and everything it started are killed; a background job "
            "(`cmd > log 2>&1 &`) of a command that returns in time keeps running.",
            {
                "command": {"type": "string", "description": "the command line"},
                "timeout_s": {
                    "type": "number",
                    "description": f"seconds before the command is killed (default 120, at most {max_timeout_s:.0f})",
                },
            },
            ["command"],
        ),
        _function(
            "finish",
            "End the session: call it once the policy file is in place and checked.",
            {"summary": {"type": "string", "description": "what you did and how well the policy did"}},
            [],
        ),
    ]


# Per tool: argument name -> (accepted JSON types, required).
_SCHEMAS: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "list_files": {"path": ((str,), False), "depth": ((int,), False)},
    "read_file": {"path": ((str,), True), "offset": ((int,), False), "limit": ((int,), False)},
    "write_file": {"path": ((str,), True), "content": ((str,), True), "executable": ((bool,), False)},
    "run_shell": {"command": ((str,), True), "timeout_s": ((int, float), False)},
    "finish": {"summary": ((str,), False)},
}
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def parse_arguments(name: str, raw: str) -> dict[str, Any]:
    """The arguments of a call to tool ``name``, checked against its schema; raises :class:`ToolError`."""
    schema = _SCHEMAS[name]
    if not raw.strip():
        raw = "{}"
    try:
        args = parse_json(raw, what="the arguments", max_bytes=MAX_ARGUMENT_BYTES, max_depth=MAX_ARGUMENT_DEPTH)
    except JsonLimitError as exc:
        raise ToolError(f"{exc} (write large files in pieces, or generate them with a script)") from None
    except ParseError as exc:
        raise ToolError(f"{exc}; arguments must be one JSON object (was the reply cut at the output limit?)") from None
    if not isinstance(args, dict):
        raise ToolError(f"the arguments must be a JSON object, not {type(args).__name__}")
    unknown = sorted(set(args) - set(schema))
    if unknown:
        shown = ", ".join(repr(cut(k, 40)) for k in unknown[:5])
        raise ToolError(f"{name} takes no argument {shown}; it takes {', '.join(schema) or 'none'}")
    for key, (types, required) in schema.items():
        if key not in args or args[key] is None:
            if required:
                raise ToolError(f"{name} needs the argument {key!r}")
            args.pop(key, None)
            continue
        value = args[key]
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            wanted = _TYPE_NAMES[float if float in types else types[0]]
            raise ToolError(f"{name}: {key!r} must be {wanted}, not {type(value).__name__}")
    return args


# -- the tools ------------------------------------------------------------------------------------


@attrs.define
class Tools:
    """The tools of one agent session in ``workspace``; ``readable`` are more folders it may read."""

    workspace: Path
    readable: tuple[Path, ...] = ()
    output_limit: int = 12_000  # characters of one result
    default_timeout_s: float = 120.0
    max_timeout_s: float = 1800.0
    time_left: Callable[[], float] = lambda: math.inf
    env: Mapping[str, str] = attrs.Factory(dict)  # the shell's environment
    required: Path | None = None  # the policy file finish looks for
    required_executable: bool = False
    _warned_finish: bool = attrs.field(init=False, default=False)
    shell: str = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.workspace = Path(os.path.realpath(self.workspace))
        self.readable = tuple(Path(os.path.realpath(p)) for p in self.readable)
        self.shell = "/bin/bash" if os.access("/bin/bash", os.X_OK) else "/bin/sh"

    def definitions(self) -> list[dict[str, Any]]:
        return definitions(max_timeout_s=self.max_timeout_s)

    def call(self, name: str, raw_arguments: str) -> ToolResult:
        """Run tool ``name`` with the model's raw JSON arguments; every failure is an error result."""
        if name not in _SCHEMAS:
            return _fail(f"there is no tool {cut(name, 60)!r}; the tools are {', '.join(_SCHEMAS)}")
        try:
            args = parse_arguments(name, raw_arguments)
            result: ToolResult = getattr(self, f"_{name}")(**args)
        except ToolError as exc:
            return _fail(str(exc))
        except OSError as exc:
            return _fail(f"{name}: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""))
        return attrs.evolve(result, text=cut(result.text, self.output_limit))

    # -- paths --

    def _resolve(self, raw: str, *, write: bool) -> Path:
        if not raw or len(raw) > MAX_PATH_CHARS or "\x00" in raw:
            raise ToolError("the path must be a non-empty string without NUL, at most 4096 characters")
        candidate = Path(raw) if os.path.isabs(raw) else self.workspace / raw
        real = Path(os.path.realpath(candidate))
        roots = (self.workspace,) if write else (self.workspace, *self.readable)
        if not any(real == r or real.is_relative_to(r) for r in roots):
            where = str(self.workspace) if write else " or ".join(str(r) for r in roots)
            shown = cut(raw, 200)
            verb = "written" if write else "read"
            raise ToolError(f"{shown!r} is outside {where}: only files there can be {verb} with this tool")
        return real

    # -- list_files --

    def _list_files(self, path: str = ".", depth: int = 2) -> ToolResult:
        root = self._resolve(path, write=False)
        if not root.is_dir():
            raise ToolError(f"{cut(path, 200)!r} is not a folder")
        depth = min(max(depth, 1), MAX_LIST_DEPTH)
        lines: list[str] = []
        more = self._walk(root, root, depth, lines)
        if not lines:
            return ToolResult(text=f"{root}: empty")
        if more:
            lines.append(f"[... {more} more entries not listed; list a subfolder]")
        return ToolResult(text=f"{root}:\n" + "\n".join(lines))

    def _walk(self, root: Path, folder: Path, depth: int, lines: list[str]) -> int:
        """Append entries under ``folder`` to ``lines``; return how many did not fit."""
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            lines.append(f"{folder.relative_to(root)}/: cannot list ({exc.strerror})")
            return 0
        skipped = 0
        for entry in entries:
            if len(lines) >= MAX_LIST_ENTRIES:
                skipped += 1
                continue
            rel = Path(entry.path).relative_to(root)
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                lines.append(f"{rel} (unreadable)")
                continue
            if stat.S_ISDIR(info.st_mode):
                lines.append(f"{rel}/")
                if depth > 1:
                    skipped += self._walk(root, Path(entry.path), depth - 1, lines)
            elif stat.S_ISLNK(info.st_mode):
                lines.append(f"{rel} -> {os.readlink(entry.path)}")
            else:
                mark = "*" if info.st_mode & 0o111 else ""
                lines.append(f"{rel}{mark} ({info.st_size} bytes)")
        return skipped

    # -- read_file --

    def _read_file(self, path: str, offset: int = 1, limit: int = DEFAULT_READ_LINES) -> ToolResult:
        real = self._resolve(path, write=False)
        if not real.exists():
            raise ToolError(f"there is no file {cut(path, 200)!r}")
        if real.is_dir():
            raise ToolError(f"{cut(path, 200)!r} is a folder; use list_files")
        if not real.is_file():
            raise ToolError(f"{cut(path, 200)!r} is not a regular file")
        if offset < 1 or limit < 1:
            raise ToolError("offset and limit must be at least 1")
        size = real.stat().st_size
        with open(real, "rb") as fh:
            if b"\x00" in fh.read(8192):
                raise ToolError(f"{real} is a binary file of {size} bytes; inspect it with run_shell (python, xxd)")
            fh.seek(0)
            return ToolResult(text=self._lines(fh, real, size, offset, limit))

    def _lines(self, fh: Any, real: Path, size: int, offset: int, limit: int) -> str:
        budget = self.output_limit - 200
        out: list[str] = []
        used = 0
        number = 0
        last = offset - 1
        for number, raw in enumerate(fh, start=1):
            if number < offset:
                continue
            if number >= offset + limit:
                break
            line = raw.decode("utf-8", "replace")
            if used + len(line) > budget:
                out.append(line[: max(budget - used, 0)])
                return (
                    "".join(out)
                    + f"\n[... cut at the output limit inside line {number}; read on with offset={number + 1}]"
                )
            out.append(line)
            used += len(line)
            last = number
        if not out:
            return f"{real}: {size} bytes, {number} lines; nothing from line {offset}"
        text = "".join(out)
        more = fh.read(1)
        tail = f"\n[... lines {offset}-{last} shown; more follows: read on with offset={last + 1}]" if more else ""
        return text + tail

    # -- write_file --

    def _write_file(self, path: str, content: str, executable: bool = False) -> ToolResult:
        data = content.encode("utf-8", "surrogatepass")
        if len(data) > MAX_WRITE_BYTES:
            raise ToolError(f"the content is {len(data)} bytes, more than {MAX_WRITE_BYTES}; generate it with a script")
        real = self._resolve(path, write=True)
        if real == self.workspace or real.is_dir():
            raise ToolError(f"{cut(path, 200)!r} is a folder")
        real.parent.mkdir(parents=True, exist_ok=True)
        tmp = real.with_name(f".{real.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, 0o755 if executable else 0o644)
            os.replace(tmp, real)
        finally:
            tmp.unlink(missing_ok=True)
        mode = ", executable" if executable else ""
        return ToolResult(text=f"wrote {len(data)} bytes to {real}{mode}")

    # -- finish --

    def _finish(self, summary: str = "") -> ToolResult:
        problem = self.policy_problem()
        if problem is not None and not self._warned_finish:
            self._warned_finish = True
            return _fail(f"{problem}. Put the policy in place, then call finish again (a second finish ends anyway)")
        return ToolResult(text="finished" + (f", although {problem}" if problem else ""), finish=True)

    def policy_problem(self) -> str | None:
        """Why the policy the harness will look for is not in place (None: it is there)."""
        path = self.required
        if path is None:
            return None
        try:
            info = path.lstat()
        except FileNotFoundError:
            return f"there is no {path} yet"
        if not stat.S_ISREG(info.st_mode):
            return f"{path} is not a regular file"
        if self.required_executable:
            if not info.st_mode & 0o111:
                return f"{path} is not executable (write_file with executable=true, or chmod +x)"
            return None
        with open(path, "rb") as fh:
            raw = fh.read(MAX_POLICY_BYTES + 1)
        try:
            load_policy(raw)
        except PolicyError as exc:
            return f"{path} is not a valid policy artifact: {exc}"
        return None

    # -- run_shell --

    def _run_shell(self, command: str, timeout_s: float | None = None) -> ToolResult:
        if "\x00" in command:
            raise ToolError("the command contains a NUL character")
        if not command.strip():
            raise ToolError("the command is empty")
        timeout = self.default_timeout_s if timeout_s is None else float(timeout_s)
        if not math.isfinite(timeout) or timeout <= 0:
            raise ToolError("timeout_s must be a positive number of seconds")
        note = ""
        if timeout > self.max_timeout_s:
            timeout, note = self.max_timeout_s, f" (timeout_s capped at {self.max_timeout_s:.0f})"
        left = self.time_left()
        if left < timeout:
            if left < 1:
                raise ToolError("no wall time is left for commands; call finish")
            timeout = left
            if timeout_s is not None:
                note = f" (timeout_s cut to the {left:.0f} s of wall time left)"
        started = time.monotonic()
        status, capture, timed_out = self._spawn(command, timeout)
        took = time.monotonic() - started
        head = (
            f"killed after {timeout:.3g} s (timeout){note}"
            if timed_out
            else f"exit status {status} in {took:.1f} s{note}"
        )
        output = capture.text()
        return ToolResult(
            text=f"{head}\n{output}" if output else f"{head}, no output",
            error=timed_out or status != 0,
            shell=(command, None if timed_out else status),
        )

    def _spawn(self, command: str, timeout: float) -> tuple[int | None, _Capture, bool]:
        capture = _Capture(max(self.output_limit // 2 - 100, 256))
        proc = subprocess.Popen(
            [self.shell, "-c", command],
            cwd=self.workspace,
            env=dict(self.env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert proc.stdout is not None
        timed_out = True
        try:
            timed_out = not _pump(proc, capture, time.monotonic() + timeout)
        finally:
            if timed_out:  # also when the agent is being stopped: leave nothing of the command behind
                _kill_group(proc)
            proc.stdout.close()
        return (None if timed_out else proc.returncode), capture, timed_out


def _pump(proc: subprocess.Popen[bytes], capture: _Capture, deadline: float) -> bool:
    """Read ``proc``'s output into ``capture`` until it exits (and its children stop writing) or
    ``deadline``; False on the deadline."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    drain_until: float | None = None
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if proc.poll() is not None and drain_until is None:
                drain_until = min(now + DRAIN_S, deadline)
            limit = drain_until if drain_until is not None else deadline
            if now >= limit:
                return drain_until is not None
            if sel.select(min(limit - now, 0.2)):
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not data:  # EOF: every writer is gone; the command may still run
                    try:
                        proc.wait(max(deadline - time.monotonic(), 0.01))
                    except subprocess.TimeoutExpired:
                        return False
                    return True
                capture.add(data)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End what is left of the command's process group: SIGTERM, then SIGKILL after a grace."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(wait)
            os.killpg(proc.pid, 0)  # still members left (the command's own children)?
        except subprocess.TimeoutExpired:
            continue
        except (ProcessLookupError, PermissionError):
            break
    if proc.poll() is None:
        proc.wait()
