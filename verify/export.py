"""``ale-verify export-site DIR``: the static leaderboard, rendered with Jinja into plain files for a CDN.

The export reads the verifier's database (:func:`accepted_submissions`), the installed
tasks and release manifest, and the project's docs, and writes:

* ``index.html`` / ``reproduction.html`` / ``open.html``: the board's three tabs (Overall,
  Reproduction, Open-ended), each with a Top-N chart (inline SVG: by score, by pass rate, both),
  paginated (``overall.p2.html``, ...) when there are more rows than ``page_size``;
* ``submissions/<id>.html``: one page per accepted submission (per-task breakdown, verification
  history, runtime attestation, how to re-verify it);
* ``tasks/index.html`` and ``tasks/<id>.html``: the tasks, their method summaries and rankings;
* ``docs/<name>.html``: the project's docs (markdown, raw HTML disabled) and ``schemas/``;
* ``leaderboard.csv`` and ``leaderboard.json`` (``docs/leaderboard-export.md``);
* ``assets/style.<sha256[:12]>.css`` and ``assets/icon.<sha256[:12]>.svg`` (content-hashed: cache
  them forever), and ``site-manifest.json`` (every file's SHA-256 and size).

No JavaScript, relative links only (the site works from any sub-path and from ``file://``),
autoescaped templates, and deterministic output: the same database, code and docs give the same
bytes (nothing depends on the time of the export; everything is sorted). Rejected submissions never
appear; revoked ones appear, marked and unranked. The export is built in a sibling folder and
swapped into place, so a reader never sees a half-written site. Beside the site, ``.DIR.inputs.json``
keeps each page's input digest (:meth:`Site.inputs_digest`): the next export renders only the
pages whose inputs changed and links the others (``docs/leaderboard-export.md``).
"""

from __future__ import annotations

import gc
import hashlib
import json
import marshal
import math
import multiprocessing
import os
import posixpath
import re
import secrets
import shutil
import sys
import tempfile
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from importlib import resources
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

import attrs
import jinja2
import jinja2.bccache
import jinja2.compiler
import jinja2.filters
import jinja2.meta
import jinja2.nodes
import jinja2.runtime
import markupsafe
import orjson
from markdown_it import MarkdownIt
from markdown_it.token import Token
from markupsafe import Markup

from ale import catalog
from ale.core.parse import ParseError, parse_json
from ale_verify import __version__, db, judging, ranking

#: The board's tabs: (category, label, first page, stem of later pages).
CATEGORIES: tuple[tuple[str, str, str, str], ...] = (
    ("overall", "Overall", "index.html", "overall"),
    ("reproduction", "Reproduction", "reproduction.html", "reproduction"),
    ("open", "Open-ended", "open.html", "open"),
)
LEVEL_INFO: dict[str, tuple[str, str]] = {
    "officially_verified": ("Officially verified", "re-run or signed by a registered runner key"),
    "audited": ("Audited", "reviewed by an operator"),
    "validated": ("Validated", "every check passed with a one-time challenge; scores recomputed"),
    "self_reported": ("Self-reported", "every check passed, but freshness or official episode counts not proven"),
    "revoked": ("Revoked", "revoked by an operator; kept for the record, never ranked"),
}
DOC_ORDER = ("agent-contract", "protocol", "policy-format", "tasks", "formats", "verifier", "leaderboard-export")
MANIFEST = "site-manifest.json"
MANIFEST_SCHEMA = "ale-site-manifest/v1"
EXPORT_SCHEMA = "ale-leaderboard/v1"
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
#: Every member of ``pipeline.audit_summary`` a page reads (an older or sparse row gets None).
SUMMARY_KEYS = (
    "run_id", "agent", "release", "release_sha256", "tasks", "task_info", "macro_mean", "categories", "pass_rate",
    "covered", "missing", "coverage_complete", "official_episode_counts", "started", "finished", "usage",
    "network_proxy", "runtime", "challenge_id", "runner", "ciphertext_sha256", "merkle_root", "trajectory_events",
    "release_images", "image_provenance", "intervals",
)  # fmt: skip
TASK_KEYS = (
    "task", "genre", "metric", "direction", "measured", "paper_value", "gap", "penalties", "score", "faithful",
    "final", "episodes", "passed", "pass_rate", "status", "reason", "judgement", "ended",
)  # fmt: skip

#: The CSV's columns in order (documented in docs/leaderboard-export.md; a test compares the two).
CSV_COLUMNS = (
    "submission_id", "url", "agent", "model", "effort", "level", "revoked",
    "rank_overall", "score_overall", "lower_overall", "upper_overall",
    "rank_reproduction", "score_reproduction", "lower_reproduction", "upper_reproduction",
    "rank_open", "score_open", "lower_open", "upper_open",
    "macro_mean", "pass_rate", "pass_rate_reproduction", "pass_rate_open",
    "covered", "required", "coverage_complete", "missing",
    "runtime_s", "input_tokens", "output_tokens", "tokens_source",
    "received_at", "started", "finished", "release", "official_episode_counts", "runner_kind",
    "run_id", "ciphertext_sha256", "merkle_root",
    "judged_faithful", "judged_unfaithful", "unjudged", "judging_pending", "judged_by",
)  # fmt: skip
#: The judgement columns: each lists the completed reproduction tasks in that state (judging.STATES).
JUDGEMENT_COLUMNS = ("judged_faithful", "judged_unfaithful", "unjudged", "judging_pending")
#: an interval's bounds where there is none
_NO_BOUNDS = (None, None)


class ExportError(Exception):
    """The export cannot be written (an unusable target folder, a database row it cannot name)."""


@attrs.frozen
class ExportReport:
    directory: Path
    files: int
    pages: int
    bytes: int
    submissions: int  # accepted submissions with a page (revoked included)
    ranked: int  # rows ranked on the Overall tab
    unchanged: int = 0  # files the previous export had with the same bytes: linked, not rewritten
    rendered: int = 0  # pages rendered (the others were rendered from the same inputs before: linked)


# -- where the templates and docs are ----------------------------------------------------------


