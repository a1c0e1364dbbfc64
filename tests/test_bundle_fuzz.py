"""Fuzz targets for every layer of a bundle: the age header and stanza parser, the zstd frame, the
tar inspector, the documents' parse, and the whole container. Random mutations of valid bytes at
each layer (flips, insertions, deletions, cuts, appended and spliced bytes) must give a
:class:`~ale.core.reasons.VerificationError` whose reason is documented for that layer, or be
accepted; never any other exception. Where a layer is accepted, an independent reader
(re-encoding the age header by hand, libzstd's own frame decoder, Python's ``tarfile``) must see
exactly what the verifier saw. ``ALE_FUZZ_EXAMPLES`` sets the inputs per target (tests/fuzzing.py).
"""

from __future__ import annotations

import base64
import io
import itertools
import json
import tarfile
from collections.abc import Callable
from typing import Any

import pyrage
import pytest
import verifier_helpers as h
import zstandard
from fuzzing import fuzz_settings, hostile_json, json_paths, json_values, replaced
from hypothesis import given
from hypothesis import strategies as st

from ale.core import bundle
from ale.core.canonical import canonical_json
from ale.core.documents import ELEVATION_MEMBERS
from ale.core.reasons import REASONS, Reason, VerificationError
from ale.core.verify import parse_documents
from ale.schemas import validate_document

pytestmark = pytest.mark.fuzz

IDENTITY = pyrage.x25519.Identity.generate()
SECRET_KEY, PUBLIC_KEY = str(IDENTITY), str(IDENTITY.to_public())
FILES = {name: f"content of {name}\n".encode() * 7 for name in bundle.ALLOWED_FILES}
TAR = bundle.build_tar(FILES)
FRAME = bundle.compress(TAR)
LIMITS = bundle.Limits(max_decompressed=4 * bundle.MiB, max_file_bytes=bundle.MiB)


def _step(reason: Reason) -> str:
    return REASONS[reason].step


