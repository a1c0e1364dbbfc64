"""The one thing pyproject.toml cannot say: the optional C module ale.core._linehash.

It is built when a C compiler, Python's headers and OpenSSL's headers (libssl-dev) are there; if
its build fails the install goes on without it (``optional=True``) and the verifier uses the
Python path it is held to (ale/core/_linehash.c, docs/verifier.md, "The native line hasher").
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            f"ale.core.{name}",
            sources=[f"ale/core/{name}.c"],
            libraries=["crypto"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"],
            optional=True,
        )
        for name in ("_linehash", "_eventscan")  # the line hasher, and the bulk chain check's scan
    ]
)
