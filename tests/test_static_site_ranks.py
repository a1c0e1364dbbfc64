"""Ranks that mean something: the board, a task's page, the exports and ``GET /api/v1/leaderboard``
rank by what the 95% intervals can tell apart (``ale_verify.ranking``, docs/intervals.md "Ranks"),
and show each interval next to its score.

The database holds runs made by ``site_fixtures`` (their intervals from ``ale.core.intervals`` over
synthetic episodes): two complete runs whose scores differ by less than their intervals, an exact
twin of one, a complete run far below them, and two partial runs. Every rank is also checked
against ``site_fixtures.reference_ranks``, the rule written out pair by pair."""

from __future__ import annotations

import csv
import io
import json
import re
from html import unescape
from pathlib import Path
from typing import Any

import pytest
import site_fixtures as sf
from hypothesis import given, settings
from hypothesis import strategies as st

from ale_verify import db, export, ranking
from ale_verify.app import leaderboard_rows

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"<tr[^>]*>(?:(?!</tr>).)*?submissions/(sub_[0-9a-f]+)\.html(?:(?!</tr>).)*</tr>", re.S)


def _full(q: float, **kw: Any) -> list[sf.Outcome]:
    return [sf.Outcome(r, quality=q, **kw) for r in sf.REFS]


RUNS: dict[str, list[sf.Outcome]] = {
    "close_a": _full(0.95),
    "close_b": _full(0.9505),  # a higher score than close_a's, by far less than either interval
    "twin_a": _full(0.95),  # close_a's outcomes exactly, another run
    "separated": _full(0.6),
    "partial_high": [sf.Outcome(sf.OPEN[0], quality=1.4)],  # the best score, one task of four
    "partial_low": [sf.Outcome(sf.OPEN[0], quality=0.3)],
}


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("ranks")
    database = base / "db.sqlite3"
    sf.prepare(database)
    ids = {}
    for i, (name, outcomes) in enumerate(RUNS.items()):
        summary = sf.make_summary(key=f"ranks-{name}", outcomes=outcomes, agent=f"agent-{name}", model="m",
                                  effort="high", started=sf.BASE_TIME, duration_s=600)  # fmt: skip
        ids[name] = sf.insert_accepted(database, summary, key=f"ranks-{name}", received_at=sf.BASE_TIME + 3600 * i)
    site = base / "site"
    export.export_site(database, site, docs_dir=ROOT / "docs")
    rows = db.ranked_submissions(database)
    return {"db": database, "site": site, "ids": ids, "rows": rows, "by_id": {r["id"]: r for r in rows}}


def _page_rows(html: str) -> list[tuple[str, list[str]]]:
    out = []
    for match in ROW.finditer(html):
        found = re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", match[0], re.S)
        cells = [unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in found]  # the text a reader sees
        out.append((match[1], cells))
    return out


def _overall(board: dict[str, Any], sid: str) -> dict[str, Any]:
    return dict(board["by_id"][sid]["summary"]["intervals"]["categories"]["overall"])


def _ranks(board: dict[str, Any]) -> dict[str, int]:
    return {r["submission_id"]: r["rank"] for r in leaderboard_rows(board["rows"], "overall")}


def test_the_fixture_is_what_it_says(board: dict[str, Any]) -> None:
    ids = board["ids"]
    a, b, sep = (_overall(board, ids[n]) for n in ("close_a", "close_b", "separated"))
    assert a["lower"] <= b["upper"]  # close_a and close_b overlap
    assert b["lower"] <= a["upper"]
    assert sep["upper"] < min(a["lower"], b["lower"])  # separated lies wholly below both
    scores = {n: board["by_id"][ids[n]]["summary"]["categories"]["overall"] for n in RUNS}
    assert scores["close_b"] > scores["close_a"] == scores["twin_a"]
    assert scores["partial_high"] > scores["close_b"]


def test_overlapping_runs_tie_and_separated_runs_do_not_on_the_api(board: dict[str, Any]) -> None:
    ids, ranks = board["ids"], _ranks(board)
    assert [ranks[ids[n]] for n in ("close_b", "close_a", "twin_a")] == [1, 1, 1]
    assert ranks[ids["separated"]] == 4  # three complete runs are better beyond doubt: competition ranking
    assert ranks[ids["partial_high"]] == 5  # after every complete run, whatever its score
    partial_high, partial_low = (_overall(board, ids[n]) for n in ("partial_high", "partial_low"))
    assert partial_low["upper"] < partial_high["lower"]
    assert ranks[ids["partial_low"]] == 6
    rows = leaderboard_rows(board["rows"], "overall")
    assert [r["submission_id"] for r in rows] == [
        ids[n] for n in ("close_b", "close_a", "twin_a", "separated", "partial_high", "partial_low")
    ]  # by rank, then score, then the earlier upload
    for r in rows:
        stored = _overall(board, r["submission_id"])
        assert (r["lower"], r["upper"]) == (stored["lower"], stored["upper"])
        assert r["lower"] <= r["score"] <= r["upper"]
    expected = sf.reference_ranks(
        sf.board_rows(board["rows"], lambda s: s["categories"]["overall"],
                      lambda s: s["intervals"]["categories"]["overall"],
                      lambda row: not row["summary"]["missing"])
    )  # fmt: skip
    assert [(r["submission_id"], r["rank"]) for r in rows] == expected


