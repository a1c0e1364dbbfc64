"""``python -m ale.images build|pin|show|lock|verify``: ``ale images`` without the harness."""

import sys

from ale.images.cli import main

sys.exit(main())