def site_dir() -> Path:
    """The templates and assets: the installed ``ale_site`` package (``static-site/`` in the
    repository), or ``static-site/`` next to this package in a source checkout."""
    try:
        return Path(str(resources.files("ale_site")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "static-site"


def default_docs_dir() -> Path | None:
    """The repository's ``docs/`` in a source checkout (an installed wheel has none)."""
    docs = Path(__file__).resolve().parent.parent / "docs"
    return docs if any(docs.glob("*.md")) else None


# -- formatting (Jinja filters) ----------------------------------------------------------------


#: what a filter writes for no value: an em dash, as a character reference. The pages' own text is
#: ASCII (character references for the rest, in the templates too), so that a page of ASCII data is
#: an ASCII str, joined and encoded a byte a character
NO_VALUE = Markup("&mdash;")


def fmt_score(value: float | None) -> str:
    """Scores are dimensionless ratios: three decimals, never a percentage."""
    return NO_VALUE if value is None else f"{value:.3f}"


def fmt_ci(bounds: tuple[float, float] | None) -> Markup:
    """A 95% interval after its score (docs/intervals.md), or nothing where there is none."""
    if bounds is None:
        return _NO_MARKUP
    low, high = bounds
    if type(low) is float and type(high) is float:  # a stored interval's (ranking.stored_bounds): fmt_score's text
        text = f"{low:.3f}&ndash;{high:.3f}"
    else:
        text = f"{fmt_score(low)}&ndash;{fmt_score(high)}"
    # digits, signs and points: nothing to escape. The Markup made as str makes it (markupsafe's
    # Markup.__new__ is Python: a third of this filter's time, on every row of every board)
    return _markup(f' <span class="ci"><span class="visually-hidden">95% interval </span>{text}</span>')


def _markup(text: str) -> Markup:
    """``Markup(text)`` for a str ``text`` (what its ``__new__`` makes of one), made by str's own."""
    return str.__new__(Markup, text)


_NO_MARKUP = Markup("")


def fmt_rate(value: float | None) -> str:
    return NO_VALUE if value is None else f"{value * 100:.1f}%"


def fmt_value(value: float | None) -> str:
    """A measured value or target: 4 significant digits, no exponent for everyday magnitudes."""
    if value is None:
        return NO_VALUE
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    if not -4 <= magnitude < 9:
        return f"{value:.3e}"
    text = f"{value:,.{max(0, 3 - magnitude)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return NO_VALUE
    s = round(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if h:
        return f"{h} h {m:02d} min"
    if m:
        return f"{m} min {sec:02d} s" if sec else f"{m} min"
    return f"{sec} s"


def fmt_tokens(value: int | None) -> str:
    if value is None:
        return NO_VALUE
    for unit, size in (("B", 10**9), ("M", 10**6), ("k", 10**3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return str(value)


def fmt_int(value: int | None) -> str:
    """Digits, grouped by thousands with a narrow no-break space (as a character reference)."""
    if value is None:
        return NO_VALUE
    text = f"{value:,}"
    return _markup(text.replace(",", "&#8239;")) if "," in text else text


def fmt_date(epoch: float | None) -> str:
    """``YYYY-MM-DD`` (UTC), as ``strftime("%Y-%m-%d")`` writes it."""
    if epoch is None:
        return NO_VALUE
    moment = datetime.fromtimestamp(epoch, UTC)
    # isoformat's first ten characters: strftime's, at half its cost (a year before 1000 aside:
    # isoformat pads it to four digits, strftime does not)
    return moment.isoformat()[:10] if moment.year >= 1000 else moment.strftime("%Y-%m-%d")


def fmt_datetime(epoch: float | None) -> str:
    """``YYYY-MM-DD HH:MM UTC``, as ``strftime("%Y-%m-%d %H:%M UTC")`` writes it."""
    if epoch is None:
        return NO_VALUE
    moment = datetime.fromtimestamp(epoch, UTC)
    if moment.year < 1000:
        return moment.strftime("%Y-%m-%d %H:%M UTC")
    return moment.isoformat(" ", "minutes")[:16] + " UTC"


def _iso(epoch: float) -> str:
    """RFC 3339 UTC with microseconds, as ``strftime("%Y-%m-%dT%H:%M:%S.%fZ")`` writes it."""
    moment = datetime.fromtimestamp(epoch, UTC)
    if moment.year < 1000:  # strftime does not pad the year, isoformat does
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return moment.isoformat(timespec="microseconds")[:-6] + "Z"  # its "+00:00" as "Z"


def _runtime_s(started: float | None, finished: float | None, active: Any) -> float | None:
    """The run's runtime: its manifest's ``run.active_s`` (its active spans) where it has one, never
    more than ``finished - started``; else ``finished - started`` (docs/leaderboard-export.md)."""
    if started is None or finished is None:
        return None
    wall = finished - started
    if type(active) in (int, float) and 0 <= active < float("inf"):
        return min(float(active), wall)
    return wall


def _parse_time(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# -- the data model ---------------------------------------------------------------------------


@attrs.define(repr=False)
class Entry:
    """One accepted submission, as the boards, the task rankings and the exports see it (picklable:
    a worker that built it sends it to the exporting process; :class:`Submission` keeps the rest)."""

    id: str
    digest: str  # SHA-256 of its database row as read (_row_digest): every member is derived from it
    level: str
    received_at: float
    agent: str
    model: str | None
    effort: str | None
    runtime_s: float | None
    tokens: tuple[int, int] | None  # (input, output) from the network proxy; None without one
    scores: dict[str, float | None]
    pass_rates: dict[str, float | None]
    coverage: dict[str, tuple[int, int]]  # category -> (covered, required)
    finals: dict[str, float]  # task ref -> final score (completed, covered or not)
    intervals: dict[str, tuple[float, float] | None]  # category -> the score's stored 95% interval
    task_intervals: dict[str, tuple[float, float]]  # task ref -> its final's stored 95% interval
    #: each task's record by its ref (the first, should one repeat): what a task's ranking shows of it
    results: dict[str, dict[str, Any]]
    #: the summary's members the CSV/JSON exports show (EXPORT_FACTS)
    facts: dict[str, Any]
    ranks: dict[str, int] = attrs.Factory(dict)  # category -> rank (docs/intervals.md, "Ranks")
    task_ranks: dict[str, int] = attrs.Factory(dict)  # task ref -> rank on the task's page
    #: each completed reproduction task's judgement (ale_verify.judging.task_judgement)
    judgements: dict[str, dict[str, Any]] = attrs.Factory(dict)
    _fingerprint: str | None = attrs.field(default=None, init=False)
    #: the board shows these on every row of the entry: sorted once
    _states: dict[str, tuple[str, ...]] = attrs.field(init=False)
    #: revoked by an operator: listed, never ranked
    revoked: bool = attrs.field(init=False)
    #: its page, from the site's root
    href: str = attrs.field(init=False)
    #: the day it was received (fmt_date), as every row of it shows it
    date: str = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._states = {state: self.in_state(state) for state in ("unjudged", "judging_pending")}
        self.revoked = self.level == "revoked"
        self.href = f"submissions/{self.id}.html"
        self.date = fmt_date(self.received_at)

    def fingerprint(self) -> str:
        """A digest of everything a page can show of this entry: its database row's (every other
        member is derived from it and the installed tasks, which the code digest covers) and its
        ranks. Computed once, after the ranks are set."""
        if self._fingerprint is None:
            raw = orjson.dumps([self.digest, self.ranks, self.task_ranks], option=_ORJSON)
            self._fingerprint = hashlib.sha256(raw).hexdigest()
        return self._fingerprint

    def __repr__(self) -> str:
        return f"Entry({self.id!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its members' values (a worker sends its entries to the exporting process):
        less work than attrs' state dictionary, and its derived members are not derived again."""
        return _entry, (tuple(getattr(self, name) for name in _ENTRY_MEMBERS),)

    def in_state(self, state: str) -> tuple[str, ...]:
        """The completed reproduction tasks whose judgement is in ``state`` (judging.STATES), sorted."""
        return tuple(ref for ref, j in sorted(self.judgements.items()) if j["state"] == state)

    @property
    def unjudged(self) -> tuple[str, ...]:
        """Without a credited verdict (final 0)."""
        return self._states["unjudged"]

    @property
    def pending(self) -> tuple[str, ...]:
        """Waiting for the verifier's judge (final 0 until it answers)."""
        return self._states["judging_pending"]


#: every member of an entry, in the order Entry.__reduce__ sends them
_ENTRY_MEMBERS = tuple(field.name for field in attrs.fields(Entry))


def _entry(values: tuple[Any, ...]) -> Entry:
    """An entry from the values Entry.__reduce__ sent."""
    e = object.__new__(Entry)
    for name, value in zip(_ENTRY_MEMBERS, values, strict=True):
        object.__setattr__(e, name, value)
    return e


@attrs.define(repr=False)
class Submission:
    """An entry with its decoded database row and summary: what its own page shows."""

    entry: Entry
    row: dict[str, Any]
    summary: dict[str, Any]  # the row's summary, every member of SUMMARY_KEYS and TASK_KEYS present
    context: dict[str, Any] | None = None  # its page's Site._submission_context, once prepared


#: a task record's members a task's ranking shows (Entry.results)
RESULT_KEYS = ("final", "measured", "pass_rate")
#: a summary's and a task record's members a page reads, each None until the row's own replace it
_NO_SUMMARY: dict[str, Any] = dict.fromkeys(SUMMARY_KEYS)
_NO_TASK: dict[str, Any] = dict.fromkeys(TASK_KEYS)
#: the summary's members the CSV/JSON exports show (Entry.facts; ``runner_kind``: its runner's kind)
EXPORT_FACTS = (
    "macro_mean", "coverage_complete", "missing", "started", "finished", "release", "official_episode_counts",
    "run_id", "ciphertext_sha256", "merkle_root",
)  # fmt: skip


class RowFault:
    """Any error raised while a submission's row is decoded and built, its page's context prepared
    or its page rendered, as an ExportError naming the submission and the fault: the export fails
    with one clear line and leaves the previous site as it was. An ExportError already says what
    it is, and an OSError or MemoryError (writing the page, the machine) is not the row's: those
    pass as they are."""

    __slots__ = ("ident",)

    def __init__(self, ident: Any) -> None:
        self.ident = ident

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _tb: Any) -> None:
        if isinstance(exc, Exception) and not isinstance(exc, _NOT_THE_ROWS):
            raise ExportError(
                f"submission {self.ident!r}: its database row is not one the verifier writes"
                f" ({type(exc).__name__}: {_clip(str(exc), 200)})"
            ) from exc


#: errors RowFault leaves as they are (see there)
_NOT_THE_ROWS = (ExportError, OSError, MemoryError)


def _number_or_none(value: Any, what: str) -> float | int | None:
    """``value`` when it is None or a number (not a bool), else an error naming ``what``."""
    if value is None or type(value) is float or type(value) is int:
        return value
    raise TypeError(f"{what} is {type(value).__name__}, not a number")


def build_submission(row: dict[str, Any], digest: str, *, specs: dict[str, Any]) -> Submission:
    """A decoded database row (``digest``: its :func:`_row_digest`) as its entry and page see it.
    A row that is not one the verifier writes (a summary of another shape, a score that is not a
    number) raises here (:meth:`Site.submissions` names it: :class:`RowFault`): every value an
    entry holds for the boards, the ranks and the exports is of its type, so that they cannot fail
    on it."""
    if not _SAFE_ID.match(str(row["id"])):
        raise ExportError(f"submission id {row['id']!r} cannot name a file")
    s = _NO_SUMMARY | row["summary"]
    s["tasks"] = tasks = [_NO_TASK | t for t in s["tasks"] or [] if isinstance(t, dict)]
    agent = s["agent"] or {}
    declared = agent.get("declared") or {}
    covered = list(s["covered"] or [])
    required = covered + list(s["missing"] or [])
    completed = {t["task"]: t for t in tasks if t["status"] == "completed" and t["final"] is not None}
    categories = s["categories"] or {}
    genres = ranking.task_genres(s, required, specs)
    count = _category_counts(covered, required, completed, genres)
    scores: dict[str, float | None] = {}
    pass_rates: dict[str, float | None] = {}
    coverage: dict[str, tuple[int, int]] = {}
    for category, (n_covered, n_required, episodes, passed) in count.items():
        scores[category] = _number_or_none(categories.get(category), f"the {category} score")
        pass_rates[category] = passed / episodes if episodes else None
        coverage[category] = (n_covered, n_required)
    if s.get("pass_rate") is not None:
        pass_rates["overall"] = _number_or_none(s["pass_rate"], "the pass rate")  # the verifier's own figure
    started, finished = _parse_time(s.get("started")), _parse_time(s.get("finished"))
    usage = s.get("usage") or {}
    tokens = None
    if s.get("network_proxy") is not None:
        tokens = (int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0))
    results: dict[str, dict[str, Any]] = {}
    for t in tasks:
        if type(t["task"]) is str and t["task"] not in results:  # a task's ranking names it by its ref
            results[t["task"]] = {key: _number_or_none(t[key], f"a task's {key}") for key in RESULT_KEYS}
    by_category, by_task = ranking.stored_intervals(s)  # (summary_interval's reading, once)
    stored_bounds = ranking.stored_bounds
    entry = Entry(
        id=row["id"],
        digest=digest,
        level=row["level"] or "self_reported",
        received_at=float(row["received_at"]),
        agent=str(agent.get("name") or "(unnamed agent)"),
        model=None if declared.get("model") is None else str(declared["model"]),
        effort=None if declared.get("effort") is None else str(declared["effort"]),
        runtime_s=_runtime_s(started, finished, s.get("active_s")),
        tokens=tokens,
        scores=scores,
        pass_rates=pass_rates,
        coverage=coverage,
        # (a completed task's final is not None)
        finals={ref: float(cast(float, _number_or_none(t["final"], "a task's final"))) for ref, t in completed.items()},
        judgements={ref: j for ref, j in judging.task_judgements(s).items() if ref in completed},  # (sorted)
        intervals={
            category: stored_bounds(by_category.get(category)) if scores[category] is not None else None
            for category in count
        },
        task_intervals={ref: bounds for ref in completed if (bounds := stored_bounds(by_task.get(ref))) is not None},
        results=results,
        facts={key: s.get(key) for key in EXPORT_FACTS} | {"runner_kind": (s.get("runner") or {}).get("kind")},
    )
    return Submission(entry, row, s)


def _category_counts(
    covered: list[Any], required: list[Any], completed: dict[Any, dict[str, Any]], genres: dict[Any, str | None]
) -> dict[str, list[int]]:
    """Each category's covered and required tasks (ranking.coverage), and the official episodes and
    passed ones of its covered completed tasks, counted in one pass over the tasks."""
    count = {category: [0, 0, 0, 0] for category, *_ in CATEGORIES}  # covered, required, episodes, passed
    overall = count["overall"]
    by_genre: dict[str | None, list[int]] = {category: c for category, c in count.items() if category != "overall"}
    for r in required:
        if (genre := genres[r]) in by_genre:
            by_genre[genre][1] += 1
    for r in covered:
        in_genre = by_genre.get(genres[r])  # (None: a genre of no category)
        if in_genre is not None:
            in_genre[0] += 1
        if (t := completed.get(r)) is not None:
            episodes, passed = int(t["episodes"] or 0), int(t["passed"] or 0)
            overall[2] += episodes
            overall[3] += passed
            if in_genre is not None:
                in_genre[2] += episodes
                in_genre[3] += passed
    overall[0], overall[1] = len(covered), len(required)
    return count


#: a board: its ranked rows in board order and its revoked rows (unranked, by upload time)
Board = tuple[list[Entry], list[Entry]]


#: a board's rows with a score while it is ranked: the not revoked ones and their standings, the revoked ones
_Rows = tuple[list[Entry], list[ranking.Standing], list[Entry]]


def rank_all(entries: Sequence[Entry], refs: Sequence[str]) -> tuple[dict[str, Board], dict[str, Board]]:
    """Every category's board and every task's ranking (``refs``), each entry's ranks set, the
    standings gathered in one pass over the entries (:func:`_standings`), each board placed by
    :func:`ale_verify.ranking.place` (a category ranks the runs that cover all its required
    tasks first; runs whose intervals cannot tell them apart share a rank), as ``GET
    /api/v1/leaderboard`` has them."""
    cats, tasks = _standings(entries, refs)
    return _boards(cats, tasks=False), _boards(tasks, tasks=True)


def _boards(rows: dict[str, _Rows], *, tasks: bool) -> dict[str, Board]:
    """Each board of ``rows`` placed, and each entry's rank on it set (in its ``task_ranks`` for a
    task's ranking, else its ``ranks``)."""
    boards: dict[str, Board] = {}
    for key, (standing, standings, unranked) in rows.items():
        ranked, ranks = _placed(standing, standings)
        for e, r in zip(ranked, ranks, strict=True):
            (e.task_ranks if tasks else e.ranks)[key] = r
        boards[key] = (ranked, sorted(unranked, key=_uploaded))
    return boards


def _standings(entries: Sequence[Entry], refs: Sequence[str]) -> tuple[dict[str, _Rows], dict[str, _Rows]]:
    """Each board's rows with a score (a category's score, a task's final), in the entries' order.
    A run without a stored interval counts as its score alone."""
    Standing, new = ranking.Standing, tuple.__new__  # (a NamedTuple's own __new__ is Python)
    cats: dict[str, _Rows] = {category: ([], [], []) for category, *_ in CATEGORIES}
    tasks: dict[str, _Rows] = {ref: ([], [], []) for ref in refs}
    for e in entries:
        revoked, at, ident = e.revoked, e.received_at, e.id
        for category, (standing, standings, unranked) in cats.items():
            value = e.scores[category]
            if value is None:
                continue
            if revoked:
                unranked.append(e)
                continue
            lower, upper = e.intervals[category] or (value, value)
            standing.append(e)
            standings.append(new(Standing, (value, lower, upper, ranking.complete(e.coverage[category]), at, ident)))
        for ref, value in e.finals.items():
            if (rows := tasks.get(ref)) is None:
                continue  # not an installed task
            if revoked:
                rows[2].append(e)
                continue
            lower, upper = e.task_intervals.get(ref) or (value, value)
            rows[0].append(e)
            rows[1].append(new(Standing, (value, lower, upper, True, at, ident)))
    return cats, tasks


def _placed(standing: list[Entry], standings: list[ranking.Standing]) -> tuple[list[Entry], list[int]]:
    """The rows in board order and their ranks (:func:`ale_verify.ranking.place`)."""
    placed = ranking.place(standings)
    return [standing[i] for i, _ in placed], [r for _, r in placed]


def _uploaded(e: Entry) -> tuple[float, str]:
    return e.received_at, e.id


# -- markdown ---------------------------------------------------------------------------------

_COMMENT_LINE = re.compile(r"^\s*<!--.*-->\s*$")


def slugify(text: str) -> str:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = unicodedata.normalize("NFKC", text).strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-") or "section"


@attrs.define
class Markdown:
    """Markdown to safe HTML: raw HTML disabled, heading anchors, links resolved against the site."""

    resolve: Callable[[str, str], str | None]  # (source folder, href path) -> site path, or None
    md: MarkdownIt = attrs.field(
        factory=lambda: MarkdownIt("commonmark", {"html": False, "typographer": False}).enable(
            ["table", "strikethrough"]
        )
    )

    def render(
        self, text: str, *, source_dir: str, page_dir: str, id_prefix: str = "", shift: int = 0
    ) -> tuple[Markup, list[dict[str, Any]]]:
        """HTML and the headings (level, text, id) of a markdown document; ``shift`` demotes its
        headings (a document embedded under a page's own ``h1`` and ``h2``)."""
        text = "\n".join(line for line in text.splitlines() if not _COMMENT_LINE.match(line))
        tokens = self.md.parse(text)
        headings: list[dict[str, Any]] = []
        seen: dict[str, int] = {}
        for i, tok in enumerate(tokens):
            if tok.type in ("heading_open", "heading_close") and shift:
                tok.tag = f"h{min(6, int(tok.tag[1]) + shift)}"
            if tok.type == "heading_open":
                inline = tokens[i + 1]
                label = "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline"))
                slug = id_prefix + slugify(label)
                n = seen.get(slug, 0)
                seen[slug] = n + 1
                anchor = slug if n == 0 else f"{slug}-{n}"
                tok.attrSet("id", anchor)
                headings.append({"level": int(tok.tag[1]), "text": label, "id": anchor})
            if tok.type == "th_open":
                tok.attrSet("scope", "col")
            if tok.type == "table_open":
                tok.attrSet("class", "md-table")  # a markdown table: header cells, no caption
            if tok.type == "inline" and tok.children:
                self._links(tok.children, source_dir, page_dir, id_prefix)
        return _markup(_ascii_html(self.md.renderer.render(tokens, self.md.options, {}))), headings

    def _links(self, children: list[Token], source_dir: str, page_dir: str, id_prefix: str) -> None:
        stack: list[Token] = []
        for child in children:
            if child.type == "image":  # no remote or unresolved images: their text stays
                alt = "".join(c.content for c in child.children or []) or str(child.attrGet("alt") or "")
                child.type, child.tag, child.attrs, child.content, child.children = "text", "", {}, alt, None
            elif child.type == "link_open":
                href = str(child.attrGet("href") or "")
                target = self._target(href, source_dir, page_dir, id_prefix)
                if target is None:
                    child.tag, child.attrs = "span", {"class": "unlinked"}
                else:
                    child.attrs = {"href": target}
                    if target.startswith(("https://", "http://")):
                        child.attrs.update({"class": "external", "rel": "noopener noreferrer"})
                stack.append(child)
            elif child.type == "link_close" and stack:
                child.tag = stack.pop().tag

    def _target(self, href: str, source_dir: str, page_dir: str, id_prefix: str) -> str | None:
        if href.startswith("#"):
            return "#" + id_prefix + href[1:]
        if re.match(r"^https?://", href):
            return href
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", href) or href.startswith("/"):
            return None
        path, _, fragment = href.partition("#")
        site_path = self.resolve(source_dir, posixpath.normpath(posixpath.join(source_dir, path)) if path else "")
        if site_path is None:
            return None
        rel = posixpath.relpath(site_path, page_dir or ".")
        return rel + (f"#{fragment}" if fragment else "")


def _first_section(paper: str) -> str:
    """The paper's first section (its problem statement) without the title: the method summary."""
    lines = paper.splitlines()
    out: list[str] = []
    started = False
    for line in lines:
        if line.startswith("# ") and not started:
            continue
        if line.startswith("## "):
            if started and any(x.strip() for x in out):
                break
            started = True
            continue
        if line.strip() or out:
            started = True
            out.append(line)
    return "\n".join(out).strip()


# -- the Top-N chart --------------------------------------------------------------------------


def top_chart(rows: Sequence[Entry], category: str, by: str, *, n: int, cap: float) -> dict[str, Any]:
    """Geometry of one horizontal bar chart (rendered by the ``chart`` macro): the top ``n`` ranked
    rows by score (``by="score"``), by pass rate (``"pass"``), or by score with both bars (``"both"``,
    on one axis: a pass rate is a fraction, 1.0 = every episode passed)."""
    if by == "pass":
        rows = sorted(rows, key=lambda e: (-(e.pass_rates[category] or 0.0), e.ranks[category]))
    rows = list(rows[:n])
    series = {"score": ["score"], "pass": ["pass"], "both": ["score", "pass"]}[by]
    bar_h = 20 if len(series) == 1 else 13
    pitch = 42
    label_w, plot_w, top, right = 230, 440, 34, 64
    scale_max = 1.0 if by == "pass" else cap
    ticks = [i / 4 for i in range(5)] if by == "pass" else [round(cap * i / 6, 10) for i in range(7)]
    bars = []
    for i, e in enumerate(rows):
        y0 = top + i * pitch + (pitch - bar_h * len(series) - 2 * (len(series) - 1)) / 2
        group = []
        for j, which in enumerate(series):
            value = e.scores[category] if which == "score" else e.pass_rates[category]
            width = plot_w * max(0.0, min(scale_max, value or 0.0)) / scale_max
            y = round(y0 + j * (bar_h + 2), 2)
            bounds = e.intervals[category] if which == "score" else None  # a pass rate has no interval
            ci: dict[str, Any] | None = None
            if bounds is not None:
                x1, x2 = (round(label_w + plot_w * max(0.0, min(scale_max, b)) / scale_max, 2) for b in bounds)
                ci = {
                    "x1": x1,
                    "x2": x2,
                    "y": round(y + bar_h / 2, 2),
                    "text": _markup(f"{fmt_score(bounds[0])}&ndash;{fmt_score(bounds[1])}"),
                }
            group.append(
                {
                    "kind": which,
                    "y": y,
                    "w": round(width, 2),
                    "h": bar_h,
                    "label": fmt_score(value) if which == "score" else fmt_rate(value),
                    "tx": round(max(label_w + width, float(ci["x2"]) if ci else 0.0) + 6, 2),
                    "ci": ci,  # the score's 95% interval: a line across the bar's end
                }
            )
        sub = " · ".join(x for x in (e.model, e.effort) if x) or "model not declared"  # text: _clip_html escapes it
        bars.append(
            {
                "entry": e,
                "rank": i + 1,  # the position in this chart (by pass rate, it is not the board rank)
                "board_rank": e.ranks[category],
                "name": _clip_html(e.agent, 27),
                "sub": _clip_html(sub, 34),
                "ty": round(top + i * pitch + pitch / 2, 2),
                "bars": group,
            }
        )
    axis_y = top + pitch * len(rows) + 2
    return {
        "id": f"top-{by}",
        "by": by,
        "cap": fmt_value(cap),
        "width": label_w + plot_w + right,
        "height": axis_y + 24,
        "label_w": label_w,
        "plot_w": plot_w,
        "top": top,
        "axis_y": axis_y,
        "ticks": [
            {
                "x": round(label_w + plot_w * t / scale_max, 2),
                "label": f"{t * 100:.0f}%" if by == "pass" else fmt_value(t),
            }
            for t in ticks
        ],
        "paper_x": None if by == "pass" else round(label_w + plot_w / scale_max, 2),
        "rows": bars,
    }


def _board_cells(rows: Sequence[Entry], category: str) -> list[tuple[Any, ...]]:
    """What a board page's rows show of their entries in ``category``: (entry, coverage, whether
    the partial runs start at it, rank, score, interval, pass rate, unjudged tasks, pending tasks)."""
    cells = []
    partial = False
    for e in rows:
        cov = e.coverage[category]
        divider = not partial and not e.revoked and cov[0] < cov[1]
        partial = partial or divider
        rank = None if e.revoked else e.ranks[category]
        judged = category != "open"  # an open task has no faithfulness gate
        cells.append((e, cov, divider, rank, e.scores[category], e.intervals[category], e.pass_rates[category],
                      e.unjudged if judged else (), e.pending if judged else ()))  # fmt: skip
    return cells


def _task_cells(rows: Sequence[Entry], ref: str) -> list[tuple[Any, ...]]:
    """What a task's ranking shows of its entries: (entry, its task record, rank, interval)."""
    return [(e, e.results[ref], None if e.revoked else e.task_ranks[ref], e.task_intervals.get(ref)) for e in rows]


def _clip_html(text: str, size: int) -> Markup:
    """:func:`_clip` as HTML: escaped, its non-ASCII characters as character references."""
    return _markup(_ascii_html(str(markupsafe.escape(_clip(text, size)))))


def _ascii_html(html: str) -> str:
    """HTML text with every character beyond ASCII written as a character reference: the same
    document to a parser, in HTML's text and attribute values alike (no raw-text element here)."""
    return html if html.isascii() else html.encode("ascii", "xmlcharrefreplace").decode("ascii")


def _clip(text: str, size: int) -> str:
    return text if len(text) <= size else text[: size - 1] + "…"


# -- pages ------------------------------------------------------------------------------------


def _pages(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)] or [items[:0]]


def _page_name(first: str, stem: str, number: int) -> str:
    if number == 1:
        return first
    folder, _, _ = first.rpartition("/")
    return f"{folder + '/' if folder else ''}{stem}.p{number}.html"


def _pager(first: str, stem: str, number: int, count: int) -> dict[str, Any] | None:
    if count <= 1:
        return None
    base = first.rpartition("/")[2]

    def href(k: int) -> str:
        return _page_name(base, stem, k)

    window = sorted({1, count, *range(max(1, number - 2), min(count, number + 2) + 1)})
    links: list[dict[str, Any] | None] = []
    for k in window:
        if links and links[-1] is not None and k - links[-1]["number"] > 1:
            links.append(None)  # a gap
        links.append({"number": k, "href": href(k), "current": k == number})
    return {
        "number": number,
        "count": count,
        "prev": href(number - 1) if number > 1 else None,
        "next": href(number + 1) if number < count else None,
        "links": links,
    }


#: markupsafe's own escaping of a str (C), as markupsafe.escape does it, without the Markup wrapper;
#: another markupsafe's public escape when it has none
_escape_inner: Callable[[str], str] = getattr(markupsafe, "_escape_inner", None) or (
    lambda text: str(markupsafe.escape(text))
)


def output_escape(value: Any, /) -> str:
    """What a template's ``{{ value }}`` writes: markupsafe.escape(value), character for character.
    A plain str (most values) is escaped without building a Markup object around it; a page's
    output is joined into one str, so the wrapper was work and nothing else. Markup and int
    values are written as escape writes them, without its checks."""
    kind = type(value)
    if kind is str:
        return _escape_inner(value)
    if kind is Markup:  # safe already: escape returns it as it is
        return cast(str, value)
    if kind is int:  # digits and a sign: nothing to escape
        return str(value)
    return markupsafe.escape(value)


class _Template(jinja2.Template):
    """A template whose output escaping (the ``escape`` its compiled code calls around each
    ``{{ }}`` when autoescaping) is :func:`output_escape`: the same characters, less work."""

    @classmethod
    def from_code(
        cls,
        environment: jinja2.Environment,
        code: Any,
        globals: Any,
        uptodate: Callable[[], bool] | None = None,
    ) -> jinja2.Template:
        template = super().from_code(environment, code, globals, uptodate)
        template.root_render_func.__globals__["escape"] = output_escape  # blocks and macros share them
        return template


#: the filters whose every result is text that escaping leaves as it is (digits, signs, points,
#: letters, character references; ``ci``: Markup) or an exception: ``{{ x|score }}`` is written
#: without the escape call around it (_CodeGenerator). A test holds each to it for any JSON value.
ESCAPED_FILTERS: dict[str, Callable[..., str]] = {
    "score": fmt_score, "ci": fmt_ci, "rate": fmt_rate, "value": fmt_value, "duration": fmt_duration,
    "tokens": fmt_tokens, "int": fmt_int, "date": fmt_date, "datetime": fmt_datetime,
}  # fmt: skip


class _CodeGenerator(jinja2.compiler.CodeGenerator):
    """Jinja's code generator, but a block's output goes to a list, yielded once joined at the
    block's end (where Jinja yields each piece, and each yield passes up the chain of blocks a page
    extends), and outside a block a run of template data and ``{{ }}`` values between two tags is
    yielded as one string (``concat`` of them); and a ``{{ }}`` whose value is a filter of
    :data:`ESCAPED_FILTERS` (registered as it is there) is not escaped again: the same output, in a
    few yields a page and with fewer calls."""

    _block: jinja2.compiler.Frame | None = None  # the block function whose output is buffered

    def _output_child_pre(
        self, node: jinja2.nodes.Expr, frame: jinja2.compiler.Frame, finalize: Any
    ) -> None:  # fmt: skip
        if not self._escaped(node, frame, finalize):
            super()._output_child_pre(node, frame, finalize)

    def _output_child_post(
        self, node: jinja2.nodes.Expr, frame: jinja2.compiler.Frame, finalize: Any
    ) -> None:  # fmt: skip
        if not self._escaped(node, frame, finalize):
            super()._output_child_post(node, frame, finalize)

    def _escaped(self, node: jinja2.nodes.Expr, frame: jinja2.compiler.Frame, finalize: Any) -> bool:
        """The output ``node`` is escaped text already: a filter of ESCAPED_FILTERS, autoescaping on
        (not volatile), no finalize around it."""
        return (
            isinstance(node, jinja2.nodes.Filter)
            and node.node is not None
            and ESCAPED_FILTERS.get(node.name) is not None
            and self.environment.filters.get(node.name) is ESCAPED_FILTERS[node.name]
            and finalize.src is None
            and frame.eval_ctx.autoescape is True
            and not frame.eval_ctx.volatile
        )

    def enter_frame(self, frame: jinja2.compiler.Frame) -> None:
        super().enter_frame(frame)
        if frame.block_frame and frame.block is not None and frame.buffer is None and not self.environment.is_async:
            self.buffer(frame)  # a block's output goes to a list, yielded once at its end
            self._block = frame

    def leave_frame(self, frame: jinja2.compiler.Frame, with_python_scope: bool = False) -> None:
        super().leave_frame(frame, with_python_scope)
        if frame is self._block:
            self.writeline(f"yield concat({frame.buffer})")
            self._block = None

    def visit_Output(self, node: jinja2.nodes.Output, frame: jinja2.compiler.Frame) -> None:
        if frame.buffer is not None or frame.require_output_check:
            super().visit_Output(node, frame)  # a macro's or call block's buffer; outside a block
            return
        finalize = self._make_finalize()
        body = self._output_body(node, frame, finalize)
        if len(body) == 1:
            self._output_item(body[0], frame, finalize, "yield ", "")
            return
        self.writeline("yield concat((")  # write_commons set `concat` in every root and block function
        self.indent()
        for item in body:
            self._output_item(item, frame, finalize, "", ",")
        self.outdent()
        self.writeline("))")

    def _output_body(
        self, node: jinja2.nodes.Output, frame: jinja2.compiler.Frame, finalize: Any
    ) -> list[list[Any] | jinja2.nodes.Expr]:
        """The pieces to output, as Jinja's own visit_Output has them: constants joined at compile time."""
        body: list[list[Any] | jinja2.nodes.Expr] = []
        for child in node.nodes:
            try:
                if not (finalize.const or isinstance(child, jinja2.nodes.TemplateData)):
                    raise jinja2.nodes.Impossible()
                const = self._output_child_to_const(child, frame, finalize)
            except (jinja2.nodes.Impossible, Exception):
                body.append(child)
                continue
            if body and isinstance(body[-1], list):
                body[-1].append(const)
            else:
                body.append([const])
        return body

    def _output_item(
        self, item: list[Any] | jinja2.nodes.Expr, frame: jinja2.compiler.Frame, finalize: Any, pre: str, post: str
    ) -> None:
        if isinstance(item, list):
            self.writeline(pre + self._output_const_repr(item) + post)
            return
        self.writeline(pre, item)
        self._output_child_pre(item, frame, finalize)
        self.visit(item, frame)
        self._output_child_post(item, frame, finalize)
        self.write(post)


class _CompiledTemplates(jinja2.BytecodeCache):
    """The export's templates, each parsed and compiled once, in the exporting process and its
    workers together. Jinja's loader asks this cache for a template's code (by the template's name
    and the SHA-1 of its source, Jinja's bucket) before it compiles one, and gives it what it
    compiled. A template parsed for its digest (:meth:`Site.template_digest`) is compiled from that
    parse, not parsed again; and the exporting process sends the code it compiled to its workers
    (:meth:`shared`, :meth:`add`: marshal, as Jinja's own bytecode caches keep code), which then
    compile none of it. Nothing is written anywhere: a new export compiles them anew."""

    def __init__(self) -> None:
        self.codes: dict[str, tuple[str, Any]] = {}  # bucket key -> (source checksum, code object)
        self.parsed: dict[str, tuple[str, jinja2.nodes.Template, str, str | None]] = {}  # ... (checksum, AST, ...)

    def parsed_as(self, name: str, filename: str | None, source: str, ast: jinja2.nodes.Template) -> None:
        """``ast`` is ``source``'s parse (of template ``name`` at ``filename``): compile it from that."""
        key, checksum = self.get_cache_key(name, filename), self.get_source_checksum(source)
        if key not in self.codes:
            self.parsed[key] = (checksum, ast, name, filename)

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        kept = self.codes.get(bucket.key)
        if kept is None and (parse := self.parsed.pop(bucket.key, None)) is not None and parse[0] == bucket.checksum:
            checksum, ast, name, filename = parse
            kept = self.codes[bucket.key] = (checksum, bucket.environment.compile(ast, name, filename))
        if kept is not None and kept[0] == bucket.checksum:
            bucket.code = kept[1]

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        self.codes[bucket.key] = (bucket.checksum, bucket.code)

    def shared(self) -> dict[str, tuple[str, bytes]]:
        """The code compiled so far, to send to a worker (:meth:`add`)."""
        return {key: (checksum, marshal.dumps(code)) for key, (checksum, code) in self.codes.items()}

    def add(self, shared: dict[str, tuple[str, bytes]]) -> None:
        """Another process's compiled code (:meth:`shared`), each checked against its source's
        checksum when a template is loaded."""
        for key, (checksum, code) in shared.items():
            self.codes.setdefault(key, (checksum, marshal.loads(code)))


class Site:
    """Renders the pages into a folder and keeps the file list for the manifest."""

    def __init__(
        self,
        out: Path,
        *,
        docs_dir: Path | None,
        page_size: int,
        top_n: int,
        previous: tuple[Path, dict[str, tuple[str, int]]] | None = None,
        previous_inputs: dict[str, str] | None = None,
        jobs: int = 1,
    ) -> None:
        if page_size < 1 or top_n < 1 or jobs < 1:
            raise ExportError("page_size, top_n and jobs must be positive")
        self.out = out
        self._root = os.fspath(out)  # a page's path is joined as a str: a Path costs more per file
        self.previous = previous  # the previous export's folder and its manifest's files
        self.jobs = jobs
        self.unchanged = 0
        self.rendered = 0
        #: each page's input digest (Site.inputs_digest), and the previous export's
        self.inputs: dict[str, str] = {}
        self.previous_inputs = previous_inputs or {}
        self.page_size = page_size
        self.top_n = top_n
        self.docs_dir = docs_dir
        self.files: dict[str, tuple[str, int]] = {}
        self._folders: set[str] = set()  # made already
        self.pages = 0
        root = site_dir()
        if not (root / "templates").is_dir():
            raise ExportError(f"the site templates are missing: {root / 'templates'}")
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(root / "templates")),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
            auto_reload=False,  # loaded once per export: no stat of the template per page
            bytecode_cache=_CompiledTemplates(),  # each template parsed and compiled once
        )
        self.env.template_class = _Template
        self.env.code_generator_class = _CodeGenerator
        self.env.globals.update(levels=LEVEL_INFO, categories=CATEGORIES, dash=NO_VALUE)
        self._template_digests: dict[str, bytes] = {}
        self._closures: dict[str, tuple[str, ...]] = {}  # each digested template's (_closure)
        #: each template's source and the templates it names (None: a name computed when rendered)
        self._sources: dict[str, tuple[str, tuple[str | None, ...]]] = {}
        self.template_digest("macros.html")  # parsed once: for the digests and the badges' macro
        # a level's badge, rendered once by its macro: every page shows several
        self.env.globals["badges"] = {
            level: self.env.get_template("macros.html").module.badge(level)  # type: ignore[attr-defined]
            for level in LEVEL_INFO
        }
        self.env.filters.update(ESCAPED_FILTERS)  # the number and date filters, each written unescaped
        self.assets = {
            "css": self._asset(root / "assets" / "style.css", "style"),
            "icon": self._asset(root / "assets" / "icon.svg", "icon"),
        }
        self.release, _ = catalog.release()
        self.tasks = catalog.tasks()
        self.specs = {t.spec.ref: t.spec for t in self.tasks.values()}
        self.schemas = sorted(
            p.name for p in (resources.files("ale") / "schemas").iterdir() if p.name.endswith(".schema.json")
        )
        self.docs: dict[str, Path] = {}
        if docs_dir is not None:
            for path in sorted(docs_dir.glob("*.md")):
                if re.fullmatch(r"[a-z0-9][a-z0-9_-]*", path.stem) and path.stem != "index":
                    self.docs[path.stem] = path
        self.markdown = Markdown(self._resolve)
        self.code_digest = _code_digest(self.release, self.specs)

    # files

    def _folder(self, rel: str) -> None:
        """Refuse a path outside the site; make its folder."""
        if rel.startswith("/") or ".." in rel.split("/"):
            raise ExportError(f"refusing to write outside the site: {rel}")
        folder, _, _ = rel.rpartition("/")
        if folder not in self._folders:
            (self.out / folder).mkdir(parents=True, exist_ok=True)
            self._folders.add(folder)

    def write(self, rel: str, data: bytes) -> None:
        self._folder(rel)
        entry = (hashlib.sha256(data).hexdigest(), len(data))
        self.files[rel] = entry
        if self.previous is not None and self.previous[1].get(rel) == entry and rel != MANIFEST:
            try:  # the same bytes as the previous export's file: that file, not a rewrite
                source = self.previous[0] / rel
                if source.read_bytes() == data:
                    os.link(source, f"{self._root}/{rel}")
                    self.unchanged += 1
                    return
            except OSError:
                pass  # gone, or another filesystem: write it
        # os.open and one write: a pathlib write_bytes costs several times as much per file, and
        # a site has a page per submission.
        fd = os.open(f"{self._root}/{rel}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    def _asset(self, source: Path, stem: str) -> str:
        data = source.read_bytes()
        name = f"assets/{stem}.{hashlib.sha256(data).hexdigest()[:12]}{source.suffix}"
        self.write(name, data)
        return name

    def page(self, rel: str, template: str, derive: Callable[[], dict[str, Any]] | None = None, **context: Any) -> None:
        """Render ``template`` into ``rel``, or, when the previous export rendered ``rel`` from the
        same inputs (:meth:`inputs_digest`), link its file without rendering. ``derive`` adds to the
        context what is computed from it alone (from its entries and the installed tasks, by this
        code): not digested, and computed only for a page that is rendered."""
        depth = rel.count("/")
        context = {"root": "../" * depth, "page": rel.rpartition("/")[2], "assets": self.assets, **context}
        key = self.inputs_digest(template, context)
        self.inputs[rel] = key
        if self._reuse(rel, key):
            self.pages += 1
            return
        if derive is not None:
            context |= derive()
        self.write(rel, self.render(template, context).encode("utf-8"))
        self.pages += 1
        self.rendered += 1

    def render(self, name: str, context: dict[str, Any]) -> str:
        """``env.get_template(name).render(context)``, its context made once: Template.render copies
        the variables into a dict, then into another with the globals, and makes a set of the
        globals' names, on every page; here the globals and the page's variables are one dict, the
        template's context (shared, as ``new_context(shared=True)`` makes it) and the page's."""
        template = self.env.get_template(name)  # cached: auto_reload is off
        variables = {**self.env.globals, **context}
        ctx = jinja2.runtime.new_context(self.env, template.name, template.blocks, variables, shared=True)
        try:
            return self.env.concat(template.root_render_func(ctx))
        except Exception:
            self.env.handle_exception()

    def inputs_digest(self, template: str, context: dict[str, Any]) -> str:
        """SHA-256 of everything a page is rendered from: the code (:attr:`code_digest`: exporter,
        installed tasks and release), the template with every template it uses
        (:meth:`template_digest`), and the page's context (each entry by :meth:`Entry.fingerprint`).
        A context holding anything else than JSON values, entries and attrs models fails here
        rather than be digested by a lossy stand-in."""
        try:
            raw = orjson.dumps([template, context], default=_context_value, option=orjson.OPT_NON_STR_KEYS)
        except orjson.JSONEncodeError as exc:
            raise ExportError(f"a page of {template}: {exc.__cause__ or exc}") from exc
        return hashlib.sha256(self.code_digest + self.template_digest(template) + raw).hexdigest()

    def template_digest(self, name: str) -> bytes:
        """SHA-256 of a template's source and of every template it extends, includes or imports."""
        if name not in self._template_digests:
            self._template_digests[name], self._closures[name] = self._closure(name)
        return self._template_digests[name]

    def _closure(self, name: str) -> tuple[bytes, tuple[str, ...]]:
        """:meth:`template_digest` of ``name`` and the templates it covers, in the order digested."""
        loader = self.env.loader
        assert loader is not None
        h = hashlib.sha256()
        seen: dict[str, None] = {}
        todo = [name, "macros.html"]  # the badges (env.globals) are rendered by macros.html
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen[current] = None
            if current not in self._sources:  # each template read and parsed once, whatever closures it is in
                source, filename, _ = loader.get_source(self.env, current)
                ast = self.env.parse(source, current, filename)
                self._sources[current] = (source, tuple(jinja2.meta.find_referenced_templates(ast)))
                self._compiled.parsed_as(current, filename, source, ast)  # compiled from this parse
            source, referenced = self._sources[current]
            h.update(f"{current} {len(source)}\n{source}".encode())
            for ref in referenced:
                if ref is None:  # a name computed at render time: every template, to be safe
                    todo += self.env.list_templates()
                else:
                    todo.append(ref)
        return h.digest(), tuple(seen)

    def warm(self, templates: Sequence[str]) -> None:
        """Load ``templates``, every template they use and their digests now: a forked worker
        inherits them, loaded and parsed once."""
        for name in templates:
            self.template_digest(name)
            for used in self._closures[name]:
                self.env.get_template(used)

    @property
    def _compiled(self) -> _CompiledTemplates:
        return cast(_CompiledTemplates, self.env.bytecode_cache)

    def templates_made(self, names: Sequence[str]) -> tuple[Any, ...]:
        """What this process made of the templates ``names`` (:meth:`warm` them first): their digests
        and closures and every compiled template, for a worker forked before (:meth:`use_templates`)."""
        return (
            {name: self._template_digests[name] for name in names},
            {name: self._closures[name] for name in names},
            self._compiled.shared(),
        )

    def use_templates(self, made: tuple[Any, ...]) -> None:
        """The exporting process's digests and compiled templates (:meth:`templates_made`): this
        worker neither parses nor compiles them."""
        digests, closures, compiled = made
        self._template_digests.update(digests)
        self._closures.update(closures)
        self._compiled.add(compiled)

    def _reuse(self, rel: str, key: str) -> bool:
        """Link the previous export's ``rel`` when it was rendered from the inputs ``key``."""
        if self.previous is None or self.previous_inputs.get(rel) != key:
            return False
        listed = self.previous[1].get(rel)
        if listed is None:
            return False
        source = f"{os.fspath(self.previous[0])}/{rel}"
        try:
            with open(source, "rb") as fh:
                if hashlib.file_digest(fh, "sha256").hexdigest() != listed[0]:
                    return False  # changed since the manifest was written: render it
            self._folder(rel)
            os.link(source, f"{self._root}/{rel}")
        except OSError:
            return False  # gone, or another filesystem: render it
        self.files[rel] = listed
        self.unchanged += 1
        return True

    def _resolve(self, source_dir: str, path: str) -> str | None:
        """Where a link of a markdown document (repository path) lives in the site."""
        if path.startswith("docs/") and path.endswith(".md") and path[5:-3] in self.docs:
            return f"docs/{path[5:-3]}.html"
        if path == "README.md":
            return "docs/index.html"
        if path.rstrip("/") == "ale/schemas":
            return "schemas/index.html"
        if path.startswith("ale/schemas/") and path[12:] in self.schemas:
            return f"schemas/{path[12:]}"
        return None

    # the whole site

    def submissions(self, rows: Rows, start: int, stop: int) -> list[Submission]:
        """The rows ``start`` to ``stop`` (of :func:`read_rows`) decoded and built."""
        at = rows.names.index("id")
        built = []
        for i in range(start, stop):
            with RowFault(rows.rows[i][at]):  # its JSON columns' decoding and its building
                built.append(build_submission(*_decode(rows, i), specs=self.specs))
        return built

    def build(self, database: db.Where) -> ExportReport:
        """Every file of the site. With many rows, ``jobs`` forked :class:`_Shards` read and build
        the entries of a part of the rows each and render their submission pages, while this
        process ranks the entries they send and renders the rest (:meth:`_run`)."""
        # what the page chrome (base.html) shows; the board adds its counts (not every page's input)
        self.chrome = {
            "version": __version__,
            "release": self.release.release,
            "export_doc": "leaderboard-export" in self.docs,
        }
        keys = read_keys(database) if self.jobs > 1 else []
        shards = _Shards(self, database, keys) if len(keys) >= PARALLEL_FROM else None
        try:
            if shards is not None:  # while they build the entries: what the forked page workers inherit,
                # the submission page's template, which the shards are sent with the ranks, and the
                # docs (here, not in a shard: the shards' shares of the pages stay equal)
                self.warm(("board.html", "task.html", "tasks.html", "submission.html"))
                self._docs_pages()
            rows = read_rows(database) if shards is None else None
            own = [] if rows is None else self.submissions(rows, 0, len(rows.rows))
            entries = shards.entries() if shards is not None else [sub.entry for sub in own]
            ranked = self._build(entries, own, shards)
            self._manifest()  # while the workers, done, end
        finally:
            if shards is not None:
                shards.close()
        return ExportReport(
            directory=self.out,
            files=len(self.files),
            pages=self.pages,
            bytes=sum(size for _, size in self.files.values()),
            submissions=len(entries),
            ranked=ranked,
            unchanged=self.unchanged,
            rendered=self.rendered,
        )

    def _build(self, entries: list[Entry], own: list[Submission], shards: _Shards | None) -> int:
        """Rank the entries and render every page; the rows ranked on the Overall tab."""
        entries.sort(key=_uploaded)
        boards, task_boards = rank_all(entries, [task.spec.ref for task in self.tasks.values()])
        if shards is not None:
            shards.render(self.templates_made(("submission.html",)))  # the workers render their pages meanwhile
        for e in entries:  # before the page workers fork: each would digest the entries it shows
            e.fingerprint()
        self.board_site = self.chrome | {
            "submissions": len(entries),
            "latest": max((e.received_at for e in entries), default=None),
            "cap": fmt_value(self.release.cap),
        }
        work: list[Callable[[], None]] = []
        unscored = [e for e in entries if e.scores["overall"] is None]
        for category, label, first, stem in CATEGORIES:
            work += self._board(
                category, label, first, stem, *boards[category], unscored=unscored if category == "overall" else []
            )
        work += self._tasks(task_boards)
        if shards is None:
            work += self._docs()
            work += [lambda sub=sub: self._submission(sub) for sub in own]  # type: ignore[misc]
        # the CSV/JSON exports: this process, while the page workers render the rest
        self._run(work, own=[lambda: self._exports(entries, boards)])
        if shards is not None:
            shards.collect()
        return len(boards["overall"][0])

    def _counts(self) -> tuple[dict[str, tuple[str, int]], dict[str, str], int, int, int]:
        """What a worker sends back: the files it wrote, the pages' input digests, its counts."""
        return self.files, self.inputs, self.pages, self.unchanged, self.rendered

    def _reset(self) -> None:
        """In a forked worker: count only what it writes."""
        self.files, self.inputs, self.pages, self.unchanged, self.rendered = {}, {}, 0, 0, 0

    def _add(self, counts: tuple[dict[str, tuple[str, int]], dict[str, str], int, int, int]) -> None:
        files, inputs, pages, unchanged, rendered = counts
        self.files.update(files)
        self.inputs.update(inputs)
        self.pages += pages
        self.unchanged += unchanged
        self.rendered += rendered

    def _run(self, work: list[Callable[[], None]], *, own: Sequence[Callable[[], None]] = ()) -> None:
        """Run every item of ``work`` (each renders pages or writes files): in forked worker
        processes when there are many, while this process runs ``own``. Each worker runs chunks of
        consecutive items and sends back only what the manifest needs (the files it wrote, its
        counts); the items and everything they read are inherited from this process, never pickled."""
        if self.jobs == 1 or len(work) < PARALLEL_FROM:
            for item in [*own, *work]:
                item()
            return
        self._folders_made()
        global _WORK
        _WORK = (self, work)
        workers = max(1, self.jobs - 1) if own else self.jobs  # this process is one of them
        step = max(1, len(work) // (workers * 8))
        chunks = [(i, min(i + step, len(work))) for i in range(0, len(work), step)]
        gc.freeze()  # the forked workers share this process's objects without touching them
        try:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
                results = pool.map(_run_chunk, chunks)
                for item in own:
                    item()
                for counts in results:
                    self._add(counts)
        finally:
            _WORK = None
            gc.unfreeze()

    def _folders_made(self) -> None:
        """Before a fork: the folders the workers write into (each would make them otherwise)."""
        for folder in ("submissions", "tasks", "docs", "schemas"):
            self._folder(f"{folder}/x")

    def _board(
        self, category: str, label: str, first: str, stem: str, ranked: list[Entry], revoked: list[Entry],
        *, unscored: list[Entry],
    ) -> list[Callable[[], None]]:  # fmt: skip
        rows = ranked + revoked
        pages = _pages(rows, self.page_size)
        charts = (
            [top_chart(ranked, category, by, n=self.top_n, cap=self.release.cap) for by in ("score", "pass", "both")]
            if ranked
            else []
        )

        def render(number: int, chunk: Sequence[Entry]) -> None:
            self.page(
                _page_name(first, stem, number),
                "board.html",
                derive=lambda: {"cells": _board_cells(chunk, category)},
                title=f"{label} leaderboard" + (f" (page {number})" if number > 1 else ""),
                section="board",
                site=self.board_site,
                category=category,
                label=label,
                rows=chunk,
                ranked_count=len(ranked),
                revoked_count=len(revoked),
                charts=charts if number == 1 else [],
                unscored=unscored if number == len(pages) else [],
                paging=_pager(first, stem, number, len(pages)),
                first_rank=(number - 1) * self.page_size + 1,
            )

        return [lambda n=n, c=c: render(n, c) for n, c in enumerate(pages, start=1)]  # type: ignore[misc]

    def _submission(self, sub: Submission) -> None:
        e = sub.entry
        with RowFault(e.id):  # its page's context and its rendering
            self.page(
                e.href,
                "submission.html",
                derive=lambda: (
                    (self._submission_context(sub) if sub.context is None else sub.context)
                    | {"ranks": {category: e.ranks.get(category) for category, *_ in CATEGORIES}}
                ),
                title=f"{e.agent}: submission {e.id}",
                section="board",
                site=self.chrome,
                e=e,
            )

    def prepare(self, part: list[Submission], arrived: Callable[[], bool]) -> None:
        """Until ``arrived()`` (the ranks, in a shard worker): the page context of each submission
        whose page will be rendered whatever its ranks (the previous export has no digest of it),
        so that its page needs only its rendering once they are there."""
        for i, sub in enumerate(part):
            if i % 32 == 0 and arrived():
                return
            if sub.entry.href not in self.previous_inputs:
                with RowFault(sub.entry.id):
                    sub.context = self._submission_context(sub)

    def _submission_context(self, sub: Submission) -> dict[str, Any]:
        """What a submission's page shows of its row, prepared (from the row and the tasks alone,
        not its ranks): what a template would read by a method call, a test or a loop counter is
        read here."""
        e, s = sub.entry, sub.summary
        history = sorted(sub.row.get("history") or [], key=lambda h: h["seq"])
        revocation = next((h for h in reversed(history) if h.get("to_level") == "revoked"), None)
        tasks = []
        for n, t in enumerate(s.get("tasks") or [], start=1):
            ref = str(t.get("task"))
            task_id = ref.partition("@")[0]
            known = task_id in self.tasks and self.tasks[task_id].spec.ref == ref
            ended = t["ended"]
            tasks.append({**t, "href": f"../tasks/{task_id}.html" if known else None,
                          "title": self.tasks[task_id].spec.title if known else None,
                          "verdict": _verdict(t.get("judgement") or {}) if t["judgement"] else _NO_VERDICT,
                          "interval": e.task_intervals.get(t.get("task")), "n": n,
                          "ended_in": (ended.get("phase"), ended.get("category"))
                          if isinstance(ended, Mapping) else None})  # fmt: skip
        missing = list(s["missing"] or [])
        return {
            "s": s,
            "tasks": tasks,
            "judged": any(t["judgement"] for t in tasks),
            "stats": [
                (cat, text, first, e.scores[cat], e.intervals[cat], e.pass_rates[cat], e.coverage[cat])
                for cat, text, first, _ in CATEGORIES
            ],
            "coverage": e.coverage["overall"],
            "missing": [(ref, i == len(missing) - 1) for i, ref in enumerate(missing)],
            "attestation": _attestation(s),
            "history": history,
            "revocation": revocation,
            "notes": sub.row.get("reasons") or [],
            "declared": sorted(
                ((s.get("agent") or {}).get("declared") or {}).items(),
                key=lambda kv: (kv[0] not in ("model", "effort"), kv[0] != "model", kv[0]),
            ),
        }

    def _tasks(self, task_boards: dict[str, Board]) -> list[Callable[[], None]]:
        summaries = []
        work: list[Callable[[], None]] = []
        for task_id, task in sorted(self.tasks.items()):
            spec = task.spec
            target = self.release.tasks.get(spec.ref)
            ranked, revoked = task_boards[spec.ref]
            summary_html, _ = self.markdown.render(
                _first_section(task.paper), source_dir=f"ale/tasks/{task_id}", page_dir="tasks", id_prefix="summary-"
            )
            paper_html, _ = self.markdown.render(
                task.paper, source_dir=f"ale/tasks/{task_id}", page_dir="tasks", id_prefix="paper-", shift=2
            )
            info = {
                "spec": spec,
                "target": target,
                "required": spec.ref in self.release.required_tasks,
                "href": f"{task_id}.html",
                "count": len(ranked),
                "best": ranked[0] if ranked else None,
            }
            summaries.append(info)
            pages = _pages(ranked + revoked, self.page_size)

            def render(
                number: int, chunk: Sequence[Entry], task_id: str = task_id, info: dict[str, Any] = info,
                summary_html: Markup = summary_html, paper_html: Markup = paper_html,
                count: int = len(pages), ranked_count: int = len(ranked),
            ) -> None:  # fmt: skip
                self.page(
                    _page_name(f"tasks/{task_id}.html", task_id, number),
                    "task.html",
                    derive=lambda: {"cells": _task_cells(chunk, info["spec"].ref)},
                    title=info["spec"].title + (f" (page {number})" if number > 1 else ""),
                    section="tasks",
                    site=self.chrome,
                    task=info,
                    summary_html=summary_html,
                    paper_html=paper_html,
                    rows=chunk,
                    ranked_count=ranked_count,
                    paging=_pager(f"tasks/{task_id}.html", task_id, number, count),
                    first_rank=(number - 1) * self.page_size + 1,
                    cap=self.release.cap,
                )

            work += [lambda n=n, c=c, r=render: r(n, c) for n, c in enumerate(pages, start=1)]  # type: ignore[misc]
        work.append(lambda: self.page("tasks/index.html", "tasks.html", title="Tasks", section="tasks",
                                      site=self.chrome, tasks=summaries))  # fmt: skip
        return work

    def _docs(self) -> list[Callable[[], None]]:
        """The docs, their index and the schemas: one work item (each doc's title, which the index
        lists, comes from its rendered markdown), so that the markdown is rendered by a worker too."""
        return [self._docs_pages]

    def _docs_pages(self) -> None:
        listing = []
        for name in sorted(self.docs, key=lambda n: (DOC_ORDER.index(n) if n in DOC_ORDER else len(DOC_ORDER), n)):
            text = self.docs[name].read_text(encoding="utf-8")
            html, headings = self.markdown.render(text, source_dir="docs", page_dir="docs")
            title = next((h["text"] for h in headings if h["level"] == 1), name)
            listing.append({"name": name, "title": title, "href": f"{name}.html"})
            self.page(
                f"docs/{name}.html",
                "doc.html",
                title=title,
                section="docs",
                site=self.chrome,
                body=html,
                toc=[h for h in headings if h["level"] == 2],
                source=f"docs/{name}.md",
            )
        self.page("docs/index.html", "docs.html", title="Documentation", section="docs", site=self.chrome,
                  docs=listing, schemas=bool(self.schemas))  # fmt: skip
        folder = resources.files("ale") / "schemas"
        for name in self.schemas:
            self.write(f"schemas/{name}", (folder / name).read_bytes())
        self.page("schemas/index.html", "schemas.html", title="JSON Schemas", section="docs", site=self.chrome,
                  schemas=self.schemas)  # fmt: skip

    # exports

    def _export_rows(self, entries: list[Entry], boards: dict[str, Board]) -> list[dict[str, Any]]:
        position = {e.id: i for i, e in enumerate(boards["overall"][0])}  # the Overall tab's order

        def order(e: Entry) -> tuple[Any, ...]:
            p = position.get(e.id)
            return (e.revoked, p is None, p or 0, e.received_at, e.id)

        out = []
        for e in sorted(entries, key=order):
            s = e.facts
            covered, required = e.coverage["overall"]
            ranks, scores, rates, tokens = e.ranks, e.scores, e.pass_rates, e.tokens
            low_overall, high_overall = e.intervals["overall"] or _NO_BOUNDS
            low_reproduction, high_reproduction = e.intervals["reproduction"] or _NO_BOUNDS
            low_open, high_open = e.intervals["open"] or _NO_BOUNDS
            states: dict[str, list[str]] = {state: [] for state in JUDGEMENT_COLUMNS}
            judged_by = []
            judgements = sorted(e.judgements.items())
            for ref, j in judgements:
                if j["state"] in states:
                    states[j["state"]].append(ref)
                if j["judged_by"]:
                    judged_by.append(f"{ref}={_judged_by(j)}")
            out.append(
                {
                    "submission_id": e.id,
                    "url": e.href,
                    "agent": e.agent,
                    "model": e.model,
                    "effort": e.effort,
                    "level": e.level,
                    "revoked": e.revoked,
                    "rank_overall": ranks.get("overall"),
                    "score_overall": scores["overall"],
                    "lower_overall": low_overall,
                    "upper_overall": high_overall,
                    "rank_reproduction": ranks.get("reproduction"),
                    "score_reproduction": scores["reproduction"],
                    "lower_reproduction": low_reproduction,
                    "upper_reproduction": high_reproduction,
                    "rank_open": ranks.get("open"),
                    "score_open": scores["open"],
                    "lower_open": low_open,
                    "upper_open": high_open,
                    "macro_mean": s["macro_mean"],
                    "pass_rate": rates["overall"],
                    "pass_rate_reproduction": rates["reproduction"],
                    "pass_rate_open": rates["open"],
                    "covered": covered,
                    "required": required,
                    "coverage_complete": bool(s["coverage_complete"]),
                    "missing": list(s["missing"] or []),
                    "runtime_s": None if e.runtime_s is None else round(e.runtime_s, 6),
                    "input_tokens": tokens[0] if tokens else None,
                    "output_tokens": tokens[1] if tokens else None,
                    "tokens_source": "network_proxy" if tokens else None,
                    "received_at": _iso(e.received_at),
                    "started": s["started"],
                    "finished": s["finished"],
                    "release": s["release"],
                    "official_episode_counts": bool(s["official_episode_counts"]),
                    "runner_kind": s["runner_kind"],
                    "run_id": s["run_id"],
                    "ciphertext_sha256": s["ciphertext_sha256"],
                    "merkle_root": s["merkle_root"],
                    "judged_faithful": states["judged_faithful"],
                    "judged_unfaithful": states["judged_unfaithful"],
                    "unjudged": states["unjudged"],
                    "judging_pending": states["judging_pending"],
                    "judged_by": judged_by,
                    "task_finals": dict(sorted(e.finals.items())),
                    "task_judgements": dict(judgements),
                }
            )
        return out

    def _exports(self, entries: list[Entry], boards: dict[str, Board]) -> None:
        rows = self._export_rows(entries, boards)
        doc = {
            "schema": EXPORT_SCHEMA,
            "release": self.release.release,
            "cap": self.release.cap,
            "required_tasks": list(self.release.required_tasks),
            "submissions": rows,
        }
        self.write("leaderboard.json", export_json(doc))
        records = [csv_record(CSV_COLUMNS)]
        texts = [i for i, name in enumerate(CSV_COLUMNS) if name in _TEXT_COLUMNS]
        for r in rows:
            values = [r[name] for name in CSV_COLUMNS]
            for i in texts:
                values[i] = _csv_text(values[i])
            records.append(csv_record(values))
        self.write("leaderboard.csv", "".join(records).encode("utf-8"))

    def _manifest(self) -> None:
        self.write(MANIFEST, manifest_json(self.files, f"ale-verify {__version__}"))


#: from this many submissions on, shard workers build them and render their pages (_Shards); from
#: this many other work items (pages, mostly) on, worker processes run them (Site._run)
PARALLEL_FROM = 200
#: what forked workers run: (site, work items), set by Site._run around the fork
_WORK: tuple[Site, list[Callable[[], None]]] | None = None


def _run_chunk(
    bounds: tuple[int, int],
) -> tuple[dict[str, tuple[str, int]], dict[str, str], int, int, int]:
    """In a forked worker: run work[start:stop]; the files written, the pages' input digests and
    the counts (pages, unchanged files, pages rendered)."""
    assert _WORK is not None, "a worker forked from Site._run"
    site, work = _WORK
    site._reset()
    for item in work[bounds[0] : bounds[1]]:
        item()
    return site._counts()


#: what a forked shard worker reads: (site, database), set by _Shards around the fork
_SHARD: tuple[Site, db.Where] | None = None


class _Shards:
    """Forked worker processes, one per contiguous part of the rows (inherited, never pickled).
    Each builds its part's submissions and sends their entries (:meth:`entries`); once sent its
    entries' ranks (:meth:`render`) each renders its submission pages and sends back what the
    manifest needs (:meth:`collect`). So the decoding of the rows, the submissions' pages and the
    links of their unchanged files are split between the workers, and only entries, ranks and the
    submission page's compiled template cross between processes."""

    def __init__(self, site: Site, database: db.Where, keys: list[Key]) -> None:
        self.site = site
        n = len(keys)
        jobs = max(1, min(site.jobs, n))
        # each reads the rows from its first key on, up to the next one's (the first and last
        # open-ended: a row uploaded meanwhile is in exactly one part)
        bounds = [(keys[n * k // jobs] if k else None, keys[n * (k + 1) // jobs] if k < jobs - 1 else None)
                  for k in range(jobs)]  # fmt: skip
        site._folders_made()
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.conns: list[Connection] = []
        self.parts: list[list[Entry]] = []
        self.done = False  # every worker sent its pages (collect)
        context = multiprocessing.get_context("fork")
        global _SHARD
        _SHARD = (site, database)
        try:
            for start, stop in bounds:
                ours, theirs = context.Pipe()
                proc = context.Process(target=_shard_main, args=(theirs, start, stop), daemon=True)
                proc.start()
                theirs.close()
                self.procs.append(proc)
                self.conns.append(ours)
        except BaseException:
            self.close()
            raise
        finally:
            _SHARD = None

    def entries(self) -> list[Entry]:
        """Every worker's entries, in the rows' order."""
        self.parts = [self._receive(k, "entries") for k in range(len(self.conns))]
        return [e for part in self.parts for e in part]

    def render(self, templates: tuple[Any, ...]) -> None:
        """Send each worker its entries' ranks (set on the entries it sent) and the submission
        page's template as this process compiled it (:meth:`Site.templates_made`)."""
        for conn, part in zip(self.conns, self.parts, strict=True):
            conn.send((templates, [(e.ranks, e.task_ranks) for e in part]))

    def collect(self) -> None:
        """Add each worker's files, page digests and counts to the site's (the workers, done,
        end meanwhile: :meth:`close` waits for them)."""
        for k in range(len(self.conns)):
            self.site._add(self._receive(k, "pages"))
        self.done = True

    def _receive(self, k: int, what: str) -> Any:
        try:
            kind, value = self.conns[k].recv()
        except EOFError:
            self.procs[k].join()
            raise ExportError(
                f"export worker {k} ended (exit status {self.procs[k].exitcode}) before it sent its {what}"
            ) from None
        if kind == "error":
            raise value
        return value

    def close(self) -> None:
        """Wait for the workers to end (ended first, unless every one sent its pages)."""
        for proc in self.procs:
            if not self.done and proc.is_alive():
                proc.terminate()
            proc.join()
        for conn in self.conns:
            conn.close()


def _shard_main(conn: Connection, start: Key | None, stop: Key | None) -> None:
    """A shard worker (:class:`_Shards`): errors are sent, not printed."""
    assert _SHARD is not None, "a worker forked by _Shards"
    site, database = _SHARD
    site._reset()
    try:
        rows = read_rows(database, start, stop, ordered=False)  # the exporting process orders the entries
        part = site.submissions(rows, 0, len(rows.rows))
        del rows  # the rows as read (their JSON text): its memory is the pages' now
        conn.send(("entries", [sub.entry for sub in part]))
        site.prepare(part, conn.poll)  # while the exporting process ranks the entries
        templates, ranks = conn.recv()
        site.use_templates(templates)  # compiled by the exporting process meanwhile
        for sub, (ranks_of, task_ranks) in zip(part, ranks, strict=True):
            sub.entry.ranks, sub.entry.task_ranks = ranks_of, task_ranks
        for sub in part:
            site._submission(sub)
        conn.send(("pages", site._counts()))
    except BaseException as exc:
        try:
            conn.send(("error", exc))
        except Exception:  # an exception that does not pickle: its text
            conn.send(("error", ExportError(f"{type(exc).__name__}: {exc}")))
    finally:
        conn.close()
        # Everything is sent: end now. Returning would free the part's submissions (their decoded
        # rows, millions of objects) one by one, ~0.1 s of a 10,000-row export that the exporting
        # process waits for (_Shards.close); the kernel takes the whole address space back at once.
        sys.stderr.flush()
        os._exit(0)


def _context_value(value: Any) -> Any:
    """How :meth:`Site.inputs_digest` writes what JSON has no form for."""
    if isinstance(value, Entry):
        return {"entry": value.fingerprint()}
    if attrs.has(type(value)):
        return {"attrs": type(value).__qualname__, **attrs.asdict(value, recurse=False)}
    return _json_fallback(value)


#: an entry's row as the database gave it (its members in the stored order: the same row, the same
#: bytes), any key type; the JSON of a page's inputs, not a file's
_ORJSON = orjson.OPT_NON_STR_KEYS


def _json_fallback(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return {"bytes": bytes(value).hex()}
    raise TypeError(f"a page input of type {type(value).__name__} has no digest")


_TEXT_COLUMNS = frozenset({"agent", "model", "effort"})


#: what a submission's page shows of a task's judgement (absent: None), and of the bundle's own verdict
VERDICT_KEYS = ("status", "faithful", "source", "judge_key_id", "judge_model", "input_sha256", "rationale")
CLAIMED_KEYS = ("outcome", "faithful", "judge_model", "signature")


def _verdict(judgement: dict[str, Any]) -> dict[str, Any]:
    """A task's judgement with every key its page reads (absent: None) and the bundle's own verdict
    (``claimed``) alike, read by key in the template, no ``.get()`` call per value; each finding
    as the tuple of its item, kind, satisfied and evidence."""
    claimed = judgement.get("claimed") or {}
    return {
        **{k: judgement.get(k) for k in VERDICT_KEYS},
        "claimed": {k: claimed.get(k) for k in CLAIMED_KEYS},
        "findings": [
            (f.get("item"), f.get("kind"), f.get("satisfied"), f.get("evidence"))
            for f in judgement.get("findings") or ()
        ],
    }


#: the verdict of a task without a judgement (what _verdict gives for none), shared
_NO_VERDICT = _verdict({})

#: how a submission's page names the members of its runtime attestation's code digest
CODE_NAMES = {
    "kind": "Attestation kind", "note": "Note", "code_sha256": "Code SHA-256",
    "dependency_lock_sha256": "Dependency lock SHA-256", "python": "Python",
    "evaluator_image_sha256": "Evaluator image SHA-256", "agent_image_sha256": "Agent image SHA-256",
    "images_lock_sha256": "Images lock SHA-256",
}  # fmt: skip


def _signer(provenance: dict[str, Any]) -> Any:
    """The first 16 characters of the runner key that signed an image's provenance ('' for none)."""
    return ((provenance.get("signed_by") or {}).get("key_id") or "")[:16]


def _attestation(s: dict[str, Any]) -> dict[str, Any]:
    """What a submission's page shows of its runtime attestation, images, their provenance and its
    runner's signature (each image and code member in key order, as Jinja's ``dictsort`` has it),
    read from the summary as the page's template did."""
    rt = s["runtime"] or {}
    engine = rt.get("engine")
    ran = (rt.get("images") or {}).get("images") or {}
    images = jinja2.filters.do_dictsort(ran)
    provenance = jinja2.filters.do_dictsort(s["image_provenance"] or {}) if ran else []
    runner = s["runner"]
    return {
        "runtime": rt.get("runtime"),
        "sandbox": rt.get("sandbox"),
        "engine": (engine.get("name"), engine.get("version"), engine.get("server"), engine.get("oci_runtime"))
        if engine
        else None,
        "images": [(name, entry.get("digest"), i == len(images) - 1) for i, (name, entry) in enumerate(images)],
        "provenance": [
            (name, p.get("status"), _signer(p), p.get("message"), p.get("reason"), i == len(provenance) - 1)
            for i, (name, p) in enumerate(provenance)
        ],
        "code": [
            (key, CODE_NAMES.get(key), key.endswith("sha256"), value)
            for key, value in jinja2.filters.do_dictsort(rt.get("code") or {})
        ],
        "runner": (runner.get("label"), str(runner.get("kind") or "").replace("_", " "), runner.get("key_id"))
        if runner
        else None,
    }


def _judged_by(judgement: dict[str, Any]) -> str:
    """``judge_key:<key id>`` or ``verifier:<model>`` (``%`` and ``;`` in the model percent-escaped,
    so that the CSV's ``;``-joined list splits back exactly)."""
    if judgement["judged_by"] == "judge_key":
        return f"judge_key:{judgement['judge_key_id']}"
    model = str(judgement["judge_model"] or "").replace("%", "%25").replace(";", "%3B")
    return f"verifier:{model}"


def export_json(doc: Any) -> bytes:
    """``leaderboard.json``'s bytes: ``doc`` as one line of JSON, keys sorted, no spaces, UTF-8, and
    a final newline, written by orjson (in C). A float is its shortest text that reads back as the
    same double (``0.25``, ``0.00001``, ``1e-6``); one that is not a finite number (a NaN a summary may hold:
    JSON has none) is written ``null``. What orjson cannot write (an integer beyond 64 bits, a
    string with a lone surrogate) is written by :mod:`json` with the same rules, non-ASCII and
    surrogates escaped."""
    try:
        return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:
        text = json.dumps(_finite(doc), sort_keys=True, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
        return (text + "\n").encode("ascii")


def manifest_json(files: dict[str, tuple[str, int]], generator: str) -> bytes:
    """``manifest.json``'s bytes: ``json.dumps(doc, sort_keys=True, indent=1)`` and a newline, for
    ``doc`` = {"files": {name: {"bytes": size, "sha256": digest}}, "generator": ..., "schema": ...},
    written a line at a time (json.dumps's indenting encoder is pure Python: ~5 us a file, and the
    manifest is written last, on one core). Each name and the generator are encoded by json.dumps
    itself (ASCII, escapes as it writes them); a digest must be 64 lowercase hex digits and a
    size an int, as :meth:`Site.write` makes them."""
    parts = ['{\n "files": {']
    entries = []
    for name in sorted(files):
        digest, size = files[name]
        if type(size) is not int or not _HEX64_TEXT.fullmatch(digest):
            raise ExportError(f"refusing to list {name!r} in the manifest: not a digest and a size")
        entries.append(f'\n  {json.dumps(name)}: {{\n   "bytes": {size},\n   "sha256": "{digest}"\n  }}')
    parts.append(",".join(entries))
    parts.append("\n }" if entries else "}")
    parts.append(f',\n "generator": {json.dumps(generator)},\n "schema": {json.dumps(MANIFEST_SCHEMA)}\n}}\n')
    return "".join(parts).encode("ascii")


_HEX64_TEXT = re.compile(r"[0-9a-f]{64}")


def _finite(value: Any) -> Any:
    """``value`` with every float that is not a finite number replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list):
        return ";".join(map(str, value))
    return str(value)


def csv_record(values: Sequence[Any]) -> str:
    """One record of ``leaderboard.csv``: what ``csv.writer(lineterminator="\\r\\n")`` writes for the
    cells :func:`_csv_cell` makes of ``values`` (two or more), character for character. A cell is
    quoted when it holds a comma, a quote, a carriage return or a line feed, its quotes doubled; a
    number's or an empty cell never is. (The csv module looks up every character of every cell in
    the line terminator, one call each: several times the cost of a record joined here.)"""
    cells: list[str] = []
    add = cells.append
    floats = iter(float_reprs([v for v in values if type(v) is float]))
    for value in values:
        kind = type(value)
        if kind is float:
            add(next(floats))  # as the csv module writes a float: its repr
        elif kind is int:
            add(str(value))
        elif value is None:
            add("")
        else:
            text = value if kind is str else _csv_cell(value)
            if '"' in text:
                text = '"' + text.replace('"', '""') + '"'
            elif "," in text or "\n" in text or "\r" in text:
                text = '"' + text + '"'
            add(text)
    return ",".join(cells) + "\r\n"


def float_reprs(values: list[float]) -> list[str]:
    """``repr`` of each float, made by orjson where its text is repr's: both write the fewest
    digits that read back as the same double, and between 1e-4 and 1e16 (and zero) both write them
    in positional notation with at least one decimal, as Python's repr does; outside that range,
    and for a NaN or an infinity (orjson writes ``null``), repr itself. One C call for a row's
    floats: repr costs several times as much a float (a fuzz test holds it to repr)."""
    texts = orjson.dumps(values).decode("ascii")[1:-1].split(",") if values else []
    for i, (value, text) in enumerate(zip(values, texts, strict=True)):
        if not (1e-4 <= abs(value) < 1e16 or value == 0.0) or "e" in text or "n" in text:
            texts[i] = repr(value)
    return texts


def _csv_text(value: Any) -> str:
    """A submitter's text in a cell: a spreadsheet must not run it as a formula."""
    text = _csv_cell(value)
    if value is None or isinstance(value, bool | float | list):
        return text
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


# -- entry point ------------------------------------------------------------------------------

#: beside the site's folder DIR: ``.DIR.inputs.json``, each page's input digest (Site.inputs_digest)
INPUTS_SCHEMA = "ale-site-inputs/v1"


def _code_digest(release: Any, specs: dict[str, Any]) -> bytes:
    """SHA-256 of the code every page is rendered by (its template aside, :meth:`Site.template_digest`):
    this exporter and the modules it derives a page's data with, the renderer's version, the
    installed tasks and the release."""
    h = hashlib.sha256(f"ale-verify {__version__} jinja2 {jinja2.__version__}\n".encode())
    here = Path(__file__).resolve().parent
    for path in (here / "export.py", here / "ranking.py", here / "judging.py"):
        data = path.read_bytes()
        h.update(f"{path.name} {len(data)}\n".encode() + data)
    h.update(repr((release, sorted(specs.items()))).encode())
    return h.digest()


def inputs_path(out: Path) -> Path:
    """Where an export keeps its pages' input digests: beside the site (they are not published)."""
    return out.with_name(f".{out.name}.inputs.json")


def _previous_inputs(out: Path) -> dict[str, str]:
    """The previous export's page input digests, when they belong to the manifest now in ``out``
    (else none: every page is rendered)."""
    try:
        manifest = hashlib.sha256((out / MANIFEST).read_bytes()).hexdigest()
        doc = parse_json(inputs_path(out).read_bytes(), what="site inputs", max_bytes=64 * 1024 * 1024)
    except (OSError, ParseError):
        return {}
    if not isinstance(doc, dict) or doc.get("schema") != INPUTS_SCHEMA or doc.get("manifest_sha256") != manifest:
        return {}
    pages = doc.get("pages")
    if not isinstance(pages, dict):
        return {}
    return {name: key for name, key in pages.items() if isinstance(key, str)}


def _write_inputs(out: Path, inputs: dict[str, str], manifest: str) -> None:
    """Record the pages' input digests for the next export (written beside, then renamed), with
    the SHA-256 of the manifest they belong to (as the export wrote it: not read back)."""
    doc = {"schema": INPUTS_SCHEMA, "manifest_sha256": manifest, "pages": dict(sorted(inputs.items()))}
    target = inputs_path(out)
    tmp = target.with_name(f"{target.name}.{secrets.token_hex(4)}")
    tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_APPEND_NEWLINE))  # (one line: it is not published)
    os.replace(tmp, target)


def _previous(out: Path) -> tuple[Path, dict[str, tuple[str, int]]] | None:
    """The previous export's folder and the files its manifest lists, or None (none, or unreadable:
    then every file is written)."""
    try:
        doc = parse_json((out / MANIFEST).read_bytes(), what=MANIFEST, max_bytes=64 * 1024 * 1024)
    except (OSError, ParseError):
        return None
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict):
        return None
    listed: dict[str, tuple[str, int]] = {}
    for name, entry in files.items():
        if isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and type(entry.get("bytes")) is int:
            listed[name] = (entry["sha256"], entry["bytes"])
    return out, listed


@attrs.frozen
class Rows:
    """The accepted submissions as the database gives them, not decoded yet (:func:`_decode`)."""

    names: tuple[str, ...]  # the columns
    rows: list[Sequence[Any]]  # in upload order
    history: dict[str, list[dict[str, Any]]]  # each submission's audit log rows, in order


#: a submission's place in upload order: (received_at, id)
Key = tuple[float, str]


def read_keys(database: db.Where) -> list[Key]:
    """The accepted submissions' keys, in upload order."""
    with db.connect(database, keep=False) as s:  # a batch job's read: nothing kept open after it
        cursor = s.execute(
            "SELECT received_at, id FROM submissions WHERE status = ? ORDER BY received_at, id", ["accepted"]
        )
        return [(at, ident) for at, ident in cursor.fetchall()]


def read_rows(database: db.Where, start: Key | None = None, stop: Key | None = None, *, ordered: bool = True) -> Rows:
    """The accepted submissions (those from ``start`` on and before ``stop``, in upload order;
    ``ordered=False``: in the database's order, for a reader that orders them itself, so that the
    database does not sort whole rows) and their audit history, not decoded."""
    where, params = "s.status = ?", list[Any](["accepted"])
    if start is not None:
        where += " AND (s.received_at > ? OR (s.received_at = ? AND s.id >= ?))"
        params += [start[0], start[0], start[1]]
    if stop is not None:
        where += " AND (s.received_at < ? OR (s.received_at = ? AND s.id < ?))"
        params += [stop[0], stop[0], stop[1]]
    with db.connect(database, keep=False) as s:  # a batch job's read: nothing kept open after it
        order = " ORDER BY s.received_at, s.id" if ordered else ""
        cursor = s.execute(f"SELECT * FROM submissions s WHERE {where}{order}", params)
        names = tuple(d[0] for d in cursor.description)
        rows = cursor.fetchall()
        history = s.rows(
            f"SELECT a.* FROM audit_log a JOIN submissions s ON s.id = a.submission_id WHERE {where} ORDER BY a.seq",
            params,
        )
    by_id: dict[str, list[dict[str, Any]]] = {}
    for h in history:
        by_id.setdefault(h["submission_id"], []).append(h)
    return Rows(names, rows, by_id)


def _decode(rows: Rows, i: int) -> tuple[dict[str, Any], str]:
    """Row ``i`` with its JSON columns decoded (by orjson, several times faster: the verifier's
    own writing; :mod:`json` for what orjson refuses, a NaN) and its history, as
    :func:`ale_verify.db.all_submissions` gives it, and its digest (:func:`_row_digest`)."""
    raw = rows.rows[i]
    row = dict(zip(rows.names, raw, strict=True))
    history = rows.history.get(row["id"], [])
    digest = _row_digest(rows.names, raw, history)
    return {**row, "reasons": _loads(row["reasons"]), "summary": _loads(row["summary"]), "history": history}, digest


def _row_digest(names: Sequence[str], raw: Sequence[Any], history: list[dict[str, Any]]) -> str:
    """SHA-256 of a submission's whole database row as read (its JSON columns as stored text) and
    of its audit history: what every member of its entry and every line of its page derive from."""
    data = orjson.dumps([names, raw, history], default=_json_fallback, option=_ORJSON)
    return hashlib.sha256(data).hexdigest()


def accepted_submissions(database: db.Where) -> list[dict[str, Any]]:
    """The accepted submissions with their audit history, as :func:`ale_verify.db.all_submissions`
    gives every submission: the rejected ones never reach a page."""
    rows = read_rows(database)
    return [_decode(rows, i)[0] for i in range(len(rows.rows))]


def _loads(text: str | bytes) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def export_site(
    database: db.Where,
    out: Path,
    *,
    docs_dir: Path | None = None,
    page_size: int = 100,
    top_n: int = 10,
    jobs: int | None = None,
) -> ExportReport:
    """Render the site for ``database`` into ``out`` (replacing a previous export there).

    A page whose inputs are those the previous export rendered it from is not rendered again, and
    a file whose bytes the previous export's manifest lists unchanged is linked from it, not
    rewritten (its inode and modification time stay), so an export after one new upload renders
    and rewrites only the pages that changed. ``jobs``: worker processes for the pages (default:
    the CPUs this process may use, at most 8)."""
    if not db.exists(database):
        raise ExportError(f"no database at {db.location(database)}")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MANIFEST).is_file())):
        raise ExportError(f"{out} exists and is not a previous export (no {MANIFEST}); refusing to replace it")
    enabled = gc.isenabled()
    gc.disable()  # a site's data is many small objects and no cycles: collecting finds nothing
    try:
        report, inputs, manifest = _build(database, out, docs_dir=docs_dir, page_size=page_size, top_n=top_n,
                                          jobs=jobs)  # fmt: skip
    finally:
        if enabled:
            gc.enable()
    try:
        _write_inputs(out, inputs, manifest)
    except OSError:
        inputs_path(out).unlink(missing_ok=True)  # the next export renders every page
    return report


def _build(
    database: db.Where, out: Path, *, docs_dir: Path | None, page_size: int, top_n: int, jobs: int | None
) -> tuple[ExportReport, dict[str, str], str]:
    out.parent.mkdir(parents=True, exist_ok=True)
    previous = _previous(out)
    previous_inputs = _previous_inputs(out) if previous is not None else {}
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=out.parent))
    try:
        stage.chmod(0o755)
        workers = jobs if jobs is not None else max(1, min(8, len(os.sched_getaffinity(0))))
        site = Site(stage, docs_dir=docs_dir, page_size=page_size, top_n=top_n, previous=previous,
                    previous_inputs=previous_inputs, jobs=workers)  # fmt: skip
        report = site.build(database)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{secrets.token_hex(4)}")
            os.replace(out, old)
            os.replace(stage, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return attrs.evolve(report, directory=out), site.inputs, site.files[MANIFEST][0]
