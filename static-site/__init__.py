"""The static leaderboard's Jinja templates (``templates/``) and assets (``assets/``).

Installed as the ``ale_site`` package (package data) so that ``ale-verify export-site`` finds them in
a wheel as well as in a source checkout; ``ale_verify.export`` renders them. No code lives here.
"""
