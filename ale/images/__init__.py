"""The evaluator and agent OCI images: defined once in ``images/*.toml``, built bit for bit.

``definition`` reads a definition; ``build`` turns it into an OCI layout (``debian``, ``wheels``
and the checkout's files into normalised ``tree`` layers, ``layout`` for the documents);
``fetch`` keeps the pinned downloads; ``resolve`` and ``pin`` turn wanted packages into pins;
``attest`` is the lock and the runtime's attestation; ``cli`` is ``ale images``. The writing
side uses the standard library only, so a bare interpreter (a Nix build's) runs it.
docs/images.md describes the images, the digests and how to check a rebuild.
"""
