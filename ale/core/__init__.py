"""The pure core shared by the runner and the verifier: bytes in, values out, no I/O.

Nothing under ``ale.core`` may import gRPC, Trio, Quart, SQLite or subprocess,
nor open files or sockets; ``tests/test_core_purity.py`` enforces it.
"""
