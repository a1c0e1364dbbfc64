"""``python -m ale_evaluator``: the evaluator as a program (how runners start it).

Once ``main`` returns, everything the evaluator writes is written (its event log is closed and its
servers and worker pools are stopped), so it ends at once instead of finalising the simulator's
and gRPC's modules, which takes longer than serving a short task's last call.
"""

import logging
import os
import sys

from ale_evaluator.cli import main

status = main()
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
os._exit(status)
