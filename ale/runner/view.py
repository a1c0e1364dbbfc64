"""``ale view``: a bundle's run as one self-contained HTML page, written to a file or served on
localhost (the trajectory viewer, as ``inspect view`` is for Inspect logs).

The bundle is decrypted and checked by ``ale inspect``'s own code (:func:`ale.runner.inspect.offline_check`:
the site's checks, offline); a bundle that fails them gets no view, only their verdict. The page
(:mod:`ale.runner.view_model` builds its data) is one file with its style, script and data inline
and no reference to anything outside it: it works from ``file://`` and makes no request. Its
``Content-Security-Policy`` allows only its own style and script (by their SHA-256) and no
connection, and everything from the bundle is escaped (Jinja's autoescape; the data the script
reads sits in a ``<script type="application/json">`` with every ``<``, ``>`` and ``&`` escaped, and
the script builds the page's lists with ``textContent`` only).
"""

from __future__ import annotations

import base64
import functools
import gc
import hashlib
import http.server
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from ale import __version__
from ale.core.trajectory import iter_events
from ale.core.verify import KeyLookup, Report, VerificationError
from ale.runner import view_model
from ale.runner.inspect import IdentityError, key_lookup, offline_check, read_identity, report_json, runner_public_key

LOCALHOST = "127.0.0.1"


class ViewError(Exception):
    """A problem the user can fix (exit status 2)."""


# -- rendering -------------------------------------------------------------------------------------


