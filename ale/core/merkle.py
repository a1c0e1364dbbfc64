"""RFC 6962 (Certificate Transparency) Merkle tree hash over a bundle's files.

``MTH({}) = SHA-256("")``; a leaf is ``SHA-256(0x00 || leaf data)``; an inner node is
``SHA-256(0x01 || left || right)``, splitting ``n`` leaves at the largest power of two below ``n``.
A bundle's leaves, in ascending byte order of file name, are
``UTF-8 name || 0x00 || SHA-256(file bytes)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def merkle_tree_hash(leaves: Sequence[bytes]) -> bytes:
    """MTH over the leaf data in order (RFC 6962, section 2.1)."""
    n = len(leaves)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return leaf_hash(leaves[0])
    k = 1
    while k * 2 < n:
        k *= 2
    return node_hash(merkle_tree_hash(leaves[:k]), merkle_tree_hash(leaves[k:]))


def file_leaves(digests: Mapping[str, str]) -> list[bytes]:
    """Leaf data for ``{name: sha256 hex}``, in ascending byte order of the UTF-8 names."""
    names = sorted(digests, key=lambda name: name.encode())
    return [name.encode() + b"\x00" + bytes.fromhex(digests[name]) for name in names]


def files_root(digests: Mapping[str, str]) -> str:
    """The bundle's integrity root (hex) over ``{name: sha256 hex}``."""
    return merkle_tree_hash(file_leaves(digests)).hex()
