"""The registry of runtime backends: a name (``ale run --runtime NAME``) -> its class.

Each entry is ``"module:Class"``, imported only when asked for, so that listing the names costs
nothing. A backend's ``name`` attribute is its registry name; the bundle manifest records it
(``runtime.runtime``). ``local`` runs the evaluator as a child process and the agent under
bubblewrap; ``podman`` and ``docker`` run both as containers of the locked images
(:mod:`ale.runner.oci`).
"""

from __future__ import annotations

import importlib
from typing import cast

from ale.runner.runtime import Runtime

DEFAULT = "local"

_REGISTRY: dict[str, str] = {
    "local": "ale.runner.local:LocalRuntime",
    "podman": "ale.runner.oci:PodmanRuntime",
    "docker": "ale.runner.oci:DockerRuntime",
}


class UnknownRuntime(ValueError):
    """A name that is not in the registry (the message lists the known ones)."""


def names() -> tuple[str, ...]:
    """The registered names, sorted."""
    return tuple(sorted(_REGISTRY))


def runtime_class(name: str) -> type[Runtime]:
    """The class registered as ``name``, else UnknownRuntime."""
    where = _REGISTRY.get(name)
    if where is None:
        raise UnknownRuntime(f"unknown runtime {name!r}; known runtimes: {', '.join(names())}")
    module, _, attr = where.partition(":")
    return cast("type[Runtime]", getattr(importlib.import_module(module), attr))


def make(name: str = DEFAULT) -> Runtime:
    """A new runtime of the backend registered as ``name`` (not yet checked: call its ``check()``)."""
    return runtime_class(name)()
