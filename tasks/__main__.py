"""Worker entry point, started by torchrun on every rank: ``python -m ddp_runner.tasks <run dir>``.

The rank's life is tasks/worker.py; torchrun's agent (runner/launch/agent.py) forks ranks from a preloaded server
instead (tasks/forked.py) and keeps this entry for any other launch of the same command.
"""

from __future__ import annotations

import sys

from ddp_runner.tasks import worker

if __name__ == "__main__":
    code = worker.main(sys.argv[1] if len(sys.argv) > 1 else None)
    if code == 0:
        worker.fast_exit(0)
    worker.after_failure()
    sys.exit(code)
