"""The incremental export: a page is rendered again exactly when one of its inputs changed.

Each page's inputs (its context, its templates, the exporter's code) have a digest the export keeps
beside the site (``verify/export.py``, ``Site.inputs_digest``); the next export links a page whose
digest is unchanged without rendering it. Every test compares the incremental result with a
fresh export of the same database: the cache may save work, never change a byte.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import site_fixtures as sf

from ale_verify import export

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGE_SIZE = 10  # 40 submissions: four pages per tab, so a change reaches some board pages only


def _tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def board(tmp_path: Path) -> dict[str, Any]:
    database, site = tmp_path / "db.sqlite3", tmp_path / "site"
    sf.fill_many(database, 40, reject_every=13, revoke_every=17)
    export.export_site(database, site, docs_dir=DOCS, page_size=PAGE_SIZE, jobs=1)
    return {"db": database, "site": site, "tmp": tmp_path}


@pytest.fixture
def rendered(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The pages the next export renders (the others it links from the previous export)."""
    pages: set[str] = set()
    reuse = export.Site._reuse

    def spy(self: export.Site, rel: str, key: str) -> bool:
        if reused := reuse(self, rel, key):
            return reused
        pages.add(rel)
        return False

    monkeypatch.setattr(export.Site, "_reuse", spy)
    return pages


def _again(board: dict[str, Any], rendered: set[str], docs: Path = DOCS) -> export.ExportReport:
    """Export into the same folder, then check the result is a fresh export's, byte for byte
    (``rendered`` keeps the pages the first of the two rendered)."""
    report = export.export_site(board["db"], board["site"], docs_dir=docs, page_size=PAGE_SIZE, jobs=1)
    incremental = set(rendered)
    fresh = board["tmp"] / "fresh"
    shutil.rmtree(fresh, ignore_errors=True)
    export.export_site(board["db"], fresh, docs_dir=docs, page_size=PAGE_SIZE, jobs=1)
    assert _tree(board["site"]) == _tree(fresh)
    rendered.clear()
    rendered.update(incremental)
    return report


def _pages(site: Path) -> set[str]:
    return {p.relative_to(site).as_posix() for p in site.rglob("*.html")}


def _listing(site: Path, sid: str) -> set[str]:
    """The pages that link to a submission's page (its board and task rows)."""
    link = re.compile(rf'href="(?:\.\./)?submissions/{sid}\.html"')
    return {name for name in _pages(site) if link.search((site / name).read_text())}


def _lowest(site: Path) -> str:
    """A ranked submission charted on no tab (ranked last on the Overall tab, not in any top 10)."""
    rows = json.loads((site / "leaderboard.json").read_text())["submissions"]
    ranked = [r for r in rows if r["rank_overall"] is not None]
    charted = {r["submission_id"] for c in ("overall", "reproduction", "open")
               for r in sorted((r for r in ranked if r[f"rank_{c}"]), key=lambda r: r[f"rank_{c}"])[:10]}  # fmt: skip
    return next(r["submission_id"] for r in reversed(ranked) if r["submission_id"] not in charted)


def _edit_summary(database: Path, sid: str, change: Any) -> None:
    """What the verifier's re-score does to a row: its summary replaced."""
    with sqlite3.connect(database) as c:
        (raw,) = c.execute("SELECT summary FROM submissions WHERE id = ?", [sid]).fetchone()
        summary = json.loads(raw)
        change(summary)
        c.execute("UPDATE submissions SET summary = ? WHERE id = ?", [json.dumps(summary), sid])


def test_an_export_of_an_unchanged_database_renders_no_page(board: dict[str, Any], rendered: set[str]) -> None:
    report = _again(board, rendered)
    assert rendered == set()
    assert report.rendered == 0
    assert report.unchanged == report.files - 1  # all but the manifest: the same files, linked


def test_a_rescore_renders_again_its_page_and_the_pages_that_list_it(board: dict[str, Any], rendered: set[str]) -> None:
    site = board["site"]
    sid = _lowest(site)
    _edit_summary(board["db"], sid, lambda s: s.update(macro_mean=0.123456))  # its ranks do not move
    _again(board, rendered)
    assert rendered == {f"submissions/{sid}.html"} | _listing(site, sid)
    assert "0.123" in (site / f"submissions/{sid}.html").read_text()


