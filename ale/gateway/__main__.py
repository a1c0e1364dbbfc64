"""``python -m ale.gateway serve ...`` (see ale.gateway.cli)."""

import sys

from ale.gateway.cli import main

sys.exit(main())
