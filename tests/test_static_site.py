"""``ale-verify export-site``: the static leaderboard (verify/export.py, static-site/).

Databases come from ``site_fixtures`` (summaries made by the verifier's own ``audit_summary``):
none, one, a curated mix of every level and genre, and a big board of thousands of rows. Checked:
deterministic bytes, content-hashed assets, relative links only and every one resolving (fragments
included), serving from a sub-path over HTTP, HTML validity (Debian's ``tidy`` and html5lib's strict
parser), accessible markup, the board's order against the API's, rejected rows never shown, revoked
rows shown unranked, escaping of hostile names, the CSV/JSON exports against their documentation,
and small pages on a big board. Browser tests are in ``test_static_site_browser.py``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import math
import os
import re
import shutil
import sqlite3
import struct
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from datetime import UTC, datetime
from html import unescape
from pathlib import Path
from typing import Any

import jinja2.compiler
import markupsafe
import pytest
import site_fixtures as sf
from fuzzing import fuzz_settings, json_values
from hypothesis import given
from hypothesis import strategies as st
from markupsafe import Markup

from ale import catalog
from ale_verify import cli, db, export
from ale_verify.app import leaderboard_rows

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BOARD_PAGES = {"overall": "index.html", "reproduction": "reproduction.html", "open": "open.html"}
#: tidy 5.6 (Debian 12) predates WAI-ARIA 1.1's aria-current; it is valid HTML (HTML-ARIA).
TIDY_ALLOWED = re.compile(r'^line \d+ column \d+ - Warning: <(a|span)> proprietary attribute "aria-current"$')
ROW_LINK = re.compile(r'<th scope="row" class="agent"><a href="(?:\.\./)?submissions/(sub_[0-9a-f]+)\.html">')


def _export(db_path: Path, out: Path, **kw: Any) -> Path:
    export.export_site(db_path, out, docs_dir=DOCS, **kw)
    return out


@pytest.fixture(scope="module")
def mix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("mix")
    ids = sf.fill_mix(base / "verifier.sqlite3")
    return {"db": base / "verifier.sqlite3", "site": _export(base / "verifier.sqlite3", base / "site"), "ids": ids}


@pytest.fixture(scope="module")
def empty(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("empty")
    sf.fill_empty(base / "db.sqlite3")
    return _export(base / "db.sqlite3", base / "site")


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("big")
    ids = sf.fill_many(base / "db.sqlite3", 2500, seed=7)
    started = time.perf_counter()
    site = _export(base / "db.sqlite3", base / "site")
    return {"db": base / "db.sqlite3", "site": site, "ids": ids, "seconds": time.perf_counter() - started}


def _read(site: Path, rel: str) -> str:
    return (site / rel).read_bytes().decode("utf-8")  # no newline translation (the CSV's are CRLF)


def _tree(site: Path) -> dict[str, bytes]:
    return {p.relative_to(site).as_posix(): p.read_bytes() for p in sorted(site.rglob("*")) if p.is_file()}


def _board_order(site: Path, first: str) -> list[str]:
    """Submission ids in board order over every page of a tab."""
    ids, page, stem = [], first, first.removesuffix(".html").replace("index", "overall")
    n = 1
    while (site / page).is_file():
        ids += ROW_LINK.findall(_read(site, page))
        n += 1
        page = f"{stem}.p{n}.html"
    return ids


def _cells(html: str, submission: str) -> list[str]:
    """The text of the cells of the board row that links to ``submission``."""
    row = re.search(rf"<tr[^>]*>(?:(?!</tr>).)*submissions/{submission}\.html(?:(?!</tr>).)*</tr>", html, re.S)
    assert row, submission
    cells = re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row.group(0), re.S)
    return [unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in cells]  # the text a reader sees


# -- the command ------------------------------------------------------------------------------


def test_cli_export_site_writes_replaces_and_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    database = tmp_path / "data" / "verifier.sqlite3"
    sf.fill_one(database)
    monkeypatch.setenv("ALE_VERIFY_DATABASE", str(database))
    out = tmp_path / "public" / "board"
    assert cli.main(["export-site", str(out), "--docs", str(DOCS)]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["event"] == "exported"
    assert line["submissions"] == 1
    assert line["ranked"] == 1
    assert (out / "index.html").is_file()
    assert (out / export.MANIFEST).is_file()
    assert oct(out.stat().st_mode & 0o777) == "0o755"
    # A re-export replaces the folder as a whole: stale files go, nothing is left beside it but
    # the pages' input digests (unpublished: the next export's cache).
    (out / "stale.html").write_text("old")
    assert cli.main(["export-site", str(out), "--page-size", "5", "--top-n", "3"]) == 0
    assert not (out / "stale.html").exists()
    assert sorted(p.name for p in out.parent.iterdir()) == [".board.inputs.json", "board"]
    # Never over a folder that is not a previous export, and never without a database.
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    assert cli.main(["export-site", str(foreign)]) == 2
    assert "refusing" in capsys.readouterr().err
    assert (foreign / "keep.txt").read_text() == "mine"
    monkeypatch.setenv("ALE_VERIFY_DATABASE", str(tmp_path / "nope.sqlite3"))
    assert cli.main(["export-site", str(tmp_path / "x")]) == 2
    assert "no database" in capsys.readouterr().err
    assert not (tmp_path / "nope.sqlite3").exists()


def test_failed_export_leaves_the_previous_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    database = tmp_path / "db.sqlite3"
    sf.fill_one(database)
    out = _export(database, tmp_path / "site")
    before = _tree(out)

    def boom(*a: object, **kw: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(export.Site, "_manifest", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        _export(database, out)
    assert _tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("db.")) == [".site.inputs.json", "site"]
    assert export._previous_inputs(out)  # no stage left, and the previous site's input digests still apply


# -- none, one, many ---------------------------------------------------------------------------


def test_empty_database(empty: Path) -> None:
    for page in BOARD_PAGES.values():
        html = _read(empty, page)
        assert "No submission has been ranked in this category yet." in html
        assert "<svg" not in html  # no chart without rows
    assert _read(empty, "leaderboard.csv") == ",".join(export.CSV_COLUMNS) + "\r\n"
    doc = json.loads(_read(empty, "leaderboard.json"))
    assert doc["schema"] == "ale-leaderboard/v1"
    assert doc["submissions"] == []
    assert not (empty / "submissions").exists()
    for task_id in catalog.tasks():
        assert "No submission has completed this task yet." in _read(empty, f"tasks/{task_id}.html")


def test_one_submission(tmp_path: Path) -> None:
    ids = sf.fill_one(tmp_path / "db.sqlite3")
    site = _export(tmp_path / "db.sqlite3", tmp_path / "site")
    row = db.get_submission(tmp_path / "db.sqlite3", ids["only"])
    assert row is not None
    cells = _cells(_read(site, "index.html"), ids["only"])
    assert cells[0] == "1"
    ci = row["summary"]["intervals"]["categories"]["overall"]
    assert cells[1] == f"{row['summary']['categories']['overall']:.3f} 95% interval {ci['lower']:.3f}–{ci['upper']:.3f}"
    assert cells[2] == "100.0%"
    assert cells[3] == "OpenHands-R"
    assert cells[4] == "gpt-5.1"
    assert cells[5] == "high"
    assert cells[6] == "4/4"
    assert cells[7] == "1 h 30 min"
    assert cells[8] == "—"
    assert cells[9] == "Validated"
    assert cells[10] == "2026-09-01"
    assert "Top 1 by score" in _read(site, "index.html")


# -- determinism and assets -------------------------------------------------------------------


def test_export_is_deterministic(mix: dict[str, Any], tmp_path: Path) -> None:
    again = _export(mix["db"], tmp_path / "again")
    first, second = _tree(mix["site"]), _tree(again)
    assert list(first) == list(second)
    assert [name for name in first if first[name] != second[name]] == []
    # Re-exporting into the same folder gives the same bytes too.
    assert _tree(_export(mix["db"], again)) == first


def test_manifest_lists_every_file(mix: dict[str, Any]) -> None:
    site = mix["site"]
    manifest = json.loads(_read(site, export.MANIFEST))
    files = {k: v for k, v in _tree(site).items() if k != export.MANIFEST}
    assert sorted(manifest["files"]) == sorted(files)
    for name, data in files.items():
        assert manifest["files"][name] == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def test_assets_are_content_hashed(mix: dict[str, Any]) -> None:
    site = mix["site"]
    assets = sorted((site / "assets").iterdir())
    assert [re.sub(r"\.[0-9a-f]{12}\.", ".HASH.", p.name) for p in assets] == ["icon.HASH.svg", "style.HASH.css"]
    for p in assets:
        assert p.name.split(".")[1] == hashlib.sha256(p.read_bytes()).hexdigest()[:12]
    css = next(p.name for p in assets if p.suffix == ".css")
    for page in sf.html_files(site):
        depth = len(page.relative_to(site).parts) - 1
        assert f'href="{"../" * depth}assets/{css}"' in page.read_text()


# -- links ------------------------------------------------------------------------------------


def _check_links(site: Path, pages: list[Path] | None = None) -> int:
    """Every reference is relative and resolves to a file of the export (and its fragment to an
    id there); external links only in rendered docs. Returns the number of references checked."""
    ids: dict[Path, set[str]] = {}
    checked = 0
    for page in pages if pages is not None else sf.html_files(site):
        refs = sf.page_refs(page.read_text(encoding="utf-8"))
        assert refs.scripts == 0, page
        assert refs.handlers == [], page
        ids.setdefault(page.resolve(), refs.ids)
        for tag, attr, value in refs.refs:
            where = f"{page.relative_to(site)}: <{tag} {attr}={value!r}>"
            assert not value.startswith(("/", "\\")), where
            assert not re.match(r"^(javascript|data|vbscript|file):", value, re.I), where
            if sf.is_external(value):
                assert page.relative_to(site).parts[0] == "docs", where
                assert tag == "a", where
                continue
            target, fragment = sf.resolve_ref(site, page, value)
            assert target.is_file(), where
            assert target.resolve().is_relative_to(site.resolve()), where
            if fragment:
                if target.resolve() not in ids:
                    ids[target.resolve()] = sf.page_refs(target.read_text(encoding="utf-8")).ids
                assert fragment in ids[target.resolve()], where
            checked += 1
    return checked


def test_links_are_relative_and_resolve(mix: dict[str, Any]) -> None:
    assert _check_links(mix["site"]) > 500


def test_links_resolve_on_the_empty_site(empty: Path) -> None:
    assert _check_links(empty) > 50


def test_works_from_a_sub_path_over_http(mix: dict[str, Any]) -> None:
    """Crawl the site from /board/index.html: every page and file it links to is served (200)."""
    site = mix["site"]
    with sf.SubPathServer(site, "/board/") as server:
        seen: set[str] = set()
        queue = deque([server.base + "index.html"])
        while queue:
            url = queue.popleft()
            if url in seen:
                continue
            seen.add(url)
            with urllib.request.urlopen(url, timeout=10) as resp:
                assert resp.status == 200, url
                body = resp.read()
            if url.endswith(".html"):
                for _, _, value in sf.page_refs(body.decode()).refs:
                    if not sf.is_external(value):
                        queue.append(urllib.parse.urljoin(url, value).partition("#")[0])
        with pytest.raises(urllib.error.HTTPError) as outside:
            urllib.request.urlopen(server.base.replace("/board/", "/index.html"), timeout=10)
        outside.value.close()
    assert server.outside == ["/index.html"]  # only the probe above left the sub-path
    reached = {url.removeprefix(server.base) for url in seen}
    assert reached == set(_tree(site)) - {export.MANIFEST}  # every file of the site is reachable


# -- validity and accessibility ----------------------------------------------------------------


def _tidy() -> str | None:
    path = shutil.which("tidy")
    if path is None:
        if sf.tools_required():
            pytest.fail("tidy is required (ALE_SITE_TOOLS_REQUIRED=1): apt-get install tidy")
        pytest.skip("Debian's tidy is not installed (apt-get install tidy)")
    return path


def _tidy_problems(tidy: str, pages: list[Path]) -> dict[str, list[str]]:
    problems = {}
    for page in pages:
        proc = subprocess.run([tidy, "-errors", "-quiet", "--show-warnings", "yes", str(page)],
                              capture_output=True, text=True, check=False)  # fmt: skip
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not TIDY_ALLOWED.match(ln)]
        if proc.returncode >= 2 or lines:
            problems[page.name] = lines or [f"exit status {proc.returncode}"]
    return problems


def test_html_is_valid_for_tidy(mix: dict[str, Any], empty: Path) -> None:
    tidy = _tidy()
    assert tidy is not None
    pages = sf.html_files(mix["site"]) + sf.html_files(empty)
    assert _tidy_problems(tidy, pages) == {}


def _html5lib() -> Any:
    try:
        import html5lib
    except ModuleNotFoundError:
        if sf.tools_required():
            pytest.fail("html5lib is required (ALE_SITE_TOOLS_REQUIRED=1): pip install html5lib")
        pytest.skip("html5lib is not installed (pip install html5lib)")
    return html5lib


def test_html_parses_strictly(mix: dict[str, Any], empty: Path) -> None:
    html5lib = _html5lib()
    parser = html5lib.HTMLParser(strict=True, namespaceHTMLElements=False)
    for page in sf.html_files(mix["site"]) + sf.html_files(empty):
        try:
            parser.parse(page.read_bytes(), transport_encoding="utf-8")
        except html5lib.html5parser.ParseError as exc:
            pytest.fail(f"{page}: {exc}")


def test_accessible_markup(mix: dict[str, Any]) -> None:
    for page in sf.html_files(mix["site"]):
        html = page.read_text()
        where = page.relative_to(mix["site"])
        assert html.startswith('<!DOCTYPE html>\n<html lang="en">'), where
        assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in html, where
        assert html.count("<h1") == 1, where
        for landmark in ("<header", "<nav", '<main id="main"', "<footer"):
            assert landmark in html, (where, landmark)
        assert html.index('class="skip-link" href="#main"') < html.index("<header"), where
        for table in re.findall(r"<table.*?</table>", html, re.S):
            assert "<caption" in table or table.startswith('<table class="md-table">'), where  # (markdown has none)
            assert all('scope="' in th for th in re.findall(r"<th[ >][^>]*>", table)), where
        for region in re.findall(r'<div class="table-scroll"[^>]*>', html):
            assert 'role="region"' in region
            assert 'tabindex="0"' in region
            assert "aria-labelledby" in region
        for svg in re.findall(r"<svg.*?</svg>", html, re.S):
            assert 'role="img"' in svg
            assert "aria-label=" in svg
            assert "<title>" in svg
            assert "<desc>" in svg
        assert not re.search(r"<img(?![^>]*\balt=)", html), where
    index = _read(mix["site"], "index.html")
    assert re.search(r'<a href="index.html" aria-current="page">Overall</a>', index)
    assert re.search(r'<a href="reproduction.html">Reproduction</a>', index)


def test_pages_are_small(mix: dict[str, Any]) -> None:
    sizes = {p.relative_to(mix["site"]).as_posix(): p.stat().st_size for p in sf.html_files(mix["site"])}
    assert sizes["index.html"] < 60_000
    assert max(v for k, v in sizes.items() if k.startswith("submissions/")) < 25_000
    assert max(v for k, v in sizes.items() if not k.startswith("docs/")) < 80_000


def test_a_page_of_ascii_data_is_ascii_and_shows_the_same_text(mix: dict[str, Any]) -> None:
    """The templates and filters write what is not ASCII as character references (export.NO_VALUE,
    the templates' &mdash; ...), and so do the markdown and the charts' clipped names: every page
    the database fills is an ASCII str unless a submitter's own text is not ASCII (joined and
    encoded a byte a character: a page with one wide character costs twice the memory). What a
    reader sees is the same text: a submitter's non-ASCII name is shown as it is."""
    unicode_pages = set()
    for page in sf.html_files(mix["site"]):
        rel = page.relative_to(mix["site"]).as_posix()
        text = page.read_bytes().decode("utf-8")
        if rel.startswith(("docs/", "schemas/")):
            continue  # the project's own docs: headings as they are written
        if not text.isascii():
            unicode_pages.add(rel)
            assert sf.UNICODE_NAME in text, rel  # only a submitter's text
    assert f"submissions/{mix['ids']['unicode']}.html" in unicode_pages
    board = _read(mix["site"], "index.html")
    assert "&mdash;" in board
    assert "&ndash;" in board
    assert "—" not in board.replace(sf.UNICODE_NAME, "")
    assert _cells(board, mix["ids"]["validated"])[8] == "—"  # a reader sees the dash
    assert export.fmt_int(1234567) == "1&#8239;234&#8239;567"
    assert type(export.fmt_int(1234567)) is Markup
    assert export.fmt_int(999) == "999"
    assert export.fmt_score(None) is export.NO_VALUE


