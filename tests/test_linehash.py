"""ale.core._linehash (C) against its Python reference, ale.core.trajectory.body_digests_reference.

The bulk chain check hashes every line without its hash member through whichever of the two was
loaded (ale.core.trajectory.body_digests). They must agree on every buffer, hostile or not: lines
without the member, the member at the very start or end of a line, overlapping occurrences, fewer
than 66 bytes after it, NUL bytes, bytes that are not UTF-8, empty lines, a line of a megabyte.
Where the C module was not built (no compiler or no OpenSSL headers) the comparisons skip with
the reason; in CI (``ALE_SITE_TOOLS_REQUIRED=1``) they fail instead: .ci/run builds it.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Callable
from types import ModuleType

import pytest
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from sandbox_tools import missing

from ale.core import trajectory
from ale.core.trajectory import body_digests_reference

KEY = b'"hash":"'
DIGITS = b"0123456789abcdef" * 4


def _native() -> ModuleType:
    try:
        from ale.core import _linehash  # type: ignore[attr-defined]
    except ImportError as exc:
        missing(f"ale.core._linehash was not built ({exc}): `make install` builds it with gcc and libssl-dev")
        raise  # (missing() skipped or failed)
    return _linehash


def _line(rng_bytes: bytes, where: int, tail: bytes) -> bytes:
    return rng_bytes[:where] + KEY + DIGITS + b'",' + tail


def _expected(lines: list[bytes]) -> bytes | None:
    """The reference's rule written out a line at a time (independent of both implementations)."""
    out = []
    for line in lines:
        at = line.rfind(KEY)
        if at < 0:
            return None
        out.append(hashlib.sha256(line[:at] + line[at + len(KEY) + 66 :]).digest())
    return b"".join(out)


CASES: dict[str, bytes] = {
    "empty": b"",
    "one canonical event": b'{"data":{},' + KEY[1:] + DIGITS + b'","kind":"x"}\n',
    "the member at the start": KEY + DIGITS + b'",rest\n',
    "the member at the end, nothing after it": b"head" + KEY + DIGITS + b'",\n',
    "fewer than 66 bytes after the member": b"head" + KEY + b"short\n",
    "only the member's key": KEY + b"\n",
    "overlapping occurrences": b'x"hash":"hash":"' + DIGITS + b'",y\n',
    "two members: the last counts": KEY + DIGITS + b'",' + KEY + DIGITS + b'",z\n',
    "NUL and non-UTF-8 bytes": b"\x00\xff\xfe" + KEY + DIGITS + b'",\x00\x80\n',
    "an empty line among others": KEY + b"a\n\n" + KEY + b"b\n",
    "a line without the member": KEY + b"a\nno member here\n",
    "a key cut short": b'"hash":\n',
    "quotes everywhere": b'""""""""' * 10 + KEY + b'""""\n',
    "a megabyte line": b"a" * (1 << 20) + KEY + DIGITS + b'",' + b"b" * 1000 + b"\n",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_reference_follows_the_rule(name: str) -> None:
    buffer = CASES[name]
    assert body_digests_reference(buffer) == _expected(buffer.split(b"\n")[:-1] if buffer else [])


@pytest.mark.parametrize("name", sorted(CASES))
def test_native_is_the_reference(name: str) -> None:
    native = _native()
    buffer = CASES[name]
    assert native.body_digests(buffer) == body_digests_reference(buffer)
    assert native.body_digests(bytearray(buffer)) == body_digests_reference(buffer)  # any bytes-like object
    assert native.body_digests(memoryview(buffer)) == body_digests_reference(buffer)


lines = st.lists(
    st.one_of(
        st.binary(max_size=300).filter(lambda b: b"\n" not in b),
        st.tuples(
            st.binary(max_size=200),
            st.sampled_from([KEY, b'x"hash":"hash":"', KEY + DIGITS + b'",']),
            st.binary(max_size=120),
        ).map(lambda t: (t[0] + t[1] + t[2]).replace(b"\n", b" ")),
    ),
    max_size=40,
)


@fuzz_settings
@given(lines=lines)
def test_fuzz_native_is_the_reference(lines: list[bytes]) -> None:
    native = _native()
    buffer = b"".join(line + b"\n" for line in lines)
    assert native.body_digests(buffer) == body_digests_reference(buffer) == _expected(lines)


@pytest.mark.parametrize("implementation", ["native", "reference"])
def test_a_buffer_that_does_not_end_in_a_newline_is_refused(implementation: str) -> None:
    digests: Callable[[bytes], bytes | None] = (
        _native().body_digests if implementation == "native" else body_digests_reference
    )
    for buffer in (b"x", KEY + DIGITS + b'",', b"ok\nnot ended"):
        with pytest.raises(ValueError, match="newline"):
            digests(buffer)


def test_native_refuses_what_is_not_bytes() -> None:
    native = _native()
    for wrong in ("a str\n", 12, None, ["list"]):
        with pytest.raises(TypeError):
            native.body_digests(wrong)
    with pytest.raises(TypeError):
        native.body_digests()
    with pytest.raises(TypeError):
        native.body_digests(b"a\n", b"b\n")


def test_native_releases_the_buffer_and_its_results_are_new_objects() -> None:
    native = _native()
    buffer = bytearray(KEY + DIGITS + b'",x\n')
    first = native.body_digests(buffer)
    buffer.extend(b"more\n")  # no view is left exported: a bytearray with one cannot be resized
    assert first == body_digests_reference(bytes(buffer[: -len(b"more\n")]))


def test_the_chain_check_uses_the_native_hasher_where_it_was_built() -> None:
    native = _native()
    assert trajectory.body_digests is native.body_digests
    assert trajectory.LINEHASH == "native"


def test_without_the_native_module_the_reference_is_used() -> None:
    """A machine where ale.core._linehash was not built (no compiler, no OpenSSL headers) checks
    chains with the reference, and says so."""
    code = (
        "import sys; sys.modules['ale.core._linehash'] = None\n"  # (an import of it raises ImportError)
        "from ale.core import trajectory as t; print(t.LINEHASH, t.body_digests is t.body_digests_reference)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["python", "True"]
