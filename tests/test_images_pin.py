"""``ale images pin``'s pieces that need neither the network nor this machine's apt state: apt's
index files found by archive and suite, the resolution written back into the definition's pinned
list, and only that list rewritten."""

from __future__ import annotations

from pathlib import Path

import pytest
from images_helpers import mini_image

from ale.images import definition, pin, resolve

PACKAGES = """\
Package: minibase
Version: 1.0-1
Depends: libmini (>= 1)
Filename: pool/main/m/minibase/minibase_1.0-1_amd64.deb
Size: 1234
SHA256: {a}

Package: libmini
Version: 2.0-1
Filename: pool/main/libm/libmini/libmini_2.0-1_amd64.deb
Size: 99
SHA256: {b}
"""


def _lists(tmp_path: Path) -> Path:
    lists = tmp_path / "lists"
    lists.mkdir()
    text = PACKAGES.format(a="a" * 64, b="b" * 64)
    (lists / "deb.example.invalid_debian_dists_bookworm_main_binary-amd64_Packages").write_text(text)
    (lists / "elsewhere.example_debian_dists_bookworm_main_binary-amd64_Packages").write_text("Package: evil\n")
    return lists


def test_apt_list_names_follow_apts_escaping() -> None:
    assert pin._list_prefix("http://deb.debian.org/debian") == "deb.debian.org_debian"
    assert pin._list_prefix("https://mirror.example/my_debian") == "mirror.example_my%5fdebian"


def test_index_files_are_only_the_definitions_archives_and_suites(tmp_path: Path) -> None:
    _checkout, path, _cache = mini_image(tmp_path)
    d = definition.load(path)
    files = pin.index_files(d.debian, _lists(tmp_path))
    assert [(a, f.name.split("_")[0]) for a, f in files] == [("debian", "deb.example.invalid")]


def test_a_missing_suite_index_says_what_to_do(tmp_path: Path) -> None:
    _checkout, path, _cache = mini_image(tmp_path)
    text = path.read_text().replace('suites = ["bookworm"]', 'suites = ["bookworm", "bookworm-security"]')
    d = definition.parse(text.encode(), path)
    with pytest.raises(pin.PinError, match=r"bookworm-security .* apt-get update"):
        pin.index_files(d.debian, _lists(tmp_path))


@pytest.mark.skipif(not Path(pin.APT_HELPER).exists(), reason="apt-helper is Debian's (apt); not installed here")
def test_resolved_packages_are_written_into_the_pinned_list_only(tmp_path: Path) -> None:
    _checkout, path, _cache = mini_image(tmp_path)
    d = definition.load(path)
    chosen = resolve.resolve(pin.debian_candidates(d.debian, _lists(tmp_path)), d.debian.want)
    before = path.read_text()
    after = pin.replace_block(before, "packages", pin.debian_block(chosen), "mini")
    pinned = definition.parse(after.encode(), path)
    assert [(p.name, p.version, p.sha256, p.size) for p in pinned.debian.packages] == [
        ("libmini", "2.0-1", "b" * 64, 99),
        ("minibase", "1.0-1", "a" * 64, 1234),
    ]
    untouched = [line for line in before.splitlines() if not line.startswith("  { name = ")]
    assert untouched == [line for line in after.splitlines() if not line.startswith("  { name = ")]


def test_wheel_rows_come_from_pips_report_sorted_and_hash_pinned() -> None:
    def item(name: str, version: str, file: str, sha: str) -> dict[str, object]:
        info = {"url": f"https://files.example/{file}", "archive_info": {"hashes": {"sha256": sha}}}
        return {"metadata": {"name": name, "version": version}, "download_info": info}

    report = [
        item("Zeta_Pkg", "1", "zeta_pkg-1-py3-none-any.whl", "c" * 64),
        item("alpha", "2", "alpha-2.whl", "d" * 64),
    ]
    rows = pin.wheel_rows(report)
    assert [r[0] for r in rows] == ["alpha", "zeta-pkg"]
    with pytest.raises(pin.PinError, match="not a hash-pinned https wheel"):
        pin.wheel_rows([{"metadata": {"name": "x", "version": "1"}, "download_info": {"url": "https://x/x-1.tar.gz"}}])


def test_a_definition_without_exactly_one_block_is_not_rewritten() -> None:
    with pytest.raises(pin.PinError, match="found 0"):
        pin.replace_block("wheels = []\n", "wheels", "wheels = [\n]\n", "x")
    with pytest.raises(pin.PinError, match="found 2"):
        pin.replace_block("wheels = [\n]\nwheels = [\n]\n", "wheels", "wheels = [\n]\n", "x")


def test_toml_strings_that_need_escaping_are_refused() -> None:
    with pytest.raises(pin.PinError, match="plain TOML string"):
        pin._toml_string('a"b')


def test_manylinux_tags_run_by_the_images_c_library() -> None:
    tags = pin.platforms("2.36")
    assert tags[0] == "manylinux_2_36_x86_64"
    assert "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags
    assert "manylinux_2_37_x86_64" not in tags


def test_installed_constraints_leave_the_project_out() -> None:
    constraints = pin.installed_constraints()
    assert constraints == sorted(constraints)
    assert not any(c.startswith("ale-robotics==") for c in constraints)
    assert any(c.startswith("numpy==") for c in constraints)