def test_board_shows_distinct_ranks_for_runs_whose_scores_do_not_differ(board: dict[str, Any]) -> None:
    """The defect: the board numbered rows 1, 2, 3 by score alone, so close_b ranked above close_a
    (and close_a above its exact twin, by upload time) although their intervals overlap. Now the
    board, a task's page, the CSV and the JSON show them tied."""
    ids, site = board["ids"], board["site"]
    rows = dict(_page_rows((site / "index.html").read_text(encoding="utf-8")))
    shown = {n: rows[ids[n]][0] for n in RUNS}
    assert shown == {"close_a": "1", "close_b": "1", "twin_a": "1", "separated": "4", "partial_high": "5",
                     "partial_low": "6"}  # fmt: skip
    data = {r["submission_id"]: r for r in json.loads((site / "leaderboard.json").read_text())["submissions"]}
    assert {n: data[ids[n]]["rank_overall"] for n in ("close_a", "close_b", "twin_a")} == dict.fromkeys(
        ("close_a", "close_b", "twin_a"), 1
    )
    table = {r["submission_id"]: r for r in csv.DictReader(io.StringIO((site / "leaderboard.csv").read_text()))}
    assert {table[ids[n]]["rank_overall"] for n in ("close_a", "close_b", "twin_a")} == {"1"}
    task = sf.REFS[0]
    page = dict(_page_rows((site / f"tasks/{task.split('@')[0]}.html").read_text(encoding="utf-8")))
    assert page[ids["partial_high"]][0] == "1"  # on its one task, partial_high is better beyond doubt
    assert page[ids["close_a"]][0] == page[ids["close_b"]][0] == page[ids["twin_a"]][0] == "2"


def test_the_interval_is_shown_next_to_the_score(board: dict[str, Any]) -> None:
    ids, site = board["ids"], board["site"]
    rows = dict(_page_rows((site / "index.html").read_text(encoding="utf-8")))
    for name in RUNS:
        sid = ids[name]
        summary = board["by_id"][sid]["summary"]
        ci = _overall(board, sid)
        assert rows[sid][1] == (
            f"{summary['categories']['overall']:.3f} 95% interval {ci['lower']:.3f}–{ci['upper']:.3f}"
        )
        page = unescape((site / f"submissions/{sid}.html").read_text(encoding="utf-8"))  # the text a reader sees
        assert f"{ci['lower']:.3f}–{ci['upper']:.3f}" in page
        for t in summary["tasks"]:
            b = summary["intervals"]["tasks"][t["task"]]
            assert f'{t["final"]:.3f} <span class="ci"' in page
            assert f"{b['lower']:.3f}–{b['upper']:.3f}" in page
    data = {r["submission_id"]: r for r in json.loads((site / "leaderboard.json").read_text())["submissions"]}
    for name in RUNS:
        ci = _overall(board, ids[name])
        assert (data[ids[name]]["lower_overall"], data[ids[name]]["upper_overall"]) == (ci["lower"], ci["upper"])
    assert data[ids["partial_high"]]["lower_reproduction"] is None  # no reproduction task: no score, no interval


def test_a_row_without_an_interval_ranks_by_its_score_alone(tmp_path: Path) -> None:
    """Rows stored before intervals (an older verifier's) rank as points: tied only when equal."""
    database = tmp_path / "db.sqlite3"
    sf.prepare(database)
    for i, score in enumerate((0.5, 0.5, 0.4)):
        summary = {"agent": {"name": f"old-{i}", "declared": {}}, "categories": {"overall": score},
                   "covered": [sf.REFS[0]], "missing": [], "tasks": []}  # fmt: skip
        db.insert_submission(
            database,
            {"id": f"sub_0dd{i}", "user_id": sf.USERS[0], "received_at": sf.BASE_TIME + i, "ciphertext_sha256": "",
             "status": "accepted", "level": "validated", "reason": None, "reasons": [], "run_id": None,
             "summary": summary},
            {"at": sf.BASE_TIME, "actor": "verifier", "action": "accepted", "from_level": None,
             "to_level": "validated", "reason": "all checks passed"},
        )  # fmt: skip
    rows = leaderboard_rows(db.ranked_submissions(database), "overall")
    assert [(r["submission_id"], r["rank"], r["lower"], r["upper"]) for r in rows] == [
        ("sub_0dd0", 1, None, None),
        ("sub_0dd1", 1, None, None),
        ("sub_0dd2", 3, None, None),
    ]
    export.export_site(database, tmp_path / "site", docs_dir=None)
    shown = dict(_page_rows((tmp_path / "site" / "index.html").read_text(encoding="utf-8")))
    assert [shown[f"sub_0dd{i}"][:2] for i in range(3)] == [["1", "0.500"], ["1", "0.500"], ["3", "0.400"]]