# -- what the board shows ---------------------------------------------------------------------


def test_board_order_matches_the_api(mix: dict[str, Any]) -> None:
    rows = db.ranked_submissions(mix["db"])
    for category, page in BOARD_PAGES.items():
        api = leaderboard_rows(rows, category)
        assert _board_order(mix["site"], page) == [r["submission_id"] for r in api], category
        html = _read(mix["site"], page)
        for r in api:
            cells = _cells(html, r["submission_id"])
            assert cells[0] == ("—" if r["rank"] is None else str(r["rank"]))
            assert cells[1].split(" ", 1)[0] == f"{r['score']:.3f}"  # then "N unjudged", if any
            assert cells[6] == f"{r['covered']}/{r['required']}"  # the category's coverage


def test_scores_are_ratios_with_three_decimals(mix: dict[str, Any]) -> None:
    for page in BOARD_PAGES.values():
        html = _read(mix["site"], page)
        scores = re.findall(r'<td class="num score">([^<]*?)(?:</td>| <span)', html)
        assert scores
        assert all(re.fullmatch(r"\d+\.\d{3}", s) for s in scores), scores
    capped = _cells(_read(mix["site"], "index.html"), mix["ids"]["capped"])
    assert capped[1] == "1.500 95% interval 1.500–1.500"  # capped in every resample too
    assert capped[0] == "1"


