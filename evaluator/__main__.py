import sys

from ale_evaluator.cli import main

sys.exit(main())