# -- the rule itself ---------------------------------------------------------------------------

intervals_st = st.tuples(st.floats(0, 1.5), st.floats(0, 0.4)).map(lambda t: (t[0], min(1.5, t[0] + t[1])))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(intervals_st, st.booleans(), st.floats(0, 1)), max_size=30))
def test_place_is_the_rule_pair_by_pair(rows: list[tuple[tuple[float, float], bool, float]]) -> None:
    table = []
    for i, ((lower, upper), complete, where) in enumerate(rows):
        score = lower + (upper - lower) * where
        table.append((f"sub_{i:03d}", score, lower, upper, complete, float(i % 5)))
    standings = [ranking.Standing(s, lo, hi, c, at, rid) for rid, s, lo, hi, c, at in table]
    placed = [(table[i][0], rank) for i, rank in ranking.place(standings)]
    assert placed == sf.reference_ranks(table)
    by_id = {r[0]: r for r in table}
    ranks = dict(placed)
    for a in table:  # better beyond doubt always ranks above; ranks never go down the list
        for b in table:
            if a[4] == b[4] and a[2] > b[3]:
                assert ranks[a[0]] < ranks[b[0]]
    assert [r for _, r in placed] == sorted(r for _, r in placed)
    complete = [ranks[rid] for rid, *_ in table if by_id[rid][4]]
    partial = [ranks[rid] for rid, *_ in table if not by_id[rid][4]]
    assert not complete or min(complete) == 1  # someone always ranks first
    assert not partial or min(partial) == 1 + len(complete)  # every partial run after every complete one


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), st.integers(), st.text(), st.dictionaries(st.sampled_from(["lower", "upper", "x"]),
                                                                       st.one_of(st.none(), st.booleans(),
                                                                                 st.integers(-(2**70), 2**70),
                                                                                 st.floats(), st.text()))))  # fmt: skip
def test_a_stored_interval_is_used_only_when_it_is_one(interval: Any) -> None:
    bounds = ranking.stored_bounds(interval)
    if bounds is None:
        assert ranking.bounds(0.25, interval) == (0.25, 0.25)
    else:
        lower, upper = bounds
        assert lower <= upper
        assert interval["lower"] == lower
        assert interval["upper"] == upper


_REFS = st.sampled_from(["a@1", "b@1", "c@1", "d@1"])
_GENRES = st.one_of(st.none(), st.just(""), st.sampled_from(["open", "reproduction", "other"]))


@pytest.mark.fuzz
@given(
    covered=st.lists(_REFS, max_size=4),
    missing=st.lists(_REFS, max_size=3),
    tasks=st.lists(
        st.one_of(st.fixed_dictionaries({"task": st.one_of(_REFS, st.integers()), "genre": _GENRES}), st.text()),
        max_size=6,
    ),
    info=st.dictionaries(_REFS, st.fixed_dictionaries({}, optional={"genre": _GENRES}), max_size=3),
    specs=st.dictionaries(_REFS, _GENRES, max_size=4),
)
@settings(max_examples=300, deadline=None)
def test_task_genres_and_coverage_read_the_genres_genre_of_reads(
    covered: list[str], missing: list[str], tasks: list[Any], info: dict[str, Any], specs: dict[str, Any]
) -> None:
    """The board's entries take each task's genre from ranking.task_genres (the summary's records
    read once): the genre genre_of gives, and the coverage it gave, for every shape of summary."""

    class Spec:
        def __init__(self, genre: str | None) -> None:
            self.genre = genre

    summary = {"covered": covered, "missing": missing, "tasks": tasks, "task_info": info}
    installed = {ref: Spec(g) for ref, g in specs.items()}
    refs = covered + missing
    assert ranking.task_genres(summary, refs, installed) == {r: ranking.genre_of(r, summary, installed) for r in refs}
    for category in ("overall", "reproduction", "open"):
        wanted = [r for r in refs if category == "overall" or ranking.genre_of(r, summary, installed) == category]
        by_genre_of = (sum(1 for r in covered if r in wanted), len(wanted))
        assert ranking.coverage(summary, category, installed) == by_genre_of
        assert ranking.coverage(summary, category, installed, ranking.task_genres(summary, refs, installed)) == (
            by_genre_of
        )