def test_rejected_submissions_never_appear(mix: dict[str, Any]) -> None:
    assert len(mix["ids"]["rejected"]) == 3
    for name, data in _tree(mix["site"]).items():
        text = data.decode("utf-8", "replace")
        for sid in mix["ids"]["rejected"]:
            assert sid not in text
            assert sid not in name
    accepted = {p.stem for p in (mix["site"] / "submissions").iterdir()}
    assert accepted == set(mix["ids"]["accepted"])


def test_revoked_submissions_are_marked_and_unranked(mix: dict[str, Any]) -> None:
    site, ids = mix["site"], mix["ids"]
    index = _read(site, "index.html")
    order = _board_order(site, "index.html")
    assert order[-2:] == ids["revoked"]  # after every ranked row
    for sid in ids["revoked"]:
        cells = _cells(index, sid)
        assert cells[0] == "—"
        assert cells[9] == "Revoked"
        assert re.search(rf'<tr class="revoked">(?:(?!</tr>).)*{sid}', index, re.S)
    charts = re.findall(r"<svg.*?</svg>", index, re.S)
    assert len(charts) == 3
    assert not any("RoboSmith · qwen3-coder-480b · high" in c for c in charts)
    page = _read(site, f"submissions/{ids['revoked_top']}.html")
    assert "the policy artifact was copied from a published solution" in page
    assert 'class="alert alert-revoked"' in page
    twice = _read(site, f"submissions/{ids['audited_then_revoked']}.html")
    history = re.search(r'<table class="history">.*?</table>', twice, re.S).group(0)  # type: ignore[union-attr]
    assert [a for a in re.findall(r'<th scope="row">(\w+)</th>', history)] == ["accepted", "audited", "revoked"]
    assert "re-run on the team&#39;s hardware matched" in history
    assert "the agent read the hidden evaluation seeds through a leaked file" in history
    rows = {r["submission_id"]: r for r in json.loads(_read(site, "leaderboard.json"))["submissions"]}
    for sid in ids["revoked"]:
        assert rows[sid]["revoked"] is True
        assert rows[sid]["rank_overall"] is None
        assert rows[sid]["level"] == "revoked"


def test_categories_split_by_genre(mix: dict[str, Any]) -> None:
    site, ids = mix["site"], mix["ids"]
    repro, opened = _board_order(site, "reproduction.html"), _board_order(site, "open.html")
    assert ids["reproduction_only"] in repro
    assert ids["reproduction_only"] not in opened
    assert ids["open_only"] in opened
    assert ids["open_only"] not in repro
    assert ids["nothing_covered"] not in _board_order(site, "index.html") + repro + opened
    assert (site / f"submissions/{ids['nothing_covered']}.html").is_file()  # it still has its page
    assert _cells(_read(site, "reproduction.html"), ids["reproduction_only"])[6] == "2/2"
    assert _cells(_read(site, "index.html"), ids["reproduction_only"])[6] == "2/4"
    unfaithful = _cells(_read(site, "reproduction.html"), ids["unfaithful"])
    assert unfaithful[1] == "0.000 95% interval 0.000–0.000"  # the faithfulness gate


def test_tokens_only_from_the_proxy(mix: dict[str, Any]) -> None:
    index = _read(mix["site"], "index.html")
    assert _cells(index, mix["ids"]["proxy_tokens"])[8] == "18.2M / 1.2M"
    assert _cells(index, mix["ids"]["validated"])[8] == "—"
    assert "Token counts come only from the network proxy" in index
    page = _read(mix["site"], f"submissions/{mix['ids']['proxy_tokens']}.html")
    assert "18\u202f234\u202f567 input, 1\u202f204\u202f311 output" in unescape(page)  # the text a reader sees
    rows = {r["submission_id"]: r for r in json.loads(_read(mix["site"], "leaderboard.json"))["submissions"]}
    assert rows[mix["ids"]["proxy_tokens"]]["input_tokens"] == 18_234_567
    assert rows[mix["ids"]["validated"]]["input_tokens"] is None


def test_hostile_names_are_escaped(mix: dict[str, Any]) -> None:
    for page in sf.html_files(mix["site"]):
        html = page.read_text()
        assert "<script" not in html
        assert "onerror=" not in html.replace("onerror=alert", "")
        assert "<b>model</b>" not in html
        assert "<i>" not in html
    index = _read(mix["site"], "index.html")
    assert "&lt;script&gt;alert(&#34;board&#34;)&lt;/script&gt; &amp; &lt;img src=x onerror=alert(1)&gt;" in index
    assert sf.UNICODE_NAME in index
    rows = list(csv.DictReader(io.StringIO(_read(mix["site"], "leaderboard.csv"))))
    by_id = {r["submission_id"]: r for r in rows}
    formula = by_id[mix["ids"]["csv_formula"]]
    assert formula["agent"] == "'" + sf.CSV_FORMULA_NAME
    assert formula["model"] == "'=1+1"
    assert formula["effort"] == "'@SUM(A1)"
    assert by_id[mix["ids"]["xss"]]["agent"] == sf.XSS_NAME  # text, not markup, in a CSV
    rows_json = {r["submission_id"]: r for r in json.loads(_read(mix["site"], "leaderboard.json"))["submissions"]}
    assert rows_json[mix["ids"]["csv_formula"]]["agent"] == sf.CSV_FORMULA_NAME  # JSON keeps the exact text