def test_a_judgement_renders_again_the_pages_of_its_submission(board: dict[str, Any], rendered: set[str]) -> None:
    site = board["site"]
    sid = _lowest(site)

    def rejudge(summary: dict[str, Any]) -> None:
        judged = [t for t in summary["tasks"] if t.get("judgement")]
        judged[0]["judgement"]["rationale"] = "re-judged: the controller is the paper's"

    _edit_summary(board["db"], sid, rejudge)
    _again(board, rendered)
    assert rendered == {f"submissions/{sid}.html"} | _listing(site, sid)
    assert "re-judged: the controller is the paper&#39;s" in (site / f"submissions/{sid}.html").read_text()


def test_a_revocation_renders_again_the_pages_whose_inputs_changed(board: dict[str, Any], rendered: set[str]) -> None:
    site = board["site"]
    sid = _lowest(site)
    before = _tree(site)
    sf.revoke(board["db"], sid, "operator found a copied controller")
    _again(board, rendered)
    after = _tree(site)
    changed = {name for name in after if name.endswith(".html") and before.get(name) != after[name]}
    assert f"submissions/{sid}.html" in changed
    assert changed <= rendered  # every page that shows something new was rendered
    # and no page that cannot show the revocation: the docs, the schemas
    assert not {n for n in rendered if n.startswith(("docs/", "schemas/"))}
    assert len(rendered) < len(_pages(site)) / 2


def test_a_template_change_renders_again_every_page_of_that_template(
    board: dict[str, Any], rendered: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    templates = board["tmp"] / "static-site"
    shutil.copytree(export.site_dir(), templates)
    doc = templates / "templates" / "doc.html"
    doc.write_text(doc.read_text().replace("{% block main %}", "{% block main %}<!-- changed -->", 1))
    monkeypatch.setattr(export, "site_dir", lambda: templates)
    _again(board, rendered)
    docs = {f"docs/{p.stem}.html" for p in DOCS.glob("*.md") if p.stem != "index"}
    assert rendered == docs
    assert "<!-- changed -->" in (board["site"] / "docs/formats.html").read_text()


def test_a_change_to_the_base_template_renders_again_every_page(
    board: dict[str, Any], rendered: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    templates = board["tmp"] / "static-site"
    shutil.copytree(export.site_dir(), templates)
    base = templates / "templates" / "base.html"
    base.write_text(base.read_text().replace("<body>", "<body>\n<!-- changed -->", 1))
    monkeypatch.setattr(export, "site_dir", lambda: templates)
    _again(board, rendered)
    assert rendered == _pages(board["site"])


def test_a_change_to_one_doc_renders_again_that_doc_page_only(board: dict[str, Any], rendered: set[str]) -> None:
    docs = board["tmp"] / "docs"
    shutil.copytree(DOCS, docs)
    export.export_site(board["db"], board["site"], docs_dir=docs, page_size=PAGE_SIZE, jobs=1)
    rendered.clear()  # the docs folder moved: its pages' links are the same, so nothing renders
    (docs / "formats.md").write_text((docs / "formats.md").read_text() + "\nA sentence added at the end.\n")
    _again(board, rendered, docs)
    assert rendered == {"docs/formats.html"}
    assert "A sentence added at the end." in (board["site"] / "docs/formats.html").read_text()


def test_input_digests_of_another_export_are_not_trusted(board: dict[str, Any], rendered: set[str]) -> None:
    inputs = export.inputs_path(board["site"])
    doc = json.loads(inputs.read_text())
    doc["manifest_sha256"] = "0" * 64  # the digests of some other site's manifest
    inputs.write_text(json.dumps(doc))
    _again(board, rendered)
    assert rendered == _pages(board["site"])


def test_a_changed_page_file_is_rendered_again(board: dict[str, Any], rendered: set[str]) -> None:
    page = board["site"] / "tasks" / "index.html"
    page.write_text(page.read_text().replace("Tasks", "Tksas"))  # the same size, not the manifest's bytes
    _again(board, rendered)
    assert rendered == {"tasks/index.html"}


def test_a_page_input_without_a_digest_fails_the_export(tmp_path: Path) -> None:
    site = export.Site(tmp_path / "s", docs_dir=None, page_size=10, top_n=3)
    with pytest.raises(export.ExportError, match="has no digest"):
        site.inputs_digest("doc.html", {"body": object()})
