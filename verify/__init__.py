"""The verifier: a Quart service on SQLite that checks uploads, assigns levels and exports the board.

Installed as ``ale_verify``. ``pipeline`` is the upload checklist, ``db`` all database access,
``app`` the HTTP API, ``cli`` the ``ale-verify`` command.
"""

__version__ = "0.1.0"