def test_submission_page(mix: dict[str, Any]) -> None:
    sid = mix["ids"]["not_completed"]
    row = db.get_submission(mix["db"], sid)
    assert row is not None
    s = row["summary"]
    html = _read(mix["site"], f"submissions/{sid}.html")
    assert "Not completed</strong>: the agent left no policy artifact at /workspace/policy.json" in html
    assert "(ended early in the agent phase: <code>agent/no_policy</code>)" in html  # its summary's `ended`
    breakdown = re.search(r'<table class="breakdown">.*?</table>', html, re.S).group(0)  # type: ignore[union-attr]
    for t in s["tasks"]:
        assert f"../tasks/{t['task'].partition('@')[0]}.html" in breakdown
        if t["status"] == "completed":
            for key in ("gap", "score", "final"):
                assert f"{t[key]:.3f}" in breakdown
            assert f"{t['passed']}/{t['episodes']}" in breakdown
            for name in t["penalties"]:
                assert f"<code>{name}</code>" in breakdown
    for digest in (s["ciphertext_sha256"], s["merkle_root"], s["runtime"]["code"]["code_sha256"],
                   s["runtime"]["code"]["dependency_lock_sha256"], s["release_sha256"]):  # fmt: skip
        assert digest in html
    assert f"ale-verify check bundles/{sid}.ale --identity site-identity.txt" in html
    assert f"ale inspect {s['run_id']}.ale --identity KEY.txt" in html
    assert "Python</dt><dd>3.11.7" in html
    official = _read(mix["site"], f"submissions/{mix['ids']['official']}.html")
    assert "ALE CI official rerun (official rerun)" in official
    assert "Officially verified" in official
    self_reported = _read(mix["site"], f"submissions/{mix['ids']['self_no_challenge']}.html")
    assert "<code>no_challenge</code>: the run had no challenge" in self_reported


def test_task_pages(mix: dict[str, Any]) -> None:
    site = mix["site"]
    rows = db.ranked_submissions(mix["db"])
    index = _read(site, "tasks/index.html")
    for task_id, task in catalog.tasks().items():
        ref = task.spec.ref
        assert f'href="{task_id}.html"' in index
        html = _read(site, f"tasks/{task_id}.html")
        assert task.spec.title in html
        first_words = export._first_section(task.paper).split("\n")[0][:40]
        assert first_words.split("**")[0] in html  # the method summary, rendered
        assert f"<code>{task.spec.headline.metric}</code>" in html
        for name in task.spec.safety_metrics:
            assert f"<code>{name}</code>" in html

        def final(summary: dict[str, Any], ref: str = ref) -> float | None:
            return next((t["final"] for t in summary["tasks"] if t["task"] == ref and t["status"] == "completed"), None)

        expected = sf.reference_ranks(
            sf.board_rows(rows, final, lambda summary, ref=ref: summary["intervals"]["tasks"].get(ref))
        )
        order = ROW_LINK.findall(html)
        assert order[: len(expected)] == [sid for sid, _ in expected]
        shown = [c for c in re.findall(r'<td class="num rank">([^<]*)</td>', html)]
        assert shown[: len(expected)] == [str(rank) for _, rank in expected]


def test_docs_are_rendered(mix: dict[str, Any]) -> None:
    site = mix["site"]
    for name in ("agent-contract", "protocol", "formats", "verifier", "tasks", "policy-format", "leaderboard-export"):
        assert (site / "docs" / f"{name}.html").is_file(), name
    formats = _read(site, "docs/formats.html")
    assert '<a href="#the-trajectory">' in formats
    assert 'id="the-trajectory"' in formats
    assert '<a href="../schemas/manifest.schema.json">' in formats
    assert "<p>&lt;!--" not in formats
    assert "<!--" not in formats
    assert (site / "schemas/manifest.schema.json").read_bytes() == (
        ROOT / "ale/schemas/manifest.schema.json"
    ).read_bytes()
    policy = _read(site, "docs/policy-format.html")
    assert 'class="external" rel="noopener noreferrer"' in policy


def test_markdown_is_safe() -> None:
    md = export.Markdown(lambda source, path: "docs/ok.html" if path == "docs/ok.md" else None)
    html, headings = md.render(
        "# Title `x`\n\n<script>alert(1)</script>\n\n<b onclick=x>bold</b> [ok](ok.md#a) [bad](javascript:alert(1)) "
        "[gone](../secret.txt) [abs](/etc/passwd) ![img](https://example.com/t.png)\n\n## Title `x`\n",
        source_dir="docs",
        page_dir="docs",
    )
    assert "<script" not in html
    assert "<b " not in html
    assert "&lt;script&gt;" in html
    assert '<a href="ok.html#a">ok</a>' in html
    assert "javascript:" not in html.replace("[bad](javascript:alert(1))", "")
    assert '<span class="unlinked">gone</span>' in html
    assert '<span class="unlinked">abs</span>' in html
    assert "<img" not in html
    assert [h["id"] for h in headings] == ["title-x", "title-x-1"]