@st.composite
def mutated(draw: st.DrawFn, original: bytes) -> bytes:
    """``original`` with one to three random edits."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 3), label="edits")):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "cut", "append", "splice"]), label="op")
        pos = draw(st.integers(0, max(len(data) - 1, 0)), label="position")
        if op == "flip" and data:
            data[pos] ^= draw(st.integers(1, 255), label="xor")
        elif op == "set" and data:
            data[pos] = draw(st.integers(0, 255), label="byte")
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16), label="inserted")
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 64), label="deleted")]
        elif op == "cut":
            del data[pos:]
        elif op == "append":
            data += draw(st.one_of(st.binary(max_size=64), st.just(original)), label="appended")
        elif op == "splice" and data:
            start = draw(st.integers(0, len(data) - 1), label="from")
            data[pos:pos] = data[start : start + draw(st.integers(1, 1024), label="length")]
    return bytes(data)


def _expect(check: Callable[[], Any], steps: set[str]) -> Any:
    """Run ``check``: its result, or None when it raised a VerificationError of these steps."""
    try:
        return check()
    except VerificationError as exc:
        error = exc
    assert _step(error.reason) in steps, f"{error.reason} ({_step(error.reason)}): {error}"
    assert str(error)
    SEEN.setdefault(steps_key(steps), set()).add(error.reason)
    return None


#: The reasons each target met (a sanity check that mutations reach past the first check).
SEEN: dict[str, set[Reason]] = {}


def steps_key(steps: set[str]) -> str:
    return ",".join(sorted(steps))


# -- age header and stanzas -----------------------------------------------------------------------

AGE = h.encrypt(FRAME, PUBLIC_KEY, *(str(pyrage.x25519.Identity.generate().to_public()) for _ in range(3)))


def _encode_header(header: bundle.AgeHeader) -> bytes:
    """age v1's header written from the spec's grammar (independent of the parser)."""
    out = [bundle.AGE_MAGIC]
    for s in header.stanzas:
        body = base64.b64encode(s.body).rstrip(b"=")
        lines = [body[i : i + 64] for i in range(0, len(body), 64)]
        if not lines or len(lines[-1]) == 64:
            lines.append(b"")
        out.append(b"-> " + " ".join(s.args).encode() + b"\n" + b"".join(line + b"\n" for line in lines))
    out.append(b"--- " + base64.b64encode(header.mac).rstrip(b"=") + b"\n")
    return b"".join(out)


@fuzz_settings
@given(data=st.one_of(mutated(AGE[:400]), mutated(AGE), st.binary(max_size=300).map(lambda b: bundle.AGE_MAGIC + b)))
def test_fuzz_age_header_parser(data: bytes) -> None:
    header = _expect(lambda: bundle.check_age_header(data, bundle.Limits()), {"3 decrypt"})
    if header is not None:
        assert _encode_header(header) == data[: header.payload_offset]  # exactly the grammar, nothing else
        assert 1 <= header.x25519 <= 8


@fuzz_settings
@given(data=mutated(AGE))
def test_fuzz_age_decryption(data: bytes) -> None:
    plain = _expect(lambda: bundle.decrypt(data, SECRET_KEY, bundle.Limits()), {"3 decrypt"})
    assert plain is None or plain == FRAME


# -- zstd -----------------------------------------------------------------------------------------


@fuzz_settings
@given(data=mutated(FRAME))
def test_fuzz_zstd_layer(data: bytes) -> None:
    out = _expect(lambda: bundle.decompress(data, LIMITS), {"4 decompress"})
    if out is not None:  # libzstd's own decoder: one whole frame, nothing left over, the same bytes
        dobj = zstandard.ZstdDecompressor().decompressobj()
        assert dobj.decompress(data) == out
        assert dobj.eof
        assert dobj.unused_data == b""


def _outcome(check: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return ("ok", check())
    except VerificationError as exc:
        return ("refused", exc.reason)


@fuzz_settings
@given(data=mutated(FRAME), limit=st.sampled_from([len(TAR) - 1, len(TAR), len(TAR) + 1, LIMITS.max_decompressed]))
def test_fuzz_zstd_into_a_buffer_is_decompress(data: bytes, limit: int) -> None:
    """decompress_into (the upload workers' way: straight into their memory file's mapping) gives
    what decompress gives, or refuses for the same reason, whatever the frame; its blocks, in
    order and within the buffer, are the stream."""
    limits = bundle.Limits(max_decompressed=limit)
    into = memoryview(bytearray(limit + 7))  # (room past the limit: the limit, not the buffer, stops it)
    blocks: list[tuple[int, int]] = []
    got = _outcome(lambda: bundle.decompress_into(data, limits, into, lambda at, n: blocks.append((at, n))))
    expected = _outcome(lambda: bundle.decompress(data, limits))
    if expected[0] == "ok":
        assert got == ("ok", len(expected[1]))
        assert bytes(into[: got[1]]) == expected[1]
        assert [at for at, _ in blocks] == list(itertools.accumulate((n for _, n in blocks[:-1]), initial=0))
        assert sum(n for _, n in blocks) == got[1]
    else:
        assert got == expected
        assert all(at + n <= limit for at, n in blocks)


def test_zstd_into_a_buffer_at_its_limit() -> None:
    """Exactly the limit is accepted, a byte more is a bomb; a buffer smaller than the limit is
    the caller's error, not the frame's."""
    frame = bundle.compress(b"x" * 1000)
    into = memoryview(bytearray(1000))
    assert bundle.decompress_into(frame, bundle.Limits(max_decompressed=1000), into) == 1000
    assert bytes(into) == b"x" * 1000
    with pytest.raises(VerificationError) as caught:
        bundle.decompress_into(frame, bundle.Limits(max_decompressed=999), into)
    assert caught.value.reason == Reason.DECOMPRESSED_TOO_LARGE
    with pytest.raises(ValueError, match="cannot hold"):
        bundle.decompress_into(frame, bundle.Limits(max_decompressed=1001), into)
    assert bundle.decompress_into(bundle.compress(b""), bundle.Limits(max_decompressed=1000), into) == 0


# -- tar ------------------------------------------------------------------------------------------


def _tarfile_view(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers()}  # type: ignore[union-attr]


@fuzz_settings
@given(data=st.one_of(mutated(TAR), mutated(TAR[:4096]).map(lambda b: b + bytes(-len(b) % 10240))))
def test_fuzz_tar_inspector(data: bytes) -> None:
    files = _expect(lambda: bundle.inspect_tar(data, LIMITS), {"5 tar"})
    if files is not None:
        assert bundle.build_tar(files) == data  # the exact inverse of the writer
        assert _tarfile_view(data) == files  # and another reader sees the same files


# -- the documents --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_files(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> dict[str, bytes]:
    return h.get_world(tmp_path_factory, request.config).files("plain")


JSON_FILES = sorted(n for n in bundle.ALLOWED_FILES if n.endswith(".json"))


@st.composite
def document_edit(draw: st.DrawFn, files: dict[str, bytes]) -> tuple[str, bytes]:
    """A JSON file of a real bundle with a value replaced somewhere (re-encoded canonically, so the
    later checks are reached), or its bytes mutated, or hostile JSON instead."""
    name = draw(st.sampled_from(JSON_FILES), label="file")
    how = draw(st.sampled_from(["value", "bytes", "hostile"]), label="how")
    if how == "hostile":
        return name, draw(hostile_json, label="hostile")
    if how == "bytes":
        return name, draw(mutated(files[name]), label="mutated")
    document = json.loads(files[name])
    path = draw(st.sampled_from(json_paths(document, per_list=3)), label="path")
    value = draw(json_values, label="value")
    if draw(st.booleans(), label="as a member"):  # a member added to the object at path (maybe a level claim)
        key = draw(st.sampled_from(sorted(ELEVATION_MEMBERS)) | st.text(max_size=12), label="key")
        target = _at(document, path)
        value = {**target, key: value} if isinstance(target, dict) else value
    edited = replaced(document, path, value)
    try:
        raw = canonical_json(edited) + b"\n"
    except ValueError:  # a value canonical JSON has no form for (an integer past 2**53)
        raw = json.dumps(edited).encode()
    return name, raw


def _at(document: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        document = document[key]
    return document


@fuzz_settings
@given(data=st.data())
def test_fuzz_documents_parse(real_files: dict[str, bytes], data: st.DataObject) -> None:
    name, raw = data.draw(document_edit(real_files))
    files = {**real_files, name: raw}
    _expect(lambda: parse_documents(files, validate_document), {"7 documents"})
    _expect(lambda: parse_documents(files), {"7 documents"})  # the models alone, past no schema


@fuzz_settings
@given(data=st.data())
def test_fuzz_events_frame_gets_the_zstd_reasons(real_files: dict[str, bytes], data: st.DataObject) -> None:
    raw = data.draw(mutated(real_files["events.jsonl.zst"]), label="events")
    _expect(lambda: parse_documents({**real_files, "events.jsonl.zst": raw}, validate_document), {"4 decompress"})


# -- the whole container --------------------------------------------------------------------------


@fuzz_settings
@given(data=st.data())
def test_fuzz_whole_container_at_each_layer(data: st.DataObject) -> None:
    layer = data.draw(st.sampled_from(["age", "zstd", "tar"]), label="layer")
    if layer == "age":
        ciphertext = data.draw(mutated(AGE), label="ciphertext")
    elif layer == "zstd":
        ciphertext = h.encrypt(data.draw(mutated(FRAME), label="frame"), PUBLIC_KEY)
    else:
        ciphertext = h.encrypt(bundle.compress(data.draw(mutated(TAR), label="tar")), PUBLIC_KEY)
    files = _expect(
        lambda: bundle.unpack(ciphertext, SECRET_KEY, LIMITS),
        {"1 receive", "3 decrypt", "4 decompress", "5 tar", "6 allow-list"},
    )
    assert files is None or set(files) == set(bundle.ALLOWED_FILES)  # contents are integrity.json's to check