def _number(value: Any, digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if value.is_integer() and abs(value) < 1e15 else f"{value:.{digits}g}"
    return str(value)


def _percent(value: Any) -> str:
    return "n/a" if not isinstance(value, int | float) or isinstance(value, bool) else f"{100 * value:.1f}%"


def _finalize(value: Any) -> Any:
    """Every ``{{ ... }}``: a string from anywhere is shown with its control characters visible."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return view_model.visible(value)
    return value


def _sparkline(values: Iterable[float], width: int = 240, height: int = 36) -> Markup:
    """Bars of per-episode values as an inline SVG (numbers only; nothing from the bundle as text)."""
    points = [float(v) for v in values]
    if not points:
        return Markup("")
    low, high = min(0.0, *points), max(0.0, *points)
    span = (high - low) or 1.0
    bar = width / len(points)
    zero = height * high / span
    rects = []
    for i, v in enumerate(points):
        top = height * (high - max(v, 0.0)) / span
        size = max(height * abs(v) / span, 0.5)
        rects.append(f'<rect x="{i * bar:.2f}" y="{min(top, zero):.2f}" width="{max(bar - 0.4, 0.3):.2f}" '
                     f'height="{size:.2f}"/>')  # fmt: skip
    return Markup(
        f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="per-episode values, {len(points)} episodes">{"".join(rects)}</svg>'
    )


@functools.cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("ale.runner", "templates"),
        autoescape=True,
        finalize=_finalize,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _number
    env.filters["pct"] = _percent
    env.filters["spark"] = _sparkline
    env.filters["compact"] = view_model.compact
    return env


def _asset(name: str) -> str:
    return (resources.files("ale.runner") / "templates" / name).read_text(encoding="utf-8")


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def content_security_policy(style: str, script: str) -> str:
    """Only the page's own style and script (by hash), data: images (the icon), nothing to connect to."""
    return (
        f"default-src 'none'; style-src {_csp_hash(style)}; script-src {_csp_hash(script)}; img-src data:; "
        "base-uri 'none'; form-action 'none'"
    )


def render(view: view_model.RunView, *, source: str) -> str:
    """The page of ``view``; ``source`` names the bundle it came from (its file name)."""
    style, script = _asset("view.css"), _asset("view.js")
    if "</" in script or "</" in style:  # the inline elements must not end early
        raise AssertionError("view.js and view.css must not contain '</'")
    return (
        _environment()
        .get_template("view.html")
        .render(
            view=view,
            run=view.report,
            manifest=view.manifest,
            source=source,
            version=__version__,
            style=Markup(style),
            script=Markup(script),
            csp=content_security_policy(style, script),
            data=Markup(view_model.script_json(view_model.page_data(view))),
            producer_names=view.timeline.producers,
            producer_counts=_producer_counts(view.timeline),
        )
    )


def _producer_counts(timeline: view_model.Timeline) -> dict[str, int]:
    counts = [0] * len(timeline.producers)
    for p in timeline.producer:
        counts[p] += 1
    return {name: counts[i] for i, name in enumerate(timeline.producers) if counts[i]}


# -- from a bundle ---------------------------------------------------------------------------------


@contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a trajectory's events become the page's data: up to
    ~100k events allocate millions of objects and no cycles, and the collector's passes over them
    cost a third of the time."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def view_of(report: Report) -> view_model.RunView:
    """The view of a bundle the offline checks passed (its trajectory parsed again, strictly)."""
    with _collector_paused():
        events = [event for _, event in iter_events(report.docs.events)]
        return view_model.build(report, events, report_json(report))


def load(bundle: Path, identity_path: Path, runner_keys: Iterable[str] = ()) -> Report:
    """Decrypt and check ``bundle`` as ``ale inspect`` does; ViewError for what the user can fix,
    VerificationError for a bundle that fails the checks."""
    try:
        identity = read_identity(identity_path)
        given = [runner_public_key(k) for k in runner_keys]
    except IdentityError as exc:
        raise ViewError(str(exc)) from None
    try:
        ciphertext = bundle.read_bytes()
    except OSError as exc:
        raise ViewError(f"cannot read {bundle}: {exc.strerror}") from None
    lookup: KeyLookup | None = key_lookup(given) if given else None
    return offline_check(ciphertext, identity, lookup)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by its owner only (it holds the decrypted run)."""
    path = path.resolve()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# -- serving ---------------------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET / (and /index.html) answers the page; anything else 404; a Host that is not this
    server's loopback address (DNS rebinding) 421."""

    server: _Server
    server_version = "ale-view"
    sys_version = ""

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        host = self.headers.get("Host", "")
        if host not in self.server.hosts:
            return self._send(421, b"misdirected request: this server answers only on its loopback address\n", body)
        if self.path.partition("?")[0] not in ("/", "/index.html"):
            return self._send(404, b"not found: the view is at /\n", body)
        return self._send(200, self.server.page, body, html=True)

    def _send(self, status: int, payload: bytes, body: bool, *, html: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8" if html else "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        if html:
            self.send_header("Content-Security-Policy", self.server.csp)
        self.end_headers()
        if body:
            self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        print(f"ale view: {self.command} {self.path[:200]!r} -> {args[1] if len(args) > 1 else '?'}", file=sys.stderr)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, page: bytes, csp: str) -> None:
        super().__init__((LOCALHOST, port), _Handler)
        self.page, self.csp = page, csp
        bound = self.server_address[1]
        self.hosts = frozenset({f"{LOCALHOST}:{bound}", f"localhost:{bound}"})


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def serve(page: str, port: int, *, csp: str) -> int:
    """Serve ``page`` on 127.0.0.1:``port`` (0: any free port) until Ctrl-C or SIGTERM."""
    try:
        server = _Server(port, page.encode("utf-8"), csp)
    except OSError as exc:
        raise ViewError(f"cannot listen on {LOCALHOST}:{port}: {exc.strerror}") from None
    url = f"http://{LOCALHOST}:{server.server_address[1]}/"
    with _sigterm_as_interrupt(), server:  # before the URL is out: a SIGTERM right after it stops cleanly
        try:
            print(f"ale view: serving on {url} (only this machine can connect; Ctrl-C stops)", file=sys.stderr)
            print(url, flush=True)
            server.serve_forever(poll_interval=0.2)
        except KeyboardInterrupt:
            print("ale view: stopped", file=sys.stderr)
    return 0


# -- the command -----------------------------------------------------------------------------------


def default_out(bundle: Path) -> Path:
    """``run-X.ale`` -> ``run-X.html`` beside it."""
    return bundle.with_name(bundle.name.removesuffix(".ale") + ".html")


def view_command(
    bundle: Path,
    identity: Path,
    *,
    out: Path | None = None,
    serve_it: bool = False,
    port: int = 0,
    runner_keys: Iterable[str] = (),
) -> int:
    """``ale view``: write the page (to ``out``, or beside the bundle unless serving), or serve it."""
    if not 0 <= port <= 65535:
        raise ViewError(f"--port {port} is not a TCP port (0 to 65535; 0 picks a free one)")
    try:
        report = load(bundle, identity, runner_keys)
    except VerificationError as exc:
        print(f"ale: the bundle fails verification ({exc.reason}): {exc}; no view was written", file=sys.stderr)
        return 1
    page = render(view_of(report), source=bundle.name)
    target = out if out is not None else (None if serve_it else default_out(bundle))
    if target is not None:
        try:
            write_private(target, page)
        except OSError as exc:
            raise ViewError(f"cannot write {target}: {exc.strerror}") from None
        print(target)
    if serve_it:
        return serve(page, port, csp=content_security_policy(_asset("view.css"), _asset("view.js")))
    return 0