def test_exports_match_their_documentation(mix: dict[str, Any]) -> None:
    doc = (DOCS / "leaderboard-export.md").read_text()
    section = doc.split("## leaderboard.csv", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `([a-z_0-9]+)` \|", section, re.M)
    assert tuple(documented) == export.CSV_COLUMNS
    header = _read(mix["site"], "leaderboard.csv").split("\r\n", 1)[0]
    assert tuple(header.split(",")) == export.CSV_COLUMNS
    data = json.loads(_read(mix["site"], "leaderboard.json"))
    json_section = doc.split("## leaderboard.json", 1)[1].split("\n## ", 1)[0]
    json_documented = set(re.findall(r"^\| `([a-z_0-9]+)` \|", json_section, re.M))
    assert set(data) == json_documented - {"task_finals", "task_judgements"}
    for row in data["submissions"]:
        assert set(row) == set(export.CSV_COLUMNS) | {"task_finals", "task_judgements"}
    judgement_section = doc.split("## A task's judgement", 1)[1].split("\n## ", 1)[0]
    members = set(re.findall(r"^\| `([a-z_0-9]+)` \|", judgement_section, re.M))
    for row in data["submissions"]:
        for judgement in row["task_judgements"].values():
            assert set(judgement) == members
    rows = list(csv.DictReader(io.StringIO(_read(mix["site"], "leaderboard.csv"), newline="")))
    assert [r["submission_id"] for r in rows] == [r["submission_id"] for r in data["submissions"]]
    assert len(rows) == len(mix["ids"]["accepted"])
    for r, j in zip(rows, data["submissions"], strict=True):
        for key in ("score_overall", "pass_rate", "runtime_s"):
            assert (r[key] == "" and j[key] is None) or math.isclose(float(r[key]), j[key])


# -- the big board ----------------------------------------------------------------------------


def test_big_board(big: dict[str, Any]) -> None:
    site, ids = big["site"], big["ids"]
    assert len(ids["accepted"]) == 2500
    assert len(ids["rejected"]) == 50
    assert len(ids["revoked"]) == 25
    assert big["seconds"] < 60, f"exporting {len(ids['accepted'])} submissions took {big['seconds']:.1f} s"
    data = json.loads(_read(site, "leaderboard.json"))["submissions"]
    assert len(data) == len(ids["accepted"])
    ranked = [r for r in data if r["rank_overall"] is not None]
    expected = sf.reference_ranks(
        sf.board_rows(
            db.ranked_submissions(big["db"]),
            lambda s: s["categories"]["overall"],
            lambda s: s["intervals"]["categories"]["overall"],
            lambda r: bool(r["summary"]["covered"]) and not r["summary"]["missing"],
        )
    )
    assert [(r["submission_id"], r["rank_overall"]) for r in ranked] == expected
    assert len({rank for _, rank in expected}) < len(expected)  # intervals overlap: ranks are shared
    order = _board_order(site, "index.html")
    scored = [r for r in data if r["score_overall"] is not None]
    assert len(order) == len(scored)
    assert order[: len(ranked)] == [r["submission_id"] for r in ranked]
    pages = sorted(site.glob("overall.p*.html"))
    assert len(pages) + 1 == math.ceil(len(scored) / 100)
    sizes = {p.relative_to(site).as_posix(): p.stat().st_size for p in sf.html_files(site)}
    assert sizes["index.html"] < 150_000, sizes["index.html"]
    assert max(sizes.values()) < 150_000, max(sizes.items(), key=lambda kv: kv[1])
    assert not set(ids["rejected"]) & {p.stem for p in (site / "submissions").iterdir()}
    # The board's pages, a task's pages and a sample of submission pages: valid, links resolving.
    sample = [site / "index.html", site / "reproduction.html", site / "open.html", *pages[:3], pages[-1],
              *sorted(site.glob("tasks/*.html"))[:6], *sorted((site / "submissions").iterdir())[::250]]  # fmt: skip
    assert _check_links(site, sample) > 1000
    html5lib = _html5lib()
    for page in sample:
        html5lib.HTMLParser(strict=True).parse(page.read_bytes(), transport_encoding="utf-8")


def test_a_sparse_summary_still_exports(tmp_path: Path) -> None:
    """A row with only a few summary members (an older verifier's) renders with dashes, not a crash."""
    database = tmp_path / "db.sqlite3"
    sf.prepare(database)
    summary = {"agent": {"name": "old-agent"}, "categories": {"overall": 0.5}, "covered": [], "missing": [],
               "tasks": [{"task": "cartpole-balance@1.0.0", "status": "completed", "final": 0.5}]}  # fmt: skip
    db.insert_submission(
        database,
        {"id": "sub_old", "user_id": sf.USERS[0], "received_at": sf.BASE_TIME, "ciphertext_sha256": "", "status":
         "accepted", "level": "validated", "reason": None, "reasons": [], "run_id": None, "summary": summary},
        {"at": sf.BASE_TIME, "actor": "verifier", "action": "accepted", "from_level": None, "to_level": "validated",
         "reason": "all checks passed"},
    )  # fmt: skip
    site = _export(database, tmp_path / "site")
    assert _cells(_read(site, "index.html"), "sub_old")[:6] == ["1", "0.500", "—", "old-agent", "—", "—"]
    assert "old-agent" in _read(site, "submissions/sub_old.html")
    assert "0.500" in _read(site, "tasks/cartpole-balance.html")
    assert _check_links(site) > 50


def test_a_partial_run_ranks_after_every_complete_run_on_the_board_and_in_the_api(mix: dict[str, Any]) -> None:
    """scoring.txt: a run is not comparable to a full run unless its coverage is complete. The
    open-genre-only run (2 of 4 tasks, the best score) used to rank second overall, above complete runs."""
    rows = db.ranked_submissions(mix["db"])
    ids = mix["ids"]
    for category, page in BOARD_PAGES.items():
        ranked = [r for r in leaderboard_rows(rows, category) if r["rank"] is not None]
        flags = [r["complete"] for r in ranked]
        assert flags == sorted(flags, reverse=True), category  # every complete row before every partial one
        assert all(r["complete"] == (r["covered"] == r["required"]) for r in ranked)
        html = _read(mix["site"], page)
        assert ("Partial coverage" in html) == (False in flags), category
    overall = {r["submission_id"]: r for r in leaderboard_rows(rows, "overall")}
    assert overall[ids["open_only"]]["complete"] is False
    assert overall[ids["open_only"]]["rank"] > max(r["rank"] or 0 for r in overall.values() if r["complete"])
    reproduction = {r["submission_id"]: r for r in leaderboard_rows(rows, "reproduction")}
    assert reproduction[ids["reproduction_only"]]["complete"] is True  # it covers every reproduction task


def test_worker_processes_write_the_same_site_as_one_process(tmp_path: Path) -> None:
    database = tmp_path / "db.sqlite3"
    sf.fill_many(database, export.PARALLEL_FROM + 37)
    one = export.export_site(database, tmp_path / "one", docs_dir=DOCS, jobs=1)
    two = export.export_site(database, tmp_path / "two", docs_dir=DOCS, jobs=2)
    assert (one.files, one.pages) == (two.files, two.pages)
    assert _tree(tmp_path / "one") == _tree(tmp_path / "two")


def test_an_export_after_one_new_upload_rewrites_only_the_pages_that_changed(tmp_path: Path) -> None:
    database, site = tmp_path / "db.sqlite3", tmp_path / "site"
    sf.fill_many(database, 300)
    export.export_site(database, site, docs_dir=DOCS)

    def files() -> dict[str, tuple[int, bytes]]:
        return {
            p.relative_to(site).as_posix(): (p.stat().st_ino, p.read_bytes()) for p in site.rglob("*") if p.is_file()
        }

    before = files()
    # ranked last everywhere (one open task, the lowest score): no other submission's rank moves
    summary = sf.make_summary(key="one-more", outcomes=[sf.Outcome(sf.OPEN[0], quality=0.0001)], agent="late-agent",
                              model="m", effort="low", started=sf.BASE_TIME, duration_s=60)  # fmt: skip
    new_page = (
        f"submissions/{sf.insert_accepted(database, summary, key='one-more', received_at=sf.BASE_TIME + 1e8)}.html"
    )
    report = export.export_site(database, site, docs_dir=DOCS)
    after = files()
    changed = {name for name in after if before.get(name, (0, b""))[1] != after[name][1]}
    kept = {name for name in after if name in before and before[name][0] == after[name][0]}
    assert kept == set(after) - changed - {export.MANIFEST}  # every unchanged file is the same file, not a rewrite
    assert report.unchanged == len(kept)
    assert {n for n in changed if n.startswith("submissions/")} == {new_page}
    assert not any(n.startswith(("docs/", "schemas/", "assets/")) for n in changed)
    fresh = export.export_site(database, tmp_path / "fresh", docs_dir=DOCS)  # the result is a fresh export's
    assert fresh.files == report.files
    assert _tree(tmp_path / "fresh") == _tree(site)


def test_the_top_chart_draws_each_runs_95_interval(mix: dict[str, Any]) -> None:
    index = _read(mix["site"], "index.html")
    charts = dict(re.findall(r'<section class="chart[^"]*" id="top-(\w+)".*?(<svg.*?</svg>)', index, re.S))
    assert set(charts) == {"score", "pass", "both"}
    assert "ci-bar" not in charts["pass"]  # a pass rate has no interval
    cap = catalog.release()[0].cap
    rows = {r["submission_id"]: r for r in leaderboard_rows(db.all_submissions(mix["db"]), "overall")}
    for by in ("score", "both"):
        groups = [unescape(g) for g in re.findall(r'<g class="bar-row">(.*?)</g>', charts[by], re.S)]
        assert len(groups) == min(10, sum(1 for r in rows.values() if r["rank"] is not None))
        for group in groups:
            name = re.search(r"<title>\d+\. (.*?)[:·]", group).group(1).strip()  # type: ignore[union-attr]
            whisker = re.search(r'<path class="ci-bar" d="M([\d.]+) [\d.]+H([\d.]+)M', group)
            title = re.search(r"<title>(.*?)</title>", group, re.S).group(1)  # type: ignore[union-attr]
            assert whisker is not None, name
            x1, x2 = float(whisker.group(1)), float(whisker.group(2))
            assert 230 <= x1 <= x2 <= 230 + 440  # inside the plot (label_w, plot_w)
            low, high = ((x - 230) / 440 * cap for x in (x1, x2))
            shown = re.search(r"score [\d.]+ \(95% interval ([\d.]+)–([\d.]+)\)", title)
            assert shown is not None, title  # the accessible text says it too
            assert abs(float(shown.group(1)) - low) < 0.002 + cap / 440
            assert abs(float(shown.group(2)) - high) < 0.002 + cap / 440


def test_the_export_reads_the_accepted_submissions_as_the_database_gives_them(tmp_path: Path) -> None:
    database = tmp_path / "db.sqlite3"
    sf.fill_many(database, 30, reject_every=7, revoke_every=11)
    with sqlite3.connect(database) as c:  # a summary only Python's json reads (orjson refuses NaN)
        (sid,) = c.execute("SELECT id FROM submissions WHERE status = 'accepted' LIMIT 1").fetchone()
        nan = """replace(summary, '"macro_mean": ', '"macro_mean": NaN, "x": ')"""
        c.execute(f"UPDATE submissions SET summary = {nan} WHERE id = ?", [sid])
    every = [r for r in db.all_submissions(database) if r["status"] == "accepted"]
    assert json.dumps(export.accepted_submissions(database)) == json.dumps(every)
    assert any(math.isnan(r["summary"]["macro_mean"]) for r in every if r["id"] == sid)


def test_the_audit_summary_keeps_how_a_task_ended_early() -> None:
    outcomes = [
        sf.Outcome(sf.REFS[0], quality=1.0),
        sf.Outcome(
            sf.REFS[1], reason="the official evaluation passed its deadline", ended=("official", "evaluation/deadline")
        ),
        sf.Outcome(sf.REFS[2], reason="an older harness: no ended"),
    ]
    summary = sf.make_summary(key="ended", outcomes=outcomes, agent="a", model=None, effort=None,
                              started=sf.BASE_TIME, duration_s=60)  # fmt: skip
    ended = {t["task"]: t.get("ended", "absent") for t in summary["tasks"]}
    assert ended == {
        sf.REFS[0]: "absent",  # a completed task's score document has no `ended`
        sf.REFS[1]: {"phase": "official", "category": "evaluation/deadline"},
        sf.REFS[2]: None,
    }


@pytest.mark.fuzz
@given(st.one_of(st.text(), st.integers(), st.floats(), st.booleans(), st.none(), st.text().map(Markup)))
@fuzz_settings
def test_the_templates_output_escape_writes_what_markupsafe_escape_writes(value: Any) -> None:
    """The templates' ``{{ }}`` escaping (export.output_escape, which skips the Markup wrapper for a
    str) writes every value character for character as markupsafe.escape does."""
    assert str(export.output_escape(value)) == str(markupsafe.escape(value))


def test_the_site_templates_escape_with_output_escape(tmp_path: Path) -> None:
    """A hostile agent name is escaped once, by the fast escape the templates are compiled to call."""
    site = export.Site(tmp_path / "s", docs_dir=None, page_size=10, top_n=3)
    template = site.env.get_template("submission.html")
    assert template.root_render_func.__globals__["escape"] is export.output_escape
    assert site.env.from_string("{{ x }}|{{ y }}|{{ n }}").render(x="<a href='x'>&\"", y=Markup("<b>"), n=-3) == (
        "&lt;a href=&#39;x&#39;&gt;&amp;&#34;|<b>|-3"
    )


@pytest.mark.parametrize(
    ("option", "raw", "message"),
    [
        ("--jobs", "100000", "'100000': between 1 and 64 worker processes"),
        ("--jobs", "0", "'0': between 1 and 64 worker processes"),
        ("--jobs", "-3", "'-3': between 1 and 64 worker processes"),
        ("--jobs", "1" + "0" * 40, "between 1 and 64 worker processes"),
        ("--jobs", "two", "'two' is not a number of worker processes"),
        ("--page-size", "0", "'0': between 1 and 10000 rows"),
        ("--page-size", "99999999", "between 1 and 10000 rows"),
        ("--page-size", "1.5", "'1.5' is not a number of rows"),
        ("--top-n", "-1", "'-1': between 1 and 1000 agents"),
        ("--top-n", "\x00", "is not a number of agents"),
    ],
)
def test_export_site_numbers_out_of_bounds_are_a_usage_error_not_a_fork_per_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, raw: str, message: str
) -> None:
    """``--jobs 100000`` made a pool of 100000 forked workers; every number of export-site is
    now bounded where it is parsed: a usage error (exit 2) naming the range, nothing written."""
    out = tmp_path / "site"
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["export-site", str(out), option, raw])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


