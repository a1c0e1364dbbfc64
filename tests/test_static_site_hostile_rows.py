"""``ale-verify export-site`` on database rows the verifier does not write: a summary of another
shape, a score that is not a number, JSON that does not parse, a NaN. The export either succeeds or
fails with one :class:`ale_verify.export.ExportError` naming the submission, and then leaves the
previous site as it was; it never fails with another exception (a traceback from the CLI, the end
of ``--every``'s loop). The mechanism: ``export.RowFault`` around each row's building, page
context and page, and entries whose every number is a number (``build_submission``)."""

from __future__ import annotations

import errno
import json
import math
import shutil
import sqlite3
from pathlib import Path
from typing import Any, cast

import pytest
import site_fixtures as sf
from fuzzing import FUZZ_EXAMPLES, fuzz_settings, hostile_json, json_paths, json_values, replaced
from hypothesis import given, settings
from hypothesis import strategies as st

from ale import catalog
from ale_verify import cli, export, judging, ranking


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, Any]]:
    """A small database (checkpointed: one file to copy) and one accepted row's id and summary."""
    folder = tmp_path_factory.mktemp("hostile-rows")
    database = folder / "db.sqlite3"
    sf.fill_many(database, 4, reject_every=100, revoke_every=3)
    with sqlite3.connect(database) as c:
        sid, summary = c.execute("SELECT id, summary FROM submissions WHERE status = 'accepted' LIMIT 1").fetchone()
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return database, sid, json.loads(summary)