# -- the exporter's worker processes -----------------------------------------------------------


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A board big enough for the shard workers (export.PARALLEL_FROM rows and more)."""
    database = tmp_path_factory.mktemp("sharded") / "db.sqlite3"
    sf.fill_many(database, export.PARALLEL_FROM + 11, seed=3)
    return database


def test_the_shard_workers_read_every_row_once(sharded: Path) -> None:
    """read_rows over the key ranges the shard workers are given (open-ended at both ends) reads
    the rows read_rows reads at once, each once, in upload order, with their audit history."""
    keys = export.read_keys(sharded)
    whole = export.read_rows(sharded)
    assert [(r[whole.names.index("received_at")], r[whole.names.index("id")]) for r in whole.rows] == keys
    bounds = [None, keys[40], keys[41], keys[200], None]
    parts = [export.read_rows(sharded, start, stop) for start, stop in itertools.pairwise(bounds)]
    assert [len(p.rows) for p in parts] == [40, 1, 159, len(keys) - 200]
    assert [r for p in parts for r in p.rows] == whole.rows
    assert {k: v for p in parts for k, v in p.history.items()} == whole.history
    # as a shard worker reads them (the database's order: the exporting process orders the entries)
    unordered = [export.read_rows(sharded, start, stop, ordered=False) for start, stop in itertools.pairwise(bounds)]
    assert [sorted(p.rows) for p in unordered] == [sorted(p.rows) for p in parts]
    assert [p.history for p in unordered] == [p.history for p in parts]


@pytest.mark.parametrize(
    ("damage", "error"),
    [
        ("UPDATE submissions SET id = '../escape' WHERE id = (SELECT max(id) FROM submissions)", "cannot name a file"),
        (
            "UPDATE submissions SET summary = '[]' WHERE id = (SELECT max(id) FROM submissions)",
            "its database row is not one the verifier writes",
        ),
    ],
)
def test_a_hostile_row_in_a_shard_fails_the_export_and_leaves_no_worker(
    sharded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str, error: str
) -> None:
    """An error in a shard worker (a submission id that cannot name a file, a summary of another
    shape) is the export's error, as it is in one process: the previous site stays, no stage
    folder or worker is left."""
    database = tmp_path / "db.sqlite3"
    with sqlite3.connect(sharded) as source, sqlite3.connect(database) as copy:
        source.backup(copy)  # (the fixture's write-ahead log included)
    assert len(export.read_keys(database)) >= export.PARALLEL_FROM
    site = _export(database, tmp_path / "site", jobs=2)
    before = _tree(site)
    with sqlite3.connect(database) as c:
        c.execute(damage)
    workers: list[Any] = []
    close = export._Shards.close

    def spy(self: Any) -> None:
        workers.extend(self.procs)
        close(self)

    monkeypatch.setattr(export._Shards, "close", spy)
    for jobs in (1, 2):
        with pytest.raises(export.ExportError, match=error):
            _export(database, tmp_path / "site", jobs=jobs)
    assert len(workers) == 2
    assert not any(p.is_alive() for p in workers)
    assert _tree(site) == before
    assert not [p.name for p in tmp_path.iterdir() if ".new-" in p.name or ".old-" in p.name]


def test_a_shard_worker_that_dies_fails_the_export(
    sharded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard worker killed before it sent its entries (the kernel's OOM killer, an operator) is an
    ExportError naming its exit status, not a hang."""

    def die(*_args: Any, **_kw: Any) -> None:
        os._exit(7)

    monkeypatch.setattr(export, "build_submission", die)
    with pytest.raises(export.ExportError, match=r"ended \(exit status 7\) before it sent its entries"):
        _export(sharded, tmp_path / "site", jobs=2)
    assert not (tmp_path / "site").exists()


def test_a_page_context_prepared_before_the_ranks_shows_the_ranks(sharded: Path, tmp_path: Path) -> None:
    """A shard worker prepares its submissions' page contexts while the ranks are computed
    (Site.prepare): the pages then rendered show the ranks set after, as unprepared pages do."""
    rows = export.read_rows(sharded)
    pages = {}
    for prepared in (False, True):
        site = export.Site(tmp_path / f"s{prepared}", docs_dir=None, page_size=10, top_n=3)
        site.chrome = {"version": "v", "release": "r", "export_doc": False}
        part = site.submissions(rows, 0, 30)
        if prepared:
            site.prepare(part, lambda: False)
            assert all(sub.context is not None for sub in part)
        export.rank_all([sub.entry for sub in part], list(site.specs))
        assert any(sub.entry.ranks for sub in part)
        for sub in part:
            site._submission(sub)
        pages[prepared] = _tree(site.out)
    assert pages[True] == pages[False]
    shown = [re.findall(r"rank (\d+)</a>", page.decode()) for page in pages[True].values()]
    assert any(shown)


def test_the_joined_output_code_generator_writes_what_jinja_writes(
    mix: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The templates are compiled by export._CodeGenerator, which yields a run of output pieces as
    one string: every page is the one Jinja's own code generator renders, byte for byte."""
    monkeypatch.setattr(export, "_CodeGenerator", jinja2.compiler.CodeGenerator)
    stock = _export(mix["db"], tmp_path / "stock")
    assert _tree(stock) == _tree(mix["site"])
    assert export.Site(tmp_path / "s", docs_dir=None, page_size=10, top_n=3).env.code_generator_class is (
        jinja2.compiler.CodeGenerator
    )


def test_the_exports_are_written_by_the_exporting_process_while_the_page_workers_run(
    sharded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With worker processes the CSV/JSON exports are this process's share of the page work
    (Site._run's ``own``): written here, the same bytes as one process writes."""
    ran_in: list[int] = []
    exports = export.Site._exports

    def spy(self: Any, *args: Any) -> None:
        ran_in.append(os.getpid())
        exports(self, *args)

    forks: list[int] = []
    run = export.Site._run

    def counted(self: Any, work: list[Any], **kw: Any) -> None:
        forks.append(len(work))
        run(self, work, **kw)

    monkeypatch.setattr(export.Site, "_exports", spy)
    monkeypatch.setattr(export.Site, "_run", counted)
    two = _export(sharded, tmp_path / "two", jobs=2, page_size=2)  # pages enough for the page workers
    assert forks[0] >= export.PARALLEL_FROM
    assert ran_in == [os.getpid()]
    one = _export(sharded, tmp_path / "one", jobs=1, page_size=2)
    assert _tree(one) == _tree(two)


def test_a_failing_export_in_the_exporting_process_leaves_no_page_worker_or_stage(
    sharded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error in the exporting process's own share (here the exports) while the page workers
    run is the export's error: the previous site stays, no stage folder or worker is left."""
    site = _export(sharded, tmp_path / "site", jobs=2, page_size=2)  # pages enough for the page workers
    before = _tree(site)
    pools: list[Any] = []
    pool_class = export.ProcessPoolExecutor

    class Spy(pool_class):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            pools.append(self)

    def fail(self: Any, *args: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(export, "ProcessPoolExecutor", Spy)
    monkeypatch.setattr(export.Site, "_exports", fail)
    with pytest.raises(OSError, match="disk full"):
        _export(sharded, tmp_path / "site", jobs=2, page_size=2)
    assert len(pools) == 1
    assert not any(p.is_alive() for pool in pools for p in (pool._processes or {}).values())
    assert _tree(site) == before
    assert not [p.name for p in tmp_path.iterdir() if ".new-" in p.name or ".old-" in p.name]


def test_warmed_templates_are_not_loaded_or_parsed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Site.warm loads a template and its digest once, before the workers fork: a page rendered
    after it reads neither the template's source nor parses it again."""
    site = export.Site(tmp_path / "out", docs_dir=None, page_size=10, top_n=3)
    site.warm(("tasks.html",))
    digest = site.template_digest("tasks.html")
    loader = site.env.loader
    assert loader is not None

    def refuse(*_args: Any, **_kw: Any) -> Any:
        raise AssertionError("loaded again")

    monkeypatch.setattr(loader, "get_source", refuse)
    monkeypatch.setattr(site.env, "parse", refuse)
    site.chrome = {"version": "v", "release": "r", "export_doc": False}
    site.page("tasks/index.html", "tasks.html", title="Tasks", section="tasks", site=site.chrome, tasks=[])
    assert site.template_digest("tasks.html") == digest
    assert (tmp_path / "out" / "tasks" / "index.html").read_text().startswith("<!DOCTYPE html>")


def test_each_template_is_parsed_once_and_the_shards_compile_none_of_the_submission_pages(
    sharded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A template was parsed twice in a process (for its digest, then to compile it), and every
    shard worker parsed and compiled the submission page's templates again: a third of a 1,000-row
    export's instructions beyond one process's were that. Now the digest's parse is compiled
    (export._CompiledTemplates) and the exporting process sends the code it compiled with the
    ranks: no process parses a template twice, and submission.html is parsed once in all."""
    log = tmp_path / "parses"
    parse = jinja2.Environment._parse

    def logged(env: jinja2.Environment, source: str, name: str | None, filename: str | None) -> Any:
        with log.open("a") as out:  # appended by every process (the forked workers inherit this)
            out.write(f"{os.getpid()} {name}\n")
        return parse(env, source, name, filename)

    monkeypatch.setattr(jinja2.Environment, "_parse", logged)
    site = _export(sharded, tmp_path / "site", jobs=2)
    parses = [tuple(line.split()) for line in log.read_text().splitlines()]
    assert len(parses) == len(set(parses)), parses  # none twice in one process
    assert [name for _, name in parses].count("submission.html") == 1
    assert len({pid for pid, _ in parses}) == 1  # the exporting process (the docs' too): the shards parse none
    one = _export(sharded, tmp_path / "one", jobs=1)
    assert _tree(site) == _tree(one)


def test_the_compiled_templates_are_checked_against_their_source(tmp_path: Path) -> None:
    """Code another process compiled is used only for the source it was compiled from (Jinja's
    bucket checksum): a template whose source differs is compiled from its own."""
    maker = export.Site(tmp_path / "a", docs_dir=None, page_size=10, top_n=3)
    maker.warm(("tasks.html",))
    made = maker.templates_made(("tasks.html",))
    stale = {key: ("0" * 40, code) for key, (_, code) in made[2].items()}
    site = export.Site(tmp_path / "b", docs_dir=None, page_size=10, top_n=3)
    site.use_templates((made[0], made[1], stale))
    assert site.env.get_template("tasks.html").render(
        {**site.env.globals, "root": "../", "page": "index.html", "assets": site.assets, "title": "Tasks",
         "section": "tasks", "site": {"version": "v", "release": "r", "export_doc": False}, "tasks": []}
    ).startswith("<!DOCTYPE html>")  # fmt: skip
    compiled = site.env.bytecode_cache
    assert isinstance(compiled, export._CompiledTemplates)
    assert all(checksum != "0" * 40 for checksum, _ in compiled.codes.values() if checksum)  # its own code


def test_shard_workers_that_sent_their_pages_end_on_their_own_while_the_manifest_is_written(
    sharded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exporting process writes the manifest while the shard workers, done, end (_Shards.close
    then waits for them): none is terminated, each ends with status 0."""
    workers: list[Any] = []
    terminated: list[Any] = []
    close = export._Shards.close

    def spy(self: Any) -> None:
        workers.extend(self.procs)
        assert self.done
        for proc in self.procs:
            monkeypatch.setattr(proc, "terminate", lambda proc=proc: terminated.append(proc))
        close(self)

    monkeypatch.setattr(export._Shards, "close", spy)
    site = _export(sharded, tmp_path / "site", jobs=2)
    assert len(workers) == 2
    assert not terminated
    assert [p.exitcode for p in workers] == [0, 0]
    assert (site / export.MANIFEST).is_file()


def _fmt_ci_as_it_was(bounds: Any) -> Markup:
    """fmt_ci before its fast path: Markup() around fmt_score's text of each bound."""
    if bounds is None:
        return Markup("")
    low, high = export.fmt_score(bounds[0]), export.fmt_score(bounds[1])
    return Markup(f' <span class="ci"><span class="visually-hidden">95% interval </span>{low}&ndash;{high}</span>')


_BOUND = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70), st.none())


@pytest.mark.fuzz
@given(bounds=st.one_of(st.none(), st.tuples(_BOUND, _BOUND)))
@fuzz_settings
def test_fmt_ci_writes_what_markup_around_fmt_score_writes(bounds: Any) -> None:
    """The interval filter's fast path (a float's text formatted in place, the Markup made by str)
    writes the same characters, as the same type, as Markup(...) around fmt_score's text did:
    -0.0, NaN, infinities, ints and None bounds included."""
    fast, slow = export.fmt_ci(bounds), _fmt_ci_as_it_was(bounds)
    assert type(fast) is Markup
    assert str(fast) == str(slow)
    assert markupsafe.escape(fast) == fast  # safe: escaping leaves it as it is


_MANIFEST_NAME = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from('"\\\n\x00\ud800'))


@pytest.mark.fuzz
@given(
    files=st.dictionaries(_MANIFEST_NAME, st.tuples(st.text("0123456789abcdef", min_size=64, max_size=64),
                                                    st.integers(0, 2**70)), max_size=8),
    generator=_MANIFEST_NAME,
)  # fmt: skip
@fuzz_settings
def test_manifest_json_writes_what_json_dumps_indent_1_writes(
    files: dict[str, tuple[str, int]], generator: str
) -> None:
    """The manifest written a line at a time is, byte for byte, json.dumps(sort_keys=True, indent=1)
    of the manifest document and a newline, as it was: any name (quotes, backslashes, newlines, NUL,
    lone surrogates, non-ASCII), sizes past 64 bits, no file at all."""
    doc = {
        "schema": export.MANIFEST_SCHEMA,
        "generator": generator,
        "files": {name: {"sha256": digest, "bytes": size} for name, (digest, size) in files.items()},
    }
    assert export.manifest_json(files, generator) == (json.dumps(doc, sort_keys=True, indent=1) + "\n").encode()


@pytest.mark.parametrize(
    "entry", [("A" * 64, 1), ("a" * 63, 1), ("a" * 64 + "\n", 1), ("a" * 64, 1.0), ("a" * 64, True)]
)
def test_manifest_json_refuses_an_entry_that_is_not_a_digest_and_a_size(entry: tuple[Any, Any]) -> None:
    """A listed file must be 64 lowercase hex digits and an int: anything else is the exporter's bug,
    refused rather than written into the manifest a client checks the files against."""
    with pytest.raises(export.ExportError, match="not a digest and a size"):
        export.manifest_json({"a.html": entry}, "g")


_CSV_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from(",\"\r\n'=;\t "))
_CSV_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    _CSV_TEXT, st.lists(_CSV_TEXT, max_size=3), st.builds(Markup, _CSV_TEXT),
    st.dictionaries(_CSV_TEXT, st.integers(), max_size=2),
)  # fmt: skip


@pytest.mark.fuzz
@given(values=st.lists(_CSV_VALUE, min_size=2, max_size=8))
@fuzz_settings
def test_csv_record_writes_what_the_csv_module_writes(values: list[Any]) -> None:
    """leaderboard.csv's records are joined by export.csv_record, not the csv module's writer (which
    looks up every character of every cell in the line terminator): the same characters for every
    cell a row can hold (None, booleans, ints past 64 bits, NaN and infinities, text with commas,
    quotes, line breaks and leading formula characters, lists, Markup, a hostile row's dict)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerow([export._csv_cell(v) for v in values])
    assert export.csv_record(values) == buf.getvalue()
    assert next(csv.reader(io.StringIO(export.csv_record(values)))) == [export._csv_cell(v) for v in values]


@pytest.mark.fuzz
@given(epoch=st.one_of(st.floats(-62135596800.0, 253402300799.0), st.integers(-62135596800, 253402300799)))
@fuzz_settings
def test_the_date_filters_write_what_strftime_writes(epoch: float) -> None:
    """fmt_date and fmt_datetime read isoformat's digits (strftime costs twice as much, on every
    page): the same text as strftime for every moment from year 1 to 9999."""
    moment = datetime.fromtimestamp(epoch, UTC)
    assert export.fmt_date(epoch) == moment.strftime("%Y-%m-%d")
    assert export.fmt_datetime(epoch) == moment.strftime("%Y-%m-%d %H:%M UTC")


@pytest.mark.fuzz
@given(name=st.sampled_from(sorted(export.ESCAPED_FILTERS)), value=st.one_of(json_values, st.floats()))
@fuzz_settings
def test_the_filters_written_unescaped_write_only_what_escaping_leaves(name: str, value: Any) -> None:
    """A ``{{ x|score }}`` is compiled without the escape call (export.ESCAPED_FILTERS): each such
    filter, for any value a database row can hold, writes text that escaping leaves as it is (a
    str, or Markup), or raises (the row's fault: the export names it)."""
    try:
        out = export.ESCAPED_FILTERS[name](value)
    except (TypeError, ValueError, OverflowError, OSError):
        return
    assert isinstance(out, str)
    assert str(markupsafe.escape(out)) == out


@pytest.mark.fuzz
@given(epoch=st.one_of(st.floats(-62135596800.0, 253402300799.0), st.integers(-62135596800, 253402300799)))
@fuzz_settings
def test_the_exports_received_at_is_what_strftime_writes(epoch: float) -> None:
    """``received_at`` in the CSV/JSON exports: RFC 3339 with microseconds, from isoformat, the same
    text as strftime's for every moment from year 1 to 9999 (microseconds of 0 included)."""
    assert export._iso(epoch) == datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.mark.fuzz
@given(
    values=st.lists(
        st.one_of(
            st.floats(),
            st.floats(min_value=1e-6, max_value=1e18),
            st.floats(min_value=0, max_value=2),
            st.integers(0, 2**64 - 1).map(lambda bits: struct.unpack("d", struct.pack("Q", bits))[0]),
            st.sampled_from([0.0, -0.0, 1e-4, 9.999999999999999e-05, 1e16, 9999999999999998.0, 1.0, 5e-05, 0.1]),
        ),
        max_size=20,
    )
)
@fuzz_settings
def test_float_reprs_writes_what_repr_writes(values: list[float]) -> None:
    """The CSV's floats are orjson's text where it is repr's (positional, 1e-4 to 1e16), repr's
    elsewhere: every double (any bit pattern, NaN, infinities, -0.0, the range's edges) as repr."""
    assert export.float_reprs(values) == [repr(v) for v in values]