#: each example is a whole export (~0.1 s): a quarter of the fuzz targets' count
export_settings = settings(fuzz_settings, max_examples=max(1, FUZZ_EXAMPLES // 4))


def _tree(site: Path) -> dict[str, bytes]:
    return {p.relative_to(site).as_posix(): p.read_bytes() for p in sorted(site.rglob("*")) if p.is_file()}


def _with(base: tuple[Path, str, dict[str, Any]], folder: Path, sql: str, params: list[Any]) -> Path:
    """A copy of the base database with ``sql`` run on it (``?`` last: the row's id)."""
    source, sid, _ = base
    database = folder / "db.sqlite3"
    shutil.copyfile(source, database)
    with sqlite3.connect(database) as c:
        c.execute(sql, [*params, sid])
    return database


def _export_or_refuse(database: Path, out: Path) -> str:
    """'exported', or 'refused' after an ExportError that names the submission (and the site at
    ``out``, a previous export, unchanged)."""
    before = _tree(out) if out.exists() else None
    try:
        export.export_site(database, out, docs_dir=None, jobs=1)
    except export.ExportError as exc:
        message = str(exc)
    else:
        return "exported"
    assert "submission 'sub_" in message
    assert "\n" not in message
    if before is not None:
        assert _tree(out) == before
    return "refused"


@pytest.mark.fuzz
@export_settings
@given(data=st.data(), new=json_values)
def test_a_summary_with_any_value_anywhere_is_exported_or_refused_by_name(
    base: tuple[Path, str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, new: Any
) -> None:
    summary = base[2]
    path = data.draw(st.sampled_from(json_paths(summary)))
    folder = tmp_path_factory.mktemp("case")
    changed = json.dumps(replaced(summary, path, new))
    database = _with(base, folder, "UPDATE submissions SET summary = ? WHERE id = ?", [changed])
    _export_or_refuse(database, folder / "site")


@pytest.mark.fuzz
@export_settings
@given(column=st.sampled_from(["summary", "reasons"]), raw=hostile_json | json_values.map(json.dumps).map(str.encode))
def test_a_json_column_of_any_bytes_is_exported_or_refused_by_name(
    base: tuple[Path, str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory, column: str, raw: bytes
) -> None:
    folder = tmp_path_factory.mktemp("case")
    text = raw.decode("utf-8", "replace")
    database = _with(base, folder, f"UPDATE submissions SET {column} = ? WHERE id = ?", [text])
    _export_or_refuse(database, folder / "site")


@pytest.mark.parametrize(
    ("column", "value"),
    [("at", "yesterday"), ("actor", 7), ("reason", b"\xff"), ("action", 1.5), ("at", 1e300)],
)  # (a level the database does not know, or no time, it refuses itself: a trigger, NOT NULL)
def test_an_audit_entry_of_another_shape_is_exported_or_refused_by_name(
    base: tuple[Path, str, dict[str, Any]], tmp_path: Path, column: str, value: Any
) -> None:
    """The audit log is append-only, but a damaged database may hold any entry."""
    entry = {"at": 1.0, "actor": "verifier", "action": "audited", "from_level": None, "to_level": None, "reason": "r"}
    entry[column] = value
    names = ", ".join(entry)
    marks = ", ".join("?" for _ in entry)
    sql = f"INSERT INTO audit_log ({names}, submission_id) VALUES ({marks}, ?)"
    database = _with(base, tmp_path, sql, list(entry.values()))
    _export_or_refuse(database, tmp_path / "site")


@pytest.mark.parametrize(
    ("what", "value"),
    [
        ("a summary that is a list", []),
        ("a task's final that is text", "tasks.0.final=abc"),
        ("the categories as a list", "categories=[1]"),
        ("the agent as text", "agent=x"),
        ("the covered tasks as a number", "covered=3"),
        ("a missing task that is an object", "missing=[{}]"),
        ("a usage that is text", "network_proxy={};usage=x"),
        ("a judgement that is text", "tasks.0.judgement=x"),
        ("an overall score that is text", 'categories={"overall": "0.5"}'),
        ("a pass rate that is text", "pass_rate=high"),
    ],
)
def test_a_malformed_row_fails_the_export_with_one_line_naming_it_and_keeps_the_site(
    base: tuple[Path, str, dict[str, Any]],
    tmp_path: Path,
    what: str,
    value: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    summary = base[2]
    if isinstance(value, str):  # PATH=JSON (or text) replacements, ';' between them
        for change in value.split(";"):
            key, _, raw = change.partition("=")
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = raw
            path = tuple(int(p) if p.isdigit() else p for p in key.split("."))
            summary = replaced(summary, path, parsed)
    else:
        summary = value
    site = tmp_path / "site"
    export.export_site(base[0], site, docs_dir=None, jobs=1)  # the previous site, from the good rows
    database = _with(base, tmp_path, "UPDATE submissions SET summary = ? WHERE id = ?", [json.dumps(summary)])
    assert _export_or_refuse(database, site) == "refused", what
    # the CLI: one line on stderr, status 2
    monkeypatch.setenv("ALE_VERIFY_DATABASE", str(database))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    code = cli.main(["export-site", str(site), "--jobs", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1, err
    assert "its database row is not one the verifier writes" in err


def test_a_received_at_that_is_text_fails_the_export_naming_the_row(
    base: tuple[Path, str, dict[str, Any]], tmp_path: Path
) -> None:
    database = _with(base, tmp_path, "UPDATE submissions SET received_at = ? WHERE id = ?", ["yesterday"])
    assert _export_or_refuse(database, tmp_path / "site") == "refused"


def test_a_nan_in_a_summary_is_written_null_in_the_json_export(
    base: tuple[Path, str, dict[str, Any]], tmp_path: Path
) -> None:
    """JSON has no NaN: a summary's NaN (only Python's json reads one) is ``null`` in
    leaderboard.json, which stays valid JSON; the export used to fail with a bare ValueError."""
    nan = """replace(summary, '"macro_mean": ', '"macro_mean": NaN, "x": ')"""
    database = _with(base, tmp_path, f"UPDATE submissions SET summary = {nan} WHERE id = ?", [])
    site = tmp_path / "site"
    assert _export_or_refuse(database, site) == "exported"
    raw = (site / "leaderboard.json").read_text()
    rows = json.loads(raw, parse_constant=lambda name: pytest.fail(f"{name} in leaderboard.json"))["submissions"]
    (row,) = [r for r in rows if r["submission_id"] == base[1]]
    assert row["macro_mean"] is None


@pytest.mark.parametrize(
    "doc",
    [
        {"b": 1, "a": [0.1, 1e-05, 1e16, 5e-324, -0.0, 123456789.125, 2**53]},
        {"é": 'ü\u2028\x00\x1f"\\', "a": True, "z": None},
        {"n": float("nan"), "i": [float("inf"), -float("inf")]},
        {"big": 2**70, "s": "\ud800", "f": float("nan")},  # orjson refuses both: json writes them
    ],
)
def test_the_json_export_reads_back_as_the_document_with_non_finite_numbers_null(doc: dict[str, Any]) -> None:
    raw = export.export_json(doc)
    assert raw.endswith(b"\n")
    assert raw.count(b"\n") == 1
    back = json.loads(raw.decode("utf-8"), parse_constant=lambda name: pytest.fail(name))

    def finite(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: finite(x) for k, x in v.items()}
        if isinstance(v, list):
            return [finite(x) for x in v]
        return v

    assert back == finite(doc)
    assert list(back) == sorted(back)  # keys sorted
    # the fast path writes what json.dumps writes for every value the exports hold, floats aside
    if "big" not in doc and "n" not in doc:
        plain = {k: v for k, v in doc.items() if k != "a" or not isinstance(v, list)}
        assert (
            export.export_json(plain)
            == (json.dumps(plain, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        )


def test_a_page_that_cannot_be_written_is_not_called_a_row_fault(
    base: tuple[Path, str, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RowFault names the rows' faults only: a full disk while a submission's page is written is
    the OSError it is, not "its database row is not one the verifier writes"."""
    write = export.Site.write

    def full(self: export.Site, rel: str, data: bytes) -> None:
        if rel.startswith("submissions/"):
            raise OSError(errno.ENOSPC, "No space left on device")
        write(self, rel, data)

    monkeypatch.setattr(export.Site, "write", full)
    with pytest.raises(OSError, match="No space left"):
        export.export_site(base[0], tmp_path / "site", docs_dir=None, jobs=1)


@pytest.mark.fuzz
@given(data=st.data())
@fuzz_settings
def test_an_entry_is_what_it_was_for_any_summary(base: tuple[Path, str, dict[str, Any]], data: st.DataObject) -> None:
    """build_submission counts each category's coverage, passed and official episodes in one pass
    over the summary's tasks and reads its stored intervals once, where it called ranking's
    functions a figure at a time: for a summary with any value at any place (a task of genre
    "overall", a genre of no category, a task covered twice, intervals of another shape), the same
    entry, member for member, or the same refusal."""
    _, _, summary = base
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [path for path in json_paths(summary, per_list=2) if path]  # (the whole summary: another test's)
        if not paths:
            break
        genres = [path for path in paths if path[-1] == "genre"]  # what places a task in a category
        path = data.draw(st.sampled_from(genres) if genres and data.draw(st.booleans()) else st.sampled_from(paths))
        value = data.draw(st.one_of(st.sampled_from(["overall", "open", "reproduction", None]), json_values))
        summary = replaced(summary, path, value)
    if isinstance(summary, dict) and data.draw(st.booleans()):
        summary = {**summary, "pass_rate": None}  # the pass rates from the task records alone
        for path in [path for path in json_paths(summary, per_list=2) if path[-1:] == ("passed",)]:
            summary = replaced(summary, path, data.draw(st.integers(0, 20)))  # tasks that pass unequally
    specs = {t.spec.ref: t.spec for t in catalog.tasks().values()}
    row = {"id": "sub_x", "level": "validated", "received_at": 1.0, "summary": summary}
    try:
        then = _build_as_it_was(row, "0" * 64, specs=specs)
    except Exception as exc:
        with pytest.raises(type(exc)):
            export.build_submission(row, "0" * 64, specs=specs)
        return
    now = export.build_submission(row, "0" * 64, specs=specs)
    for name in export._ENTRY_MEMBERS:
        assert getattr(now.entry, name) == getattr(then.entry, name), name
    assert now.summary == then.summary


def _build_as_it_was(row: dict[str, Any], digest: str, *, specs: dict[str, Any]) -> export.Submission:
    """build_submission of commit 79a8fa3, as it was: a call per figure (ranking.coverage, summary_interval)."""
    if not export._SAFE_ID.match(str(row["id"])):
        raise export.ExportError(f"submission id {row['id']!r} cannot name a file")
    s = export._NO_SUMMARY | row["summary"]
    s["tasks"] = tasks = [export._NO_TASK | t for t in s["tasks"] or [] if isinstance(t, dict)]
    agent = s["agent"] or {}
    declared = agent.get("declared") or {}
    covered = list(s["covered"] or [])
    completed = {t["task"]: t for t in tasks if t["status"] == "completed" and t["final"] is not None}
    scores: dict[str, float | None] = {}
    pass_rates: dict[str, float | None] = {}
    coverage: dict[str, tuple[int, int]] = {}
    categories = s["categories"] or {}
    genres = ranking.task_genres(s, covered + list(s["missing"] or []), specs)
    for category, *_ in export.CATEGORIES:
        scores[category] = export._number_or_none(categories.get(category), f"the {category} score")
        episodes = passed = 0
        for r in covered:
            if r in completed and (category == "overall" or genres[r] == category):
                episodes += int(completed[r]["episodes"] or 0)
                passed += int(completed[r]["passed"] or 0)
        pass_rates[category] = passed / episodes if episodes else None
        coverage[category] = ranking.coverage(s, category, specs, genres)
    if s.get("pass_rate") is not None:
        pass_rates["overall"] = export._number_or_none(s["pass_rate"], "the pass rate")  # the verifier's own figure
    started, finished = export._parse_time(s.get("started")), export._parse_time(s.get("finished"))
    usage = s.get("usage") or {}
    tokens = None
    if s.get("network_proxy") is not None:
        tokens = (int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0))
    results: dict[str, dict[str, Any]] = {}
    for t in tasks:
        if type(t["task"]) is str and t["task"] not in results:  # a task's ranking names it by its ref
            results[t["task"]] = {key: export._number_or_none(t[key], f"a task's {key}") for key in export.RESULT_KEYS}
    entry = export.Entry(
        id=row["id"],
        digest=digest,
        level=row["level"] or "self_reported",
        received_at=float(row["received_at"]),
        agent=str(agent.get("name") or "(unnamed agent)"),
        model=None if declared.get("model") is None else str(declared["model"]),
        effort=None if declared.get("effort") is None else str(declared["effort"]),
        runtime_s=export._runtime_s(started, finished, s.get("active_s")),
        tokens=tokens,
        scores=scores,
        pass_rates=pass_rates,
        coverage=coverage,
        # (a completed task's final is not None)
        finals={
            ref: float(cast(float, export._number_or_none(t["final"], "a task's final")))
            for ref, t in completed.items()
        },
        judgements={ref: j for ref, j in sorted(judging.task_judgements(s).items()) if ref in completed},
        intervals={
            category: ranking.stored_bounds(_summary_interval_as_it_was(s, category=category))
            if scores[category] is not None
            else None
            for category, *_ in export.CATEGORIES
        },
        task_intervals={
            ref: bounds
            for ref in completed
            if (bounds := ranking.stored_bounds(_summary_interval_as_it_was(s, task=ref))) is not None
        },
        results=results,
        facts={key: s.get(key) for key in export.EXPORT_FACTS} | {"runner_kind": (s.get("runner") or {}).get("kind")},
    )
    return export.Submission(entry, row, s)


def _summary_interval_as_it_was(
    summary: dict[str, Any], *, category: str | None = None, task: str | None = None
) -> Any:
    """ranking.summary_interval of commit 79a8fa3, as it was (it now reads ranking.stored_intervals)."""
    intervals = summary.get("intervals")
    if not isinstance(intervals, dict):
        return None
    where = intervals.get("categories") if task is None else intervals.get("tasks")
    return where.get(category if task is None else task) if isinstance(where, dict) else None
